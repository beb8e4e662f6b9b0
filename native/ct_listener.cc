#include "ct_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>  // before the linux/ headers: libc-compat then skips duplicates
#include <linux/types.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <bpf/bpf.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <string.h>

#include "errors.h"
#include "map_take.h"
#include "events.h"
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

void ReverseInto(svt_tuple* out, const svt_tuple& in) {
  *out = svt_tuple{};
  out->saddr = in.daddr;
  out->daddr = in.saddr;
  out->sport = in.dport;
  out->dport = in.sport;
  out->proto = in.proto;
}

bool SameTuple(const svt_tuple& a, const svt_tuple& b) {
  return a.saddr == b.saddr && a.daddr == b.daddr && a.sport == b.sport && a.dport == b.dport && a.proto == b.proto;
}

}  // namespace

CtListener::CtListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino,
                       std::shared_ptr<const ServiceSet> services, int flows_map_fd, int state_map_fd,
                       int stale_destroys_fd, volatile unsigned long long* active_flows)
    : NetlinkListener(env, netns_path, NFNLGRP_CONNTRACK_DESTROY),
      netns_ino_(netns_ino),
      services_(std::move(services)),
      flows_map_fd_(flows_map_fd),
      state_map_fd_(state_map_fd),
      stale_destroys_fd_(stale_destroys_fd),
      active_flows_(active_flows) {}

// True when a destroy of this original tuple is still owed to an entry the
// kernel saw replaced by a new one with the same tuple (svt_stale_destroys);
// takes one off the count.
bool CtListener::ConsumeStaleDestroy(const svt_tuple& orig) {
  __u32 pending = 0;
  if (bpf_map_lookup_elem(stale_destroys_fd_, &orig, &pending) != 0 || pending == 0) return false;
  if (pending == 1) {
    bpf_map_delete_elem(stale_destroys_fd_, &orig);
  } else {
    pending--;
    bpf_map_update_elem(stale_destroys_fd_, &orig, &pending, BPF_EXIST);
  }
  return true;
}

// One registered flow fewer in the kernel's count (never below zero).
void CtListener::ForgetActiveFlow() {
  if (!active_flows_) return;
  unsigned long long cur = __atomic_load_n(active_flows_, __ATOMIC_RELAXED);
  while (cur > 0 && !__atomic_compare_exchange_n(active_flows_, &cur, cur - 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
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
    if (ConsumeStaleDestroy(e.ct_orig)) {
      // An older entry's destroy: a new entry took its tuple, and the
      // state and wire tuples found through it are that entry's now. The
      // old one's end was reported when it was replaced (SVT_STATS_REUSED);
      // it still leaves the active flows.
      ForgetActiveFlow();
      return;
    }
    // The flow's final counters: its kernel address comes from the wire
    // tuple registry; the state's own tuple guards against a reused address.
    svt_flow_ref ref;
    if (bpf_map_lookup_elem(flows_map_fd_, &e.ct_orig, &ref) == 0) {
      e.ct_id = ref.ct_id;
      svt_flow_stats r = {};
      __u64 key = ref.ct_id;
      if (bpf_map_lookup_elem(state_map_fd_, &key, &r.c) == 0 && SameTuple(r.c.orig, e.ct_orig) &&
          TakeMapElem(state_map_fd_, &key, &r.c) == 0) {
        r.kind = SVT_EV_FLOW_STATS;
        r.size = sizeof(r);
        r.ts_ns = e.ts_ns;
        r.ct_id = key;
        r.reason = SVT_STATS_CLOSED;
        Emit(&r, sizeof(r));
      }
    }
    Emit(&e, sizeof(e));
    // The flow is gone: forget its wire tuples in the kernel, and count it
    // out of the active flows (never below zero) if it was registered.
    svt_tuple t;
    if (bpf_map_delete_elem(flows_map_fd_, &e.ct_orig) == 0) ForgetActiveFlow();
    bpf_map_delete_elem(flows_map_fd_, &e.ct_reply);
    ReverseInto(&t, e.ct_orig);
    bpf_map_delete_elem(flows_map_fd_, &t);
    ReverseInto(&t, e.ct_reply);
    bpf_map_delete_elem(flows_map_fd_, &t);
  }
}

}  // namespace svt
