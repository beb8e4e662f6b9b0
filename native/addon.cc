// svctrace's native addon: registers the Tracer class, the kernel feature
// probes used by `svctrace doctor`, and the event layout used by the decoder.
#include <malloc.h>
#include <napi.h>

#include "errors.h"
#include "layout.h"
#include "probe.h"
#include "tracer.h"

namespace {

// Gives glibc's free memory back to the system (malloc_trim(0) also returns
// free pages inside the heap, not just at its top). Buffers of a few hundred
// KB come and go all the time here (batches, frames); between them, long-lived
// allocations pin the heap and its free middle stays resident. Called about
// once a second by the memory watch: a few ms of work that keeps RSS to what
// is in use.
//
// releaseFreeMemory(done?): with a callback, malloc_trim runs on libuv's
// thread pool and done(released) follows on the JS thread: under short
// connections it took 5-7 ms a call, a pause of the thread that models
// every event (measured with --cpu-prof). Without one it runs here and
// returns whether anything was released.
class TrimWorker : public Napi::AsyncWorker {
 public:
  explicit TrimWorker(const Napi::Function& done) : Napi::AsyncWorker(done, "svctrace.releaseFreeMemory") {}
  void Execute() override { released_ = malloc_trim(0) == 1; }
  void OnOK() override { Callback().Call({Napi::Boolean::New(Env(), released_)}); }

 private:
  bool released_ = false;
};

Napi::Value ReleaseFreeMemory(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() > 0 && !info[0].IsUndefined()) {
    if (!info[0].IsFunction()) throw Napi::TypeError::New(env, "releaseFreeMemory: the argument must be a function");
    (new TrimWorker(info[0].As<Napi::Function>()))->Queue();
    return env.Undefined();
  }
  return Napi::Boolean::New(env, malloc_trim(0) == 1);
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  // glibc gives threads their own malloc arenas (up to 8 per core), each
  // holding on to what it freed. Our reader and listener threads allocate
  // batches that the JS thread frees: two arenas are plenty, and RSS stays
  // with what is in use (see also ReleaseFreeMemory).
  mallopt(M_ARENA_MAX, 2);
  // Batches and their JS copies are 256 KiB. glibc maps blocks that large
  // on their own, but raises that threshold each time such a block is freed,
  // after which they come from the heap, which they fragment: 30 MB held in
  // a storm, against 5 MB with the threshold fixed here (measured with the
  // memory benchmark; `[heap]` in /proc/PID/smaps). Setting it also turns
  // the raising off. Blocks of 128 KiB and more are then mapped and given
  // back whole when freed.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  svt::InstallLibbpfLogger();
  exports.Set("Tracer", svt::Tracer::Init(env));
  exports.Set("probeFeatures", Napi::Function::New(env, svt::ProbeFeatures, "probeFeatures"));
  exports.Set("releaseFreeMemory", Napi::Function::New(env, ReleaseFreeMemory, "releaseFreeMemory"));
  exports.Set("layout", Napi::Function::New(env, svt::Layout, "layout"));
  return exports;
}

}  // namespace

NODE_API_MODULE(svctrace, Init)
