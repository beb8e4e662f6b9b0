#pragma once

#include <napi.h>

namespace svt {

// dropReasons() -> { [value]: 'NO_SOCKET', ... } read from the running
// kernel's BTF (enum skb_drop_reason), so names match this kernel exactly.
Napi::Value DropReasons(const Napi::CallbackInfo& info);

}  // namespace svt
