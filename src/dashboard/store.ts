/**
 * The dashboard's state: flows (capped), each with its recent events, the
 * backend distribution per service, and health counters. Pure data: views
 * read it on animation frames, so a burst of events costs one render.
 */
import { svctrace } from '../gen/svctrace';
import { IPS_DST_NAT } from '../events/conntrack';
import { dropName } from '../events/drop-name';

import pb = svctrace.v1;

export const MAX_FLOWS = 2000;
export const MAX_EVENTS_PER_FLOW = 120;

export interface FlowView {
  /** Unique across server runs (instance/id). */
  key: string;
  /** The server's flow id, as shown. */
  id: string;
  /** The node that traced it (a relay merges several; ids are per node). */
  node: string;
  service: string;
  client: string;
  backend: string;
  backendNetns: string;
  seenByBackend: string;
  state: string;
  closed: boolean;
  reset: boolean;
  drops: string[];
  /** Over the detail budget: known by its counters, no hook or device events. */
  countedOnly: boolean;
  /** SYNs the client resent before any answer (not in packets). */
  synsResent: number;
  packets: [number, number];
  bytes: [number, number];
  firstTsNs: bigint;
  lastTsNs: bigint;
  events: pb.IEvent[];
  /** Arrival order, for recency. */
  seq: number;
}

export interface BackendStats {
  flows: number;
  bytes: number;
  /** New flows per second bucket (unix seconds -> count). */
  perSecond: Map<number, number>;
}

function ts(v: unknown): bigint {
  return v === null || v === undefined ? 0n : BigInt(String(v));
}

export class Store {
  readonly flows = new Map<string, FlowView>();
  /** service -> backend -> stats */
  readonly distribution = new Map<string, Map<string, BackendStats>>();
  private counted = new Set<string>();
  status: pb.IStatus | null = null;
  /** The latest diagnoses the server reported (newest first, at most 20). */
  diagnoses: pb.IDiagnosis[] = [];
  hello: pb.IHello | null = null;
  connected = false;
  connectionNote = 'connecting';
  eventsReceived = 0;
  dirty = true;
  private seq = 0;
  /** The server run flow ids belong to (Hello.instance): a restarted server starts ids again at 1. */
  private instance = '';

  addDiagnosis(d: pb.IDiagnosis): void {
    this.diagnoses = [d, ...this.diagnoses].slice(0, 20);
    this.dirty = true;
  }

  /** Called on every (re)connect with the server's Hello. */
  setHello(h: pb.IHello): void {
    this.hello = h;
    this.instance = h.instance ?? '';
    this.dirty = true;
  }

  /** Flow ids are unique per node server run: a relay's events and flows say which node. */
  private key(flowId: unknown, node: string | null | undefined): string {
    return `${this.instance}/${node ?? ''}/${String(flowId ?? 0)}`;
  }

  /** The node of an event or flow: its own (from a relay), else the server's. */
  private nodeOf(x: { node?: string | null }): string {
    return x.node || this.hello?.node || '';
  }

  /**
   * The server's losses by stage that are not zero ("ring_buffer=3
   * hook_runs_skipped=2"), as the trace summary names them: the header's
   * total counts events only, and this says where, and what else the
   * kernel counted (flows unseen, packets or program runs the hooks missed).
   */
  lossesByStage(): string {
    return Object.entries(this.status?.lostByStage ?? {})
      .filter(([, n]) => Number(n) > 0)
      .map(([stage, n]) => `${stage}=${String(n)}`)
      .join(' ');
  }

  /** The nodes as the server last said (a relay: each node server's state; a node server: itself). */
  nodes(): pb.INodeState[] {
    const listed = this.status?.nodes?.length ? this.status.nodes : (this.hello?.nodes ?? []);
    return listed.length ? listed : this.hello?.node ? [{ node: this.hello.node, state: this.connected ? 'connected' : 'down' }] : [];
  }

  private flow(key: string, id: string, node: string, e?: pb.IEvent): FlowView {
    let f = this.flows.get(key);
    if (!f) {
      if (this.flows.size >= MAX_FLOWS) this.evict();
      f = {
        id,
        node,
        service: e?.service ?? '',
        client: '',
        backend: '',
        backendNetns: '',
        seenByBackend: '',
        state: '',
        closed: false,
        reset: false,
        drops: [],
        countedOnly: false,
        synsResent: 0,
        packets: [0, 0],
        bytes: [0, 0],
        firstTsNs: ts(e?.tsNs),
        lastTsNs: ts(e?.tsNs),
        events: [],
        seq: 0,
        key,
      };
      this.flows.set(key, f);
    }
    f.seq = ++this.seq;
    return f;
  }

  /** Drops the least recently active flow, closed ones first. */
  private evict(): void {
    let victim: FlowView | undefined;
    for (const f of this.flows.values()) {
      if (!victim || (f.closed && !victim.closed) || (f.closed === victim.closed && f.seq < victim.seq)) victim = f;
    }
    if (victim) this.flows.delete(victim.key);
  }

  private countBackend(f: FlowView, atMs: number): void {
    if (!f.backend || this.counted.has(f.key)) return;
    this.counted.add(f.key);
    if (this.counted.size > MAX_FLOWS * 10) this.counted = new Set([...this.counted].slice(-MAX_FLOWS));
    let svc = this.distribution.get(f.service);
    if (!svc) this.distribution.set(f.service, (svc = new Map()));
    let b = svc.get(f.backend);
    if (!b) svc.set(f.backend, (b = { flows: 0, bytes: 0, perSecond: new Map() }));
    b.flows++;
    const sec = Math.floor(atMs / 1000);
    b.perSecond.set(sec, (b.perSecond.get(sec) ?? 0) + 1);
  }

  addEvents(events: pb.IEvent[], nowMs = Date.now()): void {
    this.eventsReceived += events.length;
    for (const e of events) {
      const node = this.nodeOf(e);
      const f = this.flow(this.key(e.flowId, node), String(e.flowId ?? 0), node, e);
      if (f.events.length < MAX_EVENTS_PER_FLOW) f.events.push(e);
      const t = ts(e.tsNs);
      // One clock (wall-clock ns from the server); a flow first known from a
      // FlowUpdate has no start yet: never measure a duration from zero.
      if (t && (!f.firstTsNs || t < f.firstTsNs)) f.firstTsNs = t;
      if (t > f.lastTsNs) f.lastTsNs = t;
      const c = e.counters;
      if (c) {
        f.packets = [Number(c.packetsOriginal ?? 0), Number(c.packetsReply ?? 0)];
        f.bytes = [Number(c.bytesOriginal ?? 0), Number(c.bytesReply ?? 0)];
        if (c.countedOnly) f.countedOnly = true;
        f.synsResent = Number(c.synsResent ?? 0);
        // A counted-only flow's events are its counters: their packet is its original tuple.
        if (!f.client && e.packet?.src) f.client = `${e.packet.src}:${e.packet.srcPort}`;
      }
      if (!f.client && e.conntrack?.original?.src) f.client = `${e.conntrack.original.src}:${e.conntrack.original.srcPort}`;
      if (e.conntrack?.reply?.dst && ((e.conntrack.status ?? 0) & IPS_DST_NAT) !== 0) f.seenByBackend = `${e.conntrack.reply.dst}:${e.conntrack.reply.dstPort}`;
      if (e.backend) f.backend = e.backend;
      if (e.backendNetns) f.backendNetns = e.backendNetns;
      if (e.conntrack?.tcpState) f.state = e.conntrack.tcpState;
      if (e.kind === pb.EventKind.EVENT_KIND_CT_DESTROY) f.closed = true;
      if (e.kind === pb.EventKind.EVENT_KIND_DROP && !e.benignDrop && e.dropReasonName) {
        const name = dropName(e.dropReasonName, e.dropLocation);
        if (!f.drops.includes(name)) f.drops.push(name);
      }
      if (e.tcpFlags?.includes('RST')) f.reset = true;
      this.countBackend(f, nowMs);
    }
    this.dirty = true;
  }

  addFlows(flows: pb.IFlow[]): void {
    for (const u of flows) {
      const node = this.nodeOf(u);
      const f = this.flow(this.key(u.id, node), String(u.id ?? 0), node);
      f.service = u.service || f.service;
      f.client = u.client || f.client;
      f.backend = u.backend || f.backend;
      f.backendNetns = u.backendNetns || f.backendNetns;
      f.seenByBackend = u.seenByBackend || f.seenByBackend;
      f.state = u.state || f.state;
      f.closed = !!u.closed || f.closed;
      f.reset = !!u.reset || f.reset;
      f.countedOnly = !!u.countedOnly || f.countedOnly;
      const first = ts(u.firstTsNs);
      const last = ts(u.lastTsNs);
      if (first && (!f.firstTsNs || first < f.firstTsNs)) f.firstTsNs = first;
      if (last > f.lastTsNs) f.lastTsNs = last;
      f.packets = [Number(u.packetsOriginal ?? 0), Number(u.packetsReply ?? 0)];
      f.synsResent = Number(u.synsResent ?? 0);
      const prevBytes = f.bytes[0] + f.bytes[1];
      f.bytes = [Number(u.bytesOriginal ?? 0), Number(u.bytesReply ?? 0)];
      if (u.drops?.length) f.drops = [...new Set(u.drops)];
      this.countBackend(f, Date.now());
      const b = this.distribution.get(f.service)?.get(f.backend);
      if (b) b.bytes += f.bytes[0] + f.bytes[1] - prevBytes;
    }
    this.dirty = true;
  }

  /** The rules' probability for a backend of a service, when the server found the rules. */
  expected(service: string, backend: string): number | undefined {
    const r = this.hello?.rules?.find((x) => x.service === service);
    return r?.backends?.find((b) => b.address === backend)?.probability ?? undefined;
  }

  /** Backends the rules list for a service (some may have seen no flow yet). */
  ruleBackends(service: string): string[] {
    return (this.hello?.rules?.find((x) => x.service === service)?.backends ?? []).map((b) => b.address ?? '').filter(Boolean);
  }

  affinity(service: string): number {
    return this.hello?.rules?.find((x) => x.service === service)?.affinitySeconds ?? 0;
  }

  /**
   * Flows of a service to a backend that are open (long-lived connections):
   * established TCP (UDP: not ended), never one that failed (reset, dropped)
   * or that the backend never answered (SYN_SENT).
   */
  openFlows(service: string, backend: string): number {
    let n = 0;
    for (const f of this.flows.values()) {
      if (f.service !== service || f.backend !== backend || f.closed || f.reset || f.drops.length) continue;
      if (f.state && f.state !== 'ESTABLISHED') continue;
      n++;
    }
    return n;
  }

  /** Total new flows per backend for a service (what the chart's legend shows). */
  totals(service: string): Array<[string, number]> {
    return [...(this.distribution.get(service)?.entries() ?? [])].map(([b, s]) => [b, s.flows]);
  }
}
