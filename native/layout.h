#pragma once

#include <napi.h>

namespace svt {

// layout() -> the real sizes and offsets of the event ABI (bpf/events.h) and
// its enum values, as compiled into this addon. The TypeScript decoder's
// offsets are tested against it.
Napi::Value Layout(const Napi::CallbackInfo& info);

}  // namespace svt
