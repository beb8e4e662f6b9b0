// A netfilter netlink socket opened inside one network namespace and read on
// its own thread; subclasses turn messages into records delivered to JS in
// batches (BatchSink). Shared by the conntrack DESTROY listener and the
// nftables trace listener.
#pragma once

#include <napi.h>
#include <sys/socket.h>  // mmsghdr (_GNU_SOURCE: g++ defines it)

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "batch_sink.h"

struct mnl_socket;
struct nlmsghdr;

namespace svt {

class NetlinkListener {
 public:
  NetlinkListener(const NetlinkListener&) = delete;
  NetlinkListener& operator=(const NetlinkListener&) = delete;
  virtual ~NetlinkListener();

  void Start(Napi::Env env, Napi::Function on_batch, const char* name);
  void Stop();

  uint64_t events() const { return events_.load(); }
  // Messages read from the socket, kept or not.
  uint64_t messages_read() const { return messages_read_.load(std::memory_order_relaxed); }
  // Messages the kernel could not queue to us: events we missed. The
  // socket's own drop count (one per message), or, where the kernel does
  // not tell it, the ENOBUFS errors read (one per burst of drops).
  uint64_t overruns() const;
  // Records read but not handed to JS when the listener stopped.
  uint64_t lost_at_close() const { return sink_ ? sink_->lost_at_close() : 0; }

  // A drain at stop (JS thread): asks the listener to read everything its
  // socket holds now and hand it to JS at once, without the gather delay;
  // Flushed(gen) is true once that is done and JS has returned every batch
  // handed over up to then. Without it a stop counted the last few ms of
  // destroys (the pending batch and the socket's queue) as lost at shutdown.
  // `gen` grows with each drain; a listener started after the ask, or never
  // started, has nothing owed.
  void AskFlush(uint64_t gen);
  bool Flushed(uint64_t gen) const;

 protected:
  // Opens a NETLINK_NETFILTER socket in `netns_path` joined to `group`
  // (an NFNLGRP_* number); throws a JS error on failure.
  NetlinkListener(Napi::Env env, const std::string& netns_path, unsigned int group);
  // Called on the listener thread for each message.
  virtual void Handle(const nlmsghdr* nlh) = 0;
  void Emit(const void* record, size_t size);
  int socket_fd() const;

 private:
  // Buffers for one recvmmsg: a slot, an iovec and a header per message.
  struct ReadSlots {
    ReadSlots();
    size_t slot_bytes;
    std::vector<char> bytes;
    std::vector<iovec> iov;
    std::vector<mmsghdr> msgs;
  };
  void Run();
  unsigned ReadOnce(int fd, ReadSlots& slots);
  // Bytes the socket holds (SO_MEMINFO's receive allocation; UINT64_MAX when unknown).
  uint64_t QueuedBytes() const;
  // Sleeps up to `max`, or until AskFlush wakes the thread.
  void WaitForWake(std::chrono::milliseconds max);

  mnl_socket* nl_ = nullptr;
  std::unique_ptr<BatchSink> sink_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> events_{0};
  std::atomic<uint64_t> overruns_{0};
  std::atomic<uint64_t> messages_read_{0};
  // AskFlush's generation, the last one done, and the sink's handed() when
  // it was done (written before flush_done_, read after it).
  std::atomic<uint64_t> flush_asked_{0};
  std::atomic<uint64_t> flush_done_{0};
  std::atomic<uint64_t> flush_handed_{0};
  // Wakes the thread from its poll when a flush is asked (eventfd).
  int wake_fd_ = -1;
  // The listener thread's own: bytes of messages read so far, the flush
  // it is doing, and the bytes read at which that flush is done.
  uint64_t bytes_read_ = 0;
  uint64_t flushing_gen_ = 0;
  uint64_t flush_until_ = 0;
};

// CLOCK_MONOTONIC in ns: the clock bpf_ktime_get_ns() reads.
uint64_t MonotonicNs();

}  // namespace svt
