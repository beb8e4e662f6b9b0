/**
 * The one-line account of an event ("DNAT @ LOCAL_OUT -99: 10.96.0.100:80 ->
 * backend 10.244.1.12:8080"), rendered from the wire Event's fields at the
 * edge: text timeline, `-o json`, watch, replay, pcapng comments, the
 * dashboard. The pipeline never builds these strings: at a million events a
 * second they were most of its cost, and most events are never shown.
 *
 * Pure and browser-safe (the dashboard bundles it): it reads only the Event.
 * A rule trace carries its own summary (its account, table and masquerade
 * mark, is not in the other fields); an Event that already has a summary
 * (older recordings) keeps it.
 */
import { svctrace } from '../gen/svctrace';
import { ctStatusNames, destTranslated, icmpUnreachName, IPS_DST_NAT, IPS_SRC_NAT, NF_HOOK_NAMES } from '../events/conntrack';

import pb = svctrace.v1;

function addr(a: string | null | undefined, port: number | null | undefined): string {
  return `${a ?? ''}:${port ?? 0}`;
}

function tupleText(t: pb.ITuple | null | undefined): string {
  return t ? `${addr(t.src, t.srcPort)} -> ${addr(t.dst, t.dstPort)}` : '?';
}

function hasRst(e: pb.IEvent): boolean {
  return e.packet?.protocol === pb.Protocol.PROTOCOL_TCP && /(^|\|)RST(\||$)/.test(e.tcpFlags ?? '');
}

function statusText(c: pb.IConntrack | null | undefined): string {
  if (!c) return '';
  return (c.statusNames?.length ? c.statusNames : ctStatusNames(c.status ?? 0)).join(',');
}

/** The event's one-line account. */
export function eventSummary(e: pb.IEvent): string {
  if (e.summary) return e.summary;
  return baseSummary(e) + tcpStateNote(e);
}

function baseSummary(e: pb.IEvent): string {
  const kind = e.kind ?? pb.EventKind.EVENT_KIND_UNSPECIFIED;
  const pkt = tupleText(e.packet);
  const rst = hasRst(e);
  if (rst && kind !== pb.EventKind.EVENT_KIND_ROUTE) {
    return `TCP RST from the ${e.direction === pb.Direction.DIRECTION_REPLY ? 'backend' : 'client'}: ${pkt}`;
  }
  if (e.packet?.protocol === pb.Protocol.PROTOCOL_ICMP && e.icmpType === 3 && kind !== pb.EventKind.EVENT_KIND_ROUTE) {
    return `ICMP destination unreachable (${icmpUnreachName(e.icmpCode ?? 0)}) sent to ${e.packet.dst ?? ''}`;
  }
  const flags = rst ? ' RST' : '';
  switch (kind) {
    case pb.EventKind.EVENT_KIND_NETFILTER:
      return netfilterSummary(e, pkt + flags);
    case pb.EventKind.EVENT_KIND_ROUTE: {
      const via = e.gateway ? `via ${e.gateway} ` : '';
      const t = e.routeTable ?? 0;
      const table = t === 254 ? 'main' : t === 255 ? 'local' : String(t);
      const to = e.direction === pb.Direction.DIRECTION_REPLY ? 'client' : 'backend';
      return `route to ${to} ${e.packet?.dst ?? ''}: ${via}dev ${e.device?.name || '?'} (table ${table})`;
    }
    case pb.EventKind.EVENT_KIND_DEV_XMIT:
    case pb.EventKind.EVENT_KIND_DEV_RECV: {
      const xmit = kind === pb.EventKind.EVENT_KIND_DEV_XMIT;
      const d = e.device ?? {};
      const ns = d.netns || `netns:${String(d.netnsInode ?? 0)}`;
      const linkKind = d.kind === 'vxlan' ? 'tunnel' : d.kind || 'device';
      const where = d.podSide ? ` in ${ns}` : '';
      const tunnel = d.kind !== 'vxlan' ? '' : xmit ? ' (VXLAN tunnel egress)' : ' (VXLAN tunnel ingress, decapsulated)';
      return `${xmit ? 'xmit' : 'recv'} ${d.name ?? ''} (${linkKind})${where}${tunnel}: ${pkt}${flags}`;
    }
    case pb.EventKind.EVENT_KIND_DROP: {
      const name = e.dropReasonName || String(e.dropReason ?? 0);
      // Where the kernel freed it: all a drop tells before Linux 5.17 (UNKNOWN), and what NOT_SPECIFIED means.
      const by = e.dropLocation ? `, freed by ${e.dropLocation}` : '';
      const at = e.device?.name ? ` at ${e.device.name}` : '';
      const ns = e.device?.netns ? ` in ${e.device.netns}` : '';
      return `${e.benignDrop ? 'freed' : 'DROPPED'} (${name}${by})${at}${ns}: ${pkt}`;
    }
    case pb.EventKind.EVENT_KIND_CT_DESTROY: {
      const c = e.conntrack;
      const state = c?.original?.protocol === pb.Protocol.PROTOCOL_TCP && c.tcpState ? ` in ${c.tcpState}` : '';
      return `conntrack entry destroyed${state} [${statusText(c)}]`;
    }
    case pb.EventKind.EVENT_KIND_FLOW_STATS: {
      const n = e.counters ?? {};
      const why = n.final ? `final, ${n.reason ?? ''}` : n.reason || 'periodic';
      return `counters (${why}): ${String(n.packetsOriginal ?? 0)} pkts/${String(n.bytesOriginal ?? 0)} B out, ${String(n.packetsReply ?? 0)} pkts/${String(n.bytesReply ?? 0)} B back${Number(n.drops ?? 0) ? `, ${String(n.drops)} dropped` : ''}${Number(n.synsResent ?? 0) ? `, SYN sent ${String(n.synsResent)} more time${Number(n.synsResent) === 1 ? '' : 's'}` : ''}`;
    }
    case pb.EventKind.EVENT_KIND_RULE_TRACE:
      return `kube-proxy rules: ${(e.rulePath ?? []).join(' -> ')}`;
    default:
      return `event kind ${kind}`;
  }
}

/**
 * A netfilter hook observation, told by the stage the flow model gave it
 * (classify decides; this only words it).
 */
function netfilterSummary(e: pb.IEvent, pkt: string): string {
  const hook = NF_HOOK_NAMES[(e.hook ?? 0) - 1] ?? `hook${(e.hook ?? 0) - 1}`;
  const at = `@ ${hook} ${e.priority ?? 0}`;
  const original = e.direction !== pb.Direction.DIRECTION_REPLY;
  const c = e.conntrack ?? {};
  const status = c.status ?? 0;
  const orig = c.original ?? {};
  const reply = c.reply ?? {};
  const p = e.packet ?? {};
  switch (e.stage) {
    case pb.Stage.STAGE_MATCH:
      return `matches ${e.service ?? ''} ${at}: ${pkt}, conntrack NEW`;
    case pb.Stage.STAGE_ARRIVE:
      return `before DNAT ${at}: ${pkt} [${statusText(c)}]`;
    case pb.Stage.STAGE_DNAT:
      if (!original) break;
      if (status & IPS_DST_NAT) {
        if (!e.afterNat) break;
        return `DNAT ${at}: ${addr(orig.dst, orig.dstPort)} -> backend ${addr(reply.src, reply.srcPort)}`;
      }
      // IPVS (kube-proxy IPVS mode): the entry points at the real server.
      if (destTranslated(status, { daddr: orig.dst ?? '', dport: orig.dstPort ?? 0 }, { saddr: reply.src ?? '', sport: reply.srcPort ?? 0 })) {
        return `DNAT by IPVS (seen ${at}): ${addr(orig.dst, orig.dstPort)} -> real server ${addr(reply.src, reply.srcPort)}`;
      }
      if (!e.afterNat) break;
      // In IPVS mode this is the normal way in: IPVS translates later, at
      // LOCAL_IN, and a "DNAT by IPVS" line follows.
      return `NOT DNATed ${at}: ${pkt} still goes to the service address (no kube-proxy NAT rule matched; in IPVS mode, IPVS translates it next)`;
    case pb.Stage.STAGE_SNAT:
      if (!e.afterNat || !original) break;
      return status & IPS_SRC_NAT
        ? `MASQUERADE/SNAT ${at}: backend sees ${addr(reply.dst, reply.dstPort)} (not the client ${addr(orig.src, orig.srcPort)})`
        : `no SNAT ${at}: backend sees the client ${addr(reply.dst, reply.dstPort)}`;
    case pb.Stage.STAGE_REPLY:
      if (e.afterNat && p.src === orig.dst && p.srcPort === orig.dstPort) {
        return `reply un-DNAT ${at}: source ${addr(reply.src, reply.srcPort)} rewritten to ${addr(p.src, p.srcPort)}, to ${addr(p.dst, p.dstPort)}`;
      }
      break;
  }
  const nat = hook === 'PRE_ROUTING' || hook === 'LOCAL_OUT' ? 'DNAT' : 'SNAT';
  return `${e.afterNat ? 'after' : 'before'} ${nat} ${at}: ${pkt} [${statusText(c)}]`;
}

/** Conntrack's TCP state moved with this event: " (conntrack TCP SYN_SENT -> SYN_RECV)". */
function tcpStateNote(e: pb.IEvent): string {
  const c = e.conntrack;
  return c?.tcpStateBefore ? ` (conntrack TCP ${c.tcpStateBefore} -> ${c.tcpState ?? ''})` : '';
}

const STAGE_LABEL: Record<number, string> = {
  [pb.Stage.STAGE_ARRIVE]: 'arrive',
  [pb.Stage.STAGE_MATCH]: 'match',
  [pb.Stage.STAGE_DNAT]: 'dnat',
  [pb.Stage.STAGE_SNAT]: 'snat',
  [pb.Stage.STAGE_ROUTE]: 'route',
  [pb.Stage.STAGE_DEVICE]: 'device',
  [pb.Stage.STAGE_REPLY]: 'reply',
  [pb.Stage.STAGE_DROP]: 'DROP',
  [pb.Stage.STAGE_CLOSE]: 'close',
};

/**
 * A timeline line's label. The drop stage holds three different things: a
 * packet the kernel dropped (DROP), a TCP reset (RESET: refused or aborted,
 * an answer), and an ICMP error about the flow (ICMP: e.g. port unreachable
 * from a REJECT rule).
 */
export function stageLabel(stage: number, ev: pb.IEvent): string {
  if (stage === pb.Stage.STAGE_DROP && ev.kind !== pb.EventKind.EVENT_KIND_DROP) {
    if (/\bRST\b/.test(ev.tcpFlags ?? '')) return 'RESET';
    if (ev.icmpType) return 'ICMP';
  }
  return STAGE_LABEL[stage] ?? '?';
}

/** A failure of the flow: a kernel drop (not a normal end of a packet's life), a TCP reset, an ICMP error. */
export function isFailureEvent(ev: pb.IEvent): boolean {
  return ev.stage === pb.Stage.STAGE_DROP && !ev.benignDrop;
}
