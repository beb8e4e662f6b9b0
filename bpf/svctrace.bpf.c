// SPDX-License-Identifier: GPL-2.0
/*
 * svctrace's kernel side: follow the packets of tracked Service flows through
 * the netfilter hooks around NAT, the routing decision, device crossings
 * (bridge, veth, tunnels, in any network namespace) and drops.
 *
 * A flow is tracked when its conntrack entry's original destination is a
 * traced ClusterIP:port (or any-address:NodePort) in svt_services. Once its
 * NAT is decided, its four wire tuples (before/after NAT, both directions)
 * go into svt_flows, so tracepoints that see the packet without conntrack
 * (inside a pod's namespace, on a tunnel) still recognise it. Packets of
 * other flows cost one hash lookup per hook and emit nothing.
 *
 * Flows, not packets: each tracked entry has a svt_flow_state record that
 * counts its packets and bytes in the kernel. The ring buffer carries the
 * transitions only — the first packet at each hook and device, conntrack
 * status and TCP state changes, SYN/RST, ICMP errors, drops (first of each
 * reason), route decisions — plus a svt_flow_stats record per active flow
 * every targ_stats_interval_ns. A keep-alive connection of a million
 * requests costs a bounded number of events.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "events.h"
#include "svctrace.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader when a NodePort (address 0) entry exists, so that plain
 * ClusterIP tracing never pays for the second lookup. In .bss, not rodata:
 * services can change after load. */
volatile __u32 svt_have_nodeports = 0;

/*
 * Tracked flows registered and not yet seen destroyed (user space
 * decrements it on conntrack DESTROY). Zero means no packet anywhere can be
 * of a tracked flow: the device tracepoints then return before touching the
 * packet, so tracing a quiet service costs the rest of the node nothing.
 * Flows the LRU map forgets without a destroy only make it too high (safe).
 */
volatile __u64 svt_active_flows = 0;

/* Destroys owed in svt_stale_destroys (user space takes one off as it
 * consumes one). Zero: the addon's destroy handler skips that map's lookup,
 * one syscall per destroy. Counts the LRU forgets make it too high (safe). */
volatile __u64 svt_stale_owed = 0;

/* TCP ends marked (end_sent): its atomic add is the full barrier between a
 * mark and the copy of the counters (see observe_nf). An add of 1: LLVM
 * turns an add of 0 into an atomic OR, which kernels before 5.12 reject. */
volatile __u64 svt_ends_marked = 0;

/* Emit every packet at every hook (--all-packets, for evidence) instead of
 * the transitions. Counting in svt_flow_state happens either way. */
const volatile __u32 targ_all_packets = 0;

/* Interval of the periodic svt_flow_stats records of an active flow. */
const volatile __u64 targ_stats_interval_ns = SVT_STATS_INTERVAL_NS;

/*
 * The detail budget: new tracked flows per second and per CPU whose
 * transitions are reported (0: every flow's). A flow started past it is
 * counted only: its packets, bytes, TCP flags, NAT result and drops are
 * kept and reported in its svt_flow_stats records, its hooks and device
 * crossings are not. Each transition record costs the packet's path (and
 * user space) far more than counting does: a busy Service's every new
 * connection in detail cost it a quarter of its short-connection rate.
 * Per CPU, so that deciding needs no atomic (5.10 has no fetch-and-add
 * with a result) and no shared cache line: the loader divides the
 * per-node rate by the CPUs.
 */
const volatile __u32 targ_detail_per_cpu = 0;

struct detail_window {
	__u64 start_ns; /* the current one-second window */
	__u32 admitted; /* flows given detail in it */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct detail_window);
} svt_detail_budget SEC(".maps");

/* Whether a flow starting now on this CPU gets its transitions reported. */
static __always_inline bool detail_admit(__u64 now)
{
	__u32 zero = 0;
	struct detail_window *w;

	if (!targ_detail_per_cpu || targ_all_packets)
		return true;
	w = bpf_map_lookup_elem(&svt_detail_budget, &zero);
	if (!w)
		return true;
	if (now - w->start_ns >= 1000000000ULL) {
		w->start_ns = now;
		w->admitted = 0;
	}
	if (w->admitted >= targ_detail_per_cpu)
		return false;
	w->admitted++;
	return true;
}

/* Per-flow counters and reporting state, keyed by the nf_conn address. Not
 * LRU: a full map is counted (SVT_CNT_STATE_FULL), never silently evicted;
 * entries go when conntrack destroys the flow (the addon removes them), when
 * a new entry reuses the address, or when the addon expires idle ones. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVT_MAX_FLOWS);
	__type(key, __u64);
	__type(value, struct svt_flow_counters);
} svt_flow_state SEC(".maps");

/*
 * Destroys still to come for entries a new entry with the same original
 * tuple replaced (a client reusing its port as soon as conntrack let the old
 * entry go), by that tuple. The addon's destroy handler finds a flow's state
 * through the wire-tuple registry, which names the new entry by then: one
 * count here says the next destroy of that tuple is the old entry's (whose
 * final counters went out as SVT_STATS_REUSED when it was replaced), so it
 * leaves the new entry's state and wire tuples alone. LRU: a count whose
 * destroy never comes (a netlink overrun) goes in time.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SVT_MAX_FLOWS);
	__type(key, struct svt_tuple);
	__type(value, __u32);
} svt_stale_destroys SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVT_MAX_SERVICES);
	__type(key, struct svt_service_key);
	__type(value, __u32);
} svt_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SVT_MAX_FLOWS * 4);
	__type(key, struct svt_tuple);
	__type(value, struct svt_flow_ref);
} svt_flows SEC(".maps");

/*
 * The routing decision has no skb in its tracepoint. The netfilter hook that
 * runs just before it on the same CPU (before DNAT on PRE_ROUTING/LOCAL_OUT;
 * the kernel re-routes right after NAT) leaves the flow here, and the fib
 * tracepoint reports a lookup whose destination is one of the flow's ends.
 */
struct fib_stash {
	__u64 ct_id;
	__u64 ts_ns;
	__u32 service_id;
	__u8 dir;
	__u8 _pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fib_stash);
} svt_fib_stash SEC(".maps");

/* A fib lookup further than this from the hook is not the packet's. A few
 * microseconds apart on real hardware; the margin is for slow machines (an
 * emulated CPU in the VM matrix translating a code path for the first time
 * takes milliseconds). Only a direction's first packet is stashed, one
 * lookup is taken per stash, and only one whose destination is the flow's
 * own end: a late one still names the route to that end. */
#define FIB_STASH_MAX_AGE_NS 50000000

static __always_inline __u32 *service_lookup(__u32 addr, __u16 port, __u8 proto)
{
	struct svt_service_key key = { .addr = addr, .port = port, .proto = proto };
	__u32 *svc = bpf_map_lookup_elem(&svt_services, &key);

	if (svc || !svt_have_nodeports)
		return svc;
	key.addr = 0;
	return bpf_map_lookup_elem(&svt_services, &key);
}

/*
 * The last conntrack entry each CPU looked up, with its answer: a packet
 * meets four of our netfilter programs, and a connection's packets mostly
 * stay on one CPU, so most lookups (untraced ones too) end here with no
 * hash lookup.
 *
 * `pkt` speaks for the last packet that had a full check on this CPU (see
 * remember_packet()). A packet's netfilter hooks in a namespace run one after the
 * other on one CPU, the first of them being the counting hook (PRE_ROUTING /
 * LOCAL_OUT before DNAT), which always does the full check; the hooks after
 * it recognise the same packet and, when the full check found nothing that
 * a later hook could report, return at once.
 */
struct ct_verdict {
	__u64 ct;         /* key of the verdict: ct_cache_key() */
	__u32 service_id; /* 0: not traced */
	__u32 _pad;
	__u64 pkt;        /* remember_packet() of the last packet fully checked here */
	__u64 skb_addr;   /* scratch: see pkt_hash() */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ct_verdict);
} svt_ct_cache SEC(".maps");

/* Bumped by user space whenever the service selection changes. */
volatile __u32 svt_services_gen = 0;

static __always_inline __u32 *service_of_ct_uncached(struct nf_conn *ct)
{
	return service_lookup(BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.u3.ip),
			      BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.u.all),
			      BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.protonum));
}

/* The cache key of a conntrack entry whose original tuple is `orig`. nf_conn
 * memory is reused (SLAB_TYPESAFE_BY_RCU): the client address and port tell
 * a new entry at an old address apart, and the selection's generation keeps
 * a cached "not traced" from outliving a change of it. */
static __always_inline __u64 ct_cache_key(struct nf_conn *ct, const struct svt_tuple *orig)
{
	return (__u64)ct ^ ((__u64)orig->saddr << 16) ^ ((__u64)orig->sport << 48) ^ ((__u64)svt_services_gen << 56);
}

/* The traced service id of a conntrack entry (0 when it is not traced),
 * through this CPU's cache slot `c` (may be NULL). */
static __always_inline __u32 service_id_of_ct(struct ct_verdict *c, __u64 key, const struct svt_tuple *orig)
{
	__u32 *svc;

	if (c && c->ct == key)
		return c->service_id;
	svc = service_lookup(orig->daddr, orig->dport, orig->proto);
	if (c) {
		c->ct = key;
		c->service_id = svc ? *svc : 0;
	}
	return svc ? *svc : 0;
}

static __always_inline bool tuple_eq(const struct svt_tuple *a, const struct svt_tuple *b)
{
	return a->saddr == b->saddr && a->daddr == b->daddr && a->sport == b->sport && a->dport == b->dport &&
	       a->proto == b->proto;
}

/* Writes a flow's counters into the ring buffer; false when it was full. */
static __always_inline bool emit_flow_stats(__u64 ct_id, struct svt_flow_counters *c, __u32 reason)
{
	struct svt_flow_stats *r = bpf_ringbuf_reserve(&svt_events, sizeof(*r), 0);

	if (!r) {
		svt_count(SVT_CNT_RINGBUF_LOST);
		return false;
	}
	r->kind = SVT_EV_FLOW_STATS;
	r->size = sizeof(*r);
	r->cpu = bpf_get_smp_processor_id();
	r->ts_ns = bpf_ktime_get_ns();
	r->ct_id = ct_id;
	r->reason = reason;
	r->_pad = 0;
	__builtin_memcpy(&r->c, c, sizeof(r->c));
	svt_count(SVT_CNT_EVENTS);
	bpf_ringbuf_submit(r, svt_wakeup_flag(sizeof(*r)));
	return true;
}

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

/* The last record of an entry a new one replaced. Its `delivered` tells
 * user space whether this is the first it hears of that flow (then it makes
 * the flow from it); lost with no record before it, the whole flow is. */
static __always_inline void end_replaced(__u64 ct_id, struct svt_flow_counters *st)
{
	/* Its end (SVT_STATS_ENDED) went out and no packet was counted since:
	 * that record is already its final account, and user space drops a
	 * repeat of a flow gone. On a busy node most short connections end so,
	 * their client port reused soon after: this was one record in four of
	 * theirs. (No packet of the old entry can be counting now: each holds
	 * a reference to it, and its address is taken only once it is freed.) */
	if (st->end_sent)
		return;
	if (!emit_flow_stats(ct_id, st, SVT_STATS_REUSED) && !st->delivered) {
		svt_count(SVT_CNT_FLOWS_UNSEEN);
		if ((st->tcp_flags[0] | st->tcp_flags[1]) & TCP_RST)
			svt_count(SVT_CNT_FLOWS_UNSEEN_RESET);
	}
}

static __always_inline void owe_stale_destroy(const struct svt_tuple *orig)
{
	__u32 one = 1, *pending = bpf_map_lookup_elem(&svt_stale_destroys, orig);

	__sync_fetch_and_add(&svt_stale_owed, 1);
	if (pending)
		__sync_fetch_and_add(pending, 1);
	else
		bpf_map_update_elem(&svt_stale_destroys, orig, &one, BPF_ANY);
}

/*
 * The kernel-side state of a tracked entry, created on its first packet. A
 * record left by an earlier entry at the same address is that flow's final
 * account: it is reported (SVT_STATS_REUSED) before being replaced. A dying
 * entry gets no new state (its packets were all counted already).
 */
static __always_inline struct svt_flow_counters *flow_state_of(struct nf_conn *ct, const struct svt_tuple *orig,
								__u32 status, __u32 svc, const struct nf_hook_state *state,
								__u64 now)
{
	__u64 key = (__u64)ct;
	struct svt_flow_counters *st = bpf_map_lookup_elem(&svt_flow_state, &key);
	struct svt_flow_counters init = {};
	__u32 netns_ino;

	/* The same entry, unless it is a new one with the same tuple at the
	 * same address (a client reusing its port, as soon as the old entry is
	 * gone): an unconfirmed entry where the state saw a confirmed one. */
	if (st && tuple_eq(&st->orig, orig) && ((status & IPS_CONFIRMED) || !(st->last_status & IPS_CONFIRMED)))
		return st;
	netns_ino = BPF_CORE_READ(state, net, ns.inum); /* read only when a state is made */
	if (st) {
		end_replaced(key, st);
		if (tuple_eq(&st->orig, orig))
			owe_stale_destroy(orig);
	}
	/* A new entry whose tuple the registry still gives to another entry
	 * in this namespace with a state: that entry is gone (conntrack never
	 * holds two entries with one original tuple), at another address. */
	if (!(status & IPS_CONFIRMED)) {
		struct svt_flow_ref *ref = bpf_map_lookup_elem(&svt_flows, orig);
		__u64 old = ref ? ref->ct_id : key;
		struct svt_flow_counters *prev = old != key ? bpf_map_lookup_elem(&svt_flow_state, &old) : NULL;

		if (prev && tuple_eq(&prev->orig, orig) && prev->netns_ino == netns_ino) {
			end_replaced(old, prev);
			bpf_map_delete_elem(&svt_flow_state, &old);
			owe_stale_destroy(orig);
		}
	}
	if (status & IPS_DYING)
		return NULL;
	init.orig = *orig;
	init.first_ns = now;
	init.last_ns = now;
	init.last_report_ns = now;
	init.service_id = svc;
	init.netns_ino = netns_ino;
	init.last_tcp_state = 0xff; /* nothing reported yet */
	init.counted_only = !detail_admit(now);
	if (bpf_map_update_elem(&svt_flow_state, &key, &init, BPF_ANY)) {
		svt_count(SVT_CNT_STATE_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(&svt_flow_state, &key);
}

/* Priority the stage programs are attached at, per hook (see events.h). */
/* How far from NAT's priority this instance's netfilter programs sit: 1
 * means -101/-99 around DNAT and 99/101 around SNAT. The kernel allows one
 * BPF program per hook and priority, so a second svctrace on the same
 * namespace (a CLI next to the node's agent) gets the next free distance;
 * the loader sets it before attaching, and events report where they ran. */
volatile __s32 svt_prio_gap = 1;

static __always_inline __s32 nf_priority_of(__u8 hook, __u8 stage)
{
	__s32 nat = (hook == NF_INET_PRE_ROUTING || hook == NF_INET_LOCAL_OUT) ?
			    SVT_NF_PRIO_DNAT : SVT_NF_PRIO_SNAT;
	return stage == SVT_STAGE_BEFORE_NAT ? nat - svt_prio_gap : nat + svt_prio_gap;
}

static __always_inline void flow_ref_put(struct svt_tuple *t, __u64 ct_id, __u32 svc, __u8 dir, __u8 counted_only)
{
	struct svt_flow_ref ref = { .ct_id = ct_id, .service_id = svc, .dir = dir, .counted_only = counted_only };

	bpf_map_update_elem(&svt_flows, t, &ref, BPF_ANY);
}

static __always_inline void reverse_tuple(struct svt_tuple *dst, const struct svt_tuple *src)
{
	dst->saddr = src->daddr;
	dst->daddr = src->saddr;
	dst->sport = src->dport;
	dst->dport = src->sport;
	dst->proto = src->proto;
}

/* The flow's four wire tuples: before/after NAT, in both directions. Done
 * whether or not the first packet's event fit in the ring: the flow's end
 * (and its final counters) are found through these. Only for a flow with a
 * state (see the caller). */
static __always_inline void register_flow(__u64 ct_id, __u32 svc, const struct svt_tuple *orig, const struct svt_tuple *reply,
					  __u8 counted_only)
{
	struct svt_tuple t = {};

	__sync_fetch_and_add(&svt_active_flows, 1);
	flow_ref_put((struct svt_tuple *)orig, ct_id, svc, SVT_DIR_ORIGINAL, counted_only);
	flow_ref_put((struct svt_tuple *)reply, ct_id, svc, SVT_DIR_REPLY, counted_only);
	reverse_tuple(&t, orig);
	flow_ref_put(&t, ct_id, svc, SVT_DIR_REPLY, counted_only);
	reverse_tuple(&t, reply);
	flow_ref_put(&t, ct_id, svc, SVT_DIR_ORIGINAL, counted_only);
}

static __always_inline void stash_for_fib(struct svt_event *e)
{
	__u32 zero = 0;
	struct fib_stash *st = bpf_map_lookup_elem(&svt_fib_stash, &zero);

	if (!st)
		return;
	st->ct_id = e->ct_id;
	st->ts_ns = e->ts_ns;
	st->service_id = e->service_id;
	st->dir = e->dir;
}


/* The L4 facts the transition rules need, from the IP header at nh. */
struct pkt_facts {
	__u8 proto;
	__u8 tcp_flags;
};

/* Plain loads through a BTF view of the header (bpf_core_cast: a faulting
 * address reads as 0, like a failed bpf_probe_read_kernel), instead of two
 * helper calls: this runs for every packet of every traced flow. The TCP
 * flags are the second byte of the header's fourth 32-bit word. */
static __always_inline void read_facts(struct pkt_facts *f, unsigned char *nh)
{
	struct iphdr *iph;
	union tcp_word_hdr *th;

	/* bpf_core_cast's kfunc (bpf_rdonly_cast) came in Linux 6.2; before
	 * it, the same bytes through the helper. A kernel without it resolves
	 * the weak kfunc to 0 and the verifier drops the branch. */
	if (!bpf_ksym_exists(bpf_rdonly_cast)) {
		struct iphdr ip;
		__u32 word;

		if (bpf_probe_read_kernel(&ip, sizeof(ip), nh) || ip.version != 4)
			return;
		f->proto = ip.protocol;
		if (f->proto != IPPROTO_TCP || bpf_probe_read_kernel(&word, sizeof(word), nh + ip.ihl * 4 + 12))
			return;
		f->tcp_flags = (bpf_ntohl(word) >> 16) & 0xff;
		return;
	}
	iph = bpf_core_cast(nh, struct iphdr);
	if (BPF_CORE_READ_BITFIELD(iph, version) != 4)
		return;
	f->proto = iph->protocol;
	if (f->proto != IPPROTO_TCP)
		return;
	th = bpf_core_cast(nh + BPF_CORE_READ_BITFIELD(iph, ihl) * 4, union tcp_word_hdr);
	f->tcp_flags = (bpf_ntohl(th->words[3]) >> 16) & 0xff;
}

/* Bit of svt_flow_counters.seen for one (hook, NAT stage, direction). */
static __always_inline __u32 seen_bit(__u8 hook, __u8 stage, __u8 dir)
{
	return 1U << ((hook & 7) * 4 + stage * 2 + dir);
}

/*
 * What the hooks after a packet's full check need to know about it, in one
 * 64-bit word, written and read with single stores and loads: a program on
 * this CPU can be interrupted or preempted by another one using the same
 * slot (LOCAL_OUT runs in process context), and a word is never half
 * written. High half: a hash of the packet (its sk_buff and nf_conn
 * addresses; the skb holds a reference on its nf_conn, so that is the same
 * entry) and of the service selection's generation. Low half: SVT_PKT_UNTRACED,
 * or, when the packet is of an established traced flow and quiet (state
 * record present, entry confirmed, not a TCP reset nor ICMP), the flow's
 * seen bits after the full check (bits 0-19); 0 otherwise.
 *
 * What a stale word can cost: a packet whose full check ran on another CPU
 * (process context migrated between LOCAL_OUT and POST_ROUTING) meeting the
 * word an earlier packet left here with the same sk_buff and nf_conn
 * addresses (or a 32-bit hash collision with it) skips its later hooks as
 * that packet did. Seen bits in a word are set in the map too, so no first
 * packet at a hook is lost that way (unless the record was meanwhile
 * expired and made anew, or the nf_conn address was meanwhile freed and
 * reused by a new entry); at worst a reset or ICMP packet is reported at
 * its counting hook and not again at the hooks after it.
 */
#define SVT_PKT_UNTRACED (1U << 31)

static __always_inline __u32 pkt_hash(struct ct_verdict *cv, struct sk_buff *skb, struct nf_conn *ct)
{
	__u64 x;

	/* The verifier allows no arithmetic on a trusted pointer; stored into
	 * a map value it reads back as a number (volatile: not optimised away).
	 * Should another program on this CPU overwrite it in between, the hash
	 * names the other program's packet with this one's entry: it matches
	 * no later hook of this packet (which then gets its full check), and
	 * the other packet only if it is of the same entry. */
	*(volatile __u64 *)&cv->skb_addr = (__u64)skb;
	x = *(volatile __u64 *)&cv->skb_addr;
	x = (x * 0x9E3779B97F4A7C15ULL) ^ ((__u64)ct * 0xC2B2AE3D27D4EB4FULL) ^ svt_services_gen;
	return (__u32)(x >> 32) ^ (__u32)x;
}

static __always_inline void remember_packet(struct ct_verdict *cv, __u32 h, __u32 low)
{
	if (cv)
		cv->pkt = ((__u64)h << 32) | low;
}

/* The kernel's sk_buff as IPVS extends it (CONFIG_IP_VS): a kernel built
 * without IPVS, such as this project's hosts, lacks the field, and its
 * vmlinux.h too. */
struct sk_buff___ipvs {
	__u8 ipvs_property : 1;
} __attribute__((preserve_access_index));

/*
 * A packet IPVS forwarded to a real server (kube-proxy IPVS mode, a client
 * outside the node): IPVS takes it at LOCAL_IN, rewrites it and sends it
 * through LOCAL_OUT again (ip_vs_nat_send_or_cont), marked ipvs_property.
 * It was counted at PRE_ROUTING; counting it at LOCAL_OUT would count it
 * twice.
 */
static __always_inline bool ipvs_reinjected(struct sk_buff *skb, __u8 hook)
{
	if (hook != NF_INET_LOCAL_OUT || !bpf_core_field_exists(struct sk_buff___ipvs, ipvs_property))
		return false;
	return BPF_CORE_READ_BITFIELD_PROBED((struct sk_buff___ipvs *)skb, ipvs_property);
}


/*
 * A SYN the client sent again while its entry waits for any answer (SYN_SENT,
 * confirmed by an earlier SYN, no reply seen). Conntrack neither refreshes
 * nor accounts it (nf_conntrack_tcp_packet returns before
 * nf_ct_refresh_acct: "do not renew timeout on SYN retransmit", a 2023
 * change backported to the stable kernels; 5.10, 6.1 and 6.12 of the VM
 * matrix all have it), so the flow's packet counters leave it out too and
 * stay conntrack's; it is counted in syns_resent instead: how long a client
 * waited on a backend that never answered.
 */
static __always_inline bool syn_resent(const struct pkt_facts *facts, __u32 status, __u8 tcp_state)
{
	return facts->proto == IPPROTO_TCP && (facts->tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST)) == TCP_SYN &&
	       tcp_state == TCP_CONNTRACK_SYN_SENT && (status & IPS_CONFIRMED) && !(status & IPS_SEEN_REPLY);
}

static __always_inline int observe_nf(struct sk_buff *skb, const struct nf_hook_state *state, __u8 stage,
				      const bool probed)
{
	struct svt_flow_counters *st;
	struct pkt_facts facts = {};
	struct svt_tuple orig = {}, reply = {};
	struct ct_verdict *cv;
	struct net_device *dev;
	struct svt_event *e;
	struct nf_conn *ct;
	struct net *net;
	unsigned long nfct;
	unsigned char *nh;
	__u32 svc, status, bit, h, zero = 0;
	__u8 hook, dir, ctinfo, tcp_state = 0;
	bool counting, emit, first, first_here = false, ended = false, after_end = false;
	__u64 now, pkt;

	nfct = SVT_LOAD(probed, skb, _nfct);
	ct = (struct nf_conn *)(nfct & ~SVT_NFCT_INFOMASK);
	if (!ct)
		return NF_ACCEPT;
	hook = SVT_LOAD(probed, state, hook);
	ctinfo = nfct & SVT_NFCT_INFOMASK;
	dir = ctinfo >= IP_CT_IS_REPLY ? SVT_DIR_REPLY : SVT_DIR_ORIGINAL;
	/* Every packet of the entry crosses exactly one of PRE_ROUTING /
	 * LOCAL_OUT in this namespace, after conntrack: count it there. ICMP
	 * errors about the flow (RELATED) are reported, not counted: conntrack
	 * accounting does not count them either. */
	counting = stage == SVT_STAGE_BEFORE_NAT && (hook == NF_INET_PRE_ROUTING || hook == NF_INET_LOCAL_OUT) &&
		   ctinfo != IP_CT_RELATED && ctinfo != IP_CT_RELATED_REPLY && !ipvs_reinjected(skb, hook);
	bit = seen_bit(hook, stage, dir);

	cv = bpf_map_lookup_elem(&svt_ct_cache, &zero);
	if (!cv)
		return NF_ACCEPT; /* cannot happen: a one-entry array */
	h = pkt_hash(cv, skb, ct);
	/*
	 * A hook after the full check of this same packet. Untraced: done.
	 * Established and quiet, this hook and direction already reported:
	 * nothing to count, nothing to report, so no read of the entry, no
	 * svt_flow_state lookup, no clock. Status and TCP state are not read
	 * again: the full check (microseconds ago, on this CPU) found them as
	 * last reported, and for a confirmed entry they change in conntrack's
	 * own hook (before the counting hook, which reports the change) or on
	 * another CPU for another packet, whose counting hook reports it. NAT
	 * sets its status bits on the first packet only, which never takes
	 * this path (the entry is confirmed after the last hook of its first
	 * packet). The seen bits copied here can only be behind the map's
	 * (they only grow): a missing one sends the packet to the full check.
	 */
	if (!counting) {
		pkt = cv->pkt;
		if ((__u32)(pkt >> 32) == h) {
			if (pkt & SVT_PKT_UNTRACED)
				return NF_ACCEPT;
			if ((pkt & bit) && !targ_all_packets)
				return NF_ACCEPT;
		}
	}

	/* The full check. */
	if (read_ct_tuples(&orig, &reply, ct))
		return NF_ACCEPT;
	svc = service_id_of_ct(cv, ct_cache_key(ct, &orig), &orig);
	if (!svc) {
		remember_packet(cv, h, SVT_PKT_UNTRACED);
		return NF_ACCEPT;
	}
	status = BPF_CORE_READ(ct, status);
	if (orig.proto == IPPROTO_TCP)
		tcp_state = BPF_CORE_READ(ct, proto.tcp.state);
	nh = SVT_LOAD(probed, skb, head) + SVT_LOAD(probed, skb, network_header);
	read_facts(&facts, nh);

	now = bpf_ktime_get_ns();
	st = flow_state_of(ct, &orig, status, svc, state, now);
	emit = targ_all_packets;
	if (st) {
		if (counting && syn_resent(&facts, status, tcp_state)) {
			/* Counted apart, as conntrack's accounting leaves it out.
			 * A plain add: a client resends a SYN a second or more
			 * after the last. */
			if (st->syns_resent != 0xffff)
				st->syns_resent++;
			st->last_ns = now;
			st->tcp_flags[dir & 1] |= facts.tcp_flags;
		} else if (counting) {
			/* Atomic: packets of one direction can cross this hook on
			 * two CPUs at once (a sender's data and its ACKs sent from
			 * softirq), and the counters must stay exact. */
			__sync_fetch_and_add(&st->packets[dir & 1], 1);
			__sync_fetch_and_add(&st->bytes[dir & 1], SVT_LOAD(probed, skb, len));
			st->last_ns = now;
			st->tcp_flags[dir & 1] |= facts.tcp_flags;
			/* After the counters: a packet counted while its end's
			 * record is being written clears the mark either way. */
			if (st->end_sent) {
				st->end_sent = 0;
				after_end = true;
			}
			svt_count(SVT_CNT_PACKETS);
		}
		/* Reporting state, not counters: a race between CPUs costs at
		 * most one duplicate event, so plain stores are enough. Each is
		 * written only when it changes: a store to the shared record on
		 * every packet would bounce its cache line between CPUs. */
		if (!(st->seen & bit)) {
			st->seen |= bit;
			emit = first_here = true;
		}
		if ((status & SVT_CT_STATUS_REPORTED) != st->last_status) {
			st->last_status = status & SVT_CT_STATUS_REPORTED;
			emit = true;
		}
		if (orig.proto == IPPROTO_TCP && tcp_state != st->last_tcp_state) {
			st->last_tcp_state = tcp_state;
			emit = true;
			/* The connection is over (its entry lives on: 120 s in
			 * TIME_WAIT): its counters now are its last, written at once. */
			ended = counting && (tcp_state == TCP_CONNTRACK_TIME_WAIT || tcp_state == TCP_CONNTRACK_CLOSE);
		}
		/* A packet after the end (a resent FIN or last ACK, the entry in
		 * TIME_WAIT): the end's counters again, at once. Left for the
		 * destroy, they came minutes later (TIME_WAIT is two), when
		 * user space had long let the flow go, and were not applied:
		 * the flow's final counters fell short of conntrack's. */
		if (after_end && (tcp_state == TCP_CONNTRACK_TIME_WAIT || tcp_state == TCP_CONNTRACK_CLOSE))
			ended = true;
	} else if (!(status & IPS_CONFIRMED)) {
		/* no state to remember it by (map full): report the first packet anyway */
		emit = first_here = true;
	}
	/* SYN retries (the client waiting on an answer) at the counting point;
	 * resets and ICMP errors about the flow everywhere. */
	if ((facts.tcp_flags & TCP_SYN) && counting)
		emit = true;
	if ((facts.tcp_flags & TCP_RST) || facts.proto == IPPROTO_ICMP)
		emit = true;
	if (st && st->counted_only && !targ_all_packets) {
		/* Over the detail budget: counted above, its NAT result kept
		 * below, nothing reported; once confirmed, the hooks after this
		 * one return at once for its packets (all bits "seen"). */
		emit = false;
		remember_packet(cv, h, (status & IPS_CONFIRMED) ? 0xfffff : 0);
	} else {
		remember_packet(cv, h,
				st && (status & IPS_CONFIRMED) && !(facts.tcp_flags & TCP_RST) && facts.proto != IPPROTO_ICMP ?
					st->seen & 0xfffff : 0);
	}

	/* First packet, NAT fully decided (SNAT hooks run last): remember the
	 * flow's wire tuples. Confirmation happens after these hooks. */
	first = stage == SVT_STAGE_AFTER_NAT && !(status & IPS_CONFIRMED) &&
		(hook == NF_INET_POST_ROUTING || hook == NF_INET_LOCAL_IN);

	if (first) {
		/* Only a flow with a state: the registry (4 tuples per flow, LRU)
		 * holds the flows the state map does. A flow without one (the
		 * state map full, counted) took registry room that LRU then took
		 * back from live flows, whose destroys no longer found their
		 * state: it stayed until the idle sweep, and kept the map full. */
		if (st)
			register_flow((__u64)ct, svc, &orig, &reply, st->counted_only);
		svt_count(SVT_CNT_FLOWS);
		if (st) {
			/* NAT is decided: the backend, and what it sees as the
			 * client, go with the counters (a flow known by them alone
			 * still shows where it went). */
			st->reply = reply;
			/* A counted-only flow's first record, so that user space
			 * knows it from its start, its backend with it. Not for
			 * TCP: its end (SVT_STATS_ENDED), or its first periodic
			 * record if it lasts (a SYN resent after 1 s included),
			 * tells the same a moment later; on a busy node most
			 * connections last milliseconds, and this was one record
			 * in three to user space for each. */
			if (st->counted_only) {
				svt_count(SVT_CNT_FLOWS_COUNTED_ONLY);
				if (orig.proto != IPPROTO_TCP && emit_flow_stats((__u64)ct, st, SVT_STATS_PERIODIC))
					st->delivered = 1;
			}
		}
	}
	if (emit) {
		e = svt_reserve(SVT_EV_NF);
		if (e) {
			e->nf_hook = hook;
			e->nf_stage = stage;
			e->nf_priority = nf_priority_of(hook, stage);
			e->service_id = svc;
			net = SVT_LOAD(probed, state, net);
			e->netns_ino = SVT_LOAD(probed, net, ns.inum);
			dev = hook == NF_INET_PRE_ROUTING || hook == NF_INET_LOCAL_IN ? SVT_LOAD(probed, state, in) :
										       SVT_LOAD(probed, state, out);
			fill_dev(e, dev, probed);
			fill_skb(e, skb, nh, false);
			fill_ct_read(e, ct, ctinfo, &orig, &reply, status, tcp_state);
			if (st)
				e->ct_birth = SVT_CT_BIRTH(st->first_ns);
			/* The routing decision of the direction's first packet: later
			 * packets reported for their TCP state or status take the
			 * same route (a failed lookup is a drop, reported as one). */
			if (stage == SVT_STAGE_BEFORE_NAT && (hook == NF_INET_PRE_ROUTING || hook == NF_INET_LOCAL_OUT) &&
			    (first_here || targ_all_packets))
				stash_for_fib(e);
			svt_submit(e);
			if (st && !st->delivered)
				st->delivered = 1;
		}
	}
	if (st && counting && (ended || now - st->last_report_ns >= targ_stats_interval_ns)) {
		/* A TCP connection's end is its final account, written now: its
		 * entry lives on in TIME_WAIT (two minutes on a node), and its
		 * destroy comes long after user space let its flow go. Marked
		 * before the copy, so a packet counted meanwhile unmarks it. */
		st->last_report_ns = now;
		if (ended) {
			st->end_sent = 1;
			/* A full barrier between the mark and the copy (an atomic
			 * add is one, on x86 a locked instruction): without it the
			 * CPU may read the counters before its mark is visible, and
			 * a packet counted meanwhile on another CPU, which then
			 * reads no mark, is in neither record. The other side's
			 * atomic adds order its count before its read of the mark. */
			__sync_fetch_and_add(&svt_ends_marked, 1);
		}
		if (emit_flow_stats((__u64)ct, st, ended ? SVT_STATS_ENDED : SVT_STATS_PERIODIC)) {
			if (!st->delivered)
				st->delivered = 1;
		} else if (ended) {
			st->end_sent = 0;
		}
	}
	return NF_ACCEPT;
}

/*
 * Backend "netfilter" (Linux >= 6.4): our own netfilter hooks, attached per
 * namespace just before and after NAT's priority (the loader picks free
 * priorities).
 */
SEC("netfilter")
int svt_nf_before_nat(struct bpf_nf_ctx *ctx)
{
	return observe_nf(ctx->skb, ctx->state, SVT_STAGE_BEFORE_NAT, false);
}

SEC("netfilter")
int svt_nf_after_nat(struct bpf_nf_ctx *ctx)
{
	return observe_nf(ctx->skb, ctx->state, SVT_STAGE_AFTER_NAT, false);
}

/*
 * Backend "fentry" (kernels without netfilter links, 5.5+ with module BTF):
 * entry and exit of NAT's own netfilter hook functions, which have the
 * netfilter hook signature (priv, skb, state). nf_nat_proto.c registers them
 * as nf_nat_ipv4_ops at NF_IP_PRI_NAT_DST (PRE_ROUTING, LOCAL_OUT) and
 * NF_IP_PRI_NAT_SRC (POST_ROUTING, LOCAL_IN), and they run the iptables nat
 * table or nftables nat chains (nf_nat_inet_fn) — so their entry is "before
 * NAT" and their exit "after NAT", at NAT's own priority, exactly where the
 * netfilter backend's programs sit. Present and ftrace-able (in kallsyms and
 * the nf_nat module's BTF) in Debian's 5.10, 6.1 and 6.12 kernels: see
 * scripts/vm/. Unlike netfilter links they fire in every namespace, so the
 * traced namespaces are checked first (svt_netns_inos).
 */
#define SVT_MAX_NETNS 16
volatile __u32 svt_netns_inos[SVT_MAX_NETNS] = {};

static __always_inline bool netns_traced(const struct nf_hook_state *state)
{
	__u32 ino = BPF_CORE_READ(state, net, ns.inum);

	for (int i = 0; i < SVT_MAX_NETNS; i++) {
		if (!svt_netns_inos[i])
			return false;
		if (svt_netns_inos[i] == ino)
			return true;
	}
	return false;
}

#define SVT_NAT_HOOK_PROGS(fn)                                                                                 \
	SEC("fentry/" #fn)                                                                                     \
	int BPF_PROG(svt_fentry_##fn, void *priv, struct sk_buff *skb, const struct nf_hook_state *state)      \
	{                                                                                                      \
		if (netns_traced(state))                                                                       \
			observe_nf(skb, state, SVT_STAGE_BEFORE_NAT, false);                                   \
		return 0;                                                                                      \
	}                                                                                                      \
	SEC("fexit/" #fn)                                                                                      \
	int BPF_PROG(svt_fexit_##fn, void *priv, struct sk_buff *skb, const struct nf_hook_state *state,       \
		     unsigned int verdict)                                                                     \
	{                                                                                                      \
		/* A packet NAT dropped is reported by the drop tracepoint. */                                \
		if (verdict == NF_ACCEPT && netns_traced(state))                                               \
			observe_nf(skb, state, SVT_STAGE_AFTER_NAT, false);                                    \
		return 0;                                                                                      \
	}

SVT_NAT_HOOK_PROGS(nf_nat_ipv4_pre_routing)
SVT_NAT_HOOK_PROGS(nf_nat_ipv4_local_fn)
SVT_NAT_HOOK_PROGS(nf_nat_ipv4_out)
SVT_NAT_HOOK_PROGS(nf_nat_ipv4_local_in)

/*
 * Backend "kprobe" (kernels with neither netfilter links nor module BTF for
 * trampolines, such as Debian's 5.10): a kprobe and a kretprobe on the same
 * four NAT hook functions. A kretprobe sees only the return value, so the
 * entry keeps (skb, state) on a small per-CPU stack that the exit pops:
 * these functions never sleep, and on one CPU they nest only when a softirq
 * interrupts a process-context hook (LOCAL_OUT, POST_ROUTING of a local
 * sender), which the stack's last-in first-out order matches.
 *
 * A kretprobe can miss a return (no free instance, or another BPF program
 * running on this CPU): its entry stays on the stack. Each entry therefore
 * records its hook, and an exit whose hook does not match the top frame (or
 * finds the stack empty) is counted in SVT_CNT_NAT_EXIT_UNMATCHED and resets
 * the stack: that packet's after-NAT view is lost, counted, never misread.
 */
#define SVT_KPROBE_DEPTH 4

struct svt_kprobe_frame {
	struct sk_buff *skb;
	const struct nf_hook_state *state;
	__u8 hook;
	__u8 traced;
	__u8 pad[6];
};

struct svt_kprobe_stack {
	__u32 depth;
	__u32 pad;
	struct svt_kprobe_frame frames[SVT_KPROBE_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct svt_kprobe_stack);
} svt_kprobe_stacks SEC(".maps");

static __always_inline void kprobe_nat_entry(struct sk_buff *skb, const struct nf_hook_state *state, __u8 hook)
{
	struct svt_kprobe_stack *stk;
	bool traced = netns_traced(state);
	__u32 zero = 0, d;

	stk = bpf_map_lookup_elem(&svt_kprobe_stacks, &zero);
	if (!stk)
		return;
	d = stk->depth;
	if (d >= SVT_KPROBE_DEPTH) {
		/* Deeper than these hooks ever nest: frames left by missed
		 * returns. Start again (their exits count as unmatched). */
		d = 0;
	}
	stk->frames[d].skb = skb;
	stk->frames[d].state = state;
	stk->frames[d].hook = hook;
	stk->frames[d].traced = traced;
	stk->depth = d + 1;
	if (traced)
		observe_nf(skb, state, SVT_STAGE_BEFORE_NAT, true);
}

static __always_inline void kprobe_nat_exit(unsigned int verdict, __u8 hook)
{
	struct svt_kprobe_stack *stk;
	struct svt_kprobe_frame f;
	__u32 zero = 0, d;

	stk = bpf_map_lookup_elem(&svt_kprobe_stacks, &zero);
	if (!stk)
		return;
	d = stk->depth;
	if (d == 0 || d > SVT_KPROBE_DEPTH || stk->frames[(d - 1) & (SVT_KPROBE_DEPTH - 1)].hook != hook) {
		stk->depth = 0;
		svt_count(SVT_CNT_NAT_EXIT_UNMATCHED);
		return;
	}
	f = stk->frames[(d - 1) & (SVT_KPROBE_DEPTH - 1)];
	stk->depth = d - 1;
	/* A packet NAT dropped is reported by the drop tracepoint. */
	if (f.traced && verdict == NF_ACCEPT)
		observe_nf(f.skb, f.state, SVT_STAGE_AFTER_NAT, true);
}

#define SVT_NAT_HOOK_KPROBES(fn, hooknum)                                                                      \
	SEC("kprobe/" #fn)                                                                                     \
	int BPF_KPROBE(svt_kprobe_##fn, void *priv, struct sk_buff *skb, const struct nf_hook_state *state)    \
	{                                                                                                      \
		kprobe_nat_entry(skb, state, hooknum);                                                         \
		return 0;                                                                                      \
	}                                                                                                      \
	SEC("kretprobe/" #fn)                                                                                  \
	int BPF_KRETPROBE(svt_kretprobe_##fn, unsigned int verdict)                                            \
	{                                                                                                      \
		kprobe_nat_exit(verdict, hooknum);                                                             \
		return 0;                                                                                      \
	}

/* The hook each function is registered at (nf_nat_ipv4_ops in nf_nat_proto.c). */
SVT_NAT_HOOK_KPROBES(nf_nat_ipv4_pre_routing, NF_INET_PRE_ROUTING)
SVT_NAT_HOOK_KPROBES(nf_nat_ipv4_local_fn, NF_INET_LOCAL_OUT)
SVT_NAT_HOOK_KPROBES(nf_nat_ipv4_out, NF_INET_POST_ROUTING)
SVT_NAT_HOOK_KPROBES(nf_nat_ipv4_local_in, NF_INET_LOCAL_IN)

/* Reads the IPv4 tuple at `nh` and finds its tracked flow, if any. */
static __always_inline struct svt_flow_ref *flow_of_packet(unsigned char *nh, struct svt_tuple *t)
{
	if (read_tuple_at(t, nh))
		return NULL;
	return bpf_map_lookup_elem(&svt_flows, t);
}

#define SVT_PACKET_OTHERHOST 3 /* skb->pkt_type: a frame addressed to another host's MAC */

/*
 * A copy of a frame the bridge flooded (it did not know, or no longer knew,
 * the destination MAC: its FDB entry ages out after 5 minutes of silence
 * from a pod that only receives) arriving in a pod it was not for. Its
 * destination MAC is another's; IP frees it there (OTHERHOST). The copy for
 * the frame's own destination goes on: this one is neither a crossing nor a
 * drop of the flow. Taken for one, a flooded SYN "entered" every pod on the
 * bridge (the last one read as the backend's namespace), a healthy
 * connection read as dropping packets, and on kernels without drop reasons,
 * where every drop reads UNKNOWN, the first copy's "drop" hid the flow's
 * real one (see observe_drop). A bridge port's own frames are for other
 * hosts by design (the bridge forwards them): those stay.
 */
static __always_inline bool is_flooded_copy(struct sk_buff *skb)
{
	struct net_device *dev;

	if (BPF_CORE_READ_BITFIELD_PROBED(skb, pkt_type) != SVT_PACKET_OTHERHOST)
		return false;
	dev = BPF_CORE_READ(skb, dev);
	return dev && !(BPF_CORE_READ_BITFIELD_PROBED(dev, priv_flags) & bpf_core_enum_value(enum netdev_priv_flags, IFF_BRIDGE_PORT));
}

/*
 * A device crossing worth an event: TCP's SYN and SYN-ACK (the first packet
 * each way crosses every device on the path), resets, and for other
 * protocols the first packet each way (at most one more per device on the
 * reply side, which crosses the pod's devices before it is counted).
 */
static __always_inline int observe_dev(struct sk_buff *skb, __u16 kind)
{
	struct svt_flow_counters *st;
	struct pkt_facts facts = {};
	struct svt_flow_ref *ref;
	struct svt_tuple t = {};
	struct svt_event *e;
	unsigned char *nh;
	__u64 key;

	if (!svt_active_flows || skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
	/* On receive the network header offset is reset only after this
	 * tracepoint; skb->data already points at the IP header. */
	nh = kind == SVT_EV_DEV_RECV ? skb->data : skb->head + skb->network_header;
	/* The packet's own facts first, in plain loads: a TCP segment without
	 * SYN or RST is never a transition here, whichever flow it is of, so
	 * an established connection's packets stop before the flow lookup. */
	read_facts(&facts, nh);
	if (!facts.proto)
		return 0;
	if (!targ_all_packets && facts.proto == IPPROTO_TCP && !(facts.tcp_flags & (TCP_SYN | TCP_RST)))
		return 0;
	ref = flow_of_packet(nh, &t);
	if (!ref || (ref->counted_only && !targ_all_packets))
		return 0;
	if (kind == SVT_EV_DEV_RECV && is_flooded_copy(skb))
		return 0;
	if (facts.proto == IPPROTO_TCP && (facts.tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN) {
		/* A connection's first SYN with the tuple of one that ended: a
		 * client reusing its port while the old entry waits in TIME_WAIT.
		 * Until conntrack replaces that entry, the wire tuples still
		 * name the old flow; the SYN is not its, and was told as its
		 * crossings (in a storm, one pair per reused port: a flow gone
		 * from user space, each counted as lost there). A new tuple's
		 * SYN is not seen before conntrack either. */
		key = ref->ct_id;
		st = bpf_map_lookup_elem(&svt_flow_state, &key);
		if (st && (st->last_tcp_state == TCP_CONNTRACK_TIME_WAIT || st->last_tcp_state == TCP_CONNTRACK_CLOSE))
			return 0;
	}
	if (!targ_all_packets && facts.proto != IPPROTO_TCP) {
		key = ref->ct_id;
		st = bpf_map_lookup_elem(&svt_flow_state, &key);
		if (!st || st->packets[ref->dir & 1] > 1)
			return 0;
	}
	e = svt_reserve(kind);
	if (!e)
		return 0;
	e->ct_id = ref->ct_id;
	e->service_id = ref->service_id;
	e->dir = ref->dir;
	fill_skb(e, skb, nh, kind == SVT_EV_DEV_RECV);
	fill_dev(e, skb->dev, false);
	svt_submit(e);
	return 0;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(svt_dev_xmit, struct sk_buff *skb)
{
	return observe_dev(skb, SVT_EV_DEV_XMIT);
}

SEC("tp_btf/netif_receive_skb")
int BPF_PROG(svt_dev_recv, struct sk_buff *skb)
{
	return observe_dev(skb, SVT_EV_DEV_RECV);
}

/* Drop reasons that name a packet's normal end (the same list as the
 * flow model's BENIGN_DROPS). CO-RE: a reason this kernel lacks matches no
 * packet. */
static __always_inline bool freed_by_closed_socket(struct sk_buff *skb)
{
	struct sock *sk = BPF_CORE_READ(skb, sk);

	return sk && BPF_CORE_READ(sk, __sk_common.skc_state) == 7 /* TCP_CLOSE */;
}

/* The drop reasons the benign rule names, as a local flavor of the
 * kernel's enum: CO-RE matches them by name without the ___svt suffix, so
 * the object builds from a vmlinux.h that lacks some (SOCKET_CLOSE came
 * after 6.12) and asks the running kernel which it has. */
enum skb_drop_reason___svt {
	SKB_DROP_REASON_NOT_SPECIFIED___svt,
	SKB_DROP_REASON_QUEUE_PURGE___svt,
	SKB_DROP_REASON_SOCKET_CLOSE___svt,
	SKB_DROP_REASON_TCP_CLOSE___svt,
};

#define SVT_HAS_REASON(r) bpf_core_enum_value_exists(enum skb_drop_reason___svt, SKB_DROP_REASON_##r##___svt)
#define SVT_REASON(r) bpf_core_enum_value(enum skb_drop_reason___svt, SKB_DROP_REASON_##r##___svt)

static __always_inline bool is_benign_free(struct sk_buff *skb, enum skb_drop_reason reason, const bool has_reason)
{
	/* Before those reasons existed (6.1: they came with 6.4-6.8; 5.10 has
	 * no reasons at all), a TCP socket destroyed at its end (tcp_fin ->
	 * inet_csk_destroy_sock -> sk_stream_kill_queues) freed what it still
	 * queued as NOT_SPECIFIED: such an skb belongs to a socket already in
	 * TCP_CLOSE. Without reasons, no enum value may be read (the enum does
	 * not exist there: CO-RE would poison the load). */
	if (!has_reason)
		return freed_by_closed_socket(skb);
	if (!SVT_HAS_REASON(SOCKET_CLOSE) && reason == SVT_REASON(NOT_SPECIFIED) && freed_by_closed_socket(skb))
		return true;
	return (SVT_HAS_REASON(QUEUE_PURGE) && reason == SVT_REASON(QUEUE_PURGE)) ||
	       (SVT_HAS_REASON(SOCKET_CLOSE) && reason == SVT_REASON(SOCKET_CLOSE)) ||
	       (SVT_HAS_REASON(TCP_CLOSE) && reason == SVT_REASON(TCP_CLOSE));
}

/* The namespace's conntrack entry of the packet (ours or a pod's own) is a
 * TCP connection in TIME_WAIT. */
static __always_inline bool in_time_wait(struct nf_conn *ct)
{
	return ct && BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.protonum) == IPPROTO_TCP &&
	       BPF_CORE_READ(ct, proto.tcp.state) == TCP_CONNTRACK_TIME_WAIT;
}

static __always_inline int observe_drop(struct sk_buff *skb, void *location, __u32 reason, const bool has_reason)
{
	struct svt_flow_counters *st;
	struct svt_flow_ref *ref = NULL;
	struct svt_tuple t = {};
	struct nf_conn *ct;
	struct svt_event *e;
	unsigned char *nh;
	__u32 *svc = NULL;
	__u64 flow_key;
	__u32 svc_id;

	if (BPF_CORE_READ(skb, protocol) != bpf_htons(ETH_P_IP))
		return 0;
	/* The normal end of a packet, not a drop (a closing socket freeing
	 * what it queued): neither counted nor reported, but with every packet.
	 * It was one more ring record per connection, and a "1 dropped" in
	 * every healthy flow's counters. */
	if (!targ_all_packets && is_benign_free(skb, reason, has_reason))
		return 0;
	nh = BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, network_header);
	ct = ct_of_skb(skb);
	if (ct)
		svc = service_of_ct_uncached(ct);
	if (!svc) {
		/* No entry of ours: inside a pod's namespace (its own conntrack
		 * entry, if any, is not the tracked one), on a tunnel, or a first
		 * packet dropped before conntrack kept it (table full). */
		ct = NULL;
		ref = flow_of_packet(nh, &t);
		if (!ref && t.proto)
			svc = service_lookup(t.daddr, t.dport, t.proto);
	}
	if (!svc && !ref)
		return 0;
	if (is_flooded_copy(skb))
		return 0;
	/* A segment that reached its connection in TIME_WAIT (the peer's FIN
	 * again, our last ACK having been late): TCP answers it and frees it as
	 * NOT_SPECIFIED (tcp_v4_rcv: do_time_wait -> discard_it). The end of a
	 * healthy connection, not a drop. */
	if (!targ_all_packets && (!has_reason || reason == SVT_REASON(NOT_SPECIFIED)) &&
	    in_time_wait(ct_of_skb(skb)))
		return 0;
	svc_id = svc ? *svc : ref->service_id;

	/* Count every drop in the flow's state; report the first of each
	 * reason (a retransmitted SYN dropped again is the same story). Where
	 * the kernel names no reason, every drop reads UNKNOWN: the place that
	 * freed the packet tells the stories apart instead (by reason, a flow's
	 * first drop hid every later one there, the pod firewall's too). */
	__u32 site = has_reason ? reason : (__u32)(unsigned long)location;

	flow_key = ct ? (__u64)ct : ref ? ref->ct_id : 0;
	st = flow_key ? bpf_map_lookup_elem(&svt_flow_state, &flow_key) : NULL;
	if (st) {
		bool again = st->drops && st->last_drop_site == site;

		__sync_fetch_and_add(&st->drops, 1);
		st->last_drop_site = site;
		if (again && !targ_all_packets)
			return 0;
	}

	/* A counted-only TCP flow has no record before its end (see
	 * observe_nf): its counters go first, so that user space knows the flow
	 * by its entry's tuples before this drop, found through the registry
	 * inside the pod, tells it only the packet's. */
	if (st && st->counted_only && !st->delivered && emit_flow_stats(flow_key, st, SVT_STATS_PERIODIC))
		st->delivered = 1;

	e = svt_reserve(SVT_EV_DROP);
	if (!e)
		return 0;
	e->reason = reason;
	e->drop_location = (__u64)(unsigned long)location;
	e->service_id = svc_id;
	fill_skb(e, skb, nh, false);
	fill_dev(e, skb->dev, false);
	if (ct) {
		fill_ct(e, ct, BPF_CORE_READ(skb, _nfct) & SVT_NFCT_INFOMASK);
	} else if (ref) {
		e->ct_id = ref->ct_id;
		e->dir = ref->dir;
	}
	/* The state at the address may still be an older entry's (a packet
	 * dropped before its new entry reached our hooks): its birth goes only
	 * with the entry whose tuple the event carries. A drop found through
	 * the registry carries no entry tuple, so no birth either. */
	if (st && ct && tuple_eq(&st->orig, &e->ct_orig))
		e->ct_birth = SVT_CT_BIRTH(st->first_ns);
	svt_submit(e);
	if (st && !st->delivered)
		st->delivered = 1;
	return 0;
}

/* Linux >= 5.17: kfree_skb(skb, location, reason). */
SEC("tp_btf/kfree_skb")
int BPF_PROG(svt_drop, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	return observe_drop(skb, location, reason, true);
}

/* Before 5.17 the tracepoint has no reason: kfree_skb(skb, location). Every
 * such drop reads SVT_DROP_REASON_UNKNOWN. The loader keeps the one program
 * whose arguments match this kernel's tracepoint. */
SEC("tp_btf/kfree_skb")
int BPF_PROG(svt_drop_noreason, struct sk_buff *skb, void *location)
{
	return observe_drop(skb, location, SVT_DROP_REASON_UNKNOWN, false);
}

SEC("tp_btf/fib_table_lookup")
int BPF_PROG(svt_fib, u32 tb_id, const struct flowi4 *flp, const struct fib_nh_common *nhc, int err)
{
	__u32 zero = 0;
	struct fib_stash *st;
	struct svt_event *e;
	struct nf_conn *ct;
	__u32 daddr, want;
	__u64 now;

	if (err || !nhc)
		return 0;
	st = bpf_map_lookup_elem(&svt_fib_stash, &zero);
	if (!st || !st->ct_id)
		return 0;
	now = bpf_ktime_get_ns();
	if (now - st->ts_ns > FIB_STASH_MAX_AGE_NS)
		return 0;
	/* Original direction: the lookup for the backend, once DNAT is done
	 * (read now: at the stashing hook DNAT had not happened yet). Reply: the
	 * lookup for the client. Other lookups in between (address-type checks
	 * of the rules, the re-route's source check) are not this decision. */
	ct = (struct nf_conn *)st->ct_id;
	daddr = BPF_CORE_READ(flp, daddr);
	if (st->dir == SVT_DIR_ORIGINAL) {
		want = BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_REPLY].tuple.src.u3.ip);
		if (want == BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.dst.u3.ip))
			return 0; /* not DNATed (yet) */
	} else {
		want = BPF_CORE_READ(ct, tuplehash[IP_CT_DIR_ORIGINAL].tuple.src.u3.ip);
	}
	if (daddr != want)
		return 0;

	e = svt_reserve(SVT_EV_FIB);
	if (!e)
		return 0;
	e->ct_id = st->ct_id;
	e->service_id = st->service_id;
	e->dir = st->dir;
	e->pkt.saddr = BPF_CORE_READ(flp, saddr);
	e->pkt.daddr = daddr;
	e->pkt.proto = BPF_CORE_READ(flp, __fl_common.flowic_proto);
	e->reason = tb_id; /* routing table id */
	if (BPF_CORE_READ(nhc, nhc_gw_family) == 2 /* AF_INET */)
		e->gateway = BPF_CORE_READ(nhc, nhc_gw.ipv4);
	fill_dev(e, nhc->nhc_dev, false);
	/* One report per packet: the next lookup needs a new hook visit. */
	st->ct_id = 0;
	svt_submit(e);
	return 0;
}

/*
 * Benchmark event source (bench/, never loaded by the tracer: autoload is
 * off unless the loader asks for it). Run with BPF_PROG_TEST_RUN, it writes
 * bench_count synthetic events of bench_flows tracked flows into the same
 * ring buffer, so the pipeline and a plain C consumer can be measured
 * against the same producer.
 */
volatile __u32 bench_count = 0;
volatile __u32 bench_flows = 0; /* 0 means 1 */
volatile __u64 bench_seq = 0;

static long bench_emit_one(__u64 i, void *ctx)
{
	__u32 flows = bench_flows ? bench_flows : 1;
	__u64 n = bench_seq++;
	__u32 flow = n % flows;
	struct svt_event *e;

	/* The null check right after the reservation: with a store in between,
	 * clang checked again later, and Linux 6.1's verifier, which does not
	 * know a checked ring buffer record is non-null, then followed a path
	 * that leaks it. */
	e = svt_reserve(SVT_EV_NF);
	if (!e)
		return 0;
	e->ct_id = 0xffff888800000000ULL + flow * 256;
	e->skb_id = 0xffff888900000000ULL + n;
	e->service_id = 1;
	e->nf_hook = NF_INET_LOCAL_OUT;
	e->nf_stage = (n & 1) ? SVT_STAGE_AFTER_NAT : SVT_STAGE_BEFORE_NAT;
	e->nf_priority = (n & 1) ? SVT_NF_PRIO_DNAT + 1 : SVT_NF_PRIO_DNAT - 1;
	e->ct_orig.saddr = bpf_htonl(0x0af40101);           /* 10.244.1.1 */
	e->ct_orig.daddr = bpf_htonl(0x0a600064);           /* 10.96.0.100 */
	e->ct_orig.sport = bpf_htons(10000 + flow % 50000);
	e->ct_orig.dport = bpf_htons(80);
	e->ct_orig.proto = IPPROTO_TCP;
	e->ct_reply.saddr = bpf_htonl(0x0af4010a + flow % 3); /* 10.244.1.10-12 */
	e->ct_reply.daddr = e->ct_orig.saddr;
	e->ct_reply.sport = bpf_htons(8080);
	e->ct_reply.dport = e->ct_orig.sport;
	e->ct_reply.proto = IPPROTO_TCP;
	e->pkt = (n & 1) ? (struct svt_tuple){ .saddr = e->ct_orig.saddr, .daddr = e->ct_reply.saddr,
					      .sport = e->ct_orig.sport, .dport = e->ct_reply.sport, .proto = IPPROTO_TCP } :
			   e->ct_orig;
	e->ct_status = IPS_CONFIRMED | IPS_DST_NAT | IPS_SEEN_REPLY | IPS_ASSURED;
	e->ct_tcp_state = 3; /* ESTABLISHED */
	e->tcp_flags = 0x10;
	e->pkt_len = 100;
	svt_submit(e);
	return 0;
}

SEC("syscall")
int svt_bench_emit(void *ctx)
{
	bpf_loop(bench_count, bench_emit_one, NULL, 0);
	return 0;
}

/*
 * True when a destroy of this original tuple is owed to an entry a new one
 * replaced (svt_stale_destroys); takes one off the count. The addon's
 * ConsumeStaleDestroy, without its syscalls: while a client reuses ports,
 * some destroy is nearly always owed, and every destroy looked.
 */
static __always_inline bool consume_stale_destroy(const struct svt_tuple *orig)
{
	__u32 *pending;

	if (!svt_stale_owed)
		return false;
	pending = bpf_map_lookup_elem(&svt_stale_destroys, orig);
	if (!pending || !*pending)
		return false;
	if (*pending == 1)
		bpf_map_delete_elem(&svt_stale_destroys, orig);
	else
		__sync_fetch_and_add(pending, -1);
	__sync_fetch_and_add(&svt_stale_owed, -1);
	return true;
}

/*
 * A conntrack destroy's lookups, before the addon takes the flow's state
 * (see struct svt_destroy_ctx). The ctx is the addon's copy; keys go to the
 * helpers from the stack.
 */
SEC("syscall")
int svt_destroy_find(struct svt_destroy_ctx *c)
{
	struct svt_tuple orig = c->keys[0];
	struct svt_flow_counters *st;
	struct svt_flow_ref *ref;
	__u64 key;

	c->found = 0;
	if (consume_stale_destroy(&orig)) {
		c->found = SVT_DESTROY_STALE;
		return 0;
	}
	ref = bpf_map_lookup_elem(&svt_flows, &orig);
	if (!ref)
		return 0;
	key = ref->ct_id;
	c->ct_id = key;
	st = bpf_map_lookup_elem(&svt_flow_state, &key);
	if (st && tuple_eq(&st->orig, &orig)) {
		/* Race 1: the state found is a new entry's, its stale destroy
		 * owed by now (owed before its state was written). */
		if (consume_stale_destroy(&orig)) {
			c->found = SVT_DESTROY_STALE;
			return 0;
		}
		c->first_ns = st->first_ns;
		c->found = SVT_DESTROY_REF | SVT_DESTROY_STATE;
		return 0;
	}
	c->found = SVT_DESTROY_REF;
	return 0;
}

/*
 * ... and after: forgets the flow's wire tuples. Not taken: the destroy may
 * be one owed (a new entry with its tuple came while it was read, and the
 * kernel ended this one and took its state): then the tuples are the new
 * entry's and stay. Taken: unless a new entry with the same original tuple
 * came after the take (it registered keys[0] again, at another address, or
 * at this one with a state again): its tuples stay, and this flow's other
 * tuples are left to the registry's LRU.
 */
SEC("syscall")
int svt_destroy_forget(struct svt_destroy_ctx *c)
{
	struct svt_tuple k = c->keys[0];
	struct svt_flow_ref *ref;
	__u64 key = c->ct_id;

	if (!c->taken && consume_stale_destroy(&k)) {
		c->result = SVT_FORGET_STALE;
		return 0;
	}
	if (c->taken) {
		ref = bpf_map_lookup_elem(&svt_flows, &k);
		if (ref && (ref->ct_id != key || bpf_map_lookup_elem(&svt_flow_state, &key))) {
			c->result = SVT_FORGET_KEPT;
			return 0;
		}
	}
	c->result = bpf_map_delete_elem(&svt_flows, &k) == 0 ? SVT_FORGET_DONE : SVT_FORGET_NONE;
	k = c->keys[1];
	bpf_map_delete_elem(&svt_flows, &k);
	k = c->keys[2];
	bpf_map_delete_elem(&svt_flows, &k);
	k = c->keys[3];
	bpf_map_delete_elem(&svt_flows, &k);
	return 0;
}
