/* SPDX-License-Identifier: GPL-2.0 */
/*
 * BPF-only helpers shared by svctrace's programs: the ring buffer, the
 * counters, and the readers that fill a struct svt_event from kernel objects.
 */
#ifndef SVCTRACE_BPF_H
#define SVCTRACE_BPF_H

#define NF_ACCEPT 1
#define SVT_NFCT_INFOMASK 7UL /* low bits of skb->_nfct hold enum ip_conntrack_info */

extern unsigned int CONFIG_HZ __kconfig;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SVT_RINGBUF_BYTES);
} svt_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SVT_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} svt_counters SEC(".maps");

static __always_inline void svt_count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&svt_counters, &idx);

	if (v)
		*v += 1;
}

/* Reserve a zeroed event; a full ring buffer is counted, never retried. */
static __always_inline struct svt_event *svt_reserve(__u16 kind)
{
	struct svt_event *e = bpf_ringbuf_reserve(&svt_events, sizeof(*e), 0);

	if (!e) {
		svt_count(SVT_CNT_RINGBUF_LOST);
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->size = sizeof(*e);
	e->cpu = bpf_get_smp_processor_id();
	e->ts_ns = bpf_ktime_get_ns();
	return e;
}

static __always_inline void svt_submit(struct svt_event *e)
{
	svt_count(SVT_CNT_EVENTS);
	bpf_ringbuf_submit(e, 0);
}

static __always_inline struct nf_conn *ct_of_skb(struct sk_buff *skb)
{
	unsigned long nfct = BPF_CORE_READ(skb, _nfct);

	return (struct nf_conn *)(nfct & ~SVT_NFCT_INFOMASK);
}

static __always_inline void read_tuple(struct svt_tuple *t, struct nf_conntrack_tuple *kt)
{
	t->saddr = BPF_CORE_READ(kt, src.u3.ip);
	t->daddr = BPF_CORE_READ(kt, dst.u3.ip);
	t->sport = BPF_CORE_READ(kt, src.u.all);
	t->dport = BPF_CORE_READ(kt, dst.u.all);
	t->proto = BPF_CORE_READ(kt, dst.protonum);
}

static __always_inline void fill_ct(struct svt_event *e, struct nf_conn *ct, __u8 ctinfo)
{
	__u32 timeout;

	e->ct_id = (__u64)ct;
	e->ctinfo = ctinfo;
	e->ct_status = BPF_CORE_READ(ct, status);
	read_tuple(&e->ct_orig, &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple);
	read_tuple(&e->ct_reply, &ct->tuplehash[IP_CT_DIR_REPLY].tuple);
	if (bpf_core_field_exists(ct->mark))
		e->ct_mark = BPF_CORE_READ(ct, mark);
	if (bpf_core_field_exists(ct->zone))
		e->ct_zone = BPF_CORE_READ(ct, zone.id);
	if (e->ct_orig.proto == IPPROTO_TCP)
		e->ct_tcp_state = BPF_CORE_READ(ct, proto.tcp.state);
	/* ct->timeout is an absolute jiffies value once the entry is confirmed;
	 * before that it holds the relative timeout. */
	timeout = BPF_CORE_READ(ct, timeout);
	if (e->ct_status & IPS_CONFIRMED)
		timeout -= (__u32)bpf_jiffies64();
	if ((__s32)timeout > 0 && CONFIG_HZ)
		e->ct_timeout_ms = (__u32)(((__u64)timeout * 1000) / CONFIG_HZ);
}

static __always_inline void fill_dev(struct svt_event *e, struct net_device *dev)
{
	if (!dev)
		return;
	e->ifindex = BPF_CORE_READ(dev, ifindex);
	bpf_probe_read_kernel_str(e->ifname, sizeof(e->ifname), dev->name);
}

/* Read the IPv4 header and L4 ports of skb at its network header. */
static __always_inline void fill_skb(struct svt_event *e, struct sk_buff *skb)
{
	unsigned char *head = BPF_CORE_READ(skb, head);
	__u16 nh = BPF_CORE_READ(skb, network_header);
	struct iphdr iph;
	__u8 l4[14];

	e->skb_id = (__u64)skb;
	e->pkt_len = BPF_CORE_READ(skb, len);
	if (bpf_probe_read_kernel(&iph, sizeof(iph), head + nh) || iph.version != 4)
		return;
	e->pkt.saddr = iph.saddr;
	e->pkt.daddr = iph.daddr;
	e->pkt.proto = iph.protocol;
	if (iph.protocol != IPPROTO_TCP && iph.protocol != IPPROTO_UDP)
		return;
	if (bpf_probe_read_kernel(l4, sizeof(l4), head + nh + iph.ihl * 4))
		return;
	__builtin_memcpy(&e->pkt.sport, &l4[0], 2);
	__builtin_memcpy(&e->pkt.dport, &l4[2], 2);
	if (iph.protocol == IPPROTO_TCP)
		e->tcp_flags = l4[13];
}

#endif /* SVCTRACE_BPF_H */
