/* SPDX-License-Identifier: GPL-2.0 */
/*
 * BPF-only helpers shared by svctrace's programs: the ring buffer, the
 * counters, and the readers that fill a struct svt_event from kernel objects.
 */
#ifndef SVCTRACE_BPF_H
#define SVCTRACE_BPF_H

#define NF_ACCEPT 1
#define SVT_NFCT_INFOMASK 7UL /* low bits of skb->_nfct hold enum ip_conntrack_info */
#define ETH_P_IP 0x0800

extern unsigned int CONFIG_HZ __kconfig;

/* Bytes of each packet to capture (0 = off), set by the loader before load. */
const volatile __u32 targ_snaplen = 0;

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
	struct svt_event *e;
	__u16 size;

	/* targ_snaplen is frozen at load: the verifier sees one constant size. */
	if (targ_snaplen) {
		e = bpf_ringbuf_reserve(&svt_events, sizeof(struct svt_event_cap), 0);
		size = sizeof(struct svt_event_cap);
	} else {
		e = bpf_ringbuf_reserve(&svt_events, sizeof(struct svt_event), 0);
		size = sizeof(struct svt_event);
	}
	if (!e) {
		svt_count(SVT_CNT_RINGBUF_LOST);
		return NULL;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->kind = kind;
	e->size = size;
	e->cpu = bpf_get_smp_processor_id();
	e->ts_ns = bpf_ktime_get_ns();
	return e;
}

/*
 * See SVT_WAKEUP_BYTES: the reader is woken once, by the record that takes
 * what waits past that mark. Not by every record past it: each forced wakeup
 * queues irq_work, a self-interrupt per record (measured: the pipeline
 * benchmark's producer fell from 12 M to 0.2 M records/s). The reader drains
 * until the ring is empty before it sleeps, so one wakeup per crossing is
 * enough; a crossing two CPUs race past is found by its next poll.
 */
static __always_inline __u64 svt_wakeup_flag(__u32 size)
{
	__u64 avail = bpf_ringbuf_query(&svt_events, BPF_RB_AVAIL_DATA);

	return avail >= SVT_WAKEUP_BYTES && avail - size - 8 < SVT_WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

static __always_inline void svt_submit(struct svt_event *e)
{
	__u64 flags = svt_wakeup_flag(e->size);

	svt_count(SVT_CNT_EVENTS);
	bpf_ringbuf_submit(e, flags);
}

static __always_inline struct nf_conn *ct_of_skb(struct sk_buff *skb)
{
	unsigned long nfct = BPF_CORE_READ(skb, _nfct);

	return (struct nf_conn *)(nfct & ~SVT_NFCT_INFOMASK);
}

static __always_inline void tuple_of_kernel(struct svt_tuple *t, const struct nf_conntrack_tuple *kt)
{
	t->saddr = kt->src.u3.ip;
	t->daddr = kt->dst.u3.ip;
	t->sport = kt->src.u.all;
	t->dport = kt->dst.u.all;
	t->proto = kt->dst.protonum;
}

/*
 * Both tuples of a conntrack entry, in one read of its tuplehash array
 * rather than five per tuple: every helper call costs tens of ns, and a
 * traced packet's full check and its record need both. (nf_conn is read with
 * helpers, not through a BTF cast: its type may live in the nf_conntrack
 * module's BTF, and vmlinux also has a nf_conn___init that makes a CO-RE
 * type id ambiguous.) The layout read (two list pointers, then the tuple) is
 * the same in every kernel the tracer supports.
 */
static __always_inline int read_ct_tuples(struct svt_tuple *orig, struct svt_tuple *reply, struct nf_conn *ct)
{
	struct nf_conntrack_tuple_hash th[IP_CT_DIR_MAX];

	if (bpf_core_read(th, sizeof(th), &ct->tuplehash))
		return -1;
	tuple_of_kernel(orig, &th[IP_CT_DIR_ORIGINAL].tuple);
	tuple_of_kernel(reply, &th[IP_CT_DIR_REPLY].tuple);
	return 0;
}

/*
 * The entry's fields of a record, given what the caller has read already
 * (its tuples, status and TCP state: observe_nf's full check reads them for
 * its own rules). Only what nothing else needs is read here.
 */
static __always_inline void fill_ct_read(struct svt_event *e, struct nf_conn *ct, __u8 ctinfo,
					 const struct svt_tuple *orig, const struct svt_tuple *reply, __u32 status,
					 __u8 tcp_state)
{
	__u32 timeout;

	e->ct_id = (__u64)ct;
	e->ctinfo = ctinfo;
	e->dir = ctinfo >= IP_CT_IS_REPLY ? SVT_DIR_REPLY : SVT_DIR_ORIGINAL;
	e->ct_status = status;
	e->ct_orig = *orig;
	e->ct_reply = *reply;
	if (bpf_core_field_exists(ct->mark))
		e->ct_mark = BPF_CORE_READ(ct, mark);
	if (bpf_core_field_exists(ct->zone))
		e->ct_zone = BPF_CORE_READ(ct, zone.id);
	if (orig->proto == IPPROTO_TCP)
		e->ct_tcp_state = tcp_state;
	/* ct->timeout is an absolute jiffies value once the entry is confirmed;
	 * before that it holds the relative timeout. */
	timeout = BPF_CORE_READ(ct, timeout);
	if (status & IPS_CONFIRMED)
		timeout -= (__u32)bpf_jiffies64();
	if ((__s32)timeout > 0 && CONFIG_HZ)
		e->ct_timeout_ms = (__u32)(((__u64)timeout * 1000) / CONFIG_HZ);
}

static __always_inline void fill_ct(struct svt_event *e, struct nf_conn *ct, __u8 ctinfo)
{
	struct svt_tuple orig = {}, reply = {};
	__u8 tcp_state = 0;

	read_ct_tuples(&orig, &reply, ct);
	if (orig.proto == IPPROTO_TCP)
		tcp_state = BPF_CORE_READ(ct, proto.tcp.state);
	fill_ct_read(e, ct, ctinfo, &orig, &reply, BPF_CORE_READ(ct, status), tcp_state);
}

/*
 * A field through a kernel pointer. Netfilter programs, fentry/fexit and
 * tp_btf get BTF pointers (their arguments, and what plain loads reach from
 * them): plain loads, the cheapest on the hot path (a faulting one reads 0,
 * as a failed helper read does). kprobes get plain addresses, which the
 * verifier lets us read only through bpf_probe_read_kernel. `probed` is a
 * constant in every caller of the always-inlined functions taking it, so
 * each program keeps one branch.
 */
#define SVT_LOAD(probed, p, field) ((probed) ? BPF_CORE_READ(p, field) : (p)->field)

/*
 * The device's fields of a record: every record with a device pays this,
 * so plain loads where the pointer allows them. The name is copied whole,
 * not as a string (one copy, not a byte loop): bytes past its NUL (left
 * there by a rename) are never read, user space takes the name up to its NUL.
 */
static __always_inline void fill_dev(struct svt_event *e, struct net_device *dev, const bool probed)
{
	const struct rtnl_link_ops *ops;
	const char *kind;
	struct net *net;

	if (!dev)
		return;
	e->ifindex = SVT_LOAD(probed, dev, ifindex);
	bpf_probe_read_kernel(e->ifname, sizeof(e->ifname), dev->name);
	if (!e->netns_ino) {
		net = SVT_LOAD(probed, dev, nd_net.net);
		e->netns_ino = SVT_LOAD(probed, net, ns.inum);
	}
	ops = SVT_LOAD(probed, dev, rtnl_link_ops);
	if (!ops)
		return;
	kind = SVT_LOAD(probed, ops, kind);
	if (kind)
		bpf_probe_read_kernel_str(e->link_kind, sizeof(e->link_kind), kind);
}

/* Reads the IPv4 5-tuple of the packet whose IP header is at nh. Returns
 * non-zero when it is not IPv4. ICMP type/code land in sport/dport's place
 * only in the event (fill_skb), never in map keys. */
static __always_inline int read_tuple_at(struct svt_tuple *t, unsigned char *nh)
{
	struct iphdr iph;
	__u16 ports[2];

	if (bpf_probe_read_kernel(&iph, sizeof(iph), nh) || iph.version != 4)
		return -1;
	t->saddr = iph.saddr;
	t->daddr = iph.daddr;
	t->proto = iph.protocol;
	if (iph.protocol != IPPROTO_TCP && iph.protocol != IPPROTO_UDP && iph.protocol != IPPROTO_SCTP)
		return 0;
	if (bpf_probe_read_kernel(ports, sizeof(ports), nh + iph.ihl * 4))
		return 0;
	t->sport = ports[0];
	t->dport = ports[1];
	return 0;
}

/* Copies up to targ_snaplen bytes of the packet from its IP header (the
 * linear part only: headers always are) into the record's tail. nh is the
 * skb's data (nh_at_data) or its network header. What is there to copy
 * comes from the skb's offsets and lengths, never from the pointers: a
 * pointer loaded from a BTF object is untrusted memory to newer verifiers
 * (6.18), any arithmetic on it stays one, and one is no length for the
 * helper ("R2 type=rdonly_untrusted_mem expected=scalar": record refused). */
static __always_inline void capture(struct svt_event *e, struct sk_buff *skb, unsigned char *nh, bool nh_at_data)
{
	struct svt_event_cap *c = (struct svt_event_cap *)e;
	/* 64-bit: with 32-bit lengths clang bounds a zero-extended copy and
	 * passes the unbounded register to the helper. */
	__u64 avail, len;
	__u32 tail, net;

	if (!targ_snaplen)
		return;
	if (nh_at_data) {
		avail = BPF_CORE_READ(skb, len) - BPF_CORE_READ(skb, data_len); /* the linear part */
	} else {
		tail = BPF_CORE_READ(skb, tail); /* offsets from head on 64-bit kernels */
		net = BPF_CORE_READ(skb, network_header);
		if (tail <= net)
			return;
		avail = tail - net;
	}
	len = targ_snaplen < SVT_MAX_SNAPLEN ? targ_snaplen : SVT_MAX_SNAPLEN;
	if (avail < len)
		len = avail;
	if (len == 0 || len > SVT_MAX_SNAPLEN)
		return;
	if (bpf_probe_read_kernel(c->data, len, nh) == 0)
		e->cap_len = len;
}

/* Fills the packet fields from the IP header at nh: the header in one read,
 * the start of the L4 header (ports; TCP's flags, ICMP's type and code) in
 * another. */
static __always_inline void fill_skb(struct svt_event *e, struct sk_buff *skb, unsigned char *nh, bool nh_at_data)
{
	struct iphdr iph;
	__u8 l4[14];

	e->skb_id = (__u64)skb;
	e->pkt_len = BPF_CORE_READ(skb, len);
	capture(e, skb, nh, nh_at_data);
	if (bpf_probe_read_kernel(&iph, sizeof(iph), nh) || iph.version != 4)
		return;
	e->pkt.saddr = iph.saddr;
	e->pkt.daddr = iph.daddr;
	e->pkt.proto = iph.protocol;
	nh += iph.ihl * 4;
	if (iph.protocol == IPPROTO_TCP) {
		if (!bpf_probe_read_kernel(l4, sizeof(l4), nh)) {
			__builtin_memcpy(&e->pkt.sport, &l4[0], 2);
			__builtin_memcpy(&e->pkt.dport, &l4[2], 2);
			e->tcp_flags = l4[13];
		}
	} else if (iph.protocol == IPPROTO_UDP || iph.protocol == IPPROTO_SCTP) {
		if (!bpf_probe_read_kernel(l4, 4, nh)) {
			__builtin_memcpy(&e->pkt.sport, &l4[0], 2);
			__builtin_memcpy(&e->pkt.dport, &l4[2], 2);
		}
	} else if (iph.protocol == IPPROTO_ICMP) {
		if (!bpf_probe_read_kernel(l4, 2, nh)) {
			e->icmp_type = l4[0];
			e->icmp_code = l4[1];
		}
	}
}

#endif /* SVCTRACE_BPF_H */
