// Drains the BPF ring buffer on its own thread and hands JavaScript whole
// batches through a BatchSink: one JS call per batch, never one per event.
// The poll thread never waits for JavaScript.
#pragma once

#include <napi.h>

#include <atomic>
#include <memory>
#include <thread>

#include "batch_sink.h"

struct ring_buffer;

namespace svt {

class RingReader {
 public:
  RingReader(Napi::Env env, int ringbuf_map_fd, Napi::Function on_batch);
  ~RingReader();

  void Start();
  // Stops the thread and flushes what it holds; safe to call twice.
  void Stop();

  uint64_t batches_delivered() const { return sink_->batches(); }
  uint64_t records_read() const { return records_.load(); }
  uint64_t records_dropped() const { return sink_->dropped(); }
  uint64_t malformed() const { return malformed_.load(); }

 private:
  static int OnSample(void* ctx, void* data, size_t size);
  void Run();

  std::unique_ptr<BatchSink> sink_;
  ring_buffer* rb_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
  bool stopped_ = false;
  std::atomic<uint64_t> records_{0};
  std::atomic<uint64_t> malformed_{0};
};

}  // namespace svt
