/**
 * Classifying one kernel event given its flow: which stage of a Service
 * request it shows, its one-line summary, whether it is the flow's first
 * time at that milestone, and what it changes in the flow. Pure: it reads
 * the flow and never writes it; FlowTable applies the result.
 */
import { svctrace } from '../gen/svctrace';
import type { KernelEvent, RuleTrace } from '../events/decode';
import { Dir, EventKind, NfStage } from '../events/layout';
import { ctStatusNames, IPS_CONFIRMED, IPS_DST_NAT, IPS_SRC_NAT, NF_HOOK_NAMES, TCP_CT_STATES } from '../events/conntrack';
import type { Flow } from './types';

import pb = svctrace.v1;
const Stage = pb.Stage;

/** Drop reasons that are normal end-of-life of a packet, not failures. */
export const BENIGN_DROPS = new Set(['QUEUE_PURGE', 'SOCKET_CLOSE', 'TCP_CLOSE']);

/** ICMP destination-unreachable codes (RFC 792/1122), as REJECT sends them. */
const ICMP_UNREACH: Record<number, string> = {
  0: 'net unreachable',
  1: 'host unreachable',
  3: 'port unreachable',
  9: 'net prohibited',
  10: 'host prohibited',
  13: 'administratively prohibited',
};

/** Names the classifier needs from outside the event. */
export interface ClassifyContext {
  dropReasonName: (reason: number) => string;
  netnsName?: (inode: number) => string | undefined;
}

/** What an event changes in its flow (and the table's counters). */
export interface FlowEffects {
  /** A TCP RST was seen (the flow's first one counts in the summary). */
  reset?: boolean;
  /** An ICMP error kind seen for the first time in this flow. */
  icmpError?: string;
  /** A drop that is a failure (not a benign free), by reason name. */
  drop?: string;
  /** The pod namespace the request was delivered into. */
  backendNetns?: string;
  /** Conntrack destroyed the entry. */
  closed?: boolean;
}

export interface Classification {
  stage: pb.Stage;
  summary: string;
  /** The first time the flow reaches this milestone (what text output prints). */
  milestone: boolean;
  /** The milestone's key, remembered in flow.seen so it is reported once. */
  seenKey?: string;
  effects: FlowEffects;
}

/** A milestone reported once per flow, under `key`. */
function once(f: Flow, key: string): { milestone: boolean; seenKey: string } {
  return { milestone: !f.seen.has(key), seenKey: key };
}

/** Stage, summary, milestone and effects of one event of flow `f` (after its conntrack state was updated). */
export function classifyEvent(f: Flow, e: KernelEvent, ctx: ClassifyContext): Classification {
  const pkt = `${e.pkt.saddr}:${e.pkt.sport} -> ${e.pkt.daddr}:${e.pkt.dport}`;
  const flags = e.pkt.proto === 6 && e.tcpFlags & 0x04 ? ' RST' : '';
  if (e.pkt.proto === 6 && e.tcpFlags & 0x04 && e.kind !== EventKind.FIB) {
    const who = e.dir === Dir.REPLY ? 'backend' : 'client';
    return { stage: Stage.STAGE_DROP, summary: `TCP RST from the ${who}: ${pkt}`, milestone: !f.reset, effects: { reset: true } };
  }
  if (e.pkt.proto === 1 && e.icmpType === 3 && e.kind !== EventKind.FIB) {
    const what = ICMP_UNREACH[e.icmpCode] ?? `code ${e.icmpCode}`;
    const m = once(f, `icmp:${e.icmpCode}`);
    return { stage: Stage.STAGE_DROP, summary: `ICMP destination unreachable (${what}) sent to ${e.pkt.daddr}`, ...m, effects: m.milestone ? { icmpError: what } : {} };
  }
  switch (e.kind) {
    case EventKind.NF:
      return { ...classifyNf(f, e, pkt + flags), effects: {} };
    case EventKind.FIB: {
      const via = e.gateway ? `via ${e.gateway} ` : '';
      const table = e.reason === 254 ? 'main' : e.reason === 255 ? 'local' : String(e.reason);
      const to = e.dir === Dir.REPLY ? 'client' : 'backend';
      return {
        stage: Stage.STAGE_ROUTE,
        summary: `route to ${to} ${e.pkt.daddr}: ${via}dev ${e.ifname || '?'} (table ${table})`,
        ...once(f, `route:${e.dir}:${e.pkt.daddr}:${e.ifname}`),
        effects: {},
      };
    }
    case EventKind.DEV_XMIT:
    case EventKind.DEV_RECV: {
      const verb = e.kind === EventKind.DEV_XMIT ? 'xmit' : 'recv';
      const ns = ctx.netnsName?.(e.netnsIno) ?? `netns:${e.netnsIno}`;
      const kind = e.linkKind === 'vxlan' ? 'tunnel' : e.linkKind || 'device';
      const inPod = f.nodeNetnsIno !== 0 && e.netnsIno !== f.nodeNetnsIno;
      const where = inPod ? ` in ${ns}` : '';
      const tunnel = e.linkKind !== 'vxlan' ? '' : e.kind === EventKind.DEV_XMIT ? ' (VXLAN tunnel egress)' : ' (VXLAN tunnel ingress, decapsulated)';
      return {
        stage: Stage.STAGE_DEVICE,
        summary: `${verb} ${e.ifname} (${kind})${where}${tunnel}: ${pkt}${flags}`,
        ...once(f, `dev:${e.dir}:${verb}:${e.ifname}:${e.netnsIno}`),
        effects: inPod && e.dir === Dir.ORIGINAL && e.kind === EventKind.DEV_RECV ? { backendNetns: ns } : {},
      };
    }
    case EventKind.DROP: {
      const name = ctx.dropReasonName(e.reason);
      const benign = BENIGN_DROPS.has(name);
      const ns = ctx.netnsName?.(e.netnsIno);
      const summary = `${benign ? 'freed' : 'DROPPED'} (${name})${e.ifname ? ` at ${e.ifname}` : ''}${ns ? ` in ${ns}` : ''}: ${pkt}`;
      if (benign) return { stage: Stage.STAGE_DROP, summary, milestone: false, effects: {} };
      return { stage: Stage.STAGE_DROP, summary, ...once(f, `drop:${name}`), effects: { drop: name } };
    }
    case EventKind.CT_DESTROY: {
      const state = e.ctOrig.proto === 6 ? ` in ${TCP_CT_STATES[e.ctTcpState] ?? e.ctTcpState}` : '';
      return { stage: Stage.STAGE_CLOSE, summary: `conntrack entry destroyed${state} [${ctStatusNames(e.ctStatus).join(',')}]`, milestone: !f.closed, effects: { closed: true } };
    }
    default:
      return { stage: Stage.STAGE_UNSPECIFIED, summary: `event kind ${e.kind}`, milestone: false, effects: {} };
  }
}

/** A netfilter hook event: before/after NAT, on the way in or back. */
function classifyNf(f: Flow, e: KernelEvent, pkt: string): { stage: pb.Stage; summary: string; milestone: boolean; seenKey?: string } {
  const hook = NF_HOOK_NAMES[e.nfHook] ?? `hook${e.nfHook}`;
  const at = `@ ${hook} ${e.nfPriority}`;
  const before = e.nfStage === NfStage.BEFORE_NAT;
  const dnatHook = hook === 'PRE_ROUTING' || hook === 'LOCAL_OUT';
  const status = ctStatusNames(e.ctStatus).join(',');
  if (e.dir === Dir.ORIGINAL && dnatHook && before) {
    if (!(e.ctStatus & IPS_CONFIRMED)) {
      return { stage: Stage.STAGE_MATCH, summary: `matches ${f.service} ${at}: ${pkt}, conntrack NEW`, ...once(f, 'match') };
    }
    return { stage: Stage.STAGE_ARRIVE, summary: `before DNAT ${at}: ${pkt} [${status}]`, milestone: false };
  }
  if (e.dir === Dir.ORIGINAL && dnatHook && !before) {
    if (e.ctStatus & IPS_DST_NAT) {
      return { stage: Stage.STAGE_DNAT, summary: `DNAT ${at}: ${e.ctOrig.daddr}:${e.ctOrig.dport} -> backend ${e.ctReply.saddr}:${e.ctReply.sport}`, ...once(f, 'dnat') };
    }
    return { stage: Stage.STAGE_DNAT, summary: `NOT DNATed ${at}: ${pkt} still goes to the service address (no kube-proxy rule matched)`, ...once(f, 'no-dnat') };
  }
  if (e.dir === Dir.ORIGINAL && !dnatHook && !before) {
    const seen = `${e.ctReply.daddr}:${e.ctReply.dport}`;
    const summary =
      e.ctStatus & IPS_SRC_NAT
        ? `MASQUERADE/SNAT ${at}: backend sees ${seen} (not the client ${e.ctOrig.saddr}:${e.ctOrig.sport})`
        : `no SNAT ${at}: backend sees the client ${seen}`;
    return { stage: Stage.STAGE_SNAT, summary, ...once(f, 'snat') };
  }
  if (e.dir === Dir.REPLY && !before && e.pkt.saddr === e.ctOrig.daddr && e.pkt.sport === e.ctOrig.dport) {
    return {
      stage: Stage.STAGE_REPLY,
      summary: `reply un-DNAT ${at}: source ${e.ctReply.saddr}:${e.ctReply.sport} rewritten to ${e.pkt.saddr}:${e.pkt.sport}, to ${e.pkt.daddr}:${e.pkt.dport}`,
      ...once(f, 'reply'),
    };
  }
  const nat = dnatHook ? 'DNAT' : 'SNAT';
  return {
    stage: e.dir === Dir.REPLY ? Stage.STAGE_REPLY : dnatHook ? Stage.STAGE_DNAT : Stage.STAGE_SNAT,
    summary: `${before ? 'before' : 'after'} ${nat} ${at}: ${pkt} [${status}]`,
    milestone: false,
  };
}

/**
 * Conntrack's TCP state moving with this event (a transition worth a line):
 * the note to append to the summary, or undefined.
 */
export function tcpStateChangeNote(e: KernelEvent, prevState: number, newState: number): string | undefined {
  if (e.kind !== EventKind.NF || e.ctOrig.proto !== 6 || newState === prevState || prevState === 0) return undefined;
  return ` (conntrack TCP ${TCP_CT_STATES[prevState] ?? prevState} -> ${TCP_CT_STATES[newState] ?? newState})`;
}

/**
 * The kube-proxy rule path in one traced packet's nftables trace messages:
 * from the NAT base chain to the chain that DNATed (kube-proxy's filter
 * chains and the SNAT chains after it are other stages), or undefined.
 */
export function rulePathOf(group: RuleTrace[]): { path: string[]; table: string; masquerade: boolean; summary: string } | undefined {
  const path: string[] = [];
  let masquerade = false;
  let table = '';
  for (const t of group) {
    if (t.table.startsWith('svctrace_')) continue; // our own marking table
    if (t.table !== 'nat' && t.table !== 'kube-proxy') continue;
    if (/^(KUBE-MARK-MASQ|mark-for-masquerade)$/.test(t.chain)) {
      masquerade = true;
      continue;
    }
    table ||= t.table;
    if (path.at(-1) !== t.chain) path.push(t.chain);
  }
  const start = Math.max(0, path.findIndex((c) => /^(nat-|PREROUTING$|OUTPUT$)/.test(c)));
  const dnatAt = path.findIndex((c) => /^(KUBE-SEP-|endpoint-)/.test(c));
  path.splice(dnatAt >= 0 ? dnatAt + 1 : path.length);
  path.splice(0, start);
  if (!path.length) return undefined;
  const summary = `kube-proxy rules taken (observed, nftables trace, table ${table}): ${path.join(' -> ')}${masquerade ? ' (marked for masquerade)' : ''}`;
  return { path, table, masquerade, summary };
}

/** The summary of a rule path known without tracing (inferred from the DNAT target). */
export function inferredRulePathSummary(path: string[], why: string): string {
  return `kube-proxy rules (inferred from the DNAT target; ${why}): ${path.join(' -> ')}`;
}
