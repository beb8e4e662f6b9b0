#include "layout.h"

#include <linux/types.h>
#include <stddef.h>

#include "batch_sink.h"
#include "events.h"

namespace svt {

namespace {

#define SVT_FIELD(obj, type, field)                                             \
  do {                                                                          \
    Napi::Array f = Napi::Array::New(env, 2);                                   \
    f.Set(0u, Napi::Number::New(env, offsetof(type, field)));                   \
    f.Set(1u, Napi::Number::New(env, sizeof(((type*)nullptr)->field)));        \
    obj.Set(#field, f);                                                         \
  } while (0)

Napi::Object StructLayout(Napi::Env env, size_t size, Napi::Object fields) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("size", Napi::Number::New(env, size));
  o.Set("fields", fields);
  return o;
}

}  // namespace

Napi::Value Layout(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);

  Napi::Object tuple = Napi::Object::New(env);
  SVT_FIELD(tuple, svt_tuple, saddr);
  SVT_FIELD(tuple, svt_tuple, daddr);
  SVT_FIELD(tuple, svt_tuple, sport);
  SVT_FIELD(tuple, svt_tuple, dport);
  SVT_FIELD(tuple, svt_tuple, proto);
  out.Set("svt_tuple", StructLayout(env, sizeof(svt_tuple), tuple));

  Napi::Object ev = Napi::Object::New(env);
  SVT_FIELD(ev, svt_event, kind);
  SVT_FIELD(ev, svt_event, size);
  SVT_FIELD(ev, svt_event, cpu);
  SVT_FIELD(ev, svt_event, ts_ns);
  SVT_FIELD(ev, svt_event, ct_id);
  SVT_FIELD(ev, svt_event, skb_id);
  SVT_FIELD(ev, svt_event, pkt);
  SVT_FIELD(ev, svt_event, ct_orig);
  SVT_FIELD(ev, svt_event, ct_reply);
  SVT_FIELD(ev, svt_event, ct_status);
  SVT_FIELD(ev, svt_event, ct_mark);
  SVT_FIELD(ev, svt_event, ct_timeout_ms);
  SVT_FIELD(ev, svt_event, netns_ino);
  SVT_FIELD(ev, svt_event, ifindex);
  SVT_FIELD(ev, svt_event, nf_priority);
  SVT_FIELD(ev, svt_event, reason);
  SVT_FIELD(ev, svt_event, pkt_len);
  SVT_FIELD(ev, svt_event, ct_zone);
  SVT_FIELD(ev, svt_event, nf_hook);
  SVT_FIELD(ev, svt_event, ctinfo);
  SVT_FIELD(ev, svt_event, tcp_flags);
  SVT_FIELD(ev, svt_event, ct_tcp_state);
  SVT_FIELD(ev, svt_event, nf_stage);
  SVT_FIELD(ev, svt_event, dir);
  SVT_FIELD(ev, svt_event, service_id);
  SVT_FIELD(ev, svt_event, gateway);
  SVT_FIELD(ev, svt_event, ifname);
  SVT_FIELD(ev, svt_event, link_kind);
  SVT_FIELD(ev, svt_event, icmp_type);
  SVT_FIELD(ev, svt_event, icmp_code);
  SVT_FIELD(ev, svt_event, cap_len);
  SVT_FIELD(ev, svt_event, ct_birth);
  SVT_FIELD(ev, svt_event, drop_location);
  out.Set("svt_event", StructLayout(env, sizeof(svt_event), ev));

  Napi::Object nt = Napi::Object::New(env);
  SVT_FIELD(nt, svt_nftrace, kind);
  SVT_FIELD(nt, svt_nftrace, size);
  SVT_FIELD(nt, svt_nftrace, trace_id);
  SVT_FIELD(nt, svt_nftrace, ts_ns);
  SVT_FIELD(nt, svt_nftrace, pkt);
  SVT_FIELD(nt, svt_nftrace, rule_handle);
  SVT_FIELD(nt, svt_nftrace, type);
  SVT_FIELD(nt, svt_nftrace, verdict);
  SVT_FIELD(nt, svt_nftrace, netns_ino);
  SVT_FIELD(nt, svt_nftrace, table);
  SVT_FIELD(nt, svt_nftrace, chain);
  SVT_FIELD(nt, svt_nftrace, target);
  out.Set("svt_nftrace", StructLayout(env, sizeof(svt_nftrace), nt));

  Napi::Object fc = Napi::Object::New(env);
  SVT_FIELD(fc, svt_flow_counters, packets);
  SVT_FIELD(fc, svt_flow_counters, bytes);
  SVT_FIELD(fc, svt_flow_counters, drops);
  SVT_FIELD(fc, svt_flow_counters, first_ns);
  SVT_FIELD(fc, svt_flow_counters, last_ns);
  SVT_FIELD(fc, svt_flow_counters, last_report_ns);
  SVT_FIELD(fc, svt_flow_counters, orig);
  SVT_FIELD(fc, svt_flow_counters, seen);
  SVT_FIELD(fc, svt_flow_counters, last_status);
  SVT_FIELD(fc, svt_flow_counters, service_id);
  SVT_FIELD(fc, svt_flow_counters, netns_ino);
  SVT_FIELD(fc, svt_flow_counters, last_drop_site);
  SVT_FIELD(fc, svt_flow_counters, tcp_flags);
  SVT_FIELD(fc, svt_flow_counters, last_tcp_state);
  SVT_FIELD(fc, svt_flow_counters, delivered);
  SVT_FIELD(fc, svt_flow_counters, reply);
  SVT_FIELD(fc, svt_flow_counters, counted_only);
  SVT_FIELD(fc, svt_flow_counters, end_sent);
  SVT_FIELD(fc, svt_flow_counters, syns_resent);
  out.Set("svt_flow_counters", StructLayout(env, sizeof(svt_flow_counters), fc));

  Napi::Object fs = Napi::Object::New(env);
  SVT_FIELD(fs, svt_flow_stats, kind);
  SVT_FIELD(fs, svt_flow_stats, size);
  SVT_FIELD(fs, svt_flow_stats, cpu);
  SVT_FIELD(fs, svt_flow_stats, ts_ns);
  SVT_FIELD(fs, svt_flow_stats, ct_id);
  SVT_FIELD(fs, svt_flow_stats, reason);
  SVT_FIELD(fs, svt_flow_stats, c);
  out.Set("svt_flow_stats", StructLayout(env, sizeof(svt_flow_stats), fs));

  Napi::Object kinds = Napi::Object::New(env);
  kinds.Set("NF", Napi::Number::New(env, SVT_EV_NF));
  kinds.Set("DEV_XMIT", Napi::Number::New(env, SVT_EV_DEV_XMIT));
  kinds.Set("DEV_RECV", Napi::Number::New(env, SVT_EV_DEV_RECV));
  kinds.Set("DROP", Napi::Number::New(env, SVT_EV_DROP));
  kinds.Set("FIB", Napi::Number::New(env, SVT_EV_FIB));
  kinds.Set("CT_DESTROY", Napi::Number::New(env, SVT_EV_CT_DESTROY));
  kinds.Set("NFTRACE", Napi::Number::New(env, SVT_EV_NFTRACE));
  kinds.Set("FLOW_STATS", Napi::Number::New(env, SVT_EV_FLOW_STATS));
  out.Set("kinds", kinds);

  Napi::Object consts = Napi::Object::New(env);
  consts.Set("NF_PRIO_DNAT", Napi::Number::New(env, SVT_NF_PRIO_DNAT));
  consts.Set("NF_PRIO_SNAT", Napi::Number::New(env, SVT_NF_PRIO_SNAT));
  consts.Set("MAX_SERVICES", Napi::Number::New(env, SVT_MAX_SERVICES));
  consts.Set("STAGE_BEFORE_NAT", Napi::Number::New(env, SVT_STAGE_BEFORE_NAT));
  consts.Set("STAGE_AFTER_NAT", Napi::Number::New(env, SVT_STAGE_AFTER_NAT));
  consts.Set("MAX_SNAPLEN", Napi::Number::New(env, SVT_MAX_SNAPLEN));
  consts.Set("EVENT_CAP_SIZE", Napi::Number::New(env, sizeof(svt_event_cap)));
  consts.Set("DIR_ORIGINAL", Napi::Number::New(env, SVT_DIR_ORIGINAL));
  consts.Set("DIR_REPLY", Napi::Number::New(env, SVT_DIR_REPLY));
  consts.Set("CHANNEL_RING", Napi::Number::New(env, (double)Channel::kRing));
  consts.Set("CHANNEL_NETLINK", Napi::Number::New(env, (double)Channel::kNetlink));
  consts.Set("RINGBUF_BYTES", Napi::Number::New(env, SVT_RINGBUF_BYTES));
  consts.Set("STATS_INTERVAL_MS", Napi::Number::New(env, SVT_STATS_INTERVAL_NS / 1000000));
  consts.Set("STATS_PERIODIC", Napi::Number::New(env, SVT_STATS_PERIODIC));
  consts.Set("STATS_CLOSED", Napi::Number::New(env, SVT_STATS_CLOSED));
  consts.Set("STATS_REUSED", Napi::Number::New(env, SVT_STATS_REUSED));
  consts.Set("STATS_EXPIRED", Napi::Number::New(env, SVT_STATS_EXPIRED));
  consts.Set("STATS_ENDED", Napi::Number::New(env, SVT_STATS_ENDED));
  out.Set("consts", consts);
  return out;
}

}  // namespace svt
