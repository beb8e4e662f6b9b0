#include "ct_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>  // before the linux/ headers: libc-compat then skips duplicates
#include <linux/types.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <bpf/bpf.h>
#include <endian.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <string.h>

#include "ct_filter.h"
#include "errors.h"
#include "map_take.h"
#include "events.h"
#include "flow_refs.h"
#include "netns.h"

#include "nlattr.h"

namespace svt {

namespace {

// CTA_TUPLE_* -> svt_tuple (network byte order kept).
bool ParseTuple(const nlattr* nest, svt_tuple* t) {
  if (!nest) return false;
  auto tuple = Nested<CTA_TUPLE_MAX>(nest);
  auto ip = Nested<CTA_IP_MAX>(tuple.a[CTA_TUPLE_IP]);
  auto proto = Nested<CTA_PROTO_MAX>(tuple.a[CTA_TUPLE_PROTO]);
  if (!ip.a[CTA_IP_V4_SRC] || !ip.a[CTA_IP_V4_DST] || !proto.a[CTA_PROTO_NUM]) return false;
  t->saddr = mnl_attr_get_u32(ip.a[CTA_IP_V4_SRC]);
  t->daddr = mnl_attr_get_u32(ip.a[CTA_IP_V4_DST]);
  t->proto = mnl_attr_get_u8(proto.a[CTA_PROTO_NUM]);
  if (proto.a[CTA_PROTO_SRC_PORT]) t->sport = mnl_attr_get_u16(proto.a[CTA_PROTO_SRC_PORT]);
  if (proto.a[CTA_PROTO_DST_PORT]) t->dport = mnl_attr_get_u16(proto.a[CTA_PROTO_DST_PORT]);
  return true;
}

// CTA_COUNTERS_ORIG / CTA_COUNTERS_REPLY: conntrack's own accounting of the
// entry, present when nf_conntrack_acct was on at its creation.
bool ParseCounters(const nlattr* nest, __u64* packets, __u64* bytes) {
  if (!nest) return false;
  auto c = Nested<CTA_COUNTERS_MAX>(nest);
  if (!c.a[CTA_COUNTERS_PACKETS] || !c.a[CTA_COUNTERS_BYTES]) return false;
  *packets = be64toh(mnl_attr_get_u64(c.a[CTA_COUNTERS_PACKETS]));
  *bytes = be64toh(mnl_attr_get_u64(c.a[CTA_COUNTERS_BYTES]));
  return true;
}

}  // namespace

// Raises the flow's final counters to conntrack's, direction by direction,
// where conntrack counted more packets; true if it did. Each side
// counts real packets of the entry only, so each is a lower bound: conntrack
// leaves out segments its TCP tracker ignores (svctrace counts those), and
// our hooks miss the packets the kernel did not run them for. A kprobe's
// program is skipped, uncounted before Linux 6.7, while another kprobe or
// tracepoint program or a BPF syscall (this thread's own map reads) holds
// the CPU's bpf_prog_active: a timer's retransmission handled at the end of
// that interrupt crosses the node unseen, and its answer with it. A
// trampoline's (fentry) is skipped while the same program already runs on
// that CPU (a softirq that interrupted it). (A packet a rule drops between
// conntrack and NAT, in mangle, is one too: conntrack counted it, the
// counting hook never saw it.) The packets missed are counted.
bool CtListener::RaiseToConntrack(const nlattr* const* top, svt_flow_counters* c) {
  __u64 missed = 0;
  bool raised = false;
  const int attrs[2] = {CTA_COUNTERS_ORIG, CTA_COUNTERS_REPLY};
  for (int dir = 0; dir < 2; dir++) {
    __u64 packets = 0, bytes = 0;
    if (!ParseCounters(top[attrs[dir]], &packets, &bytes) || packets <= c->packets[dir]) continue;
    __u64 short_by = packets - c->packets[dir];
    // A kernel without "do not renew timeout on SYN retransmit" (2023)
    // still accounts the SYNs a client resent before any reply, which the
    // counting hook keeps apart (syns_resent): seen, not missed. They join
    // the packets with conntrack's count.
    if (dir == 0) short_by -= short_by < c->syns_resent ? short_by : c->syns_resent;
    missed += short_by;
    c->packets[dir] = packets;
    c->bytes[dir] = bytes;  // the same packets' bytes, from the same count
    raised = true;
  }
  if (missed) packets_missed_.fetch_add(missed, std::memory_order_relaxed);
  return raised;
}

CtListener::CtListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino,
                       std::shared_ptr<const ServiceSet> services, int flows_map_fd, int state_map_fd,
                       int stale_destroys_fd, volatile unsigned long long* active_flows,
                       volatile unsigned long long* stale_owed, int find_prog_fd, int forget_prog_fd)
    : NetlinkListener(env, netns_path, NFNLGRP_CONNTRACK_DESTROY),
      netns_ino_(netns_ino),
      services_(std::move(services)),
      flows_map_fd_(flows_map_fd),
      state_map_fd_(state_map_fd),
      stale_destroys_fd_(stale_destroys_fd),
      active_flows_(active_flows),
      stale_owed_(stale_owed),
      find_prog_fd_(find_prog_fd),
      forget_prog_fd_(forget_prog_fd) {}

// Runs one of the destroy programs on `c` (in and out). False when the
// kernel refused the run: the caller then does the work with map syscalls,
// as it does from then on (destroy_programs() says so).
bool CtListener::RunDestroyProgram(int prog_fd, svt_destroy_ctx* c) {
  LIBBPF_OPTS(bpf_test_run_opts, opts, .ctx_in = c, .ctx_size_in = sizeof(*c));
  if (bpf_prog_test_run_opts(prog_fd, &opts) == 0) return true;
  find_prog_fd_ = forget_prog_fd_ = -1;
  programs_refused_.store(true, std::memory_order_relaxed);
  return false;
}

// A destroy's lookups before the take: SVT_DESTROY_STALE when it is one
// owed (taken off the count; nothing else looked up), else SVT_DESTROY_REF
// when `orig` is in the wire-tuple registry (*ct_id its entry), with
// SVT_DESTROY_STATE when that entry's state is this tuple's (*first_ns its
// first packet). One program run where the kernel has them.
unsigned CtListener::FindFlow(const svt_tuple& orig, __u64* ct_id, __u64* first_ns) {
  if (find_prog_fd_ >= 0) {
    svt_destroy_ctx c = {};
    c.keys[0] = orig;
    if (RunDestroyProgram(find_prog_fd_, &c)) {
      *ct_id = c.ct_id;
      *first_ns = c.first_ns;
      return c.found;
    }
  }
  if (ConsumeStaleDestroy(orig)) return SVT_DESTROY_STALE;
  svt_flow_ref ref;
  if (bpf_map_lookup_elem(flows_map_fd_, &orig, &ref) != 0) return 0;
  *ct_id = ref.ct_id;
  svt_flow_counters seen;
  __u64 key = ref.ct_id;
  if (bpf_map_lookup_elem(state_map_fd_, &key, &seen) != 0 || !SameTuple(seen.orig, orig)) return SVT_DESTROY_REF;
  // Race 1: the state found is the new entry's (its stale destroy is owed
  // by now: owed before its state was written).
  if (ConsumeStaleDestroy(orig)) return SVT_DESTROY_STALE;
  *first_ns = seen.first_ns;
  return SVT_DESTROY_REF | SVT_DESTROY_STATE;
}

// A destroy's work after the take (enum svt_forget_result): forgets the
// flow's wire tuples (`keys`, keys[0] its original tuple), unless
// - not `taken`, the destroy is one owed (the same race as race 1, lost the
//   other way: while it was being read, a new entry with its tuple came, and
//   the kernel ended this one (REUSED) and took its state; the wire tuples
//   are the new entry's now);
// - `taken` (entry `ct_id`), race 3: a new entry with this tuple came after
//   the take, found no state to end (nothing owed) and registered its own
//   wire tuples, at another address, or at this one with a state again.
//   Those stay, and this flow's other tuples are left to the registry's LRU.
unsigned CtListener::ForgetFlow(const svt_tuple (&keys)[4], bool taken, __u64 ct_id) {
  if (forget_prog_fd_ >= 0) {
    svt_destroy_ctx c = {};
    for (int i = 0; i < 4; i++) c.keys[i] = keys[i];
    c.ct_id = ct_id;
    c.taken = taken;
    if (RunDestroyProgram(forget_prog_fd_, &c)) return c.result;
  }
  if (!taken && ConsumeStaleDestroy(keys[0])) return SVT_FORGET_STALE;
  if (taken) {
    svt_flow_ref ref;
    svt_flow_counters probe;
    if (bpf_map_lookup_elem(flows_map_fd_, &keys[0], &ref) == 0 &&
        (ref.ct_id != ct_id || bpf_map_lookup_elem(state_map_fd_, &ct_id, &probe) == 0))
      return SVT_FORGET_KEPT;
  }
  return DeleteFlowRefs(keys, 4) ? SVT_FORGET_DONE : SVT_FORGET_NONE;
}

bool CtListener::FilterServices(const std::vector<svt_service_key>& keys) {
  std::vector<sock_filter> prog = CtDestroyFilter(keys);
  const int fd = socket_fd();
  if (!prog.empty()) {
    sock_fprog fprog = {(unsigned short)prog.size(), prog.data()};
    // Replaces the filter before it at once: no message sees neither.
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof(fprog)) == 0) return true;
  }
  setsockopt(fd, SOL_SOCKET, SO_DETACH_FILTER, nullptr, 0);  // ENOENT when none: fine
  return false;
}

// True when a destroy of this original tuple is still owed to an entry the
// kernel saw replaced by a new one with the same tuple (svt_stale_destroys);
// takes one off the count.
bool CtListener::ConsumeStaleDestroy(const svt_tuple& orig) {
  // None owed (the kernel's count): no lookup. Almost always, on a node
  // whose clients do not reuse a port within conntrack's TIME_WAIT.
  if (stale_owed_ && __atomic_load_n(stale_owed_, __ATOMIC_RELAXED) == 0) return false;
  __u32 pending = 0;
  if (bpf_map_lookup_elem(stale_destroys_fd_, &orig, &pending) != 0 || pending == 0) return false;
  if (pending == 1) {
    bpf_map_delete_elem(stale_destroys_fd_, &orig);
  } else {
    pending--;
    bpf_map_update_elem(stale_destroys_fd_, &orig, &pending, BPF_EXIST);
  }
  Decrement(stale_owed_);
  return true;
}

// Deletes those of `keys` in the wire-tuple registry (a flow's four, of
// which two are the same when nothing was translated); true when keys[0]
// was there. One syscall for all of them where the kernel has batch
// deletes: a destroy took eight syscalls, on a thread that handles every
// connection's end. A batch stops at a missing key; the rest go on.
bool CtListener::DeleteFlowRefs(const svt_tuple* keys, unsigned n) {
  bool first = false;
  unsigned i = 0;
  while (batch_delete_ && i < n) {
    __u32 count = n - i;
    int err = bpf_map_delete_batch(flows_map_fd_, keys + i, &count, nullptr);
    if (i == 0 && count > 0) first = true;
    if (err == 0) return first;
    if (errno != ENOENT) {
      // Not a missing key: no batch deletes here (before 5.6), one by one.
      if (errno == EINVAL || errno == kKernelEnotsupp || errno == EOPNOTSUPP) batch_delete_ = false;
      break;
    }
    i += count + 1;  // keys[i + count] was not there
  }
  for (; i < n; i++)
    if (bpf_map_delete_elem(flows_map_fd_, &keys[i]) == 0 && i == 0) first = true;
  return first;
}

void CtListener::Handle(const nlmsghdr* nlh) {
  {
    if (NFNL_SUBSYS_ID(nlh->nlmsg_type) != NFNL_SUBSYS_CTNETLINK) return;
    if (NFNL_MSG_TYPE(nlh->nlmsg_type) != IPCTNL_MSG_CT_DELETE) return;
    Attrs<CTA_MAX> top;
    mnl_attr_parse(nlh, sizeof(nfgenmsg), CollectAttr<CTA_MAX>, &top);
    svt_event e = {};
    if (!ParseTuple(top.a[CTA_TUPLE_ORIG], &e.ct_orig)) return;
    if (!services_->Contains(e.ct_orig.daddr, e.ct_orig.dport, e.ct_orig.proto)) return;
    ParseTuple(top.a[CTA_TUPLE_REPLY], &e.ct_reply);
    e.kind = SVT_EV_CT_DESTROY;
    e.size = sizeof(svt_event);
    e.ts_ns = MonotonicNs();
    e.netns_ino = (__u32)netns_ino_;
    e.pkt = e.ct_orig;
    if (top.a[CTA_STATUS]) e.ct_status = ntohl(mnl_attr_get_u32(top.a[CTA_STATUS]));
    if (top.a[CTA_MARK]) e.ct_mark = ntohl(mnl_attr_get_u32(top.a[CTA_MARK]));
    if (top.a[CTA_ZONE]) e.ct_zone = ntohs(mnl_attr_get_u16(top.a[CTA_ZONE]));
    // The netlink id is not the kernel address the BPF side reports; user
    // space correlates the destroy by tuple and namespace instead.
    if (top.a[CTA_ID]) e.reason = ntohl(mnl_attr_get_u32(top.a[CTA_ID]));
    if (top.a[CTA_PROTOINFO]) {
      auto pi = Nested<CTA_PROTOINFO_MAX>(top.a[CTA_PROTOINFO]);
      auto tcp = Nested<CTA_PROTOINFO_TCP_MAX>(pi.a[CTA_PROTOINFO_TCP]);
      if (tcp.a[CTA_PROTOINFO_TCP_STATE]) e.ct_tcp_state = mnl_attr_get_u8(tcp.a[CTA_PROTOINFO_TCP_STATE]);
    }
    // The flow's final counters: its kernel address comes from the wire
    // tuple registry; the state's own tuple guards against a reused address.
    //
    // A new entry with this tuple (a client reusing its port) can come at
    // any moment while this runs: the BPF side then ends the old state
    // (REUSED), owes its destroy (svt_stale_destroys, before it writes the
    // new state) and registers the new entry's wire tuples. Each step
    // checks for that, so that this destroy never takes the new entry's
    // state or wire tuples (the three races: in FindFlow, below, and in
    // ForgetFlow). A destroy owed is an older entry's: a new entry took its
    // tuple, and the state and wire tuples found through it are that
    // entry's now. The old one's end was reported when it was replaced
    // (SVT_STATS_REUSED); it still leaves the active flows.
    bool told = false;
    bool taken = false;
    __u64 key = 0, seen_first_ns = 0;
    const unsigned found = FindFlow(e.ct_orig, &key, &seen_first_ns);
    if (found & SVT_DESTROY_STALE) {
      Decrement(active_flows_);
      return;
    }
    if (found & SVT_DESTROY_REF) e.ct_id = key;
    if (found & SVT_DESTROY_STATE) {
      svt_flow_stats r = {};
      if (TakeMapElem(state_map_fd_, &key, &r.c) == 0) {
        if (r.c.first_ns != seen_first_ns) {
          // Race 2: the new entry came at the same address between the
          // lookup and the take: its state goes back (unless its next
          // packet made another already: its first counters are then
          // lost, and counted), and this is the stale destroy.
          if (bpf_map_update_elem(state_map_fd_, &key, &r.c, BPF_NOEXIST) != 0)
            states_lost_in_race_.fetch_add(1, std::memory_order_relaxed);
          ConsumeStaleDestroy(e.ct_orig);
          Decrement(active_flows_);
          return;
        }
        taken = true;
        // A connection whose end the kernel already reported (ENDED), with
        // no packet since: its account is complete, so no counters again.
        // A counted-only one reports no transitions either, so its destroy
        // adds nothing at all. (Two records fewer per connection on a busy
        // node, where most are counted only.)
        const bool end_told = r.c.end_sent;
        const bool corrected = RaiseToConntrack(top.a, &r.c);
        told = r.c.counted_only && end_told && !corrected;
        if (!end_told || corrected) {
          // Corrected counters are news even after an end: not marked as
          // its repeat (user space ignores a repeat of a flow gone).
          r.c.end_sent = 0;
          r.kind = SVT_EV_FLOW_STATS;
          r.size = sizeof(r);
          r.ts_ns = e.ts_ns;
          r.ct_id = key;
          r.reason = SVT_STATS_CLOSED;
          Emit(&r, sizeof(r));
        }
      }
    }
    // The flow is gone: forget its wire tuples in the kernel, and count it
    // out of the active flows (never below zero) if it was registered.
    svt_tuple keys[4] = {e.ct_orig, e.ct_reply};
    ReverseInto(&keys[2], e.ct_orig);
    ReverseInto(&keys[3], e.ct_reply);
    const unsigned forgot = ForgetFlow(keys, taken, key);
    if (forgot != SVT_FORGET_STALE && !told) Emit(&e, sizeof(e));
    if (forgot != SVT_FORGET_NONE) Decrement(active_flows_);
  }
}

}  // namespace svt
