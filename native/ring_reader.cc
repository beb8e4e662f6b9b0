#include "ring_reader.h"

#include <linux/types.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <stdio.h>

#include "errors.h"
#include "events.h"

namespace svt {

namespace {
// A batch is flushed when it holds this many bytes, or when its first record
// has waited kFlushAfter: events reach JS within a few ms, frames stay large.
constexpr size_t kFlushBytes = 256 * 1024;
constexpr auto kFlushAfter = std::chrono::milliseconds(5);
// Poll timeout while a batch is pending vs idle.
constexpr int kPollBusyMs = 2;
constexpr int kPollIdleMs = 100;
// Batches queued towards JS before the reader keeps accumulating instead.
constexpr size_t kMaxQueuedBatches = 16;
// When JS is that far behind, a pending batch above this is dropped (counted).
constexpr size_t kMaxPendingBytes = 32 * 1024 * 1024;
}  // namespace

RingReader::RingReader(Napi::Env env, int ringbuf_map_fd, Napi::Function on_batch) {
  rb_ = ring_buffer__new(ringbuf_map_fd, &RingReader::OnSample, this, nullptr);
  if (!rb_) ThrowErrno(env, "ring_buffer__new", errno);
  tsfn_ = Tsfn::New(env, on_batch, "svctrace-ring-reader", kMaxQueuedBatches, 1);
  pending_.bytes.reserve(kFlushBytes + sizeof(svt_event));
}

RingReader::~RingReader() {
  Stop();
  if (rb_) ring_buffer__free(rb_);
}

void RingReader::Start() {
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { Run(); });
}

void RingReader::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  tsfn_.Release();
}

int RingReader::OnSample(void* ctx, void* data, size_t size) {
  auto* self = static_cast<RingReader*>(ctx);
  const auto* hdr = static_cast<const svt_event*>(data);
  // Records are written by our own BPF object; a size mismatch means the
  // object and the addon disagree on the ABI. Skip and count, never crash.
  if (size < sizeof(svt_event) || hdr->size != sizeof(svt_event)) {
    self->malformed_++;
    return 0;
  }
  if (self->pending_.count == 0) self->pending_since_ = std::chrono::steady_clock::now();
  const auto* bytes = static_cast<const uint8_t*>(data);
  self->pending_.bytes.insert(self->pending_.bytes.end(), bytes, bytes + sizeof(svt_event));
  self->pending_.count++;
  self->records_++;
  if (self->pending_.bytes.size() >= kFlushBytes) self->Flush();
  return 0;
}

void RingReader::Flush() {
  if (pending_.count == 0) return;
  auto* batch = new Batch(std::move(pending_));
  napi_status st = tsfn_.NonBlockingCall(batch);
  if (st == napi_ok) {
    batches_++;
    pending_ = Batch();
    pending_.bytes.reserve(kFlushBytes + sizeof(svt_event));
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

void RingReader::Run() {
  while (!stop_.load()) {
    int timeout = pending_.count ? kPollBusyMs : kPollIdleMs;
    int n = ring_buffer__poll(rb_, timeout);
    if (n < 0 && n != -EINTR) break;
    if (pending_.count &&
        (std::chrono::steady_clock::now() - pending_since_ >= kFlushAfter ||
         pending_.bytes.size() >= kFlushBytes))
      Flush();
  }
  // Drain what the kernel still holds, then hand over the rest.
  ring_buffer__consume(rb_);
  Flush();
  if (pending_.count) dropped_ += pending_.count;
}

void RingReader::CallJs(Napi::Env env, Napi::Function fn, std::nullptr_t*, Batch* batch) {
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
