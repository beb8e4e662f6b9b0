#include "drop_reasons.h"

#include <linux/types.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <string.h>

#include <string>

#include "errors.h"
#include "events.h"

namespace svt {

Napi::Value DropReasons(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  struct btf* btf = btf__load_vmlinux_btf();
  if (!btf) ThrowErrno(env, "btf__load_vmlinux_btf", errno);
  Napi::Object out = Napi::Object::New(env);
  __s32 id = btf__find_by_name_kind(btf, "skb_drop_reason", BTF_KIND_ENUM);
  if (id > 0) {
    const struct btf_type* t = btf__type_by_id(btf, id);
    const struct btf_enum* e = btf_enum(t);
    const char* prefix = "SKB_DROP_REASON_";
    size_t plen = strlen(prefix);
    for (__u16 i = 0; i < btf_vlen(t); i++, e++) {
      std::string name = btf__name_by_offset(btf, e->name_off);
      if (name.compare(0, plen, prefix) == 0) name = name.substr(plen);
      out.Set(std::to_string((__u32)e->val), name);
    }
  }
  // Before Linux 5.17 kfree_skb has no reason: every drop reads
  // SVT_DROP_REASON_UNKNOWN, named as what it is.
  if (id <= 0) out.Set(std::to_string(SVT_DROP_REASON_UNKNOWN), "UNKNOWN");
  btf__free(btf);
  return out;
}

}  // namespace svt
