/**
 * The flow table: correlates kernel events from every hook into one flow per
 * connection (one conntrack entry), keeps per-flow state, counters and
 * timeline, and expires and caps flows. What each event means is decided in
 * ./classify (pure); this module indexes and applies.
 *
 * Keys: the nf_conn kernel address the BPF side reports (ct_id); conntrack
 * DESTROY messages from netlink carry no address, so they find their flow by
 * (namespace, original tuple). A kernel address can be reused after the
 * entry dies, so a NEW entry at a known address starts a new flow.
 */
import { svctrace } from '../gen/svctrace';
import { FlowStatsRecord, KernelEvent, RuleTrace, Tuple } from '../events/decode';
import { Dir, EventKind, StatsReason } from '../events/layout';
import { destTranslated, IPS_CONFIRMED, IPS_DST_NAT, IPS_SEEN_REPLY, IPS_SRC_NAT } from '../events/conntrack';
import { wallNs } from '../clock';
import { formatLocation } from '../events/kallsyms';
import { dropName } from '../events/drop-name';
import { TCP_CT_STATES } from '../events/conntrack';
import { EventContext, longFromBigint, protoTuple } from './to-proto';
import { KernelIngested, StatsIngested } from './ingested';
import { BENIGN_DROPS, Classification, classifyEvent, inferredRulePathSummary, MARKER_TABLE_PREFIX, rulePathOf, tcpStateLeft } from './classify';
import { serviceLabelById } from './service-ids';
import { endpoint, flat, internKey, sameTuple, tupleKey } from './tuple';
import { flowTableLost, type Flow, type FlowSummary, type FlowTableOptions, type FlowTableView, type Ingested, type TimelineEntry } from './types';

import pb = svctrace.v1;
const Stage = pb.Stage;

/**
 * When a flow's rule path was taken. A trace message is stamped when our
 * socket reads it, usually a fraction of a millisecond after the packet
 * crossed the rules, often after the flow's next events ("+0.602ms rules"
 * above "+0.029ms route"). A path through NAT's chains is a connection's
 * first packet's (NAT sees nothing else), which crossed our first hook,
 * just before NAT's, at the flow's first event: the path goes there. Only
 * when read soon after (RULE_TRACE_REDATE_NS): a SYN sent again after the
 * first was lost unconfirmed takes NAT's chains too, a second (TCP's first
 * timeout) or more later, and a path read late may be another packet's.
 * Otherwise, and for paths that did not cross NAT (a UDP datagram sent
 * again before any reply, through the filter table only), the message's
 * own time is kept.
 */
const RULE_TRACE_REDATE_NS = 500_000_000n;
function ruleTraceTime(f: Flow, traceTsNs: bigint, r: { table: string; path: string[] }): bigint {
  const throughNat = r.table === 'nat' ? r.path.length > 0 : r.path.some((c) => c.startsWith('nat-'));
  const since = traceTsNs - f.firstTsNs;
  return throughNat && since >= 0n && since < RULE_TRACE_REDATE_NS ? f.firstTsNs : traceTsNs;
}

export class FlowTable implements FlowTableView {
  /** By nf_conn address (KernelEvent.ctKey), or `pkt:` tuple key for a packet dropped before conntrack kept an entry. */
  private readonly byKey = new Map<number | string, Flow>();
  private readonly byTuple = new Map<string, Flow>();
  /** Flows retired by address reuse or evicted by the cap, not yet taken by the pipeline (bounded: taken after every batch). */
  private retired: Flow[] = [];
  /** Flows by their packets as the backend receives them (after DNAT and SNAT): traces from a pod's namespace find their flow here. */
  private readonly byBackendTuple = new Map<string, Flow>();
  private nextId = 1;
  private readonly opts: Required<Omit<FlowTableOptions, 'netnsName' | 'dropReasons' | 'deliveredThrough' | 'dropLocations' | 'nodeNetnsIno'>> &
    Pick<FlowTableOptions, 'netnsName' | 'deliveredThrough' | 'dropLocations' | 'nodeNetnsIno'>;
  /** deliveredThrough, read at most once per ingested batch. */
  private deliveredThroughNow?: bigint;
  private readonly dropReasons: Record<string, string>;
  private readonly summaryCounters: FlowSummary = { flows: 0, closed: 0, perBackend: {}, dropsByReason: {}, dropFlowsByReason: {}, packetsDropped: 0, resets: 0, evicted: 0, lateCounters: 0, orphanEvents: 0, ruleTracesNotKept: 0, countedOnly: 0 };
  /** Rule traces that were waiting for a flow, emitted right after its first event. */
  private readonly deferred: Ingested[] = [];
  /** Flows of entries older than the one at their address, made from their late records (see olderEntryFlow). */
  private readonly olderEntries = new Map<string, Flow>();
  /** Keys in summaryCounters.perBackend. */
  private backendKeys = 0;
  /** Rule traces that arrived before their flow's first kernel event, by tuple index key. */
  private readonly pendingTraces = new Map<string, PendingTraces>();
  /** The same, keyed as the backend receives the packet (a trace from a pod's namespace that came before its flow's DNAT). */
  private readonly pendingBackendTraces = new Map<string, PendingTraces>();

  constructor(opts: FlowTableOptions) {
    this.opts = {
      services: opts.services,
      netnsName: opts.netnsName,
      closeGraceMs: opts.closeGraceMs ?? 2000,
      idleMs: opts.idleMs ?? 600_000,
      maxFlows: opts.maxFlows ?? 20_000,
      deliveredThrough: opts.deliveredThrough,
      dropLocations: opts.dropLocations,
      nodeNetnsIno: opts.nodeNetnsIno,
    };
    this.dropReasons = opts.dropReasons ?? {};
  }

  /** Flows evicted by the cap so far (read on every status: no summary copy). */
  get evicted(): number {
    return this.summaryCounters.evicted;
  }

  /** What the table lost (the flow_table stage): see flowTableLost. */
  get lost(): number {
    return flowTableLost(this.summaryCounters);
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

  /** Packets of traced flows the kernel dropped so far, repeats included (FlowSummary.packetsDropped). */
  get packetsDropped(): number {
    return this.summaryCounters.packetsDropped;
  }

  /** Drops reported per reason so far (a copy): what each Status carries, without a copy of the whole summary. */
  dropsByReason(): Record<string, number> {
    return { ...this.summaryCounters.dropsByReason };
  }

  private readonly serviceLabels = new Map<number, string>();

  /** One label string per service id, shared by its flows. */
  private serviceLabel(id: number): string {
    let l = this.serviceLabels.get(id);
    if (l === undefined) {
      l = flat(serviceLabelById(this.opts.services, id));
      if (this.serviceLabels.size < 1024) this.serviceLabels.set(id, l);
    }
    return l;
  }

  dropReasonName(reason: number): string {
    return this.dropReasons[String(reason)] ?? `reason ${reason}`;
  }

  /** What a drop is called in its flow and the summary (events/drop-name). */
  dropName(e: KernelEvent): string {
    return dropName(this.dropReasonName(e.reason), this.dropLocation(e));
  }

  /**
   * Ingests a batch: its events and flow counters together, in kernel-
   * timestamp order, counters first on a tie (the addon gives a destroy's
   * final counters the destroy's time: they are in place before its close
   * event). A TCP connection's end (ENDED) is written right after the
   * event of its last packet, and a short connection's whole life can be
   * one batch: its counters then come after the events that made its flow.
   */
  ingest(events: KernelEvent[], stats: FlowStatsRecord[] = []): Ingested[] {
    const sorted = events.length > 1 ? [...events].sort(byTs) : events;
    const counters = stats.length > 1 ? [...stats].sort(byTs) : stats;
    const out: Ingested[] = [];
    this.deliveredThroughNow = undefined;
    let next = 0;
    for (const e of sorted) {
      for (; next < counters.length && counters[next]!.tsNs <= e.tsNs; next++) {
        const i = this.applyStats(counters[next]!);
        if (i) out.push(i);
      }
      const r = this.ingestOne(e);
      if (r) out.push(r);
      // A rule trace that was waiting for this flow goes right after its first event.
      if (this.deferred.length) out.push(...this.deferred.splice(0));
    }
    for (; next < counters.length; next++) {
      const i = this.applyStats(counters[next]!);
      if (i) out.push(i);
      // What counters found (a drop at the backend, known from its NAT) goes out with them, not with a later batch's event.
      if (this.deferred.length) out.push(...this.deferred.splice(0));
    }
    return out;
  }

  /**
   * A flow's counters from the kernel. A flow whose events never arrived
   * (they did not fit the ring buffer) is created from its counters, so it
   * is still counted and shown.
   */
  private applyStats(r: FlowStatsRecord): Ingested | undefined {
    const key = r.ctKey;
    let f = this.byKey.get(key);
    if (f && f.ctBirth !== 0 && f.ctBirth !== r.ctBirth) f = this.olderEntries.get(olderEntryKey(key, r.ctBirth)) ?? f;
    // Counters of an earlier entry at a reused address never touch a newer
    // flow (the kernel writes them before the new entry's first event, so
    // the earlier flow, still in the table then, got them).
    let detached = false;
    if (f && (!sameTuple(f.orig, r.orig) || (f.ctBirth !== 0 && f.ctBirth !== r.ctBirth))) {
      // Another entry's record. The flow at the address ended before that
      // entry began; or, older, is left be and the record's flow is made
      // apart (when it is one to make: see unseen). A record of a flow seen
      // before is a late one, handled below like any other.
      if (this.unseen(r)) {
        if (r.firstNs > f.firstTsNs) this.retire(f, r.firstNs);
        else detached = true;
      }
      f = undefined;
    }
    if (!f && !this.unseen(r)) {
      // A flow that was here and left. A record that repeats its end's
      // counters (nothing counted since: the address reused by a new
      // entry, a snapshot of the kernel's state) tells nothing new. A
      // packet counted after its end (the last ACK often comes after
      // conntrack's TIME_WAIT; a resent FIN) makes the kernel write the
      // end again: it goes to the flow the sinks already have, if it left
      // recently; else it is counted lost.
      if (r.endSent && r.reason !== StatsReason.ENDED) return undefined;
      f = this.endedFlow(r);
      if (!f) {
        this.summaryCounters.lateCounters++;
        return undefined;
      }
    }
    if (!f) {
      // A counted-only connection known by its end alone (the kernel's one
      // record of it): it is over, and nothing more is owed of it (its
      // destroy sends nothing), so it goes to the sinks as ended and never
      // into the table. A busy node's short connections are mostly these;
      // each one's stay, indexed and aged out, cost more than its record.
      if (r.reason === StatsReason.ENDED && r.countedOnly && !r.delivered) detached = true;
      f = this.newFlow(key, { netnsIno: r.netnsIno, serviceId: r.serviceId, tsNs: r.firstNs, kind: EventKind.NF, ctReply: r.orig, ctId: r.ctId, ctBirth: r.ctBirth }, r.orig, !detached);
    }
    f.ctBirth = r.ctBirth;
    if (r.countedOnly && !f.countedOnly) {
      f.countedOnly = true;
      this.summaryCounters.countedOnly++;
    }
    // A flow no hook event told about (counted only, or its events lost):
    // its NAT result comes with its counters; and so do its resets.
    if (f.status === 0 && r.reply.proto) this.natFromCounters(f, r.reply);
    // A reply packet counted is a reply conntrack saw (the kernel counts
    // after conntrack, ICMP errors apart), whatever the events said: a flow
    // whose reply events did not reach it (made from counters that came
    // ahead of a lagging ring, or an older entry's final counters) is not
    // an unanswered one. Judged unanswered, it was a broken reply path
    // (seen in the fault catalogue's IPVS column under load).
    if (r.packets[1] > 0) f.status |= IPS_SEEN_REPLY;
    if (f.countedOnly) this.stateFromCounters(f, r);
    // The record's own pairs (made for it, never changed after): no copy.
    f.packets = r.packets;
    f.bytes = r.bytes;
    // The kernel counts every drop of the flow and reports a run of drops at
    // one place once: its counter is the packets' number.
    if (r.drops > f.kernelDrops) this.summaryCounters.packetsDropped += r.drops - f.kernelDrops;
    f.kernelDrops = r.drops;
    f.synsResent = r.synsResent;
    if (r.lastNs > f.lastTsNs) f.lastTsNs = r.lastNs;
    const final = r.reason !== StatsReason.PERIODIC;
    if (final) f.countersFinal = true;
    // The entry is gone: destroyed, or replaced by a new one (whose destroy
    // is then not reported), or older than the entry now at its address.
    // (Expired state is only idle: it may go on.)
    // (A counted-only connection's end, ENDED, is its TCP state's: see stateFromCounters.)
    // (ENDED closes any flow: its events said TIME_WAIT or CLOSE first,
    // unless they were lost, and the kernel writes no REUSED after an end.)
    if ((r.reason === StatsReason.CLOSED || r.reason === StatsReason.REUSED || r.reason === StatsReason.ENDED || detached) && !f.closed) {
      f.closed = true;
      f.closedTsNs = r.tsNs;
      this.summaryCounters.closed++;
    }
    if (detached) {
      this.retired.push(f); // to the sinks as ended, never in the table
      this.rememberEnded(f);
    }
    const entry: TimelineEntry = { tsNs: r.tsNs, stage: Stage.STAGE_UNSPECIFIED, milestone: false };
    // Its wire event is made only if a sink reads it: a counted-only flow
    // is its counter records, and most are only modelled or streamed.
    return new StatsIngested(f, entry, r, f.backend, STATS_REASON_NAMES[r.reason] ?? String(r.reason));
  }

  /**
   * Whether a record of a flow not in the table is the first we hear of
   * that flow: no record of it reached the ring buffer before (the kernel's
   * `delivered`), or some did and are still in the ring (the record came by
   * netlink, ahead of a lagging ring). Otherwise the flow was here and left
   * (closed, expired, evicted): its late record is not a new flow. (A
   * TIME_WAIT entry's destroy comes two minutes after its flow closed.)
   */
  private unseen(r: FlowStatsRecord): boolean {
    if (!r.delivered) return true;
    if (!this.opts.deliveredThrough) return false;
    this.deliveredThroughNow ??= this.opts.deliveredThrough();
    return r.lastNs > this.deliveredThroughNow;
  }

  /** A flow, counted; in the table unless `indexed` is false (then the caller hands it to the sinks). */
  private newFlow(key: number | string, e: Pick<KernelEvent, 'netnsIno' | 'serviceId' | 'tsNs' | 'kind' | 'ctReply' | 'ctId' | 'ctBirth'>, orig: Tuple, indexed = true): Flow {
    if (indexed && this.byKey.size >= this.opts.maxFlows) this.evictOldest();
    const tupleIndexKey = flat(`${e.netnsIno}|${tupleKey(orig)}`);
    const f: Flow = {
      id: this.nextId++,
      key,
      tupleIndexKey,
      service: this.serviceLabel(e.serviceId),
      serviceId: e.serviceId,
      proto: orig.proto,
      orig,
      reply: e.ctReply.proto ? e.ctReply : orig,
      ctId: e.ctId,
      ctBirth: e.ctBirth,
      nodeNetnsIno: e.kind === EventKind.NF ? e.netnsIno : 0,
      status: 0,
      tcpState: 0,
      dnat: false,
      masqueraded: false,
      packets: [0, 0],
      bytes: [0, 0],
      kernelDrops: 0,
      synsResent: 0,
      countersFinal: false,
      firstTsNs: e.tsNs,
      lastTsNs: e.tsNs,
      closed: false,
      // Shared until the flow has one of its own (see NONE).
      drops: NONE,
      reset: false,
      icmpErrors: NONE,
      rulePath: NONE,
      seen: NONE,
      countedOnly: false,
      // The optional fields too, from the start: every flow then has one
      // shape, and the model's and the encoder's reads of flows stay fast
      // (flows that gained fields in different orders had a dozen shapes).
      backend: undefined,
      backendOf: undefined,
      backendKey: undefined,
      backendNetns: undefined,
      closedTsNs: undefined,
      replyDrops: undefined,
      backendReset: undefined,
      backendRefused: undefined,
      ruleTraces: undefined,
      backendDropRule: undefined,
      wire: undefined,
    };
    if (indexed) {
      this.byKey.set(key, f);
      this.byTuple.set(tupleIndexKey, f);
    }
    this.summaryCounters.flows++;
    return f;
  }

  /**
   * Ingests nftables trace messages: the rule path of each traced packet
   * becomes one RULE_TRACE event of its flow (the first packet's only).
   */
  ingestRuleTraces(traces: RuleTrace[], nowMs = Date.now()): Ingested[] {
    this.expirePendingTraces(nowMs);
    const byTrace = new Map<number, RuleTrace[]>();
    for (const t of traces) {
      // Our own marking table's trace tells nothing of the path (rulePathOf skips it): not kept while waiting.
      if (t.table.startsWith(MARKER_TABLE_PREFIX)) continue;
      const group = byTrace.get(t.traceId);
      if (group) group.push(t);
      else byTrace.set(t.traceId, [t]);
    }
    const out: Ingested[] = [];
    for (const group of byTrace.values()) {
      const first = group[0]!;
      if (!first.pkt.proto) continue;
      const key = `${first.netnsIno}|${tupleKey(first.pkt)}`;
      const f = this.byTuple.get(key);
      if (!f) {
        // A packet traced where the backend receives it (a traced pod's
        // namespace): only a rule that dropped it is news there.
        const atBackend = this.byBackendTuple.get(tupleKey(first.pkt));
        if (atBackend) {
          const r = this.attachBackendDrop(atBackend, group);
          if (r) out.push(r);
          continue;
        }
        const dropped = !!rulePathOf(group)?.droppedBy;
        const node = this.opts.nodeNetnsIno?.();
        // Traced in a pod's namespace (another traced one): only a drop is
        // news there, and waits below, by the backend's key; the path of a
        // packet that went through is not (most of a pod's traffic).
        const atNode = node === undefined || first.netnsIno === node;
        let kept = false;
        if (atNode) {
          // One packet's traces wait (its path is the flow's): a later packet
          // of the same tuple (a retransmitted SYN, or a new connection reusing
          // the ports of one whose events were lost) takes the place.
          const p = this.pendingTraces.get(key);
          if (p && p.traces[0]!.traceId === first.traceId) p.traces.push(...group);
          else if (p || this.pendingTraces.size < PENDING_TRACE_GROUPS_MAX) {
            // Inserted anew, at the end: the map stays in arrival order (expireOldest).
            if (p) this.pendingTraces.delete(key);
            this.pendingTraces.set(key, { at: nowMs, tsNs: first.tsNs, traces: group });
          }
          kept = this.pendingTraces.has(key);
        }
        // Or it was traced where the backend receives it, before its flow's
        // DNAT reached us: only a group with a drop verdict waits (parking
        // every group held tens of MB in a storm).
        if (dropped) {
          const backendKey = tupleKey(first.pkt);
          const had = this.pendingBackendTraces.delete(backendKey); // anew, at the end (expireOldest)
          if (had || this.pendingBackendTraces.size < PENDING_TRACE_GROUPS_MAX) {
            this.pendingBackendTraces.set(backendKey, { at: nowMs, tsNs: first.tsNs, traces: group });
            kept = true;
          }
        }
        // News (a node's path, a drop anywhere) with no room to wait: lost, counted.
        if (!kept && (atNode || dropped)) this.summaryCounters.ruleTracesNotKept++;
        continue;
      }
      const r = this.attachRuleTrace(f, group, nowMs);
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
    return this.ruleEvent(f, f.lastTsNs, inferredRulePathSummary(path, why), path);
  }

  private attachBackendDrop(f: Flow, group: RuleTrace[]): Ingested | undefined {
    if (f.backendDropRule) return undefined;
    const by = rulePathOf(group)?.droppedBy;
    if (!by) return undefined;
    f.backendDropRule = by;
    const where = this.opts.netnsName?.(group[0]!.netnsIno) ?? `netns ${group[0]!.netnsIno}`;
    return this.ruleEvent(f, group[0]!.tsNs, `dropped or rejected where the backend receives it (${where}, nftables trace): ${by}`, []);
  }

  private attachRuleTrace(f: Flow, group: RuleTrace[], nowMs = Date.now()): Ingested | undefined {
    // Only the first traced packet's path. The rest of that packet's trace,
    // read in a later batch, completes it (a REJECT in the filter table
    // after the nat table's chains): the path is then told again, whole.
    const earlier = f.ruleTraces?.traces;
    const samePacket = earlier !== undefined && earlier[0]!.traceId === group[0]!.traceId;
    if (f.rulePath.length && !samePacket) return undefined;
    const traces = samePacket ? [...earlier, ...group] : group;
    f.ruleTraces = { traces, atMs: nowMs };
    const r = rulePathOf(traces);
    if (!r) return undefined;
    f.rulePath = r.path;
    return this.ruleEvent(f, ruleTraceTime(f, traces[0]!.tsNs, r), r.summary, r.path);
  }

  private ruleEvent(f: Flow, tsNs: bigint, summary: string, path: string[]): Ingested {
    const entry: TimelineEntry = { tsNs, stage: Stage.STAGE_DNAT, milestone: true, label: 'rules' };
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
    if (f.backend) event.backend = f.backend;
    return { flow: f, event, entry };
  }

  /**
   * The table is at its cap: its oldest flow leaves it, counted (flow_table),
   * and goes to the sinks like an expired one, marked, so that `-o flows`
   * still shows it and the metrics do not judge it unanswered.
   */
  private evictOldest(): void {
    const first = this.byKey.values().next();
    if (!first.done) {
      const f = first.value;
      this.remove(f);
      this.summaryCounters.evicted++;
      f.evicted = true;
      this.retired.push(f);
      // Its connection may go on in the kernel: its periodic counters still
      // reach it while it is remembered, else each is counted lost.
      this.rememberEnded(f);
    }
  }

  /**
   * A new conntrack entry took the address of this flow's: its connection
   * is over (a refused one is destroyed at once, and the next takes its
   * place within microseconds). It leaves the table now, as an ended flow
   * the pipeline hands to its sinks (takeRetired), instead of vanishing:
   * `explain --watch` and the metrics count it. Kept for the grace period
   * like other closed flows, these filled the table to its cap in a storm.
   */
  private retire(f: Flow, tsNs: bigint): void {
    if (!f.closed) {
      f.closed = true;
      f.closedTsNs = tsNs;
      this.summaryCounters.closed++;
    }
    this.remove(f);
    this.retired.push(f);
    this.rememberEnded(f); // its own late counters (a destroy after the new entry's first packet) still find it
  }

  /** Entries in each index: each must hold only flows still in the table (memory bounded by the cap). */
  indexSizes(): { byKey: number; byTuple: number; byBackendTuple: number } {
    return { byKey: this.byKey.size, byTuple: this.byTuple.size, byBackendTuple: this.byBackendTuple.size };
  }

  /** Flows that ended because their address was reused, since the last call (see retire). */
  takeRetired(): Flow[] {
    return this.retired.splice(0);
  }

  private remove(f: Flow): void {
    this.byKey.delete(f.key);
    if (this.byTuple.get(f.tupleIndexKey) === f) this.byTuple.delete(f.tupleIndexKey);
    this.forgetBackendTuple(f);
  }

  private forgetBackendTuple(f: Flow): void {
    if (f.backendKey && this.byBackendTuple.get(f.backendKey) === f) this.byBackendTuple.delete(f.backendKey);
    f.backendKey = undefined;
  }

  /** Indexes a flow by the tuple its backend receives; a trace from there that came first is attached now. */
  private indexBackendTuple(f: Flow, r: Tuple): void {
    this.forgetBackendTuple(f);
    // A flow handed to the sinks without a stay in the table (see
    // applyStats) is in no index: the indexes hold only the table's flows.
    if (this.byKey.get(f.key) !== f) return;
    const k = tupleKey({ saddr: r.daddr, daddr: r.saddr, sport: r.dport, dport: r.sport, proto: r.proto });
    f.backendKey = k;
    this.byBackendTuple.set(k, f);
    const pending = this.pendingBackendTraces.get(k);
    if (pending) {
      this.pendingBackendTraces.delete(k);
      const dropped = this.attachBackendDrop(f, pending.traces);
      if (dropped) this.deferred.push(dropped);
    }
  }

  private flowFor(e: KernelEvent): Flow | undefined {
    if (e.kind === EventKind.CT_DESTROY) {
      // A miss means the flow was already expired or evicted.
      return this.byTuple.get(`${e.netnsIno}|${tupleKey(e.ctOrig)}`);
    }
    if (e.ctKey) {
      const key = e.ctKey;
      const f = this.byKey.get(key);
      // The birth is the kernel state's at the address when the record was
      // written: a packet dropped before a new entry got its state carries
      // the old entry's birth with the new entry's tuple. A tuple says no first.
      if (f && e.ctBirth && f.ctBirth && (e.ctOrig.proto === 0 || sameTuple(e.ctOrig, f.orig))) {
        // The kernel says which entry each is: no guessing. Another
        // entry's record is of a newer one (the ring is in order), unless
        // the flow here was made from final counters that came by netlink
        // ahead of a lagging ring: then the record is an older entry's, a
        // flow already ended (olderEntryFlow).
        if (e.ctBirth === f.ctBirth) return f;
        if (e.tsNs < f.firstTsNs) return this.olderEntryFlow(key, e);
        this.retire(f, e.tsNs);
        return this.newFlowAt(key, e);
      }
      const isNewEntry = e.kind === EventKind.NF && !(e.ctStatus & IPS_CONFIRMED);
      const sameEntry = f && (e.ctOrig.proto === 0 || sameTuple(e.ctOrig, f.orig));
      // A new entry at the address of a closed one starts after it was
      // destroyed. The closed entry's own first packets can come later
      // than its end: its destroy and final counters travel by netlink,
      // which may overtake a ring buffer that is seconds behind in a storm.
      // A new entry with the same tuple at the same address (a client
      // reusing its port) is told apart by the old one's confirmation.
      const reused = f && isNewEntry && ((f.status & IPS_CONFIRMED) !== 0 || (f.closed && (f.closedTsNs === undefined || e.tsNs > f.closedTsNs)));
      if (f && sameEntry && !reused) {
        if (!f.ctBirth) f.ctBirth = e.ctBirth;
        return f;
      }
      if (f) this.retire(f, e.tsNs); // the address was reused by a new entry
      return this.newFlowAt(key, e);
    }
    // A packet dropped before conntrack kept an entry: a flow of its own.
    const key = flat(`pkt:${tupleKey(e.pkt)}`);
    return this.byKey.get(key) ?? this.newFlow(key, e, e.pkt);
  }

  /**
   * The flow of an entry older than the one whose flow holds its address:
   * the newer entry's end came by netlink while the ring, seconds behind in
   * a storm, still held the older one's records. It ended before the newer
   * one began, so it goes to the sinks as ended and is never indexed by
   * address; its later records (events, final counters) find it here by
   * address and birth.
   */
  private olderEntryFlow(key: number, e: KernelEvent): Flow | undefined {
    const id = olderEntryKey(key, e.ctBirth);
    const known = this.olderEntries.get(id);
    if (known) return known;
    if (e.kind !== EventKind.NF && e.kind !== EventKind.DROP) return undefined;
    const f = this.newFlow(key, e, e.ctOrig.proto ? e.ctOrig : e.pkt, false);
    f.closed = true;
    f.closedTsNs = e.tsNs;
    this.summaryCounters.closed++;
    this.retired.push(f);
    // The oldest one goes (a Map keeps insertion order): clearing them all
    // at once made the next event of each a second flow of its entry.
    if (this.olderEntries.size >= OLDER_ENTRIES_MAX) this.olderEntries.delete(this.olderEntries.keys().next().value!);
    this.olderEntries.set(id, f);
    return f;
  }

  /** A new flow at a ct address from one of its events, if the event can anchor one. */
  private newFlowAt(key: number, e: KernelEvent): Flow | undefined {
    if (e.kind !== EventKind.NF && e.kind !== EventKind.DROP) return undefined; // nothing to anchor a new flow on
    return this.newFlow(key, e, e.ctOrig.proto ? e.ctOrig : e.pkt);
  }

  private ingestOne(e: KernelEvent): Ingested | undefined {
    const f = this.flowFor(e);
    if (!f) {
      if (e.kind !== EventKind.CT_DESTROY) this.summaryCounters.orphanEvents++;
      return undefined;
    }
    // (Most of the time none wait: no lookup per event then.)
    const pending = this.pendingTraces.size ? this.pendingTraces.get(f.tupleIndexKey) : undefined;
    if (pending && !f.rulePath.length) {
      this.pendingTraces.delete(f.tupleIndexKey);
      const r = this.attachRuleTrace(f, pending.traces);
      if (r) this.deferred.push(r);
    }
    if (e.tsNs > f.lastTsNs) f.lastTsNs = e.tsNs;
    const prevTcpState = f.tcpState;
    if (e.kind === EventKind.NF) this.updateConntrack(f, e);
    const c = classifyEvent(f, e, this.classifyContext);
    this.apply(f, e, c);
    // A reset that answers the SYN (no SYN-ACK came first) is a refusal;
    // one later in the connection is an abort, by a backend that listens.
    if (c.effects.backendReset && prevTcpState <= TCP_SYN_SENT) f.backendRefused = true;
    const left = tcpStateLeft(e, prevTcpState, f.tcpState);
    const stage = c.stage;
    // Flows keep no timeline: each entry goes out once, with its event, to
    // the sinks that show it (text output prints milestones as they come).
    // No text is made here: sinks that show an event render its account
    // from the event (output/event-summary).
    const entry: TimelineEntry = { tsNs: e.tsNs, stage, milestone: c.milestone || left !== 0, stateChange: left !== 0 };
    const context: EventContext = {
      flowId: f.id,
      ctId: f.ctId,
      service: f.service,
      stage,
      netnsName: e.ifindex || e.netnsIno ? this.opts.netnsName?.(e.netnsIno) : undefined,
      dropReasonName: e.kind === EventKind.DROP ? this.dropReasonName(e.reason) : undefined,
      dropLocation: e.kind === EventKind.DROP ? this.dropLocation(e) : undefined,
      backend: f.backend,
      backendNetns: f.backendNetns,
      podSide: c.podSide,
      tcpStateBefore: left ? TCP_CT_STATES[left] ?? String(left) : undefined,
    };
    if (e.kind === EventKind.DROP && BENIGN_DROPS.has(this.dropReasonName(e.reason))) context.benignDrop = true;
    return new KernelIngested(f, entry, e, context);
  }

  private readonly classifyContext = { dropName: (e: KernelEvent) => this.dropName(e), dropReasonName: (r: number) => this.dropReasonName(r), netnsName: (ino: number) => this.opts.netnsName?.(ino) };

  /** "nf_hook_slow+0x8c", or the address in hex when no function is known for it. */
  private dropLocation(e: KernelEvent): string | undefined {
    if (!e.dropLocation || e.dropLocation === '0') return undefined;
    const at = this.opts.dropLocations?.locate(e.dropLocation);
    return at ? formatLocation(at) : `0x${e.dropLocation}`;
  }

  /** Applies what the classifier decided to the flow and the summary counters. */
  private apply(f: Flow, e: KernelEvent, c: Classification): void {
    if (c.seenKey && c.milestone) f.seen = appended(f.seen, internKey(c.seenKey));
    const fx = c.effects;
    if (fx.reset) {
      if (!f.reset) this.summaryCounters.resets++;
      f.reset = true;
      if (fx.backendReset) f.backendReset = true;
    }
    if (fx.icmpError) f.icmpErrors = appended(f.icmpErrors, fx.icmpError);
    if (fx.backendNetns) f.backendNetns = fx.backendNetns;
    if (fx.drop && e.dir === Dir.REPLY && (f.replyDrops?.length ?? 0) < 4) {
      const where = `${fx.drop} at ${e.ifname || '?'} in ${this.opts.netnsName?.(e.netnsIno) ?? `netns ${e.netnsIno}`}`;
      if (!f.replyDrops?.includes(where)) (f.replyDrops ??= []).push(where);
    }
    if (fx.drop) {
      const c = this.summaryCounters;
      // Each reason once per flow, its packets counted in the summary: under
      // --all-packets every dropped packet is an event, and the flow's list
      // grew with them (memory bounded by the flows, not by the packets).
      if (!f.drops.includes(fx.drop)) {
        c.dropFlowsByReason[fx.drop] = (c.dropFlowsByReason[fx.drop] ?? 0) + 1;
        f.drops = appended(f.drops, fx.drop);
      }
      c.dropsByReason[fx.drop] = (c.dropsByReason[fx.drop] ?? 0) + 1;
    }
    // A TCP connection in TIME_WAIT or CLOSE has ended, though conntrack
    // keeps its entry a while (120 s for TIME_WAIT): it is closed, and
    // leaves the table after the grace period like a destroyed one (the
    // kernel wrote its counters when it entered that state).
    const tcpOver = f.proto === 6 && (f.tcpState === TCP_TIME_WAIT || f.tcpState === TCP_CLOSE);
    if ((fx.closed || tcpOver) && !f.closed) {
      f.closed = true;
      f.closedTsNs = e.tsNs;
      this.summaryCounters.closed++;
    }
  }

  /**
   * What a counted-only flow's hooks would have told, from its counters:
   * answered (a packet came back: conntrack's SEEN_REPLY, which the
   * diagnoses read), reset, and refused (the backend's reset came with no
   * SYN-ACK before it).
   */
  private stateFromCounters(f: Flow, r: FlowStatsRecord): void {
    // Its TCP state as of its last packet: a connection in TIME_WAIT or
    // CLOSE is over and leaves the table after the grace period, as a
    // detailed one does (its entry may live on for two minutes).
    if (f.proto === 6 && r.tcpState !== 0xff && r.tcpState !== 0) f.tcpState = r.tcpState;
    if (f.proto === 6 && (f.tcpState === TCP_TIME_WAIT || f.tcpState === TCP_CLOSE) && !f.closed) {
      f.closed = true;
      f.closedTsNs = r.tsNs;
      this.summaryCounters.closed++;
    }
    if ((r.tcpFlags[0] | r.tcpFlags[1]) & TCP_RST && !f.reset) {
      f.reset = true;
      this.summaryCounters.resets++;
      if (r.tcpFlags[1] & TCP_RST) {
        f.backendReset = true;
        if (!(r.tcpFlags[1] & TCP_SYN)) f.backendRefused = true;
      }
    }
  }

  /** The NAT result of a flow from its counters' reply tuple (no conntrack status with it: judged from the tuples). */
  private natFromCounters(f: Flow, reply: Tuple): void {
    f.reply = reply;
    f.masqueraded = reply.daddr !== f.orig.saddr || reply.dport !== f.orig.sport;
    this.setBackend(f, destTranslated(0, f.orig, reply), reply);
  }

  private updateConntrack(f: Flow, e: KernelEvent): void {
    // A reply once seen stays seen (an older record, or counters ahead of
    // the events, may have said so first).
    f.status = e.ctStatus | (f.status & IPS_SEEN_REPLY);
    f.reply = e.ctReply;
    if (e.ctOrig.proto === 6) f.tcpState = e.ctTcpState;
    if (!f.nodeNetnsIno) f.nodeNetnsIno = e.netnsIno;
    f.masqueraded = (e.ctStatus & IPS_SRC_NAT) !== 0;
    this.setBackend(f, destTranslated(e.ctStatus, e.ctOrig, e.ctReply), e.ctReply);
    // Packets and bytes are counted in the kernel (applyStats), not here:
    // established packets do not reach user space one by one.
  }

  /** The flow's DNAT verdict and backend, from its current reply tuple `r`. */
  private setBackend(f: Flow, dnat: boolean, r: Tuple): void {
    const wasDnat = f.dnat;
    f.dnat = dnat;
    // The backend's text is made when DNAT is first seen, or when the reply
    // tuple under the same flow changed (a new entry at the same address
    // whose first events were lost), not per event.
    if (!f.dnat) {
      this.forgetBackendTuple(f);
      f.backend = f.backendOf = undefined;
    } else {
      const was = f.backendOf;
      if (!f.backend || !was || was.saddr !== r.saddr || was.sport !== r.sport) f.backend = flat(endpoint(r.saddr, r.sport));
      // What the backend receives (the reply tuple, reversed) changes with
      // SNAT too, after DNAT: indexed again whenever any of it changes.
      if (!was || was.saddr !== r.saddr || was.sport !== r.sport || was.daddr !== r.daddr || was.dport !== r.dport) this.indexBackendTuple(f, r);
      f.backendOf = r;
      if (!wasDnat) {
        // One key per backend address ever seen, at most PER_BACKEND_MAX: a
        // long trace across pod churn meets new ones for ever.
        const per = this.summaryCounters.perBackend;
        const key = per[f.backend] !== undefined || this.backendKeys < PER_BACKEND_MAX ? f.backend : OTHER_BACKENDS;
        if (per[key] === undefined) this.backendKeys++;
        per[key] = (per[key] ?? 0) + 1;
      }
    }
  }

  /**
   * Traces stop waiting for their flow once the ring buffer has delivered
   * everything up to a second past their arrival: a flow's first event is
   * written before its packet reaches the rules, so if it is not here by
   * then it was lost in the ring (counted there), and its traces never will
   * be matched. A ring that is behind is waited for: trace messages come by
   * their own socket, and overtake a ring seconds behind under load (CI's
   * emulated guests: 18 s once; a 5 s limit on the wall clock then threw
   * away a REJECT's trace before its flow came). A minute on the wall clock
   * is only a backstop. The maps hold at most the ring's backlog of marked
   * connections (100 per second per Service, rule-marker), and 10,000 each.
   */
  private expirePendingTraces(nowMs: number, deliveredNs?: bigint): void {
    expireOldest(this.pendingTraces, nowMs, deliveredNs);
    expireOldest(this.pendingBackendTraces, nowMs, deliveredNs);
  }

  /** Rule traces waiting for their flow (both keys), for tests and status. */
  get pendingTraceGroups(): number {
    return this.pendingTraces.size + this.pendingBackendTraces.size;
  }

  /** Removes flows closed longer than the grace period or idle too long; returns them. */
  expire(nowNs: bigint, nowMs = Date.now()): Flow[] {
    this.expirePendingTraces(nowMs, nowNs);
    const graceNs = BigInt(this.opts.closeGraceMs) * 1_000_000n;
    const idleNs = BigInt(this.opts.idleMs) * 1_000_000n;
    const gone: Flow[] = [];
    for (const f of this.byKey.values()) {
      if (f.ruleTraces && nowMs - f.ruleTraces.atMs > SPLIT_TRACE_MAX_MS) f.ruleTraces = undefined;
      if ((f.closed && f.closedTsNs !== undefined && nowNs - f.closedTsNs >= graceNs) || nowNs - f.lastTsNs >= idleNs) gone.push(f);
    }
    for (const f of gone) {
      this.remove(f);
      if (f.closed) this.rememberEnded(f);
    }
    return gone;
  }

  /**
   * The last ENDED_RECENTLY_MAX flows that left the table closed (or went
   * to the sinks at their end without a stay in it), for the counters a
   * packet after a connection's end brings (applyStats): a ring of
   * references, written once per flow and searched only for such a record.
   * Memory is the ring's; in a storm it covers a fraction of a second.
   */
  private readonly endedRecently: (Flow | undefined)[] = new Array<Flow | undefined>(ENDED_RECENTLY_MAX);
  private endedNext = 0;

  private rememberEnded(f: Flow): void {
    this.endedRecently[this.endedNext] = f;
    this.endedNext = (this.endedNext + 1) % ENDED_RECENTLY_MAX;
  }

  /** The recently ended flow a record is of (its address, tuple and birth), if still remembered. */
  private endedFlow(r: FlowStatsRecord): Flow | undefined {
    for (const f of this.endedRecently) {
      if (f && f.key === r.ctKey && sameTuple(f.orig, r.orig) && (f.ctBirth === 0 || f.ctBirth === r.ctBirth)) return f;
    }
    return undefined;
  }
}

/** Flows remembered after they left, for counters a packet after their end brings (see FlowTable.endedRecently). */
const ENDED_RECENTLY_MAX = 1024;

/**
 * The empty list every new flow starts with, for its drops, ICMP errors,
 * rule path and milestones seen: most flows of a busy Service never get a
 * drop or an ICMP error, and a counted-only flow no milestone, so four
 * empty arrays per flow were about a sixth of a flow's heap at the table's
 * cap. Frozen, so that a push on it throws instead of reaching every flow.
 */
const NONE: string[] = Object.freeze([]) as unknown as string[];

/** `list` with `x` at its end: the same array, or a flow's own one in place of NONE. */
function appended(list: string[], x: string): string[] {
  if (list === NONE) return [x];
  list.push(x);
  return list;
}

/** Rule traces waiting for their flow's first event (see expirePendingTraces). */
interface PendingTraces {
  /** Wall clock when the first trace came. */
  at: number;
  /** Monotonic time the trace message was received (after the packet's ring record was written). */
  tsNs: bigint;
  traces: RuleTrace[];
}

/**
 * Removes the expired groups from the front of `pending`. A Map iterates in
 * insertion order and a group is always inserted anew (see
 * ingestRuleTraces), so the groups are in the order they came and the first
 * one still waiting ends the walk: this runs for every batch of trace
 * messages, and a storm's counted-only connections leave hundreds of
 * groups waiting for flows that never come.
 */
function expireOldest(pending: Map<string, PendingTraces>, nowMs: number, deliveredNs?: bigint): void {
  for (const k of pending.keys()) {
    const v = pending.get(k)!;
    if (!(nowMs - v.at > PENDING_TRACE_BACKSTOP_MS || (deliveredNs !== undefined && deliveredNs - v.tsNs > PENDING_TRACE_DELIVERED_NS))) return;
    pending.delete(k);
  }
}

/** Kernel-time order (a stable sort keeps a tie in arrival order). */
function byTs(a: { tsNs: bigint }, b: { tsNs: bigint }): number {
  return a.tsNs < b.tsNs ? -1 : a.tsNs > b.tsNs ? 1 : 0;
}

/** Backends counted by address in the summary, at most; the rest under OTHER_BACKENDS. */
export const PER_BACKEND_MAX = 4096;
export const OTHER_BACKENDS = 'other backends';

/** Older entries' flows remembered for their late records: a storm's ring backlog of them at most. */
const OLDER_ENTRIES_MAX = 1024;

function olderEntryKey(ctKey: number, birth: number): string {
  return `${ctKey}|${birth}`;
}

const PENDING_TRACE_BACKSTOP_MS = 60_000;
/** Rule-trace groups waiting for their flow, at most, per key kind: the ring's backlog of marked connections is far less (100 per second per Service). */
const PENDING_TRACE_GROUPS_MAX = 10_000;
const PENDING_TRACE_DELIVERED_NS = 1_000_000_000n;
/** How long a flow's first traced packet waits for the rest of its trace (read in the next batch of the same socket). */
const SPLIT_TRACE_MAX_MS = 5000;

/** enum tcp_conntrack (events/conntrack TCP_CT_STATES). */
const TCP_SYN_SENT = 1;
/** TCP's SYN and RST flag bits. */
const TCP_SYN = 0x02;
const TCP_RST = 0x04;
const TCP_TIME_WAIT = 7;
const TCP_CLOSE = 8;

const STATS_REASON_NAMES: Record<number, string> = {
  [StatsReason.PERIODIC]: 'periodic',
  [StatsReason.CLOSED]: 'closed',
  [StatsReason.REUSED]: 'reused',
  [StatsReason.EXPIRED]: 'expired',
  [StatsReason.ENDED]: 'ended',
};
