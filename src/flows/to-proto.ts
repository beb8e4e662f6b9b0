/**
 * The one place that knows both the flow model (KernelEvent, Flow) and the
 * wire messages (svctrace.v1.Event, svctrace.v1.Flow): maps one onto the other.
 */
import Long from 'long';
import { svctrace } from '../gen/svctrace';
import { KernelEvent, Tuple } from '../events/decode';
import { EventKind, NfStage, Dir } from '../events/layout';
import { ctStatusNames, PROTO_NAMES, TCP_CT_STATES, tcpFlagNames } from '../events/conntrack';
import type { Flow } from './types';
import { endpoint } from './tuple';
import { wallNs } from '../clock';
import { eventSummary } from '../output/event-summary';

import pb = svctrace.v1;

const KIND: Record<number, pb.EventKind> = {
  [EventKind.NF]: pb.EventKind.EVENT_KIND_NETFILTER,
  [EventKind.DEV_XMIT]: pb.EventKind.EVENT_KIND_DEV_XMIT,
  [EventKind.DEV_RECV]: pb.EventKind.EVENT_KIND_DEV_RECV,
  [EventKind.DROP]: pb.EventKind.EVENT_KIND_DROP,
  [EventKind.FIB]: pb.EventKind.EVENT_KIND_ROUTE,
  [EventKind.CT_DESTROY]: pb.EventKind.EVENT_KIND_CT_DESTROY,
};

/** A kernel nanosecond count as a protobuf uint64, exact beyond 2^53. */
export function longFromBigint(v: bigint): Long {
  return Long.fromBits(Number(v & 0xffffffffn), Number((v >> 32n) & 0xffffffffn), true);
}

export function protoTuple(t: Tuple): pb.ITuple {
  return { src: t.saddr, dst: t.daddr, srcPort: t.sport, dstPort: t.dport, protocol: t.proto as pb.Protocol };
}

export function hasConntrack(e: KernelEvent): boolean {
  return e.kind === EventKind.NF || e.kind === EventKind.CT_DESTROY || (e.kind === EventKind.DROP && e.ctOrig.proto !== 0);
}

/** Context the kernel record does not carry. */
export interface EventContext {
  flowId: number;
  /** The flow's nf_conn address, hex (the event's own, made once per flow). */
  ctId: string;
  service: string;
  stage: pb.Stage;
  netnsName?: string;
  dropReasonName?: string;
  /** Drops: the kernel code that freed the packet, "nf_hook_slow+0x8c" (hex when it has no name). */
  dropLocation?: string;
  backend?: string;
  backendNetns?: string;
  /** Device events: the device is in a pod's namespace. */
  podSide?: boolean;
  /** The TCP state this event left, when it moved conntrack's TCP state. */
  tcpStateBefore?: string;
  /** Drops: a normal end of a packet's life, not a failure. */
  benignDrop?: boolean;
  /** From the Kubernetes API, when it knows them (pipeline/api-names). */
  serviceName?: string | null;
  backendPod?: string | null;
}

/** Event.kind of a kernel record. */
export function protoKind(e: KernelEvent): pb.EventKind {
  return KIND[e.kind] ?? pb.EventKind.EVENT_KIND_UNSPECIFIED;
}

/** Event.direction of a kernel record. */
export function protoDirection(e: KernelEvent): pb.Direction {
  return e.dir === Dir.REPLY ? pb.Direction.DIRECTION_REPLY : pb.Direction.DIRECTION_ORIGINAL;
}

/** Event.conntrack.tcp_state of a kernel record ('' for other protocols); undefined when its event has no conntrack state. */
export function protoTcpState(e: KernelEvent): string | undefined {
  if (!hasConntrack(e)) return undefined;
  return e.ctOrig.proto === 6 ? TCP_CT_STATES[e.ctTcpState] ?? String(e.ctTcpState) : '';
}

/** The wire event of a kernel record; no summary (rendered at the edge: output/event-summary). */
export function toProtoEvent(e: KernelEvent, ctx: EventContext): pb.IEvent {
  const out: pb.IEvent = {
    tsNs: longFromBigint(wallNs(e.tsNs)),
    kind: protoKind(e),
    flowId: ctx.flowId,
    service: ctx.service,
    stage: ctx.stage,
    direction: protoDirection(e),
    cpu: e.cpu,
  };
  if (e.capture) out.packetData = e.capture;
  if (ctx.backend) out.backend = ctx.backend;
  if (ctx.backendNetns) out.backendNetns = ctx.backendNetns;
  if (e.kind !== EventKind.CT_DESTROY) {
    out.packet = protoTuple(e.pkt);
    out.length = e.pktLen;
    if (e.pkt.proto === 6 && e.kind !== EventKind.FIB) out.tcpFlags = tcpFlagNames(e.tcpFlags);
  }
  if (hasConntrack(e)) {
    out.conntrack = {
      id: ctx.ctId,
      original: protoTuple(e.ctOrig),
      reply: protoTuple(e.ctReply),
      status: e.ctStatus,
      tcpState: protoTcpState(e),
      mark: e.ctMark,
      zone: e.ctZone,
      timeoutMs: e.ctTimeoutMs,
    };
    if (ctx.tcpStateBefore) out.conntrack.tcpStateBefore = ctx.tcpStateBefore;
  } else if (ctx.ctId) {
    out.conntrack = { id: ctx.ctId };
  }
  if (e.ifindex || e.netnsIno) {
    out.device = { ifindex: e.ifindex, name: e.ifname, kind: e.linkKind, netnsInode: e.netnsIno, netns: ctx.netnsName ?? '' };
    if (ctx.podSide) out.device.podSide = true;
  }
  if (e.kind === EventKind.NF) {
    out.hook = (e.nfHook + 1) as pb.NfHook;
    out.priority = e.nfPriority;
    out.afterNat = e.nfStage === NfStage.AFTER_NAT;
  }
  if (e.kind === EventKind.DROP) {
    out.dropReason = e.reason;
    out.dropReasonName = ctx.dropReasonName ?? String(e.reason);
    if (ctx.dropLocation) out.dropLocation = ctx.dropLocation;
  }
  if (e.kind === EventKind.FIB) {
    out.gateway = e.gateway;
    out.routeTable = e.reason;
  }
  if (e.pkt.proto === 1) {
    out.icmpType = e.icmpType;
    out.icmpCode = e.icmpCode;
  }
  if (ctx.benignDrop) out.benignDrop = true;
  if (ctx.serviceName) out.serviceName = ctx.serviceName;
  if (ctx.backendPod) out.backendPod = ctx.backendPod;
  return out;
}

/**
 * proto3 canonical JSON of an Event (what `trace -o json` prints, one per
 * line). Its summary and conntrack status names are rendered here, at the
 * edge: the pipeline, the stream and recordings carry the numbers only.
 */
export function eventToJson(ev: pb.IEvent): string {
  const c = ev.conntrack;
  const named: pb.IEvent = {
    ...ev,
    summary: eventSummary(ev),
    conntrack: c && c.original && !c.statusNames?.length ? { ...c, statusNames: ctStatusNames(c.status ?? 0) } : c,
  };
  return JSON.stringify(pb.Event.toObject(pb.Event.fromObject(named), { longs: String, enums: String, bytes: String, json: true }));
}

/** The Flow message for a flow (for summaries and streaming). */
export function flowToProto(f: Flow): pb.IFlow {
  return {
    id: f.id,
    service: f.service,
    protocol: f.proto as pb.Protocol,
    client: endpoint(f.orig.saddr, f.orig.sport),
    serviceAddress: endpoint(f.orig.daddr, f.orig.dport),
    backend: f.dnat ? endpoint(f.reply.saddr, f.reply.sport) : '',
    backendNetns: f.backendNetns ?? '',
    seenByBackend: endpoint(f.reply.daddr, f.reply.dport),
    masqueraded: f.masqueraded,
    state: f.proto === 6 ? TCP_CT_STATES[f.tcpState] ?? '' : PROTO_NAMES[f.proto] ?? '',
    statusNames: ctStatusNames(f.status),
    packetsOriginal: f.packets[0],
    bytesOriginal: f.bytes[0],
    packetsReply: f.packets[1],
    bytesReply: f.bytes[1],
    firstTsNs: longFromBigint(wallNs(f.firstTsNs)),
    lastTsNs: longFromBigint(wallNs(f.lastTsNs)),
    closed: f.closed,
    drops: f.drops,
    reset: f.reset,
    conntrackId: f.ctId,
    rulePath: f.rulePath,
    countedOnly: f.countedOnly,
    synsResent: f.synsResent,
  };
}
