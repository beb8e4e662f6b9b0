/**
 * The flow model: correlates kernel events from every hook into one flow per
 * connection (one conntrack entry), classifies each event into the stages of
 * a Service request, and keeps per-flow state, counters and timeline.
 *
 * Keys: the nf_conn kernel address the BPF side reports (ct_id); conntrack
 * DESTROY messages from netlink carry no address, so they find their flow by
 * (namespace, original tuple). A kernel address can be reused after the
 * entry dies, so a NEW entry at a known address starts a new flow.
 */
import { svctrace } from '../gen/svctrace';
import { FlowStatsRecord, KernelEvent, RuleTrace, Tuple } from '../events/decode';
import { Dir, EventKind, NfStage, StatsReason } from '../events/layout';
import { ctStatusNames, IPS_CONFIRMED, IPS_DST_NAT, IPS_SRC_NAT, NF_HOOK_NAMES, PROTO_NAMES, TCP_CT_STATES } from '../events/conntrack';
import { wallNs } from '../clock';
import { ServiceSpec } from '../net/ipv4';
import { longFromBigint, protoTuple, toProtoEvent } from './to-proto';

import pb = svctrace.v1;
const Stage = pb.Stage;

/** Drop reasons that are normal end-of-life of a packet, not failures. */
export const BENIGN_DROPS = new Set(['QUEUE_PURGE', 'SOCKET_CLOSE', 'TCP_CLOSE']);

export interface TimelineEntry {
  tsNs: bigint;
  stage: pb.Stage;
  summary: string;
  /** First occurrence of this milestone in the flow (what text output prints). */
  milestone: boolean;
  /** Conntrack's TCP state moved with this packet. */
  stateChange?: boolean;
  /** Overrides the stage's label in text output. */
  label?: string;
}

export interface Flow {
  id: number;
  key: string;
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
  nodeNetnsIno: number;
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
  /** The counters are the flow's last (it ended: closed, address reused, or expired). */
  countersFinal: boolean;
  firstTsNs: bigint;
  lastTsNs: bigint;
  closed: boolean;
  closedTsNs?: bigint;
  drops: string[];
  reset: boolean;
  icmpErrors: string[];
  /** The kube-proxy chains the first packet went through (nftables trace), when observed. */
  rulePath: string[];
  timeline: TimelineEntry[];
  /** Milestones already reported, e.g. 'dnat', 'dev:0:veth2:123'. */
  seen: Set<string>;
}

export interface Ingested {
  flow: Flow;
  event: pb.IEvent;
  entry: TimelineEntry;
}

export interface FlowTableOptions {
  services: ServiceSpec[];
  dropReasons?: Record<string, string>;
  netnsName?: (inode: number) => string | undefined;
  /** How long a closed flow stays before it is expired (default 5 s). */
  closeGraceMs?: number;
  /** Flows with no event for this long are expired (default 10 min). */
  idleMs?: number;
  /** At most this many flows are kept; the oldest go first (default 20k). */
  maxFlows?: number;
  /** Milestones kept per flow (default 64); counters keep counting. */
  maxTimeline?: number;
}

export interface FlowSummary {
  flows: number;
  closed: number;
  perBackend: Record<string, number>;
  dropsByReason: Record<string, number>;
  resets: number;
  /** Flows removed from the table to stay under maxFlows (their later events start new flows). */
  evicted: number;
}

function sameTuple(a: Tuple, b: Tuple): boolean {
  return a.sport === b.sport && a.dport === b.dport && a.saddr === b.saddr && a.daddr === b.daddr && a.proto === b.proto;
}

export function tupleKey(t: Tuple): string {
  return `${t.proto}|${t.saddr}:${t.sport}>${t.daddr}:${t.dport}`;
}

export function endpoint(addr: string, port: number): string {
  return `${addr}:${port}`;
}

export function serviceLabel(s: ServiceSpec): string {
  return `${s.address ?? '*'}:${s.port}/${s.proto}`;
}

export class FlowTable {
  private readonly byKey = new Map<string, Flow>();
  private readonly byTuple = new Map<string, Flow>();
  private nextId = 1;
  private readonly opts: Required<Omit<FlowTableOptions, 'netnsName' | 'dropReasons'>> & Pick<FlowTableOptions, 'netnsName'>;
  private readonly dropReasons: Record<string, string>;
  private readonly summaryCounters: FlowSummary = { flows: 0, closed: 0, perBackend: {}, dropsByReason: {}, resets: 0, evicted: 0 };

  constructor(opts: FlowTableOptions) {
    this.opts = {
      services: opts.services,
      netnsName: opts.netnsName,
      closeGraceMs: opts.closeGraceMs ?? 5000,
      idleMs: opts.idleMs ?? 600_000,
      maxFlows: opts.maxFlows ?? 20_000,
      maxTimeline: opts.maxTimeline ?? 64,
    };
    this.dropReasons = opts.dropReasons ?? {};
  }

  get size(): number {
    return this.byKey.size;
  }

  flows(): Flow[] {
    return [...this.byKey.values()];
  }

  summary(): FlowSummary {
    return structuredClone(this.summaryCounters);
  }

  private serviceName(id: number): string {
    const s = this.opts.services[id - 1];
    return s ? serviceLabel(s) : `service#${id}`;
  }

  dropReasonName(reason: number): string {
    return this.dropReasons[String(reason)] ?? `reason ${reason}`;
  }

  /**
   * Ingests a batch; events are processed in kernel-timestamp order, after
   * the batch's flow counters (absolute values: a flow's final counters are
   * in place before its close event).
   */
  ingest(events: KernelEvent[], stats: FlowStatsRecord[] = []): Ingested[] {
    const sorted = events.length > 1 ? [...events].sort((a, b) => (a.tsNs < b.tsNs ? -1 : a.tsNs > b.tsNs ? 1 : 0)) : events;
    const out: Ingested[] = [];
    for (const r of stats) {
      const i = this.applyStats(r);
      if (i) out.push(i);
    }
    for (const e of sorted) {
      const r = this.ingestOne(e);
      if (r) out.push(r);
      // A rule trace that was waiting for this flow goes right after its first event.
      if (this.deferred.length) out.push(...this.deferred.splice(0));
    }
    return out;
  }

  private readonly deferred: Ingested[] = [];

  /**
   * A flow's counters from the kernel. A flow whose events never arrived
   * (they did not fit the ring buffer) is created from its counters, so it
   * is still counted and shown.
   */
  private applyStats(r: FlowStatsRecord): Ingested | undefined {
    const key = `ct:${r.ctId}`;
    let f = this.byKey.get(key);
    if (f && !sameTuple(f.orig, r.orig)) {
      if (r.reason !== StatsReason.REUSED) return undefined; // a newer flow holds the address
      // The old flow's final account, after its events: it was already replaced.
      return undefined;
    }
    if (!f) {
      if (r.reason === StatsReason.REUSED || r.reason === StatsReason.EXPIRED) return undefined; // long gone from the table
      f = this.newFlowFromStats(key, r);
    }
    f.packets = [r.packets[0], r.packets[1]];
    f.bytes = [r.bytes[0], r.bytes[1]];
    f.kernelDrops = r.drops;
    if (r.lastNs > f.lastTsNs) f.lastTsNs = r.lastNs;
    const final = r.reason !== StatsReason.PERIODIC;
    if (final) f.countersFinal = true;
    const entry: TimelineEntry = { tsNs: r.tsNs, stage: Stage.STAGE_UNSPECIFIED, summary: '', milestone: false };
    const event: pb.IEvent = {
      tsNs: longFromBigint(wallNs(r.tsNs)),
      kind: pb.EventKind.EVENT_KIND_FLOW_STATS,
      flowId: f.id,
      service: f.service,
      direction: pb.Direction.DIRECTION_ORIGINAL,
      packet: protoTuple(f.orig),
      conntrack: { id: f.ctId },
      counters: {
        packetsOriginal: r.packets[0],
        bytesOriginal: r.bytes[0],
        packetsReply: r.packets[1],
        bytesReply: r.bytes[1],
        drops: r.drops,
        final,
        reason: STATS_REASON_NAMES[r.reason] ?? String(r.reason),
      },
    };
    if (f.dnat) event.backend = endpoint(f.reply.saddr, f.reply.sport);
    return { flow: f, event, entry };
  }

  private newFlowFromStats(key: string, r: FlowStatsRecord): Flow {
    const f = this.newFlow(key, { netnsIno: r.netnsIno, serviceId: r.serviceId, tsNs: r.firstNs, kind: EventKind.NF, ctReply: r.orig, ctId: r.ctId }, r.orig);
    f.nodeNetnsIno = r.netnsIno;
    return f;
  }

  private newFlow(key: string, e: Pick<KernelEvent, 'netnsIno' | 'serviceId' | 'tsNs' | 'kind' | 'ctReply' | 'ctId'>, orig: Tuple): Flow {
    if (this.byKey.size >= this.opts.maxFlows) this.evictOldest();
    const tupleIndexKey = `${e.netnsIno}|${tupleKey(orig)}`;
    const f: Flow = {
      id: this.nextId++,
      key,
      tupleIndexKey,
      service: this.serviceName(e.serviceId),
      serviceId: e.serviceId,
      proto: orig.proto,
      orig,
      reply: e.ctReply.proto ? e.ctReply : orig,
      ctId: e.ctId,
      nodeNetnsIno: e.kind === EventKind.NF ? e.netnsIno : 0,
      status: 0,
      tcpState: 0,
      dnat: false,
      masqueraded: false,
      packets: [0, 0],
      bytes: [0, 0],
      kernelDrops: 0,
      countersFinal: false,
      firstTsNs: e.tsNs,
      lastTsNs: e.tsNs,
      closed: false,
      drops: [],
      reset: false,
      icmpErrors: [],
      rulePath: [],
      timeline: [],
      seen: new Set(),
    };
    this.byKey.set(key, f);
    this.byTuple.set(tupleIndexKey, f);
    this.summaryCounters.flows++;
    return f;
  }

  /** Rule traces that arrived before their flow's first kernel event, by tuple index key. */
  private readonly pendingTraces = new Map<string, { at: number; traces: RuleTrace[] }>();

  /**
   * Ingests nftables trace messages: the rule path of each traced packet
   * becomes one RULE_TRACE event of its flow (the first packet's only).
   */
  ingestRuleTraces(traces: RuleTrace[], nowMs = Date.now()): Ingested[] {
    for (const [k, v] of this.pendingTraces) if (nowMs - v.at > 5000) this.pendingTraces.delete(k);
    const byTrace = new Map<number, RuleTrace[]>();
    for (const t of traces) byTrace.set(t.traceId, [...(byTrace.get(t.traceId) ?? []), t]);
    const out: Ingested[] = [];
    for (const group of byTrace.values()) {
      const first = group[0]!;
      if (!first.pkt.proto) continue;
      const key = `${first.netnsIno}|${tupleKey(first.pkt)}`;
      const f = this.byTuple.get(key);
      if (!f) {
        const p = this.pendingTraces.get(key) ?? { at: nowMs, traces: [] };
        p.traces.push(...group);
        if (this.pendingTraces.size < 10_000) this.pendingTraces.set(key, p);
        continue;
      }
      const r = this.attachRuleTrace(f, group);
      if (r) out.push(r);
    }
    return out;
  }

  /**
   * A rule path known without tracing (iptables-legacy rules are not
   * nftables rules): inferred from the DNAT target and the node's rules.
   */
  inferRulePath(f: Flow, path: string[], why: string): Ingested | undefined {
    if (f.rulePath.length || !path.length) return undefined;
    f.rulePath = path;
    return this.ruleEvent(f, f.lastTsNs, `kube-proxy rules (inferred from the DNAT target; ${why}): ${path.join(' -> ')}`, path);
  }

  private attachRuleTrace(f: Flow, group: RuleTrace[]): Ingested | undefined {
    if (f.rulePath.length) return undefined; // only the first packet's path
    const path: string[] = [];
    let masq = false;
    let table = '';
    for (const t of group) {
      if (t.table.startsWith('svctrace_')) continue; // our own marking table
      if (t.table !== 'nat' && t.table !== 'kube-proxy') continue;
      if (/^(KUBE-MARK-MASQ|mark-for-masquerade)$/.test(t.chain)) {
        masq = true;
        continue;
      }
      table ||= t.table;
      if (path.at(-1) !== t.chain) path.push(t.chain);
    }
    // From the NAT base chain to the chain that DNATed (kube-proxy's filter
    // chains and the SNAT chains after it are other stages).
    const start = Math.max(0, path.findIndex((c) => /^(nat-|PREROUTING$|OUTPUT$)/.test(c)));
    const dnatAt = path.findIndex((c) => /^(KUBE-SEP-|endpoint-)/.test(c));
    path.splice(dnatAt >= 0 ? dnatAt + 1 : path.length);
    path.splice(0, start);
    if (!path.length) return undefined;
    f.rulePath = path;
    const summary = `kube-proxy rules taken (observed, nftables trace, table ${table}): ${path.join(' -> ')}${masq ? ' (marked for masquerade)' : ''}`;
    return this.ruleEvent(f, group[0]!.tsNs, summary, path);
  }

  private ruleEvent(f: Flow, tsNs: bigint, summary: string, path: string[]): Ingested {
    const entry: TimelineEntry = { tsNs, stage: Stage.STAGE_DNAT, summary, milestone: true, label: 'rules' };
    if (f.timeline.length < this.opts.maxTimeline) f.timeline.push(entry);
    const event: pb.IEvent = {
      tsNs: longFromBigint(wallNs(tsNs)),
      kind: pb.EventKind.EVENT_KIND_RULE_TRACE,
      flowId: f.id,
      service: f.service,
      stage: Stage.STAGE_DNAT,
      summary,
      direction: pb.Direction.DIRECTION_ORIGINAL,
      packet: { src: f.orig.saddr, dst: f.orig.daddr, srcPort: f.orig.sport, dstPort: f.orig.dport, protocol: f.orig.proto as pb.Protocol },
      rulePath: path,
    };
    if (f.dnat) event.backend = endpoint(f.reply.saddr, f.reply.sport);
    return { flow: f, event, entry };
  }

  private evictOldest(): void {
    const first = this.byKey.values().next();
    if (!first.done) {
      this.remove(first.value);
      this.summaryCounters.evicted++;
    }
  }

  private remove(f: Flow): void {
    this.byKey.delete(f.key);
    if (this.byTuple.get(f.tupleIndexKey) === f) this.byTuple.delete(f.tupleIndexKey);
  }

  private flowFor(e: KernelEvent): Flow | undefined {
    if (e.kind === EventKind.CT_DESTROY) {
      // A miss means the flow was already expired or evicted.
      return this.byTuple.get(`${e.netnsIno}|${tupleKey(e.ctOrig)}`);
    }
    if (e.ctId) {
      const key = `ct:${e.ctId}`;
      const f = this.byKey.get(key);
      const isNewEntry = e.kind === EventKind.NF && !(e.ctStatus & IPS_CONFIRMED);
      const sameEntry = f && (e.ctOrig.proto === 0 || sameTuple(e.ctOrig, f.orig));
      if (f && sameEntry && !(f.closed && isNewEntry)) return f;
      if (f) this.remove(f); // the address was reused by a new entry
      if (e.kind !== EventKind.NF && e.kind !== EventKind.DROP) return undefined; // nothing to anchor a new flow on
      return this.newFlow(key, e, e.ctOrig.proto ? e.ctOrig : e.pkt);
    }
    // A packet dropped before conntrack kept an entry: a flow of its own.
    const key = `pkt:${tupleKey(e.pkt)}`;
    return this.byKey.get(key) ?? this.newFlow(key, e, e.pkt);
  }

  private ingestOne(e: KernelEvent): Ingested | undefined {
    const f = this.flowFor(e);
    if (!f) return undefined;
    const pending = this.pendingTraces.get(f.tupleIndexKey);
    if (pending && !f.rulePath.length) {
      this.pendingTraces.delete(f.tupleIndexKey);
      const r = this.attachRuleTrace(f, pending.traces);
      if (r) this.deferred.push(r);
    }
    if (e.tsNs > f.lastTsNs) f.lastTsNs = e.tsNs;
    const prevTcpState = f.tcpState;
    if (e.kind === EventKind.NF) this.updateConntrack(f, e);
    const c = this.classify(f, e);
    let { summary, milestone } = c;
    let stateChange = false;
    const stage = c.stage;
    // Conntrack's TCP state machine moving is a transition worth a line.
    if (e.kind === EventKind.NF && e.ctOrig.proto === 6 && f.tcpState !== prevTcpState && prevTcpState !== 0) {
      summary += ` (conntrack TCP ${TCP_CT_STATES[prevTcpState] ?? prevTcpState} -> ${TCP_CT_STATES[f.tcpState] ?? f.tcpState})`;
      milestone = true;
      stateChange = true;
    }
    const entry: TimelineEntry = { tsNs: e.tsNs, stage, summary, milestone, stateChange };
    // The timeline keeps milestones only (what a person reads); every event
    // still goes out through the returned Ingested. Bounded per flow.
    if (milestone && f.timeline.length < this.opts.maxTimeline) {
      // Keep the timeline in kernel order even when batches interleave.
      let i = f.timeline.length;
      while (i > 0 && f.timeline[i - 1]!.tsNs > e.tsNs) i--;
      f.timeline.splice(i, 0, entry);
    }
    const netnsName = this.opts.netnsName?.(e.netnsIno);
    const event = toProtoEvent(e, {
      flowId: f.id,
      service: f.service,
      stage,
      summary,
      netnsName,
      dropReasonName: e.kind === EventKind.DROP ? this.dropReasonName(e.reason) : undefined,
      backend: f.dnat ? endpoint(f.reply.saddr, f.reply.sport) : undefined,
      backendNetns: f.backendNetns,
    });
    if (e.kind === EventKind.DROP && BENIGN_DROPS.has(this.dropReasonName(e.reason))) event.benignDrop = true;
    return { flow: f, event, entry };
  }

  private updateConntrack(f: Flow, e: KernelEvent): void {
    f.status = e.ctStatus;
    f.reply = e.ctReply;
    if (e.ctOrig.proto === 6) f.tcpState = e.ctTcpState;
    if (!f.nodeNetnsIno) f.nodeNetnsIno = e.netnsIno;
    const wasDnat = f.dnat;
    f.dnat = (e.ctStatus & IPS_DST_NAT) !== 0;
    f.masqueraded = (e.ctStatus & IPS_SRC_NAT) !== 0;
    if (f.dnat && !wasDnat) {
      const b = endpoint(e.ctReply.saddr, e.ctReply.sport);
      this.summaryCounters.perBackend[b] = (this.summaryCounters.perBackend[b] ?? 0) + 1;
    }
    // Packets and bytes are counted in the kernel (applyStats), not here:
    // established packets do not reach user space one by one.
  }

  /** Stage, summary and whether this is a first-time milestone of the flow. */
  private classify(f: Flow, e: KernelEvent): { stage: pb.Stage; summary: string; milestone: boolean } {
    const once = (key: string) => {
      if (f.seen.has(key)) return false;
      f.seen.add(key);
      return true;
    };
    const pkt = `${e.pkt.saddr}:${e.pkt.sport} -> ${e.pkt.daddr}:${e.pkt.dport}`;
    const flags = e.pkt.proto === 6 && e.tcpFlags & 0x04 ? ' RST' : '';
    if (e.pkt.proto === 6 && e.tcpFlags & 0x04 && e.kind !== EventKind.FIB) {
      const first = !f.reset;
      if (first) this.summaryCounters.resets++;
      f.reset = true;
      const who = e.dir === Dir.REPLY ? 'backend' : 'client';
      return { stage: Stage.STAGE_DROP, summary: `TCP RST from the ${who}: ${pkt}`, milestone: first };
    }
    if (e.pkt.proto === 1 && e.icmpType === 3 && e.kind !== EventKind.FIB) {
      const what = ICMP_UNREACH[e.icmpCode] ?? `code ${e.icmpCode}`;
      const first = once(`icmp:${e.icmpCode}`);
      if (first) f.icmpErrors.push(what);
      return { stage: Stage.STAGE_DROP, summary: `ICMP destination unreachable (${what}) sent to ${e.pkt.daddr}`, milestone: first };
    }
    switch (e.kind) {
      case EventKind.NF:
        return this.classifyNf(f, e, once, pkt + flags);
      case EventKind.FIB: {
        const via = e.gateway ? `via ${e.gateway} ` : '';
        const table = e.reason === 254 ? 'main' : e.reason === 255 ? 'local' : String(e.reason);
        const to = e.dir === Dir.REPLY ? 'client' : 'backend';
        return {
          stage: Stage.STAGE_ROUTE,
          summary: `route to ${to} ${e.pkt.daddr}: ${via}dev ${e.ifname || '?'} (table ${table})`,
          milestone: once(`route:${e.dir}:${e.pkt.daddr}:${e.ifname}`),
        };
      }
      case EventKind.DEV_XMIT:
      case EventKind.DEV_RECV: {
        const verb = e.kind === EventKind.DEV_XMIT ? 'xmit' : 'recv';
        const ns = this.opts.netnsName?.(e.netnsIno) ?? `netns:${e.netnsIno}`;
        const kind = e.linkKind === 'vxlan' ? 'tunnel' : e.linkKind || 'device';
        const inPod = f.nodeNetnsIno !== 0 && e.netnsIno !== f.nodeNetnsIno;
        if (inPod && e.dir === Dir.ORIGINAL && e.kind === EventKind.DEV_RECV) f.backendNetns = ns;
        const where = inPod ? ` in ${ns}` : '';
        const tunnel = e.linkKind !== 'vxlan' ? '' : e.kind === EventKind.DEV_XMIT ? ' (VXLAN tunnel egress)' : ' (VXLAN tunnel ingress, decapsulated)';
        return {
          stage: Stage.STAGE_DEVICE,
          summary: `${verb} ${e.ifname} (${kind})${where}${tunnel}: ${pkt}${flags}`,
          milestone: once(`dev:${e.dir}:${verb}:${e.ifname}:${e.netnsIno}`),
        };
      }
      case EventKind.DROP: {
        const name = this.dropReasonName(e.reason);
        const benign = BENIGN_DROPS.has(name);
        if (!benign) {
          f.drops.push(name);
          this.summaryCounters.dropsByReason[name] = (this.summaryCounters.dropsByReason[name] ?? 0) + 1;
        }
        const ns = this.opts.netnsName?.(e.netnsIno);
        return {
          stage: Stage.STAGE_DROP,
          summary: `${benign ? 'freed' : 'DROPPED'} (${name})${e.ifname ? ` at ${e.ifname}` : ''}${ns ? ` in ${ns}` : ''}: ${pkt}`,
          milestone: !benign && once(`drop:${name}`),
        };
      }
      case EventKind.CT_DESTROY: {
        const first = !f.closed;
        if (first) {
          f.closed = true;
          f.closedTsNs = e.tsNs;
          this.summaryCounters.closed++;
        }
        const state = e.ctOrig.proto === 6 ? ` in ${TCP_CT_STATES[e.ctTcpState] ?? e.ctTcpState}` : '';
        return { stage: Stage.STAGE_CLOSE, summary: `conntrack entry destroyed${state} [${ctStatusNames(e.ctStatus).join(',')}]`, milestone: first };
      }
      default:
        return { stage: Stage.STAGE_UNSPECIFIED, summary: `event kind ${e.kind}`, milestone: false };
    }
  }

  private classifyNf(f: Flow, e: KernelEvent, once: (k: string) => boolean, pkt: string): { stage: pb.Stage; summary: string; milestone: boolean } {
    const hook = NF_HOOK_NAMES[e.nfHook] ?? `hook${e.nfHook}`;
    const at = `@ ${hook} ${e.nfPriority}`;
    const before = e.nfStage === NfStage.BEFORE_NAT;
    const dnatHook = hook === 'PRE_ROUTING' || hook === 'LOCAL_OUT';
    const status = ctStatusNames(e.ctStatus).join(',');
    if (e.dir === Dir.ORIGINAL && dnatHook && before) {
      if (!(e.ctStatus & IPS_CONFIRMED)) {
        return {
          stage: Stage.STAGE_MATCH,
          summary: `matches ${f.service} ${at}: ${pkt}, conntrack NEW`,
          milestone: once('match'),
        };
      }
      return { stage: Stage.STAGE_ARRIVE, summary: `before DNAT ${at}: ${pkt} [${status}]`, milestone: false };
    }
    if (e.dir === Dir.ORIGINAL && dnatHook && !before) {
      if (e.ctStatus & IPS_DST_NAT) {
        return {
          stage: Stage.STAGE_DNAT,
          summary: `DNAT ${at}: ${e.ctOrig.daddr}:${e.ctOrig.dport} -> backend ${e.ctReply.saddr}:${e.ctReply.sport}`,
          milestone: once('dnat'),
        };
      }
      return {
        stage: Stage.STAGE_DNAT,
        summary: `NOT DNATed ${at}: ${pkt} still goes to the service address (no kube-proxy rule matched)`,
        milestone: once('no-dnat'),
      };
    }
    if (e.dir === Dir.ORIGINAL && !dnatHook && !before) {
      const seen = `${e.ctReply.daddr}:${e.ctReply.dport}`;
      const summary =
        e.ctStatus & IPS_SRC_NAT
          ? `MASQUERADE/SNAT ${at}: backend sees ${seen} (not the client ${e.ctOrig.saddr}:${e.ctOrig.sport})`
          : `no SNAT ${at}: backend sees the client ${seen}`;
      return { stage: Stage.STAGE_SNAT, summary, milestone: once('snat') };
    }
    if (e.dir === Dir.REPLY && !before && e.pkt.saddr === e.ctOrig.daddr && e.pkt.sport === e.ctOrig.dport) {
      return {
        stage: Stage.STAGE_REPLY,
        summary: `reply un-DNAT ${at}: source ${e.ctReply.saddr}:${e.ctReply.sport} rewritten to ${e.pkt.saddr}:${e.pkt.sport}, to ${e.pkt.daddr}:${e.pkt.dport}`,
        milestone: once('reply'),
      };
    }
    const nat = dnatHook ? 'DNAT' : 'SNAT';
    return {
      stage: e.dir === Dir.REPLY ? Stage.STAGE_REPLY : dnatHook ? Stage.STAGE_DNAT : Stage.STAGE_SNAT,
      summary: `${before ? 'before' : 'after'} ${nat} ${at}: ${pkt} [${status}]`,
      milestone: false,
    };
  }

  /** Removes flows closed longer than the grace period or idle too long; returns them. */
  expire(nowNs: bigint): Flow[] {
    const graceNs = BigInt(this.opts.closeGraceMs) * 1_000_000n;
    const idleNs = BigInt(this.opts.idleMs) * 1_000_000n;
    const gone: Flow[] = [];
    for (const f of this.byKey.values()) {
      if ((f.closed && f.closedTsNs !== undefined && nowNs - f.closedTsNs >= graceNs) || nowNs - f.lastTsNs >= idleNs) gone.push(f);
    }
    for (const f of gone) this.remove(f);
    return gone;
  }
}

const STATS_REASON_NAMES: Record<number, string> = {
  [StatsReason.PERIODIC]: 'periodic',
  [StatsReason.CLOSED]: 'closed',
  [StatsReason.REUSED]: 'reused',
  [StatsReason.EXPIRED]: 'expired',
};

/** ICMP destination-unreachable codes (RFC 792/1122), as REJECT sends them. */
const ICMP_UNREACH: Record<number, string> = {
  0: 'net unreachable',
  1: 'host unreachable',
  3: 'port unreachable',
  9: 'net prohibited',
  10: 'host prohibited',
  13: 'administratively prohibited',
};

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
  };
}
