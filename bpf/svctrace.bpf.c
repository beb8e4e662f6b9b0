// SPDX-License-Identifier: GPL-2.0
/*
 * svctrace's kernel side: observe the packets of tracked Service flows at the
 * netfilter hooks around NAT and report what conntrack and NAT did to them.
 *
 * A flow is tracked when its conntrack entry's original destination is a
 * traced ClusterIP:port (or any-address:NodePort) in svt_services. Every
 * other packet costs one hash lookup and emits nothing.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "events.h"
#include "svctrace.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader when a NodePort (address 0) entry exists, so that plain
 * ClusterIP tracing never pays for the second lookup. Live-tunable on purpose:
 * services are added after load. */
volatile __u32 svt_have_nodeports = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVT_MAX_SERVICES);
	__type(key, struct svt_service_key);
	__type(value, __u32);
} svt_services SEC(".maps");

static __always_inline __u32 *service_of_ct(struct nf_conn *ct)
{
	struct svt_service_key key = {};
	__u32 *svc;

	key.addr = BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.u3.ip);
	key.port = BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.u.all);
	key.proto = BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.protonum);
	svc = bpf_map_lookup_elem(&svt_services, &key);
	if (svc || !svt_have_nodeports)
		return svc;
	key.addr = 0;
	return bpf_map_lookup_elem(&svt_services, &key);
}

/* Priority the stage programs are attached at, per hook (see events.h). */
static __always_inline __s32 nf_priority_of(__u8 hook, __u8 stage)
{
	__s32 nat = (hook == NF_INET_PRE_ROUTING || hook == NF_INET_LOCAL_OUT) ?
			    SVT_NF_PRIO_DNAT : SVT_NF_PRIO_SNAT;
	return stage == SVT_STAGE_BEFORE_NAT ? nat - 1 : nat + 1;
}

static __always_inline int observe_nf(struct bpf_nf_ctx *ctx, __u8 stage)
{
	const struct nf_hook_state *state = ctx->state;
	struct sk_buff *skb = ctx->skb;
	struct net_device *dev;
	struct svt_event *e;
	struct nf_conn *ct;
	__u32 *svc;
	__u8 hook;

	ct = ct_of_skb(skb);
	if (!ct)
		return NF_ACCEPT;
	svc = service_of_ct(ct);
	if (!svc)
		return NF_ACCEPT;

	e = svt_reserve(SVT_EV_NF);
	if (!e)
		return NF_ACCEPT;
	hook = BPF_CORE_READ(state, hook);
	e->nf_hook = hook;
	e->nf_stage = stage;
	e->nf_priority = nf_priority_of(hook, stage);
	e->service_id = *svc;
	e->netns_ino = BPF_CORE_READ(state, net, ns.inum);
	if (hook == NF_INET_PRE_ROUTING || hook == NF_INET_LOCAL_IN)
		dev = BPF_CORE_READ(state, in);
	else
		dev = BPF_CORE_READ(state, out);
	fill_dev(e, dev);
	fill_skb(e, skb);
	fill_ct(e, ct, BPF_CORE_READ(skb, _nfct) & SVT_NFCT_INFOMASK);
	svt_submit(e);
	return NF_ACCEPT;
}

SEC("netfilter")
int svt_nf_before_nat(struct bpf_nf_ctx *ctx)
{
	return observe_nf(ctx, SVT_STAGE_BEFORE_NAT);
}

SEC("netfilter")
int svt_nf_after_nat(struct bpf_nf_ctx *ctx)
{
	return observe_nf(ctx, SVT_STAGE_AFTER_NAT);
}
