// svctrace's native addon: registers the Tracer class, the kernel feature
// probes used by `svctrace doctor`, and the event layout used by the decoder.
#include <napi.h>

#include "drop_reasons.h"
#include "errors.h"
#include "layout.h"
#include "probe.h"
#include "tracer.h"

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  svt::InstallLibbpfLogger();
  exports.Set("Tracer", svt::Tracer::Init(env));
  exports.Set("probeFeatures", Napi::Function::New(env, svt::ProbeFeatures, "probeFeatures"));
  exports.Set("dropReasons", Napi::Function::New(env, svt::DropReasons, "dropReasons"));
  exports.Set("layout", Napi::Function::New(env, svt::Layout, "layout"));
  return exports;
}

}  // namespace

NODE_API_MODULE(svctrace, Init)
