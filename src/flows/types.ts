/** The flow model's types: a flow (one conntrack entry), a timeline entry, and what ingesting an event yields. */
import { svctrace } from '../gen/svctrace';
import type { RuleTrace, Tuple } from '../events/decode';
import type { KernelLocation } from '../events/kallsyms';
import type { ServiceSpec } from '../net/ipv4';

import pb = svctrace.v1;

export interface TimelineEntry {
  tsNs: bigint;
  stage: pb.Stage;
  /** First occurrence of this milestone in the flow (what text output prints). */
  milestone: boolean;
  /** Conntrack's TCP state moved with this packet. */
  stateChange?: boolean;
  /** Overrides the stage's label in text output. */
  label?: string;
}

export interface Flow {
  id: number;
  /** The flow table's key: the nf_conn address as a number, or a `pkt:` tuple key. */
  key: number | string;
  /** Key in the (namespace, original tuple) index, for conntrack DESTROY messages. */
  tupleIndexKey: string;
  service: string;
  serviceId: number;
  proto: number;
  /** Original tuple: client -> service address. */
  orig: Tuple;
  /** Reply tuple: backend -> what the backend sees. */
  reply: Tuple;
  ctId: string;
  /** Which entry at the ct address the flow is (KernelEvent.ctBirth); 0 until a record says. */
  ctBirth: number;
  nodeNetnsIno: number;
  /** The backend "ip:port" once DNAT is known (made once, put on every event). */
  backend?: string;
  /** The reply tuple `backend` was made from. */
  backendOf?: Tuple;
  /** The flow table's key for the tuple the backend receives (its index of traces from a pod's namespace). */
  backendKey?: string;
  backendNetns?: string;
  status: number;
  tcpState: number;
  dnat: boolean;
  masqueraded: boolean;
  /** Counted in the kernel (svt_flow_state), per direction [original, reply]; from flow-stats records. */
  packets: [number, number];
  bytes: [number, number];
  /** Packets of the flow the kernel dropped (counted in the kernel, every retry included). */
  kernelDrops: number;
  /** SYNs the client resent before any answer (counted in the kernel; not in packets, as conntrack does not account them). */
  synsResent: number;
  /** The counters are the flow's last (it ended: closed, address reused, or expired). */
  countersFinal: boolean;
  /** The flow started over the detail budget (--detail-rate): known by its kernel counters (packets, bytes, TCP flags, NAT result) and drops; no hook or device events. */
  countedOnly: boolean;
  firstTsNs: bigint;
  lastTsNs: bigint;
  closed: boolean;
  closedTsNs?: bigint;
  /** Left the table while open, to keep it under its cap (flow_table counts it): what came after went to a new flow. */
  evicted?: boolean;
  /** The reasons its packets were dropped for, each once (how many packets: the summary's dropsByReason). */
  drops: string[];
  /** Drops of reply packets (the backend answered; the answer was lost on its way back): "REASON at DEV in NETNS", a few at most. */
  replyDrops?: string[];
  reset: boolean;
  /** The backend sent the reset (reply direction): nothing listened, or it aborted. */
  backendReset?: boolean;
  /** That reset answered the opening SYN (the connection never got further): the backend refused it, nothing listens. */
  backendRefused?: boolean;
  icmpErrors: string[];
  /** The kube-proxy chains the first packet went through (nftables trace), when observed. */
  rulePath: string[];
  /**
   * The traced packet's messages so far, while more of them may come: one
   * packet's trace can span two netlink batches (its nat table in one, its
   * filter table's REJECT in the next). Dropped a few seconds on.
   */
  ruleTraces?: { traces: RuleTrace[]; atMs: number };
  /** The rule that dropped or rejected the flow's packet where the backend receives it (a pod's own firewall), when traced there. */
  backendDropRule?: string;
  /** Milestones already reported, e.g. 'dnat', 'dev:0:recv:veth2:123' (a few, shared strings: a short array is smaller than a Set). */
  seen: string[];
  /** The stream encoder's claim on a slot of its bytes (stream/kernel-event-encoder.ts); opaque to the model. */
  wire?: unknown;
}

/** One event as the flow table hands it on: its flow, the wire event, and its timeline entry. */
export interface Ingested {
  flow: Flow;
  event: pb.IEvent;
  entry: TimelineEntry;
}

export interface FlowTableOptions {
  services: ServiceSpec[];
  dropReasons?: Record<string, string>;
  netnsName?: (inode: number) => string | undefined;
  /** Names the kernel code that freed a dropped packet (events/kallsyms DropLocations); without it, drops show its address. */
  dropLocations?: { locate(hexAddr: string): KernelLocation | undefined };
  /** How long a closed flow stays before it is expired, by the kernel time delivered (default 2 s: its entry is gone, and its events came before its end). */
  closeGraceMs?: number;
  /** Flows with no event for this long are expired (default 10 min). */
  idleMs?: number;
  /** At most this many flows are kept; the oldest go first (default 20k). */
  maxFlows?: number;
  /**
   * Kernel time up to which the ring buffer has been delivered (a live
   * tracer's; without it, records are taken to arrive in order). A flow's
   * last record from netlink can overtake the flow's events in the ring.
   */
  deliveredThrough?: () => bigint;
  /**
   * The node's namespace (the first traced; undefined until attached): its
   * rule traces are the Service's path. Another traced namespace is a
   * pod's, where only a rule that dropped the packet is news.
   */
  nodeNetnsIno?: () => number | undefined;
}

export interface FlowSummary {
  flows: number;
  /** Flows whose connection ended: conntrack destroyed the entry, or TCP reached TIME_WAIT/CLOSE. */
  closed: number;
  perBackend: Record<string, number>;
  /**
   * Drops reported, per reason: every drop event. A flow's repeated drops at
   * one place (a SYN the client resends into the same DROP rule) are
   * reported once, unless --all-packets; packetsDropped counts them all.
   */
  dropsByReason: Record<string, number>;
  /** Packets of traced flows the kernel dropped, repeats included: the sum of the flows' kernel drop counters (their counter records). */
  packetsDropped: number;
  /** Flows with at least one drop of that reason (what the timelines show once each). */
  dropFlowsByReason: Record<string, number>;
  resets: number;
  /** Flows removed from the table to stay under maxFlows (their later events start new flows). */
  evicted: number;
  /**
   * Counter records that came after their flow had left the table and was
   * no longer remembered (a packet after a connection's end, long after it
   * or in a storm): not applied, counted as lost (stage flow_table).
   */
  lateCounters: number;
  /**
   * Events (a device crossing, a route, a drop) of a flow no longer in the
   * table (evicted, expired) or whose first event never came (lost in the
   * ring: counted there too, as that one event): no flow to show them in,
   * counted as lost (stage flow_table). Destroys of flows gone are not
   * counted: the flow went to the sinks already.
   */
  orphanEvents: number;
  /**
   * Rule-trace groups (each one RULE_TRACE event once its flow comes) that
   * came before their flow and found no room to wait (10,000 wait at most):
   * counted as lost (stage flow_table).
   */
  ruleTracesNotKept: number;
  /** Flows seen that were counted only (over the detail budget, --detail-rate): in `flows` too. */
  countedOnly: number;
}

/** What readers of a flow table (sinks, the stream, explain) may do with it. */
export interface FlowTableView {
  readonly size: number;
  flows(): Flow[];
  summary(): FlowSummary;
}

/** What a flow table lost (the flow_table stage): flows evicted by its cap, and records that came when their flow was no longer there. */
export function flowTableLost(s: Pick<FlowSummary, 'evicted' | 'lateCounters' | 'orphanEvents' | 'ruleTracesNotKept'>): number {
  return s.evicted + (s.lateCounters ?? 0) + (s.orphanEvents ?? 0) + (s.ruleTracesNotKept ?? 0);
}
