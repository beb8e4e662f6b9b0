#include "ring_reader.h"

#include <linux/types.h>
#include <bpf/libbpf.h>
#include <errno.h>

#include "errors.h"
#include "events.h"

namespace svt {

namespace {
// Poll timeout while a batch is pending vs idle.
constexpr int kPollBusyMs = 2;
constexpr int kPollIdleMs = 100;
}  // namespace

RingReader::RingReader(Napi::Env env, int ringbuf_map_fd, Napi::Function on_batch) {
  rb_ = ring_buffer__new(ringbuf_map_fd, &RingReader::OnSample, this, nullptr);
  if (!rb_) ThrowErrno(env, "ring_buffer__new", errno);
  sink_ = std::make_unique<BatchSink>(env, on_batch, "svctrace-ring-reader");
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
  sink_->Close();
}

int RingReader::OnSample(void* ctx, void* data, size_t size) {
  auto* self = static_cast<RingReader*>(ctx);
  const auto* ev = static_cast<const svt_event*>(data);
  // Records are written by our own BPF object: a plain event, or one with a
  // packet capture. Any other size means the object and the addon disagree
  // on the ABI: skip and count, never crash.
  if (size < sizeof(svt_event) || (ev->size != sizeof(svt_event) && ev->size != sizeof(svt_event_cap)) ||
      size < ev->size) {
    self->malformed_++;
    return 0;
  }
  self->sink_->Append(data, ev->size);
  self->records_++;
  return 0;
}

void RingReader::Run() {
  while (!stop_.load()) {
    int n = ring_buffer__poll(rb_, sink_->pending() ? kPollBusyMs : kPollIdleMs);
    if (n < 0 && n != -EINTR) break;
    if (sink_->Due()) sink_->Flush();
  }
  // Drain what the kernel still holds; Stop() hands over the rest.
  ring_buffer__consume(rb_);
}

}  // namespace svt
