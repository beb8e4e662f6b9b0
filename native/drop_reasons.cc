#include "drop_reasons.h"

#include <linux/types.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <string.h>

#include "events.h"

namespace svt {

DropReasonInfo ReadDropReasons() {
  DropReasonInfo info;
  struct btf* btf = btf__load_vmlinux_btf();
  if (!btf) return info;
  // btf_trace_kfree_skb is a pointer to (void *ctx, skb, location[, reason]).
  __s32 proto = btf__find_by_name_kind(btf, "btf_trace_kfree_skb", BTF_KIND_TYPEDEF);
  if (proto > 0) {
    const struct btf_type* t = btf__type_by_id(btf, proto);
    while (t && (btf_is_typedef(t) || btf_is_ptr(t))) t = btf__type_by_id(btf, t->type);
    if (t && btf_is_func_proto(t)) info.has_reason = btf_vlen(t) >= 4;
  }
  __s32 id = btf__find_by_name_kind(btf, "skb_drop_reason", BTF_KIND_ENUM);
  if (id > 0) {
    const struct btf_type* t = btf__type_by_id(btf, id);
    const struct btf_enum* e = btf_enum(t);
    const char* prefix = "SKB_DROP_REASON_";
    size_t plen = strlen(prefix);
    for (__u16 i = 0; i < btf_vlen(t); i++, e++) {
      std::string name = btf__name_by_offset(btf, e->name_off);
      if (name.compare(0, plen, prefix) == 0) name = name.substr(plen);
      info.names.emplace_back((uint32_t)e->val, name);
    }
  } else {
    // Before Linux 5.17 kfree_skb has no reason: every drop reads
    // SVT_DROP_REASON_UNKNOWN, named as what it is.
    info.names.emplace_back(SVT_DROP_REASON_UNKNOWN, "UNKNOWN");
  }
  btf__free(btf);
  return info;
}

}  // namespace svt
