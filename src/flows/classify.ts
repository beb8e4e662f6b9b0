/**
 * Classifying one kernel event given its flow: which stage of a Service
 * request it shows, whether it is the flow's first time at that milestone,
 * and what it changes in the flow. Pure: it reads the flow and never
 * writes it; FlowTable applies the result.
 */
import { svctrace } from '../gen/svctrace';
import type { KernelEvent, RuleTrace } from '../events/decode';
import { Dir, EventKind, NfStage } from '../events/layout';
import { destTranslated, icmpUnreachName, IPS_CONFIRMED, IPS_DST_NAT, NF_HOOK_NAMES } from '../events/conntrack';
import type { Flow } from './types';
import { intern } from '../intern';

import pb = svctrace.v1;
const Stage = pb.Stage;

/** A packet's normal end, not a drop (the kernel reports these only with --all-packets: bpf/svctrace.bpf.c is_benign_free). */
export const BENIGN_DROPS = new Set(['QUEUE_PURGE', 'SOCKET_CLOSE', 'TCP_CLOSE']);

/** Names the classifier needs from outside the event. */
export interface ClassifyContext {
  /** A drop's reason by name (its kernel's enum skb_drop_reason). */
  dropReasonName: (reason: number) => string;
  /** What a drop is called in its flow: its reason, or where the kernel gives none, also the function that freed it. */
  dropName?: (e: KernelEvent) => string;
  netnsName?: (inode: number) => string | undefined;
}

/** What an event changes in its flow (and the table's counters). */
export interface FlowEffects {
  /** A TCP RST was seen (the flow's first one counts in the summary). */
  reset?: boolean;
  /** The reset came from the backend (reply direction). */
  backendReset?: boolean;
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
  /** The first time the flow reaches this milestone (what text output prints). */
  milestone: boolean;
  /** The milestone's key, remembered in flow.seen so it is reported once. */
  seenKey?: string;
  /** Device events: the device is in a pod's namespace, not the node's. */
  podSide?: boolean;
  effects: FlowEffects;
}

const NO_EFFECTS: FlowEffects = Object.freeze({});

/**
 * Device milestone keys (`dev:DIR:VERB:NAME:INODE`), made once per device,
 * direction and verb and shared (interned): a direct-mapped table by
 * ifindex, namespace inode, direction and verb, each slot checked against
 * what its key is made of (inode, direction and verb, name). Most events are device crossings; a
 * new string per event, flattened to be compared and hashed to be shared,
 * was about 6% of the model's time on short connections (bench/replay).
 */
const DEV_KEY_BITS = 9;
const devKeyIno = new Uint32Array(1 << DEV_KEY_BITS);
const devKeyCode = new Uint8Array(1 << DEV_KEY_BITS);
const devKeyName: string[] = new Array<string>(1 << DEV_KEY_BITS).fill('');
const devKeyText: string[] = new Array<string>(1 << DEV_KEY_BITS).fill('');

function devKey(e: KernelEvent, xmit: boolean): string {
  const code = e.dir * 2 + (xmit ? 1 : 0);
  // Pods' devices share ifindex and differ in the inode's low bits: both mixed into the top bits.
  const i = Math.imul(Math.imul(e.ifindex * 4 + code, 0x9e3779b1) ^ e.netnsIno, 0x85ebca6b) >>> (32 - DEV_KEY_BITS);
  // The key is made of inode, code and name: a slot holding all three holds it (an empty slot's name '' never matches a device).
  if (devKeyIno[i] === e.netnsIno && devKeyCode[i] === code && devKeyName[i] === e.ifname && devKeyText[i] !== '') return devKeyText[i]!;
  const text = intern(`dev:${e.dir}:${xmit ? 'xmit' : 'recv'}:${e.ifname}:${e.netnsIno}`);
  devKeyIno[i] = e.netnsIno;
  devKeyCode[i] = code;
  devKeyName[i] = e.ifname;
  devKeyText[i] = text;
  return text;
}

/** A milestone reported once per flow, under `key`. */
function once(f: Flow, key: string): { milestone: boolean; seenKey: string } {
  return { milestone: !f.seen.includes(key), seenKey: key };
}

/**
 * Stage, milestone and effects of one event of flow `f` (after its
 * conntrack state was updated). No text: the account of an event is
 * rendered at the edge from the wire event (output/event-summary), and this
 * runs for every event.
 */
export function classifyEvent(f: Flow, e: KernelEvent, ctx: ClassifyContext): Classification {
  if (e.pkt.proto === 6 && e.tcpFlags & 0x04 && e.kind !== EventKind.FIB) {
    return { stage: Stage.STAGE_DROP, milestone: !f.reset, effects: e.dir === Dir.REPLY ? { reset: true, backendReset: true } : { reset: true } };
  }
  if (e.pkt.proto === 1 && e.icmpType === 3 && e.kind !== EventKind.FIB) {
    const m = once(f, `icmp:${e.icmpCode}`);
    return { stage: Stage.STAGE_DROP, ...m, effects: m.milestone ? { icmpError: icmpUnreachName(e.icmpCode) } : NO_EFFECTS };
  }
  switch (e.kind) {
    case EventKind.NF:
      return classifyNf(f, e);
    case EventKind.FIB:
      return { stage: Stage.STAGE_ROUTE, ...once(f, `route:${e.dir}:${e.pkt.daddr}:${e.ifname}`), effects: NO_EFFECTS };
    case EventKind.DEV_XMIT:
    case EventKind.DEV_RECV: {
      const podSide = f.nodeNetnsIno !== 0 && e.netnsIno !== f.nodeNetnsIno;
      const delivered = podSide && e.dir === Dir.ORIGINAL && e.kind === EventKind.DEV_RECV;
      return {
        stage: Stage.STAGE_DEVICE,
        ...once(f, devKey(e, e.kind === EventKind.DEV_XMIT)),
        podSide,
        effects: delivered ? { backendNetns: ctx.netnsName?.(e.netnsIno) ?? `netns:${e.netnsIno}` } : NO_EFFECTS,
      };
    }
    case EventKind.DROP: {
      if (BENIGN_DROPS.has(ctx.dropReasonName(e.reason))) return { stage: Stage.STAGE_DROP, milestone: false, effects: NO_EFFECTS };
      const name = ctx.dropName?.(e) ?? ctx.dropReasonName(e.reason);
      return { stage: Stage.STAGE_DROP, ...once(f, `drop:${name}`), effects: { drop: name } };
    }
    case EventKind.CT_DESTROY:
      return { stage: Stage.STAGE_CLOSE, milestone: !f.closed, effects: { closed: true } };
    default:
      return { stage: Stage.STAGE_UNSPECIFIED, milestone: false, effects: NO_EFFECTS };
  }
}

const PRE_ROUTING = NF_HOOK_NAMES.indexOf('PRE_ROUTING');
const LOCAL_OUT = NF_HOOK_NAMES.indexOf('LOCAL_OUT');

/** A netfilter hook event: before/after NAT, on the way in or back. */
function classifyNf(f: Flow, e: KernelEvent): Classification {
  const before = e.nfStage === NfStage.BEFORE_NAT;
  const dnatHook = e.nfHook === PRE_ROUTING || e.nfHook === LOCAL_OUT;
  const translated = destTranslated(e.ctStatus, e.ctOrig, e.ctReply);
  // IPVS translates after NAT's hooks (at LOCAL_IN for a client elsewhere,
  // then re-sends the packet through LOCAL_OUT; just after NAT on LOCAL_OUT
  // for one on the node): the first hook that sees the entry translated
  // without conntrack's DST_NAT reports it.
  if (e.dir === Dir.ORIGINAL && translated && !(e.ctStatus & IPS_DST_NAT) && !f.seen.includes('dnat')) {
    return { stage: Stage.STAGE_DNAT, milestone: true, seenKey: 'dnat', effects: NO_EFFECTS };
  }
  if (e.dir === Dir.ORIGINAL && dnatHook && before) {
    if (!(e.ctStatus & IPS_CONFIRMED)) return { stage: Stage.STAGE_MATCH, ...once(f, 'match'), effects: NO_EFFECTS };
    return { stage: Stage.STAGE_ARRIVE, milestone: false, effects: NO_EFFECTS };
  }
  if (e.dir === Dir.ORIGINAL && dnatHook) {
    return { stage: Stage.STAGE_DNAT, ...once(f, translated ? 'dnat' : 'no-dnat'), effects: NO_EFFECTS };
  }

  if (e.dir === Dir.ORIGINAL && !before) return { stage: Stage.STAGE_SNAT, ...once(f, 'snat'), effects: NO_EFFECTS };
  if (e.dir === Dir.REPLY && !before && e.pkt.saddr === e.ctOrig.daddr && e.pkt.sport === e.ctOrig.dport) {
    return { stage: Stage.STAGE_REPLY, ...once(f, 'reply'), effects: NO_EFFECTS };
  }
  return { stage: e.dir === Dir.REPLY ? Stage.STAGE_REPLY : dnatHook ? Stage.STAGE_DNAT : Stage.STAGE_SNAT, milestone: false, effects: NO_EFFECTS };
}

/** Conntrack's TCP state moved with this event: the state it left, or 0. */
export function tcpStateLeft(e: KernelEvent, prevState: number, newState: number): number {
  if (e.kind !== EventKind.NF || e.ctOrig.proto !== 6 || newState === prevState || prevState === 0) return 0;
  return prevState;
}

/**
 * The kube-proxy rule path in one traced packet's nftables trace messages:
 * from the NAT base chain to the chain that DNATed (kube-proxy's filter
 * chains and the SNAT chains after it are other stages), or undefined.
 */
/** Names of svctrace's own nftables tables that mark new connections for tracing (pipeline/rule-marker). */
export const MARKER_TABLE_PREFIX = 'svctrace_';

/** enum nft_trace_types and the netfilter verdict of a trace message (see events/decode RuleTrace). */
const NFT_TRACETYPE_POLICY = 1;
const NFT_TRACETYPE_RULE = 3;
const NF_DROP_VERDICT = 0;

export function rulePathOf(group: RuleTrace[]): { path: string[]; table: string; masquerade: boolean; summary: string; droppedBy?: string } | undefined {
  const path: string[] = [];
  let masquerade = false;
  let table = '';
  // The rule whose verdict ended the packet (DROP, or REJECT, which drops
  // after answering): in any table, e.g. kube-proxy's filter KUBE-SERVICES
  // that REJECTs a Service without endpoints, or a NetworkPolicy chain.
  let dropped: RuleTrace | undefined;
  for (const t of group) {
    if (t.table.startsWith(MARKER_TABLE_PREFIX)) continue; // our own marking table
    if (!dropped && t.verdict === NF_DROP_VERDICT && (t.type === NFT_TRACETYPE_RULE || t.type === NFT_TRACETYPE_POLICY)) dropped = t;
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
  const droppedBy = dropped
    ? `table ${dropped.table} chain ${dropped.chain} ${dropped.type === NFT_TRACETYPE_POLICY ? '(its policy)' : `rule handle ${String(dropped.ruleHandle)}`}`
    : undefined;
  if (!path.length && !droppedBy) return undefined;
  const taken = path.length ? `kube-proxy rules taken (observed, nftables trace, table ${table}): ${path.join(' -> ')}${masquerade ? ' (marked for masquerade)' : ''}` : 'rules taken (observed, nftables trace)';
  const summary = droppedBy ? `${taken}; dropped or rejected by ${droppedBy}` : taken;
  return { path, table, masquerade, summary, droppedBy };
}

/** The summary of a rule path known without tracing (inferred from the DNAT target). */
export function inferredRulePathSummary(path: string[], why: string): string {
  return `kube-proxy rules (inferred from the DNAT target; ${why}): ${path.join(' -> ')}`;
}
