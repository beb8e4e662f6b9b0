// Drains the BPF ring buffer on its own thread and hands JavaScript whole
// batches through a BatchSink: one JS call per batch, never one per event.
// When JavaScript is behind, the reader stops draining: records wait in the
// ring, and what the ring cannot hold the kernel counts (SVT_CNT_RINGBUF_LOST).
//
// The ring's data pages are mapped once, not twice as libbpf's consumer maps
// them (so that a record that wraps reads as one): every mapped page counts
// in the process's RSS, and the ring is the largest thing svctrace holds. A
// record that wraps (rare: at most one per lap) is copied out in two parts.
#pragma once

#include <napi.h>

#include <atomic>
#include <memory>
#include <thread>

#include "batch_sink.h"

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
  // Records never handed to JS at shutdown: read from the ring and not
  // handed over, or still in the ring (the caller's drain ran out of time).
  uint64_t lost_at_close() const { return sink_->lost_at_close() + left_in_ring_.load(); }
  uint64_t malformed() const { return malformed_.load(); }
  // Times the reader held back because JS was behind.
  uint64_t held_back() const { return held_back_.load(); }
  // Bytes waiting in the ring, records pending here and batches held by JS:
  // zero everywhere means everything produced so far has been delivered.
  uint64_t ring_bytes() const;
  uint32_t pending() const { return pending_.load(); }
  uint32_t in_flight() const { return sink_->in_flight(); }

 private:
  // Takes committed records until the ring is empty or the batch is full;
  // returns how many it took.
  size_t Consume();
  // Committed records between the consumer and producer positions, not
  // taken: what Stop() leaves in the ring.
  uint64_t CountLeft() const;
  void Take(const void* record, size_t size);
  void Unmap();
  void Run();

  std::unique_ptr<BatchSink> sink_;
  int map_fd_ = -1;
  int epoll_fd_ = -1;
  size_t page_size_ = 0;
  size_t data_size_ = 0;  // the ring's size: a power of two, a multiple of the page size
  unsigned long* consumer_pos_ = nullptr;  // its own page, written by us
  const unsigned long* producer_pos_ = nullptr;  // read-only page, followed by the data
  const uint8_t* data_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
  bool stopped_ = false;
  std::atomic<uint64_t> records_{0};
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> held_back_{0};
  std::atomic<uint64_t> left_in_ring_{0};
  std::atomic<uint32_t> pending_{0};
};

}  // namespace svt
