#include "nftrace_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>  // before the linux/ headers: libc-compat then skips duplicates
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nf_tables.h>
#include <libmnl/libmnl.h>
#include <string.h>

#include "nlattr.h"

namespace svt {

namespace {

void CopyString(char* dst, size_t cap, const nlattr* a) {
  if (!a) return;
  size_t n = strnlen(static_cast<const char*>(mnl_attr_get_payload(a)), mnl_attr_get_payload_len(a));
  if (n >= cap) n = cap - 1;
  memcpy(dst, mnl_attr_get_payload(a), n);
  dst[n] = 0;
}

}  // namespace

NftTraceListener::NftTraceListener(Napi::Env env, const std::string& netns_path, unsigned long netns_ino)
    : NetlinkListener(env, netns_path, NFNLGRP_NFTRACE), netns_ino_(netns_ino) {}

void NftTraceListener::Handle(const nlmsghdr* nlh) {
  if (NFNL_SUBSYS_ID(nlh->nlmsg_type) != NFNL_SUBSYS_NFTABLES || NFNL_MSG_TYPE(nlh->nlmsg_type) != NFT_MSG_TRACE) return;
  Attrs<NFTA_TRACE_MAX> t;
  mnl_attr_parse(nlh, sizeof(nfgenmsg), CollectAttr<NFTA_TRACE_MAX>, &t);
  if (!t.a[NFTA_TRACE_ID]) return;
  svt_nftrace r = {};
  r.kind = SVT_EV_NFTRACE;
  r.verdict = NFT_CONTINUE;  // no verdict attribute: the rule decided nothing (0 would read as NF_DROP)
  r.size = sizeof(r);
  r.ts_ns = MonotonicNs();
  r.netns_ino = (__u32)netns_ino_;
  r.trace_id = ntohl(mnl_attr_get_u32(t.a[NFTA_TRACE_ID]));
  if (t.a[NFTA_TRACE_TYPE]) r.type = ntohl(mnl_attr_get_u32(t.a[NFTA_TRACE_TYPE]));
  if (t.a[NFTA_TRACE_RULE_HANDLE]) r.rule_handle = be64toh(mnl_attr_get_u64(t.a[NFTA_TRACE_RULE_HANDLE]));
  CopyString(r.table, sizeof(r.table), t.a[NFTA_TRACE_TABLE]);
  CopyString(r.chain, sizeof(r.chain), t.a[NFTA_TRACE_CHAIN]);
  if (t.a[NFTA_TRACE_VERDICT]) {
    Attrs<NFTA_VERDICT_MAX> v;
    mnl_attr_parse_nested(t.a[NFTA_TRACE_VERDICT], CollectAttr<NFTA_VERDICT_MAX>, &v);
    if (v.a[NFTA_VERDICT_CODE]) r.verdict = (__s32)ntohl(mnl_attr_get_u32(v.a[NFTA_VERDICT_CODE]));
    CopyString(r.target, sizeof(r.target), v.a[NFTA_VERDICT_CHAIN]);
  }
  // The first message of a trace carries the IPv4 and transport headers.
  if (t.a[NFTA_TRACE_NETWORK_HEADER] && mnl_attr_get_payload_len(t.a[NFTA_TRACE_NETWORK_HEADER]) >= 20) {
    const auto* ip = static_cast<const uint8_t*>(mnl_attr_get_payload(t.a[NFTA_TRACE_NETWORK_HEADER]));
    if ((ip[0] >> 4) == 4) {
      memcpy(&r.pkt.saddr, ip + 12, 4);
      memcpy(&r.pkt.daddr, ip + 16, 4);
      r.pkt.proto = ip[9];
      if (t.a[NFTA_TRACE_TRANSPORT_HEADER] && mnl_attr_get_payload_len(t.a[NFTA_TRACE_TRANSPORT_HEADER]) >= 4) {
        const auto* l4 = static_cast<const uint8_t*>(mnl_attr_get_payload(t.a[NFTA_TRACE_TRANSPORT_HEADER]));
        memcpy(&r.pkt.sport, l4, 2);
        memcpy(&r.pkt.dport, l4 + 2, 2);
      }
      RememberedTuple& slot = tuples_[r.trace_id & (kTupleSlots - 1)];
      slot = {r.trace_id, true, r.pkt};
    }
  } else {
    const RememberedTuple& slot = tuples_[r.trace_id & (kTupleSlots - 1)];
    if (slot.used && slot.trace_id == r.trace_id) r.pkt = slot.pkt;
  }
  Emit(&r, sizeof(r));
}

}  // namespace svt
