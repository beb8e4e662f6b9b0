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
// OnSample's answer when the pending batch is full: libbpf stops consuming
// (the record it was given is already kept) and ring_buffer__poll returns it.
constexpr int kStopDraining = -EAGAIN;

bool ValidRecord(const void* data, size_t size) {
  if (size < sizeof(__u32)) return false;
  const auto* head = static_cast<const svt_event*>(data);
  if (size < head->size) return false;
  if (head->kind == SVT_EV_FLOW_STATS) return head->size == sizeof(svt_flow_stats);
  return size >= sizeof(svt_event) && (head->size == sizeof(svt_event) || head->size == sizeof(svt_event_cap));
}
}  // namespace

RingReader::RingReader(Napi::Env env, int ringbuf_map_fd, Napi::Function on_batch) {
  rb_ = ring_buffer__new(ringbuf_map_fd, &RingReader::OnSample, this, nullptr);
  if (!rb_) ThrowErrno(env, "ring_buffer__new", errno);
  sink_ = std::make_unique<BatchSink>(env, on_batch, "svctrace-ring-reader", Channel::kRing);
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

uint64_t RingReader::ring_bytes() const {
  ring* r = ring_buffer__ring(rb_, 0);
  return r ? ring__avail_data_size(r) : 0;
}

int RingReader::OnSample(void* ctx, void* data, size_t size) {
  auto* self = static_cast<RingReader*>(ctx);
  // Records are written by our own BPF object: an event (with or without a
  // packet capture) or a flow's counters. Anything else means the object and
  // the addon disagree on the ABI: skip and count, never crash.
  if (!ValidRecord(data, size)) {
    self->malformed_++;
    return 0;
  }
  self->sink_->Append(data, static_cast<const svt_event*>(data)->size);
  self->records_++;
  self->pending_.store(self->sink_->pending());
  return self->sink_->Full() ? kStopDraining : 0;
}

void RingReader::Run() {
  while (!stop_.load()) {
    if (sink_->Full() && !sink_->Flush()) {
      // JS holds as many batches as it may: leave the records in the ring.
      held_back_++;
      sink_->WaitForRoom(std::chrono::milliseconds(kPollIdleMs));
      continue;
    }
    int n = ring_buffer__poll(rb_, sink_->pending() ? kPollBusyMs : kPollIdleMs);
    if (n < 0 && n != -EINTR && n != kStopDraining) break;
    if (sink_->Due()) sink_->Flush();
    pending_.store(sink_->pending());
  }
  // What is still in the ring stays there: Stop() runs on the JS thread,
  // which cannot take more batches. The caller drains first (see stats()).
}

}  // namespace svt
