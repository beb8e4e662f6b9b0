#include "batch_sink.h"

#include <stdio.h>
#include <string.h>

#include <algorithm>

#include <linux/types.h>

#include "events.h"

namespace svt {

namespace {
// A batch is flushed when it holds this many bytes, or when its first record
// has waited kFlushAfter: events reach JS within a few ms, batches stay large.
constexpr size_t kFlushBytes = 256 * 1024;
constexpr auto kFlushAfter = std::chrono::milliseconds(5);
// Batches handed to JS and not yet returned. With the pending one, at most
// (kMaxInFlight + 1) x kMaxPendingBytes of records live in the addon; as
// soon as JS is behind, records stay in the kernel's buffer.
constexpr uint32_t kMaxInFlight = 4;
// The pending batch stops growing here: the producer stops reading.
constexpr size_t kMaxPendingBytes = kFlushBytes;
// JS handles batches for at most about this long before the event loop gets
// a turn (see CallJs).
constexpr auto kMaxTurn = std::chrono::milliseconds(100);
}  // namespace

void InFlight::Done() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (count) count--;
    returned++;
  }
  cv.notify_all();
}

void InFlight::Recycle(std::vector<uint8_t>&& bytes) {
  std::lock_guard<std::mutex> lock(mu);
  if (spare.size() > kMaxInFlight) return;  // freed with `bytes`
  bytes.clear();
  spare.push_back(std::move(bytes));
}

std::vector<uint8_t> InFlight::TakeSpare(size_t reserve) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!spare.empty()) {
      std::vector<uint8_t> v = std::move(spare.back());
      spare.pop_back();
      return v;
    }
  }
  std::vector<uint8_t> v;
  v.reserve(reserve);
  return v;
}

BatchSink::BatchSink(Napi::Env env, Napi::Function on_batch, const char* name, Channel channel) : channel_(channel) {
  // Queue size 0 (unbounded) at the TSFN: the bound is ours (kMaxInFlight).
  tsfn_ = Tsfn::New(env, on_batch, name, 0, 1, new JsSide(), [](Napi::Env, void*, JsSide* js) { delete js; });
  pending_.bytes = in_flight_->TakeSpare(kFlushBytes);
}

void BatchSink::Append(const void* record, size_t size) {
  if (pending_.count == 0) pending_since_ = std::chrono::steady_clock::now();
  const auto* bytes = static_cast<const uint8_t*>(record);
  pending_.bytes.insert(pending_.bytes.end(), bytes, bytes + size);
  pending_.count++;
  if (pending_.bytes.size() >= kFlushBytes) Flush();
}

bool BatchSink::Full() const {
  return pending_.bytes.size() >= kMaxPendingBytes;
}

bool BatchSink::Due() const {
  return pending_.count &&
         (pending_.bytes.size() >= kFlushBytes || std::chrono::steady_clock::now() - pending_since_ >= kFlushAfter);
}

uint32_t BatchSink::in_flight() const {
  std::lock_guard<std::mutex> lock(in_flight_->mu);
  return in_flight_->count;
}

uint64_t BatchSink::handed() const {
  std::lock_guard<std::mutex> lock(in_flight_->mu);
  return in_flight_->handed;
}

uint64_t BatchSink::returned() const {
  std::lock_guard<std::mutex> lock(in_flight_->mu);
  return in_flight_->returned;
}

bool BatchSink::Flush() {
  if (pending_.count == 0 || closed_) return true;
  {
    std::lock_guard<std::mutex> lock(in_flight_->mu);
    if (in_flight_->count >= kMaxInFlight) return false;
    in_flight_->count++;
    in_flight_->handed++;
  }
  auto* batch = new Batch(std::move(pending_));
  batch->in_flight = in_flight_;
  batch->channel = channel_;
  if (tsfn_.NonBlockingCall(batch) != napi_ok) {
    // The function is closing (environment teardown): nothing will consume it.
    lost_at_close_ += batch->count;
    delete batch;
    in_flight_->Done();
  } else {
    batches_++;
  }
  pending_ = Batch();
  pending_.bytes = in_flight_->TakeSpare(kFlushBytes);
  return true;
}

void BatchSink::WaitForRoom(std::chrono::milliseconds max) {
  std::unique_lock<std::mutex> lock(in_flight_->mu);
  in_flight_->cv.wait_for(lock, max, [this] { return in_flight_->count < kMaxInFlight; });
}

void BatchSink::Close() {
  if (closed_) return;
  if (!Flush()) lost_at_close_ += pending_.count;
  pending_ = Batch();
  closed_ = true;
  tsfn_.Release();
}

void BatchSink::CallJs(Napi::Env env, Napi::Function fn, JsSide* js, Batch* batch) {
  // No env: Node is tearing the environment down (the process or worker is
  // exiting) with batches still queued. They are freed uncounted: the
  // stats that would count them can no longer be read by anyone.
  if (env != nullptr && fn != nullptr && js != nullptr) {
    try {
      // A copy into memory V8 owns and accounts for (external memory handed
      // over with a finalizer is invisible to its GC, and piled up unbounded
      // under load), reused for every batch (see JsSide).
      const size_t size = batch->bytes.size();
      if (js->buffer.IsEmpty() || js->capacity < size) {
        js->capacity = std::max(size, kMaxPendingBytes + sizeof(svt_event_cap));
        js->buffer = Napi::Persistent(Napi::ArrayBuffer::New(env, js->capacity));
      }
      Napi::ArrayBuffer ab = js->buffer.Value();
      memcpy(ab.Data(), batch->bytes.data(), size);
      auto view = Napi::Uint8Array::New(env, size, ab, 0);
      fn.Call({view, Napi::Number::New(env, batch->count), Napi::Number::New(env, (double)batch->channel)});
    } catch (const Napi::Error& e) {
      // The TS wrapper never lets its handler throw; if it does anyway, say
      // so rather than unwinding into Node's thread-safe-function machinery.
      fprintf(stderr, "svctrace: batch handler threw: %s\n", e.Message().c_str());
    }
    // Node drains a thread-safe function's queue in one go (up to 1000
    // calls), and a reader that refills it as fast as JS empties it would
    // keep the event loop from serving anything else (/metrics, status, new
    // clients) for seconds under load. So after kMaxTurn of back-to-back
    // batches, the slot is given back on the loop's next turn instead of
    // now. Not on every batch: waiting for a turn each time cost a third of
    // the throughput in a storm.
    InFlight& f = *batch->in_flight;
    const auto now = std::chrono::steady_clock::now();
    if (!f.in_turn) {
      f.in_turn = true;
      f.turn_start = now;
    }
    if (now - f.turn_start >= kMaxTurn && ReleaseOnNextTurn(env, batch->in_flight)) {
      batch->in_flight->Recycle(std::move(batch->bytes));
      delete batch;
      return;
    }
  }
  batch->in_flight->Recycle(std::move(batch->bytes));
  batch->in_flight->Done();
  delete batch;
}

bool BatchSink::ReleaseOnNextTurn(Napi::Env env, const std::shared_ptr<InFlight>& in_flight) {
  try {
    auto release = Napi::Function::New(
        env,
        [in_flight](const Napi::CallbackInfo&) {
          in_flight->in_turn = false;  // the loop turned: the next batch starts a new turn
          in_flight->Done();
        },
        "svtReleaseBatch");
    env.Global().Get("setImmediate").As<Napi::Function>().Call({release});
    return true;
  } catch (const Napi::Error&) {
    return false;  // no event loop to defer to (teardown): released now
  }
}

}  // namespace svt
