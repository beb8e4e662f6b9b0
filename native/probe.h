#pragma once

#include <napi.h>

namespace svt {

// probeFeatures() -> { ringbuf, netfilterLink, tpBtf, kprobe, fentry }, each
// { ok: boolean, code?, errno?, message? }.
Napi::Value ProbeFeatures(const Napi::CallbackInfo& info);

}  // namespace svt
