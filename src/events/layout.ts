/**
 * Offsets of the kernel event ABI (bpf/events.h), kept as literals so the
 * decoder is a straight DataView walk. test/native/layout.test.ts asserts they
 * equal what the addon compiled (binding.layout()): change events.h and that
 * test tells you what to change here.
 */
export const TUPLE = {
  size: 16,
  fields: { saddr: [0, 4], daddr: [4, 4], sport: [8, 2], dport: [10, 2], proto: [12, 1] },
} as const;

export const EVENT = {
  size: 168,
  fields: {
    kind: [0, 2],
    size: [2, 2],
    cpu: [4, 4],
    ts_ns: [8, 8],
    ct_id: [16, 8],
    skb_id: [24, 8],
    pkt: [32, 16],
    ct_orig: [48, 16],
    ct_reply: [64, 16],
    ct_status: [80, 4],
    ct_mark: [84, 4],
    ct_timeout_ms: [88, 4],
    netns_ino: [92, 4],
    ifindex: [96, 4],
    nf_priority: [100, 4],
    reason: [104, 4],
    pkt_len: [108, 4],
    ct_zone: [112, 2],
    nf_hook: [114, 1],
    ctinfo: [115, 1],
    tcp_flags: [116, 1],
    ct_tcp_state: [117, 1],
    nf_stage: [118, 1],
    dir: [119, 1],
    service_id: [120, 4],
    gateway: [124, 4],
    ifname: [128, 16],
    link_kind: [144, 8],
    icmp_type: [152, 1],
    icmp_code: [153, 1],
    cap_len: [154, 2],
    ct_birth: [156, 4],
    drop_location: [160, 8],
  },
} as const;

/** struct svt_nftrace: one nftables trace message (bpf/events.h). */
export const NFTRACE = {
  size: 216,
  fields: {
    kind: [0, 2],
    size: [2, 2],
    trace_id: [4, 4],
    ts_ns: [8, 8],
    pkt: [16, 16],
    rule_handle: [32, 8],
    type: [40, 4],
    verdict: [44, 4],
    netns_ino: [48, 4],
    table: [56, 32],
    chain: [88, 64],
    target: [152, 64],
  },
} as const;

/** struct svt_flow_counters: a flow's in-kernel counters (bpf/events.h). */
export const FLOW_COUNTERS = {
  size: 128,
  fields: {
    packets: [0, 16],
    bytes: [16, 16],
    drops: [32, 8],
    first_ns: [40, 8],
    last_ns: [48, 8],
    last_report_ns: [56, 8],
    orig: [64, 16],
    seen: [80, 4],
    last_status: [84, 4],
    service_id: [88, 4],
    netns_ino: [92, 4],
    last_drop_site: [96, 4],
    tcp_flags: [100, 2],
    last_tcp_state: [102, 1],
    delivered: [103, 1],
    reply: [104, 16],
    counted_only: [120, 1],
    end_sent: [121, 1],
    syns_resent: [122, 2],
  },
} as const;

/** struct svt_flow_stats: the ring-buffer record carrying a flow's counters. */
export const FLOW_STATS = {
  size: 160,
  fields: {
    kind: [0, 2],
    size: [2, 2],
    cpu: [4, 4],
    ts_ns: [8, 8],
    ct_id: [16, 8],
    reason: [24, 4],
    c: [32, 128],
  },
} as const;

/** enum svt_stats_reason: why a flow's counters were reported. */
export const StatsReason = { PERIODIC: 0, CLOSED: 1, REUSED: 2, EXPIRED: 3, ENDED: 4 } as const;

/** Which native source a batch came from (native/batch_sink.h Channel). */
export const Channel = { RING: 0, NETLINK: 1 } as const;

/** Defaults the loader uses (SVT_RINGBUF_BYTES, SVT_STATS_INTERVAL_NS). */
export const DEFAULT_RING_BUFFER_BYTES = 16 * 1024 * 1024;
export const DEFAULT_STATS_INTERVAL_MS = 1000;

/**
 * New flows per second whose transitions are reported by default
 * (--detail-rate); flows past it are counted only — packets, bytes, TCP
 * flags, backend and drops, every one of them. Each detailed short
 * connection costs svctrace about 100 us of CPU (docs/performance.md):
 * this many are about a tenth of a core, and more than a person can read.
 * The loader (addon) itself defaults to 0: every flow.
 */
export const DEFAULT_DETAIL_RATE = 1000;

/** Most packet bytes a record carries (SVT_MAX_SNAPLEN); with capture on every record is EVENT_CAP_SIZE long. */
export const MAX_SNAPLEN = 128;
export const EVENT_CAP_SIZE = EVENT.size + MAX_SNAPLEN;

/** enum svt_event_kind */
export const EventKind = { NF: 1, DEV_XMIT: 2, DEV_RECV: 3, DROP: 4, FIB: 5, CT_DESTROY: 6, NFTRACE: 7, FLOW_STATS: 8 } as const;
export type EventKindValue = (typeof EventKind)[keyof typeof EventKind];

/** enum svt_nf_stage */
export const NfStage = { BEFORE_NAT: 0, AFTER_NAT: 1 } as const;

/** enum svt_dir */
export const Dir = { ORIGINAL: 0, REPLY: 1 } as const;

/** Netfilter priorities of kernel NAT (SVT_NF_PRIO_*). */
export const NF_PRIO_DNAT = -100;
export const NF_PRIO_SNAT = 100;
