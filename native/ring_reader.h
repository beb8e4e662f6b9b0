// Drains the BPF ring buffer on its own thread and hands JavaScript whole
// batches: one JS call per batch, never one per event. The poll thread never
// waits for JavaScript; when JS falls behind, batches grow up to a hard cap
// and then records are dropped and counted.
#pragma once

#include <napi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

struct ring_buffer;

namespace svt {

struct Batch {
  std::vector<uint8_t> bytes;
  uint32_t count = 0;
};

class RingReader {
 public:
  // `on_batch` is called on the JS thread as on_batch(buffer, count).
  RingReader(Napi::Env env, int ringbuf_map_fd, Napi::Function on_batch);
  ~RingReader();

  void Start();
  // Stops the thread and flushes what it holds; safe to call twice.
  void Stop();

  uint64_t batches_delivered() const { return batches_.load(); }
  uint64_t records_read() const { return records_.load(); }
  uint64_t records_dropped() const { return dropped_.load(); }
  uint64_t malformed() const { return malformed_.load(); }

 private:
  static int OnSample(void* ctx, void* data, size_t size);
  static void CallJs(Napi::Env env, Napi::Function fn, std::nullptr_t*, Batch* batch);
  void Run();
  void Flush();

  using Tsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, Batch, CallJs>;
  Tsfn tsfn_;
  ring_buffer* rb_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
  bool stopped_ = false;

  Batch pending_;
  std::chrono::steady_clock::time_point pending_since_;
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> records_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> malformed_{0};
};

}  // namespace svt
