/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The kernel <-> user-space event ABI of svctrace: the one definition of what
 * the BPF programs write into the ring buffer and of the maps user space fills.
 *
 * Included by the BPF programs in bpf/ (after vmlinux.h) and by native/ (after
 * <linux/types.h>). It includes nothing itself. Only fixed-width types and
 * explicit padding: the TypeScript decoder reads these bytes by offset, and a
 * test checks its offsets against the ones the addon exports (native/layout.cc).
 *
 * Byte order: addresses and ports are kept in network byte order, exactly as
 * the kernel holds them; everything else is host order.
 */
#ifndef SVCTRACE_EVENTS_H
#define SVCTRACE_EVENTS_H

#ifdef __cplusplus
#define SVT_STATIC_ASSERT static_assert
#else
#define SVT_STATIC_ASSERT _Static_assert
#endif

/* Capacity of the service selection map (ClusterIP/NodePort entries). */
#define SVT_MAX_SERVICES 1024
/* Tracked flows (conntrack entries and their wire tuples) kept at once; LRU. */
#define SVT_MAX_FLOWS 65536
/*
 * Default ring buffer size in bytes (power of two, multiple of the page
 * size); the loader can change it (`--ring-buffer`). The ring is the only
 * buffer between the kernel and a busy user space: the reader stops draining
 * when JavaScript is behind, and what does not fit is counted by the kernel.
 */
#define SVT_RINGBUF_BYTES (16 * 1024 * 1024)
/*
 * The reader is woken by the kernel only once this many bytes wait in the
 * ring; below that it finds them at its next poll, at most SVT_POLL_MS later
 * while records are coming. Left to itself, the ring wakes its reader for
 * every record written while the reader is caught up: under steady traffic
 * that is one wakeup (an inter-processor interrupt and two context switches)
 * per packet, which cost short connections more than the programs did.
 */
#define SVT_WAKEUP_BYTES (64 * 1024)
#define SVT_POLL_MS 5
/* Default interval of the periodic per-flow counter records (ns). */
#define SVT_STATS_INTERVAL_NS 1000000000ULL

/* What produced an event. */
enum svt_event_kind {
	SVT_EV_NF = 1,         /* a netfilter hook saw a packet of a tracked flow */
	SVT_EV_DEV_XMIT = 2,   /* net_dev_queue: a device is about to transmit it */
	SVT_EV_DEV_RECV = 3,   /* netif_receive_skb: a device received it */
	SVT_EV_DROP = 4,       /* kfree_skb: the kernel dropped it, with a reason */
	SVT_EV_FIB = 5,        /* fib_table_lookup: the routing decision for it */
	SVT_EV_CT_DESTROY = 6, /* conntrack netlink DESTROY (written by the addon) */
	SVT_EV_NFTRACE = 7,    /* an nftables trace message: struct svt_nftrace (written by the addon) */
	SVT_EV_FLOW_STATS = 8, /* a flow's in-kernel counters: struct svt_flow_stats */
};

/*
 * Netfilter priorities of kernel NAT (NF_IP_PRI_NAT_DST / NF_IP_PRI_NAT_SRC).
 * The "before" program is attached at NAT - 1, the "after" one at NAT + 1:
 * DNAT on PRE_ROUTING and LOCAL_OUT, SNAT on POST_ROUTING and LOCAL_IN.
 */
#define SVT_NF_PRIO_DNAT (-100)
#define SVT_NF_PRIO_SNAT 100

/* A drop on a kernel whose kfree_skb has no reason (< 5.17). 0 is
 * SKB_NOT_DROPPED_YET where reasons exist: never the reason of a drop. */
#define SVT_DROP_REASON_UNKNOWN 0

/* Which side of a NAT hook the netfilter program ran on. */
enum svt_nf_stage {
	SVT_STAGE_BEFORE_NAT = 0,
	SVT_STAGE_AFTER_NAT = 1,
};

/* Direction of a packet relative to its conntrack entry. */
enum svt_dir {
	SVT_DIR_ORIGINAL = 0, /* client -> service */
	SVT_DIR_REPLY = 1,    /* backend -> client */
};

/* A packet or conntrack tuple; addresses and ports in network byte order. */
struct svt_tuple {
	__u32 saddr;
	__u32 daddr;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 _pad[3];
};
SVT_STATIC_ASSERT(sizeof(struct svt_tuple) == 16, "svt_tuple ABI changed");

/*
 * One observation of a packet belonging to a tracked flow. All kinds share
 * this record; fields a kind does not fill stay zero.
 */
struct svt_event {
	__u16 kind;              /* enum svt_event_kind */
	__u16 size;              /* sizeof(struct svt_event), checked by the reader */
	__u32 cpu;
	__u64 ts_ns;             /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u64 ct_id;             /* kernel address of the nf_conn: flow key, 0 if none */
	__u64 skb_id;            /* kernel address of the sk_buff: packet key */
	struct svt_tuple pkt;    /* the IP/L4 header as seen at this point */
	struct svt_tuple ct_orig;  /* conntrack original-direction tuple */
	struct svt_tuple ct_reply; /* conntrack reply-direction tuple (NAT shows here) */
	__u32 ct_status;         /* enum ip_conntrack_status bits */
	__u32 ct_mark;
	__u32 ct_timeout_ms;     /* time left before the entry expires */
	__u32 netns_ino;         /* inode of the network namespace it was seen in */
	__u32 ifindex;           /* netfilter: in-device on PRE_ROUTING/LOCAL_IN, else out; fib: out */
	__s32 nf_priority;       /* netfilter: the priority the program ran at */
	__u32 reason;            /* drop: enum skb_drop_reason, or SVT_DROP_REASON_UNKNOWN */
	__u32 pkt_len;           /* skb->len */
	__u16 ct_zone;
	__u8 nf_hook;            /* enum nf_inet_hooks (NF_INET_PRE_ROUTING = 0 ...) */
	__u8 ctinfo;             /* enum ip_conntrack_info */
	__u8 tcp_flags;          /* FIN=0x01 SYN=0x02 RST=0x04 PSH=0x08 ACK=0x10 */
	__u8 ct_tcp_state;       /* enum tcp_conntrack */
	__u8 nf_stage;           /* enum svt_nf_stage */
	__u8 dir;                /* enum svt_dir */
	__u32 service_id;        /* value of the matching svt_services entry */
	__u32 gateway;           /* fib: next-hop gateway, network order; 0 = directly connected */
	char ifname[16];         /* name of ifindex, read in the kernel */
	char link_kind[8];       /* rtnl link kind of the device: "veth", "bridge", "vxlan", "" */
	__u8 icmp_type;          /* ICMP packets (e.g. port unreachable for a REJECT) */
	__u8 icmp_code;
	__u16 cap_len;           /* bytes of the packet captured after the event (svt_event_cap) */
	__u32 ct_birth;          /* SVT_CT_BIRTH of the flow's state (0: not known here). See below. */
	__u64 drop_location;     /* drop: the kernel code address that freed the packet (kfree_skb's
				  * caller), which user space names from /proc/kallsyms: where the
				  * kernel has no drop reasons (< 5.17) it is all a drop tells */
};
SVT_STATIC_ASSERT(sizeof(struct svt_event) == 168, "svt_event ABI changed");

/*
 * Which conntrack entry at an nf_conn address an event is of. An address is
 * reused as soon as its entry is freed; in a storm a client reusing its port
 * gets a new entry at the very address of the old one, with the same tuple.
 * The address and the tuple then name two connections, and when the new
 * one's first records did not fit the ring buffer, user space cannot tell
 * its later records from the old one's. The birth is the low 32 bits of the
 * state's first_ns (odd, so never 0): two entries at one address share it
 * only if born a multiple of 2^32 ns apart to the nanosecond. Stats records
 * carry first_ns itself; user space derives the same value from it.
 */
#define SVT_CT_BIRTH(first_ns) ((__u32)(first_ns) | 1U)

/* Most bytes of a packet (from its IP header) an event can carry. */
#define SVT_MAX_SNAPLEN 128

/*
 * With packet capture on (the loader's targ_snaplen > 0), every record is
 * this larger one: the event, then cap_len valid bytes of the packet
 * starting at its IP header. `size` tells the reader which kind it got.
 */
struct svt_event_cap {
	struct svt_event ev;
	__u8 data[SVT_MAX_SNAPLEN];
};
SVT_STATIC_ASSERT(sizeof(struct svt_event_cap) == 296, "svt_event_cap ABI changed");

/* Value of the svt_flows map: which tracked flow a wire tuple belongs to. */
struct svt_flow_ref {
	__u64 ct_id;
	__u32 service_id;
	__u8 dir;  /* enum svt_dir of packets carrying this tuple */
	__u8 counted_only; /* the flow is over the detail budget: counted, its transitions not reported */
	__u8 _pad[2];
};
SVT_STATIC_ASSERT(sizeof(struct svt_flow_ref) == 16, "svt_flow_ref ABI changed");

/*
 * In and out of the conntrack destroy handler's two programs (SEC("syscall"),
 * run by the addon with BPF_PROG_TEST_RUN, Linux 5.14+): the lookups of a
 * destroy before and after it takes the flow's state, one syscall each
 * instead of five. The take itself stays a syscall (BPF_MAP_LOOKUP_AND_DELETE:
 * atomic, which a program's lookup then delete is not).
 */
struct svt_destroy_ctx {
	struct svt_tuple keys[4]; /* in: keys[0] the entry's original tuple; all four its wire tuples (forget) */
	__u64 ct_id;              /* find: out, the registry's entry for keys[0]; forget: in, the entry taken */
	__u64 first_ns;           /* find: out, that entry's state's first packet (SVT_DESTROY_STATE) */
	__u32 found;              /* find: out, SVT_DESTROY_* bits */
	__u32 taken;              /* forget: in, 1 when this destroy took the entry's state */
	__u32 result;             /* forget: out, enum svt_forget_result */
	__u32 _pad;
};
SVT_STATIC_ASSERT(sizeof(struct svt_destroy_ctx) == 96, "svt_destroy_ctx ABI changed");

#define SVT_DESTROY_REF 1U   /* keys[0] is in the wire-tuple registry (ct_id) */
#define SVT_DESTROY_STATE 2U /* ct_id's state is this tuple's (first_ns) */
/* The destroy is one owed (svt_stale_destroys), now taken off: an older
 * entry's, whose end went out when a new entry replaced it. Nothing else
 * was looked up. */
#define SVT_DESTROY_STALE 4U

enum svt_forget_result {
	SVT_FORGET_NONE = 0,   /* keys[0] was not in the registry */
	SVT_FORGET_DONE = 1,   /* keys[0] was, and the four tuples are forgotten */
	SVT_FORGET_KEPT = 2,   /* a new entry holds keys[0] (race 3): nothing forgotten */
	SVT_FORGET_STALE = 3,  /* not taken, and the destroy is one owed (SVT_DESTROY_STALE) */
};

/*
 * One nftables trace message (NFT_MSG_TRACE, read by the addon from the
 * NFNLGRP_NFTRACE group) for a packet svctrace marked with nftrace: the rule
 * or chain end the packet met. Delivered on its own callback, not the ring.
 */
#define SVT_NFT_NAME_LEN 64
struct svt_nftrace {
	__u16 kind;              /* SVT_EV_NFTRACE */
	__u16 size;              /* sizeof(struct svt_nftrace) */
	__u32 trace_id;          /* the same for every message about one packet */
	__u64 ts_ns;             /* CLOCK_MONOTONIC when the addon read it */
	struct svt_tuple pkt;    /* the packet's header (from the first message of its trace) */
	__u64 rule_handle;
	__u32 type;              /* enum nft_trace_types: 1 policy, 2 return, 3 rule */
	__s32 verdict;           /* NF_ACCEPT (1), NF_DROP (0), NFT_JUMP (-3), NFT_GOTO (-4), ... */
	__u32 netns_ino;
	__u32 _pad;
	char table[32];
	char chain[SVT_NFT_NAME_LEN];
	char target[SVT_NFT_NAME_LEN]; /* jump/goto target chain */
};
SVT_STATIC_ASSERT(sizeof(struct svt_nftrace) == 216, "svt_nftrace ABI changed");

/*
 * Per-flow state the kernel keeps for each tracked conntrack entry (value of
 * the svt_flow_state map, keyed by the nf_conn address). Packets are counted
 * here, not reported one by one: the ring buffer carries transitions only.
 * Counted once per packet, at the hook every packet of the entry crosses
 * exactly once in its namespace (before DNAT on PRE_ROUTING / LOCAL_OUT),
 * with skb->len: the same packets and bytes conntrack accounting counts.
 */
struct svt_flow_counters {
	__u64 packets[2];        /* per enum svt_dir */
	__u64 bytes[2];
	__u64 drops;             /* packets of the flow the kernel dropped (any reason) */
	__u64 first_ns;          /* CLOCK_MONOTONIC of the first packet seen */
	__u64 last_ns;           /* ... and of the last one counted */
	__u64 last_report_ns;    /* last periodic svt_flow_stats record */
	struct svt_tuple orig;   /* the entry's original tuple: tells a reused nf_conn address apart */
	__u32 seen;              /* bit per (hook, NAT stage, direction) already reported */
	__u32 last_status;       /* conntrack status bits last reported (SVT_CT_STATUS_REPORTED) */
	__u32 service_id;
	__u32 netns_ino;
	__u32 last_drop_site;    /* the last drop's reason; where the kernel names none, the low half of its kfree_skb caller */
	__u8 tcp_flags[2];       /* OR of the TCP flags seen, per direction */
	__u8 last_tcp_state;     /* conntrack TCP state last reported */
	__u8 delivered;          /* 1 once any record of this flow was written to the ring buffer */
	/* The entry's reply tuple once NAT is decided (zero before): the
	 * backend, and what it sees as the client, for a flow known by its
	 * counters alone (counted only, or its events lost). */
	struct svt_tuple reply;
	/* 1: the flow started over the detail budget (targ_detail_per_cpu):
	 * counted here, drops reported, its transitions not (see
	 * detail_admit). */
	__u8 counted_only;
	/* 1: this TCP flow's end (SVT_STATS_ENDED) was written and no packet
	 * was counted since. Its destroy then has no new counters: the addon
	 * removes its state without another record, and without the destroy
	 * event too for a counted-only flow (see native/ct_listener.cc). */
	__u8 end_sent;
	/* SYNs the client sent again while the entry waited for any reply
	 * (saturates at 0xffff). Conntrack's accounting leaves them out, and
	 * so do packets[] and bytes[]: a client waiting on a silent backend. */
	__u16 syns_resent;
	__u8 _pad[4];
};
SVT_STATIC_ASSERT(sizeof(struct svt_flow_counters) == 128, "svt_flow_counters ABI changed");

/* Why a svt_flow_stats record was written. */
enum svt_stats_reason {
	SVT_STATS_PERIODIC = 0, /* the flow is active; counters so far */
	SVT_STATS_CLOSED = 1,   /* conntrack destroyed the entry: final counters (written by the addon) */
	SVT_STATS_REUSED = 2,   /* a new entry took the nf_conn address: the old flow's final counters
				 * (none when its ENDED was the last: nothing counted since) */
	SVT_STATS_EXPIRED = 3,  /* no packet for a long time, state removed (written by the addon) */
	SVT_STATS_ENDED = 4,    /* a TCP connection is over (TIME_WAIT or CLOSE): its final
				 * counters, unless a packet comes later (then its destroy's are) */
};

/* Ring-buffer record of kind SVT_EV_FLOW_STATS: a flow's counters. */
struct svt_flow_stats {
	__u16 kind;              /* SVT_EV_FLOW_STATS */
	__u16 size;              /* sizeof(struct svt_flow_stats) */
	__u32 cpu;
	__u64 ts_ns;             /* CLOCK_MONOTONIC when written */
	__u64 ct_id;             /* the flow's nf_conn address, as in svt_event */
	__u32 reason;            /* enum svt_stats_reason */
	__u32 _pad;
	struct svt_flow_counters c;
};
SVT_STATIC_ASSERT(sizeof(struct svt_flow_stats) == 160, "svt_flow_stats ABI changed");

/* Conntrack status bits whose change is a transition worth an event:
 * EXPECTED, SEEN_REPLY, ASSURED, CONFIRMED, SRC_NAT, DST_NAT, DYING. */
#define SVT_CT_STATUS_REPORTED 0x23fU

/* Key of the svt_services map: a traced ClusterIP/NodePort. */
struct svt_service_key {
	__u32 addr;  /* network byte order; 0 = any address (NodePort) */
	__u16 port;  /* network byte order */
	__u8 proto;  /* IPPROTO_TCP / IPPROTO_UDP */
	__u8 _pad;
};
SVT_STATIC_ASSERT(sizeof(struct svt_service_key) == 8, "svt_service_key ABI changed");

/* Indices of the per-CPU svt_counters array. */
enum svt_counter {
	SVT_CNT_RINGBUF_LOST = 0, /* events lost because the ring buffer was full */
	SVT_CNT_EVENTS = 1,       /* events written */
	SVT_CNT_FLOWS = 2,        /* tracked flows started */
	SVT_CNT_STATE_FULL = 3,   /* flows not counted in the kernel: svt_flow_state was full */
	SVT_CNT_PACKETS = 4,      /* packets of tracked flows counted in the kernel */
	SVT_CNT_FLOWS_UNSEEN = 5, /* flows none of whose records fit the ring buffer, their final counters included */
	SVT_CNT_FLOWS_UNSEEN_RESET = 6, /* ... of which a TCP reset ended (attempts, mostly) */
	SVT_CNT_NAT_EXIT_UNMATCHED = 7, /* kprobe backend: NAT hook returns whose entry was lost (their after-NAT view) */
	SVT_CNT_FLOWS_COUNTED_ONLY = 8, /* tracked flows started over the detail budget: counted, transitions not reported */
	SVT_CNT_MAX = 9,
};

#endif /* SVCTRACE_EVENTS_H */
