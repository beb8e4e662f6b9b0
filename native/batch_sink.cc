#include "batch_sink.h"

#include <stdio.h>

namespace svt {

namespace {
// A batch is flushed when it holds this many bytes, or when its first record
// has waited kFlushAfter: events reach JS within a few ms, batches stay large.
constexpr size_t kFlushBytes = 256 * 1024;
constexpr auto kFlushAfter = std::chrono::milliseconds(5);
// Batches queued towards JS before the producer keeps accumulating instead.
// Bytes in flight towards JS are at most about kMaxQueuedBatches x
// kMaxPendingBytes: memory stays bounded when JS falls behind.
constexpr size_t kMaxQueuedBatches = 8;
// When JS is that far behind, a pending batch above this is dropped (counted).
constexpr size_t kMaxPendingBytes = 1024 * 1024;
}  // namespace

BatchSink::BatchSink(Napi::Env env, Napi::Function on_batch, const char* name) {
  tsfn_ = Tsfn::New(env, on_batch, name, kMaxQueuedBatches, 1);
  pending_.bytes.reserve(kFlushBytes);
}

void BatchSink::Append(const void* record, size_t size) {
  if (pending_.count == 0) pending_since_ = std::chrono::steady_clock::now();
  const auto* bytes = static_cast<const uint8_t*>(record);
  pending_.bytes.insert(pending_.bytes.end(), bytes, bytes + size);
  pending_.count++;
  if (pending_.bytes.size() >= kFlushBytes) Flush();
}

bool BatchSink::Due() const {
  return pending_.count &&
         (pending_.bytes.size() >= kFlushBytes || std::chrono::steady_clock::now() - pending_since_ >= kFlushAfter);
}

void BatchSink::Flush() {
  if (pending_.count == 0 || closed_) return;
  auto* batch = new Batch(std::move(pending_));
  napi_status st = tsfn_.NonBlockingCall(batch);
  if (st == napi_ok) {
    batches_++;
    pending_ = Batch();
    pending_.bytes.reserve(kFlushBytes);
    return;
  }
  // JS is behind (queue full) or gone: keep the records while bounded.
  pending_ = std::move(*batch);
  delete batch;
  if (pending_.bytes.size() > kMaxPendingBytes) {
    dropped_ += pending_.count;
    pending_ = Batch();
  }
}

void BatchSink::Close() {
  if (closed_) return;
  Flush();
  dropped_ += pending_.count;
  pending_ = Batch();
  closed_ = true;
  tsfn_.Release();
}

void BatchSink::CallJs(Napi::Env env, Napi::Function fn, std::nullptr_t*, Batch* batch) {
  if (env != nullptr && fn != nullptr) {
    try {
      auto buf = Napi::Buffer<uint8_t>::Copy(env, batch->bytes.data(), batch->bytes.size());
      fn.Call({buf, Napi::Number::New(env, batch->count)});
    } catch (const Napi::Error& e) {
      // The TS wrapper never lets its handler throw; if it does anyway, say
      // so rather than unwinding into Node's thread-safe-function machinery.
      fprintf(stderr, "svctrace: batch handler threw: %s\n", e.Message().c_str());
    }
  }
  delete batch;
}

}  // namespace svt
