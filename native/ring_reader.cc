#include "ring_reader.h"

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf.h>
#include <errno.h>
#include <string.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include "errors.h"
#include "events.h"

namespace svt {

namespace {
// Poll timeout while a batch is pending; while records came in the last
// kActiveFor (the kernel wakes the reader only for SVT_WAKEUP_BYTES, so
// smaller amounts are found by polling); and when idle. An idle tracer
// wakes 20 times a second, and its first record waits at most kPollIdleMs.
constexpr int kPollBusyMs = 2;
constexpr int kPollActiveMs = SVT_POLL_MS;
constexpr int kPollIdleMs = 50;
constexpr auto kActiveFor = std::chrono::seconds(1);
// The largest record our BPF object writes: a wrapped record is reassembled
// in a buffer of this size.
constexpr size_t kMaxRecord = sizeof(svt_event_cap);

bool ValidRecord(const void* data, size_t size) {
  if (size < sizeof(__u32)) return false;
  const auto* head = static_cast<const svt_event*>(data);
  if (size < head->size) return false;
  if (head->kind == SVT_EV_FLOW_STATS) return head->size == sizeof(svt_flow_stats);
  return size >= sizeof(svt_event) && (head->size == sizeof(svt_event) || head->size == sizeof(svt_event_cap));
}

// The kernel's record header: length with the busy and discard bits, then
// the page offset; records start 8-byte aligned.
size_t RecordSpan(__u32 len) {
  const size_t body = len & ~(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT);
  return (body + BPF_RINGBUF_HDR_SZ + 7) & ~size_t{7};
}
}  // namespace

RingReader::RingReader(Napi::Env env, int ringbuf_map_fd, Napi::Function on_batch) : map_fd_(ringbuf_map_fd) {
  bpf_map_info info = {};
  __u32 len = sizeof(info);
  if (bpf_map_get_info_by_fd(map_fd_, &info, &len) < 0) ThrowErrno(env, "bpf_map_get_info_by_fd (ring buffer)", errno);
  page_size_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  data_size_ = info.max_entries;
  // Consumer position: one page we write. Producer position and the data:
  // read-only, the data once (libbpf maps it twice).
  void* cons = mmap(nullptr, page_size_, PROT_READ | PROT_WRITE, MAP_SHARED, map_fd_, 0);
  if (cons == MAP_FAILED) ThrowErrno(env, "mmap (ring buffer consumer page)", errno);
  void* prod = mmap(nullptr, page_size_ + data_size_, PROT_READ, MAP_SHARED, map_fd_, static_cast<off_t>(page_size_));
  if (prod == MAP_FAILED) {
    int err = errno;
    munmap(cons, page_size_);
    ThrowErrno(env, "mmap (ring buffer data)", err);
  }
  consumer_pos_ = static_cast<unsigned long*>(cons);
  producer_pos_ = static_cast<const unsigned long*>(prod);
  data_ = static_cast<const uint8_t*>(prod) + page_size_;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = {};
  ev.events = EPOLLIN;
  if (epoll_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, map_fd_, &ev) < 0) {
    int err = errno;
    Unmap();
    ThrowErrno(env, "epoll on the ring buffer", err);
  }
  sink_ = std::make_unique<BatchSink>(env, on_batch, "svctrace-ring-reader", Channel::kRing);
}

RingReader::~RingReader() {
  Stop();
  Unmap();
}

void RingReader::Unmap() {
  if (epoll_fd_ >= 0) close(epoll_fd_);
  epoll_fd_ = -1;
  if (consumer_pos_) munmap(consumer_pos_, page_size_);
  if (producer_pos_) munmap(const_cast<unsigned long*>(producer_pos_), page_size_ + data_size_);
  consumer_pos_ = nullptr;
  producer_pos_ = nullptr;
  data_ = nullptr;
}

void RingReader::Start() {
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "svt-ring");  // for `top -H` on a busy node
    Run();
  });
}

void RingReader::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  // The ring is not read again: what it still holds is lost, and counted.
  if (consumer_pos_) left_in_ring_.store(CountLeft());
  if (sink_) sink_->Close();
}

uint64_t RingReader::CountLeft() const {
  const size_t mask = data_size_ - 1;
  unsigned long cons = __atomic_load_n(consumer_pos_, __ATOMIC_ACQUIRE);
  const unsigned long prod = __atomic_load_n(producer_pos_, __ATOMIC_ACQUIRE);
  uint64_t left = 0;
  while (cons < prod) {
    const __u32 len = __atomic_load_n(reinterpret_cast<const __u32*>(data_ + (cons & mask)), __ATOMIC_ACQUIRE);
    if (len & BPF_RINGBUF_BUSY_BIT) break;  // still being written: not counted by anyone yet
    if (!(len & BPF_RINGBUF_DISCARD_BIT)) left++;
    cons += RecordSpan(len);
  }
  return left;
}

uint64_t RingReader::ring_bytes() const {
  if (!consumer_pos_) return 0;
  return __atomic_load_n(producer_pos_, __ATOMIC_ACQUIRE) - __atomic_load_n(consumer_pos_, __ATOMIC_ACQUIRE);
}

void RingReader::Take(const void* record, size_t size) {
  // Records are written by our own BPF object: an event (with or without a
  // packet capture) or a flow's counters. Anything else means the object and
  // the addon disagree on the ABI: skip and count, never crash.
  if (!ValidRecord(record, size)) {
    malformed_++;
    return;
  }
  sink_->Append(record, static_cast<const svt_event*>(record)->size);
  records_++;
}

size_t RingReader::Consume() {
  const size_t mask = data_size_ - 1;
  unsigned long cons = __atomic_load_n(consumer_pos_, __ATOMIC_ACQUIRE);
  const unsigned long prod = __atomic_load_n(producer_pos_, __ATOMIC_ACQUIRE);
  size_t taken = 0;
  uint8_t wrapped[kMaxRecord];
  while (cons < prod && !sink_->Full()) {
    const size_t at = cons & mask;
    const __u32 len = __atomic_load_n(reinterpret_cast<const __u32*>(data_ + at), __ATOMIC_ACQUIRE);
    if (len & BPF_RINGBUF_BUSY_BIT) break;  // reserved, not yet committed: the next poll gets it
    if (!(len & BPF_RINGBUF_DISCARD_BIT)) {
      const size_t size = len & ~(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT);
      const size_t start = (at + BPF_RINGBUF_HDR_SZ) & mask;
      if (start + size <= data_size_) {
        Take(data_ + start, size);
      } else if (size <= kMaxRecord) {
        const size_t first = data_size_ - start;
        memcpy(wrapped, data_ + start, first);
        memcpy(wrapped + first, data_, size - first);
        Take(wrapped, size);
      } else {
        malformed_++;  // larger than anything our object writes
      }
      taken++;
    }
    cons += RecordSpan(len);
    // The count of records held here goes out before the position that
    // frees their space, both as releases: stats() reads the position
    // first, so a ring read as empty never comes with a count that misses
    // the records just taken from it (ringIdle() in JS would call the ring
    // idle while they are still on their way).
    pending_.store(sink_->pending(), std::memory_order_release);
    __atomic_store_n(consumer_pos_, cons, __ATOMIC_RELEASE);
  }
  return taken;
}

void RingReader::Run() {
  auto last_record = std::chrono::steady_clock::now() - kActiveFor;
  while (!stop_.load()) {
    if (sink_->Full() && !sink_->Flush()) {
      // JS holds as many batches as it may: leave the records in the ring.
      held_back_++;
      sink_->WaitForRoom(std::chrono::milliseconds(kPollIdleMs));
      continue;
    }
    const size_t taken = Consume();
    const auto now = std::chrono::steady_clock::now();
    if (taken) last_record = now;
    if (taken == 0 && !sink_->Full()) {
      // Empty: sleep until the kernel says a batch's worth is waiting, or
      // the next poll. Level-triggered: records left behind wake it at once.
      const int timeout = sink_->pending() ? kPollBusyMs : now - last_record < kActiveFor ? kPollActiveMs : kPollIdleMs;
      epoll_event ev;
      int n = epoll_wait(epoll_fd_, &ev, 1, timeout);
      if (n < 0 && errno != EINTR) break;
    }
    if (sink_->Due()) sink_->Flush();
    pending_.store(sink_->pending());
  }
  // What is still in the ring stays there: Stop() runs on the JS thread,
  // which cannot take more batches. The caller drains first (see stats()).
}

}  // namespace svt
