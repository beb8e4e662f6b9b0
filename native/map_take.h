// Taking an element out of a BPF hash map: read it and delete it, once, so
// that of two takers (the conntrack listener ending a flow, the expiry sweep)
// only one gets it.
#pragma once

#include <bpf/bpf.h>
#include <errno.h>

namespace svt {

// The kernel-internal ENOTSUPP (include/linux/errno.h), which 5.10 returns
// to user space for an unsupported map command; no user-space header has it.
constexpr int kKernelEnotsupp = 524;

// Returns 0 and fills `value` when this call took the element. The kernel
// does it in one step for hash maps from Linux 5.14; before (5.10) that
// command is refused for them, and the element is read, then deleted: the
// delete that succeeds is the one taker (the value read just before is the
// element's last, as nothing updates a flow being taken).
inline int TakeMapElem(int fd, const void* key, void* value) {
  if (bpf_map_lookup_and_delete_elem(fd, key, value) == 0) return 0;
  if (errno != EINVAL && errno != kKernelEnotsupp && errno != EOPNOTSUPP) return -errno;
  if (bpf_map_lookup_elem(fd, key, value) != 0) return -errno;
  return bpf_map_delete_elem(fd, key) == 0 ? 0 : -errno;
}

}  // namespace svt
