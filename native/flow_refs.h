// A flow's wire tuples in the registry (svt_flows): the four tuples its
// packets carry (original and reply, each way round), each naming the
// conntrack entry (`ct_id`) of the flow, for the device and drop hooks and
// for the conntrack listener's destroys. Shared by the listener (a destroy
// forgets them) and the tracer's idle sweep (a flow whose destroy never
// came).
#pragma once

#include <bpf/bpf.h>

#include "events.h"

namespace svt {

inline void ReverseInto(svt_tuple* out, const svt_tuple& in) {
  *out = svt_tuple{};
  out->saddr = in.daddr;
  out->daddr = in.saddr;
  out->sport = in.dport;
  out->dport = in.sport;
  out->proto = in.proto;
}

inline bool SameTuple(const svt_tuple& a, const svt_tuple& b) {
  return a.saddr == b.saddr && a.daddr == b.daddr && a.sport == b.sport && a.dport == b.dport && a.proto == b.proto;
}

// One off a count the BPF side adds to (memory-mapped .bss), never below zero.
inline void Decrement(volatile unsigned long long* count) {
  if (!count) return;
  unsigned long long cur = __atomic_load_n(count, __ATOMIC_RELAXED);
  while (cur > 0 && !__atomic_compare_exchange_n(count, &cur, cur - 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

// Forgets the wire tuples of the entry `ct_id`, whose kernel state was `c`
// (its original tuple, and its reply tuple once NAT was decided), where the
// registry still gives them to that entry: a new entry that took a tuple
// keeps it. True when its original tuple was there (the flow was counted in
// svt_active_flows). For the idle sweep, whose flows counted no packet for
// half an hour: a new entry registering one of these tuples between the
// lookup and the delete is not a case worth a lock.
inline bool ForgetOwnFlowRefs(int flows_fd, const svt_flow_counters& c, __u64 ct_id) {
  svt_tuple keys[4] = {c.orig, c.reply};
  ReverseInto(&keys[2], c.orig);
  ReverseInto(&keys[3], c.reply);
  bool registered = false;
  for (int i = 0; i < 4; i++) {
    if (!keys[i].proto) continue;  // reply tuple not known (NAT never decided)
    svt_flow_ref ref;
    if (bpf_map_lookup_elem(flows_fd, &keys[i], &ref) != 0 || ref.ct_id != ct_id) continue;
    if (bpf_map_delete_elem(flows_fd, &keys[i]) == 0 && i == 0) registered = true;
  }
  return registered;
}

}  // namespace svt
