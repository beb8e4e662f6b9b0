// Hands batches of records from a native thread to one JS callback, one call
// per batch. Shared by the ring-buffer reader and the netlink listeners so
// all deliver the same way, with the same bounds.
//
// It never drops. At most kMaxInFlight batches wait for JavaScript and one
// more accumulates; when that one is full too the producer must stop reading
// its source (Full()) and wait (WaitForRoom()): the kernel's buffer — the
// BPF ring buffer, a netlink socket — is then the buffer, and what does not
// fit there is counted by the kernel. Memory here is bounded by construction.
#pragma once

#include <napi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace svt {

// Batches handed to JS and not yet returned; outlives the sink (a queued
// call may run after the sink is gone).
struct InFlight {
  std::mutex mu;
  std::condition_variable cv;
  uint32_t count = 0;
  // Batches handed over since the start, and returned (under mu): a drain
  // waits until `returned` reaches what `handed` was when it asked.
  uint64_t handed = 0;
  uint64_t returned = 0;
  void Done();
  // Record buffers of delivered batches, reused by the producer: a fresh
  // 256 KiB buffer per batch was a fresh mapping, its page faults, and an
  // unmap from another thread (a TLB shootdown) with every batch.
  std::vector<std::vector<uint8_t>> spare;
  void Recycle(std::vector<uint8_t>&& bytes);
  std::vector<uint8_t> TakeSpare(size_t reserve);
  // Touched on the JS thread only: when JS started handling batches without
  // the event loop turning in between (see BatchSink::CallJs).
  bool in_turn = false;
  std::chrono::steady_clock::time_point turn_start;
};

// Which source a batch comes from, passed to JS as the callback's third
// argument: user space orders the conntrack channel against the ring by time.
enum class Channel : uint32_t { kRing = 0, kNetlink = 1 };

// The JS side of a sink, touched on the JS thread only: one buffer V8
// owns, into which each batch is copied just before the callback, which
// gets a view of it valid for the call (it must copy what it keeps). A new
// buffer per batch cost a fresh mapping, its page faults and an unmap with
// every batch (blocks this large are mapped on their own, see addon.cc);
// reusing one keeps the copy and nothing else. Freed with the thread-safe
// function, on the JS thread.
struct JsSide {
  Napi::Reference<Napi::ArrayBuffer> buffer;
  size_t capacity = 0;
};

struct Batch {
  std::vector<uint8_t> bytes;
  uint32_t count = 0;
  Channel channel = Channel::kRing;
  std::shared_ptr<InFlight> in_flight;
};

class BatchSink {
 public:
  BatchSink(Napi::Env env, Napi::Function on_batch, const char* name, Channel channel);
  BatchSink(const BatchSink&) = delete;
  BatchSink& operator=(const BatchSink&) = delete;

  // Producer side (one thread). Append always keeps the record.
  void Append(const void* record, size_t size);
  // The pending batch is at its limit: read no more until Flush() succeeds.
  bool Full() const;
  bool Due() const;
  // Hands the pending batch to JS; false when JS already holds the most
  // batches it may (the batch stays pending).
  bool Flush();
  // Blocks until JS returns a batch, or `max` passes.
  void WaitForRoom(std::chrono::milliseconds max);
  // Final flush, then release the JS function. Producer thread must be done.
  // Records that could not be handed over are counted in lost_at_close().
  void Close();

  uint32_t pending() const { return pending_.count; }
  uint32_t in_flight() const;
  // Batches handed to JS so far, and how many of them JS has returned.
  uint64_t handed() const;
  uint64_t returned() const;
  uint64_t batches() const { return batches_.load(); }
  uint64_t lost_at_close() const { return lost_at_close_.load(); }

 private:
  static void CallJs(Napi::Env env, Napi::Function fn, JsSide* js, Batch* batch);
  static bool ReleaseOnNextTurn(Napi::Env env, const std::shared_ptr<InFlight>& in_flight);
  using Tsfn = Napi::TypedThreadSafeFunction<JsSide, Batch, CallJs>;

  Tsfn tsfn_;
  bool closed_ = false;
  Channel channel_;
  Batch pending_;
  std::shared_ptr<InFlight> in_flight_ = std::make_shared<InFlight>();
  std::chrono::steady_clock::time_point pending_since_;
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> lost_at_close_{0};
};

}  // namespace svt
