#pragma once

#include <stdint.h>

#include <string>
#include <utility>
#include <vector>

struct btf;

namespace svt {

// What the running kernel says about drops, read from its BTF once (a
// tracer reads it when it opens): whether kfree_skb carries a reason, and
// the reasons' names (enum skb_drop_reason), so names match this kernel.
struct DropReasonInfo {
  // Linux >= 5.17: the tracepoint is kfree_skb(skb, location, reason). A
  // tp_btf program may read only the arguments the tracepoint has, so the
  // drop program is chosen to match.
  bool has_reason = true;
  // value -> name without the SKB_DROP_REASON_ prefix; without reasons,
  // SVT_DROP_REASON_UNKNOWN -> "UNKNOWN".
  std::vector<std::pair<uint32_t, std::string>> names;
};

// From the vmlinux BTF; has_reason stays true (and names empty) when BTF
// cannot be read: loading the programs then says what is wrong with it.
DropReasonInfo ReadDropReasons();

}  // namespace svt
