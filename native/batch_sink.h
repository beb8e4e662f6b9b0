// Hands batches of svt_event records from a native thread to one JS
// callback, one call per batch. Shared by the ring-buffer reader and the
// conntrack listener so both deliver the same way, with the same bounds.
#pragma once

#include <napi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace svt {

struct Batch {
  std::vector<uint8_t> bytes;
  uint32_t count = 0;
};

class BatchSink {
 public:
  BatchSink(Napi::Env env, Napi::Function on_batch, const char* name);
  BatchSink(const BatchSink&) = delete;
  BatchSink& operator=(const BatchSink&) = delete;

  // Producer side (one thread): append a record, flush when due.
  void Append(const void* record, size_t size);
  bool Due() const;
  void Flush();
  // Final flush, then release the JS function. Producer thread must be done.
  void Close();

  uint32_t pending() const { return pending_.count; }
  uint64_t batches() const { return batches_.load(); }
  uint64_t dropped() const { return dropped_.load(); }

 private:
  static void CallJs(Napi::Env env, Napi::Function fn, std::nullptr_t*, Batch* batch);
  using Tsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, Batch, CallJs>;

  Tsfn tsfn_;
  bool closed_ = false;
  Batch pending_;
  std::chrono::steady_clock::time_point pending_since_;
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace svt
