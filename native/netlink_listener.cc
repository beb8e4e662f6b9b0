#include "netlink_listener.h"

#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "errors.h"
#include "events.h"
#include "netns.h"

namespace svt {

namespace {
constexpr int kPollMs = 50;
// After a drain that found messages, let the next ones gather this long
// before waiting again. The kernel sends each conntrack or trace message on
// its own and wakes the reader for each: on a busy node that was a thread
// wakeup (an inter-processor interrupt, two context switches) per new
// connection, several per connection for rule traces. The socket buffer
// (16 MiB) holds far more than arrives in this time.
constexpr auto kGather = std::chrono::milliseconds(SVT_POLL_MS);
// Reads of the socket at stop (each up to kReadBatch messages): its 16 MiB
// buffer several times over.
constexpr int kDrainAtStopMax = 4096;
// Messages taken per syscall (recvmmsg). The kernel queues each conntrack
// or trace message as a datagram of its own, and one recv each was a
// syscall per destroyed connection on the listener's thread, plus one more
// per wakeup to find the socket empty (a short read says so now).
constexpr unsigned kReadBatch = 16;
}  // namespace

// Each slot holds one message of any size the kernel sends (4 pages, as
// the single buffer before it did).
NetlinkListener::ReadSlots::ReadSlots()
    : slot_bytes(MNL_SOCKET_BUFFER_SIZE * 4), bytes(slot_bytes * kReadBatch), iov(kReadBatch), msgs(kReadBatch) {}

uint64_t MonotonicNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

NetlinkListener::NetlinkListener(Napi::Env env, const std::string& netns_path, unsigned int group) {
  // A netlink socket belongs to the namespace it is created in: create it
  // there, then read it from any thread.
  NetnsResult r = RunInNetns(netns_path, [&](NetnsResult& res) {
    nl_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
    if (!nl_) {
      res.op = "mnl_socket_open(NETLINK_NETFILTER)";
      return -errno;
    }
    if (mnl_socket_bind(nl_, 0, MNL_SOCKET_AUTOPID) < 0) {
      res.op = "mnl_socket_bind";
      return -errno;
    }
    if (mnl_socket_setsockopt(nl_, NETLINK_ADD_MEMBERSHIP, &group, sizeof(group)) < 0) {
      res.op = "join netlink group " + std::to_string(group);
      return -errno;
    }
    // Bursts must not overflow the socket: ask for 16 MiB (kernel memory,
    // used only while this thread is behind). With 4 MiB, a storm of
    // ~4.5k connections/s on two busy cores overflowed the conntrack
    // socket: about a tenth of the destroys were lost (counted), in every
    // 20 s storm; with 16 MiB none were, in the same runs.
    int rcvbuf = 16 * 1024 * 1024;
    setsockopt(mnl_socket_get_fd(nl_), SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
    return 0;
  });
  if (r.err != 0) {
    if (nl_) mnl_socket_close(nl_);
    nl_ = nullptr;
    ThrowErrno(env, r.op, r.err, r.detail.empty() ? netns_path : r.detail);
  }
}

NetlinkListener::~NetlinkListener() {
  Stop();
  if (nl_) mnl_socket_close(nl_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void NetlinkListener::Start(Napi::Env env, Napi::Function on_batch, const char* name) {
  if (sink_) return;
  // Without it a drain's flush waits for the next poll timeout (kPollMs): slower, not wrong.
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  sink_ = std::make_unique<BatchSink>(env, on_batch, name, Channel::kNetlink);
  // Named for `top -H` on a busy node: the kernel keeps 15 characters.
  std::string thread_name = name;
  if (thread_name.rfind("svctrace-", 0) == 0) thread_name = "svt-" + thread_name.substr(9);
  thread_name.resize(std::min<size_t>(thread_name.size(), 15));
  thread_ = std::thread([this, thread_name] {
    pthread_setname_np(pthread_self(), thread_name.c_str());
    Run();
  });
}

void NetlinkListener::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (sink_) sink_->Close();
}

uint64_t NetlinkListener::overruns() const {
  uint64_t errors = overruns_.load();
  // SO_MEMINFO (Linux >= 4.12; before it, the ENOBUFS count):
  // SK_MEMINFO_DROPS is the socket's sk_drops, which a netlink overrun
  // increments for each message it drops. ENOBUFS is reported once per
  // congestion, however many messages were dropped. Where a socket filter
  // keeps only traced services' messages (ct_filter.h) these are theirs;
  // without one, messages of untraced entries count too: an upper bound.
  __u32 mem[SK_MEMINFO_VARS] = {};
  socklen_t len = sizeof(mem);
  if (nl_ && getsockopt(mnl_socket_get_fd(nl_), SOL_SOCKET, SO_MEMINFO, mem, &len) == 0 &&
      len > SK_MEMINFO_DROPS * sizeof(__u32))
    return std::max<uint64_t>(errors, mem[SK_MEMINFO_DROPS]);
  return errors;
}

void NetlinkListener::AskFlush(uint64_t gen) {
  if (!sink_ || !thread_.joinable()) return;
  uint64_t had = flush_asked_.load();
  while (had < gen && !flush_asked_.compare_exchange_weak(had, gen)) {
  }
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t w = write(wake_fd_, &one, sizeof(one));
    (void)w;  // a full counter already wakes the thread
  }
}

bool NetlinkListener::Flushed(uint64_t gen) const {
  if (!sink_ || flush_asked_.load() < gen) return true;
  if (flush_done_.load(std::memory_order_acquire) < gen) return false;
  return sink_->returned() >= flush_handed_.load();
}

uint64_t NetlinkListener::QueuedBytes() const {
  __u32 mem[SK_MEMINFO_VARS] = {};
  socklen_t len = sizeof(mem);
  if (getsockopt(mnl_socket_get_fd(nl_), SOL_SOCKET, SO_MEMINFO, mem, &len) == 0 && len > SK_MEMINFO_RMEM_ALLOC * sizeof(__u32))
    return mem[SK_MEMINFO_RMEM_ALLOC];
  return UINT64_MAX;  // unknown: read until the socket is empty
}

void NetlinkListener::WaitForWake(std::chrono::milliseconds max) {
  if (wake_fd_ < 0) {
    std::this_thread::sleep_for(max);
    return;
  }
  // The wake stays readable: the next poll of Run() clears it.
  struct pollfd pfd = {wake_fd_, POLLIN, 0};
  poll(&pfd, 1, (int)max.count());
}

int NetlinkListener::socket_fd() const { return mnl_socket_get_fd(nl_); }

void NetlinkListener::Emit(const void* record, size_t size) {
  sink_->Append(record, size);
  events_++;
}

void NetlinkListener::Run() {
  ReadSlots slots;
  int fd = mnl_socket_get_fd(nl_);
  while (!stop_.load()) {
    const uint64_t asked = flush_asked_.load();
    const bool flushing = asked > flush_done_.load(std::memory_order_relaxed);
    if (sink_->Full() && !sink_->Flush()) {
      // JS is behind: leave messages in the socket; what it cannot hold the
      // kernel reports as ENOBUFS, counted in overruns().
      sink_->WaitForRoom(std::chrono::milliseconds(kPollMs));
      continue;
    }
    if (flushing) {
      // A drain asked (AskFlush): what the socket holds now goes to JS now.
      // Bounded by what it held at the ask (its queued bytes then: a
      // message's buffer takes more than the message, so that covers all of
      // them, and at most about as much again that came after), so a node
      // whose destroys never stop coming does not hold the drain.
      if (asked != flushing_gen_) {
        flushing_gen_ = asked;
        const uint64_t queued = QueuedBytes();
        flush_until_ = queued == UINT64_MAX ? UINT64_MAX : bytes_read_ + queued;
      }
      while (!sink_->Full() && bytes_read_ < flush_until_) {
        if (ReadOnce(fd, slots) < kReadBatch) flush_until_ = bytes_read_;  // the socket held no more
      }
      if (bytes_read_ < flush_until_) continue;  // the batch is full: handed over at the top, then read on
      if (!sink_->Flush()) {
        sink_->WaitForRoom(std::chrono::milliseconds(kPollMs));
        continue;
      }
      flush_handed_.store(sink_->handed());
      flush_done_.store(asked, std::memory_order_release);
      continue;
    }
    struct pollfd pfds[2] = {{fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int pr = poll(pfds, wake_fd_ >= 0 ? 2 : 1, sink_->pending() ? 2 : kPollMs);
    if (pr > 0 && (pfds[1].revents & POLLIN)) {
      uint64_t n;
      ssize_t r = read(wake_fd_, &n, sizeof(n));
      (void)r;  // cleared, or already cleared: the flush is seen at the top
      continue;
    }
    if (pr > 0) {
      // Drain what is queued (while the batch has room), then flush once.
      bool got = false;
      while (!sink_->Full()) {
        unsigned n = ReadOnce(fd, slots);
        if (n) got = true;
        if (n < kReadBatch) break;  // the socket held no more
      }
      if (sink_->Due()) sink_->Flush();
      if (got && !stop_.load()) WaitForWake(kGather);
      continue;
    }
    if (sink_->Due()) sink_->Flush();
  }
  // Stopping: what the socket still holds is read and goes with the last
  // batch (handed over by Stop, or counted lost at close), instead of going
  // with the socket uncounted. Bounded: new messages may keep coming on a
  // busy node, and the socket would be read forever.
  for (int i = 0; i < kDrainAtStopMax && ReadOnce(fd, slots) == kReadBatch; i++) {
  }
}

// One read of the socket (up to kReadBatch messages), its messages
// handled; how many it held (0: none). An overrun (ENOBUFS: the kernel
// dropped messages, counted) is not the end of what it holds: recvmmsg
// returns what it read before one, and reports it on the next call.
unsigned NetlinkListener::ReadOnce(int fd, ReadSlots& s) {
  for (;;) {
    for (unsigned i = 0; i < kReadBatch; i++) {
      s.iov[i] = {s.bytes.data() + i * s.slot_bytes, s.slot_bytes};
      s.msgs[i] = {};
      s.msgs[i].msg_hdr.msg_iov = &s.iov[i];
      s.msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(fd, s.msgs.data(), kReadBatch, MSG_DONTWAIT, nullptr);
    if (n < 0) {
      if (errno == ENOBUFS) {
        overruns_++;
        continue;
      }
      return 0;
    }
    for (int i = 0; i < n; i++) {
      const nlmsghdr* nlh = reinterpret_cast<const nlmsghdr*>(s.iov[i].iov_base);
      int len = (int)s.msgs[i].msg_len;
      for (; mnl_nlmsg_ok(nlh, len); nlh = mnl_nlmsg_next(nlh, &len)) Handle(nlh);
    }
    for (int i = 0; i < n; i++) bytes_read_ += s.msgs[i].msg_len;
    messages_read_.fetch_add((unsigned)n, std::memory_order_relaxed);
    return (unsigned)n;
  }
}

}  // namespace svt
