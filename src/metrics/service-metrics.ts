/**
 * The incident questions as Prometheus series, from the flow model: which
 * backend gets the connections (next to the share the rules give it), how
 * many were refused, reset or dropped and why, how long DNAT to the first
 * reply takes, whether conntrack is near full, which diagnoses are active.
 *
 * Fed by the pipeline (a sink: `observe` per batch, `expired` per flow end).
 * Each flow is counted once, when the event that decides it arrives; per-flow
 * marks live in a WeakMap, so they go with the flow. Labels come only from
 * the traced Services and their backends, never client addresses or ports,
 * and each family is capped (SeriesCap).
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { svctrace } from '../gen/svctrace';
import type { Flow, Ingested } from '../flows/types';
import { itemApiNames, itemBackend, itemDirection, itemKernelDrops, itemTcpState } from '../flows/ingested';
import { SeriesCap } from './series-cap';

import pb = svctrace.v1;

/** Latency buckets, seconds: 50 µs (a local pod) to 10 s (SYN retries behind a slow path). */
export const LATENCY_BUCKETS = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
export const DEFAULT_MAX_SERIES = 1000;

export interface ExpectedShare {
  service: string;
  backend: string;
  /** The chance the rules give this backend for a new connection (0..1). */
  ratio: number;
}

export interface ActiveDiagnosis {
  code: string;
  service: string;
  severity: string;
}

export interface ServiceMetricsOptions {
  /** The node's name, on the connection series (a DaemonSet scrapes many). */
  node: string;
  maxSeriesPerFamily?: number;
  expected?: ExpectedShare[];
}

interface FlowMarks {
  attempted: boolean;
  connected: boolean;
  masqueraded: boolean;
  reset: boolean;
  icmpErrors: number;
  /** The flow's kernel drop counter as last added to svctrace_dropped_packets_total. */
  drops: number;
  dnatNs?: bigint;
  replied: boolean;
  established: boolean;
}

export class ServiceMetrics {
  readonly registry = new Registry();
  private readonly cap: SeriesCap;
  private readonly marks = new WeakMap<Flow, FlowMarks>();
  /** Connections per service and per "service\0backend", for the observed share. */
  private readonly perService = new Map<string, number>();
  private readonly perBackend = new Map<string, { service: string; backend: string; n: number }>();
  private diagnoses: ActiveDiagnosis[] = [];
  private readonly conntrack = new Map<string, { entries: number; limit: number }>();

  private readonly attempts: Counter<string>;
  private readonly connections: Counter<string>;
  private readonly masqueraded: Counter<string>;
  private readonly drops: Counter<string>;
  private readonly droppedPackets: Counter<string>;
  private readonly errors: Counter<string>;
  private readonly unanswered: Counter<string>;
  private readonly setup: Histogram<string>;
  private readonly firstReply: Histogram<string>;

  constructor(private readonly opts: ServiceMetricsOptions) {
    this.cap = new SeriesCap(opts.maxSeriesPerFamily ?? DEFAULT_MAX_SERIES);
    const registers = [this.registry];
    this.attempts = new Counter({
      name: 'svctrace_connection_attempts_total',
      help: 'New connections (conntrack entries) to a traced Service, answered or not.',
      labelNames: ['service'],
      registers,
    });
    this.connections = new Counter({
      name: 'svctrace_connections_total',
      help: 'New connections to a traced Service, by the backend DNAT chose.',
      labelNames: ['service', 'service_name', 'backend', 'backend_pod', 'node'],
      registers,
    });
    this.masqueraded = new Counter({
      name: 'svctrace_masqueraded_connections_total',
      help: 'Connections whose source was rewritten (SNAT/MASQUERADE): the backend sees the node, not the client.',
      labelNames: ['service'],
      registers,
    });
    this.drops = new Counter({
      name: 'svctrace_drops_total',
      help: 'Drops of traced connections the kernel reported, by drop reason (normal ends of a packet life excluded): a connection\'s repeated drops at one place are reported once, unless --all-packets (svctrace_dropped_packets_total counts every packet).',
      labelNames: ['service', 'reason'],
      registers,
    });
    this.droppedPackets = new Counter({
      name: 'svctrace_dropped_packets_total',
      help: 'Packets of traced connections the kernel dropped, repeats included: the kernel\'s per-connection drop counters.',
      labelNames: ['service'],
      registers,
    });
    this.errors = new Counter({
      name: 'svctrace_connection_errors_total',
      help: 'Connections refused or broken: kind="reset" (TCP RST), kind="icmp" (ICMP error, e.g. port unreachable from a REJECT rule).',
      labelNames: ['service', 'kind'],
      registers,
    });
    this.unanswered = new Counter({
      name: 'svctrace_unanswered_connections_total',
      help: 'Connections that ended with no packet back from the backend (counted when svctrace forgets the flow).',
      labelNames: ['service', 'backend'],
      registers,
    });
    const latency = (name: string, help: string) => new Histogram({ name, help, labelNames: ['service', 'backend'], buckets: LATENCY_BUCKETS, registers });
    this.setup = latency('svctrace_connection_setup_seconds', 'TCP: first packet to ESTABLISHED, from kernel timestamps.');
    this.firstReply = latency('svctrace_first_reply_seconds', 'DNAT of the first packet to the first packet back from the backend, from kernel timestamps.');
    const expected = opts.expected ?? [];
    new Gauge({
      name: 'svctrace_backend_expected_ratio',
      help: "The share of new connections the Service's rules give each backend (0..1).",
      labelNames: ['service', 'backend'],
      registers,
      collect() {
        this.reset();
        for (const e of expected) this.set({ service: e.service, backend: e.backend }, e.ratio);
      },
    });
    const self = this;
    new Gauge({
      name: 'svctrace_backend_observed_ratio',
      help: 'The share of new connections each backend got since svctrace started (0..1).',
      labelNames: ['service', 'backend'],
      registers,
      collect() {
        this.reset();
        for (const b of self.perBackend.values()) this.set({ service: b.service, backend: b.backend }, b.n / (self.perService.get(b.service) ?? b.n));
      },
    });
    new Gauge({
      name: 'svctrace_diagnosis_active',
      help: 'Diagnoses in effect (1), by code, Service and severity: from the rules, and from the traffic of the last window.',
      labelNames: ['code', 'service', 'severity'],
      registers,
      collect() {
        this.reset();
        for (const d of self.diagnoses) this.set({ code: d.code, service: d.service, severity: d.severity }, 1);
      },
    });
    new Gauge({
      name: 'svctrace_conntrack_entries',
      help: 'Conntrack entries in a traced network namespace.',
      labelNames: ['netns'],
      registers,
      collect() {
        this.reset();
        for (const [netns, c] of self.conntrack) this.set({ netns }, c.entries);
      },
    });
    new Gauge({
      name: 'svctrace_conntrack_entries_limit',
      help: 'The conntrack table size (nf_conntrack_max) seen from a traced network namespace.',
      labelNames: ['netns'],
      registers,
      collect() {
        this.reset();
        for (const [netns, c] of self.conntrack) this.set({ netns }, c.limit);
      },
    });
    new Counter({
      name: 'svctrace_series_refused_total',
      help: 'Observations not recorded because their metric already had its maximum number of label sets.',
      labelNames: ['metric'],
      registers,
      collect() {
        this.reset();
        for (const [metric, n] of self.cap.refused()) this.inc({ metric }, n);
      },
    });
  }

  /** A batch of ingested events (kernel order). */
  observe(items: readonly Ingested[]): void {
    for (const item of items) {
      const { flow, entry } = item;
      let m = this.marks.get(flow);
      if (!m) {
        m = { attempted: false, connected: false, masqueraded: false, reset: false, icmpErrors: 0, drops: 0, replied: false, established: false };
        this.marks.set(flow, m);
      }
      const service = flow.service;
      if (!m.attempted) {
        m.attempted = true;
        this.inc(this.attempts, 'svctrace_connection_attempts_total', [service]);
      }
      // Timing comes from the events, not the flow: a batch is observed
      // after the table took all of it, so the flow already holds its last
      // state. An event's backend is the flow's as of that event.
      // The items' fields are read without making their wire events (flows/ingested).
      const eventBackend = m.connected ? undefined : itemBackend(item);
      if (eventBackend) {
        m.connected = true;
        m.dnatNs = entry.tsNs;
        const names = itemApiNames(item);
        if (this.inc(this.connections, 'svctrace_connections_total', [service, names.serviceName, eventBackend, names.backendPod, this.opts.node])) {
          this.perService.set(service, (this.perService.get(service) ?? 0) + 1);
          const key = `${service}\u0000${eventBackend}`;
          const b = this.perBackend.get(key);
          if (b) b.n++;
          else this.perBackend.set(key, { service, backend: eventBackend, n: 1 });
        }
      }
      if (!m.masqueraded && flow.masqueraded) {
        m.masqueraded = true;
        this.inc(this.masqueraded, 'svctrace_masqueraded_connections_total', [service]);
      }
      if (!m.reset && flow.reset) {
        m.reset = true;
        this.inc(this.errors, 'svctrace_connection_errors_total', [service, 'reset']);
      }
      for (; m.icmpErrors < flow.icmpErrors.length; m.icmpErrors++) this.inc(this.errors, 'svctrace_connection_errors_total', [service, 'icmp']);
      // A counter record: the packets dropped since the flow's last one.
      const kernelDrops = itemKernelDrops(item);
      if (kernelDrops !== undefined && kernelDrops > m.drops) {
        this.inc(this.droppedPackets, 'svctrace_dropped_packets_total', [service], kernelDrops - m.drops);
        m.drops = kernelDrops;
      }
      // An item's entry has its event's stage: only drops' events are made here.
      if (entry.stage === pb.Stage.STAGE_DROP) {
        const event = item.event;
        if (!event.benignDrop && event.dropReasonName) this.inc(this.drops, 'svctrace_drops_total', [service, event.dropReasonName]);
      }
      const backend = flow.backend ?? '';
      // A counted-only flow has no reply-direction events: its counters say whether anything came back (no timing, so no histogram).
      if (!m.replied && flow.countedOnly && flow.packets[1] > 0) m.replied = true;
      if (!m.replied && m.dnatNs !== undefined && itemDirection(item) === pb.Direction.DIRECTION_REPLY) {
        m.replied = true;
        this.observeSeconds(this.firstReply, 'svctrace_first_reply_seconds', [service, backend], entry.tsNs - m.dnatNs);
      }
      if (!m.established && itemTcpState(item) === 'ESTABLISHED') {
        m.established = true;
        this.observeSeconds(this.setup, 'svctrace_connection_setup_seconds', [service, backend], entry.tsNs - flow.firstTsNs);
      }
    }
  }

  /** Flows the table forgot: a connection that got no packet back is counted now. */
  expired(flows: readonly Flow[]): void {
    for (const f of flows) {
      if (f.evicted) continue; // open when it left the table: not known to be unanswered
      const m = this.marks.get(f);
      if (m?.connected && !m.replied) this.inc(this.unanswered, 'svctrace_unanswered_connections_total', [f.service, f.backend ?? '']);
    }
  }

  /** The diagnoses in effect now (replaces the previous set). */
  setDiagnoses(active: readonly ActiveDiagnosis[]): void {
    this.diagnoses = active.map((d) => ({ code: d.code, service: d.service, severity: d.severity }));
  }

  /** Conntrack use in a traced namespace, as last read. */
  setConntrack(netns: string, entries: number, limit: number): void {
    this.conntrack.set(netns, { entries, limit });
  }

  private inc(c: Counter<string>, family: string, labels: string[], by = 1): boolean {
    if (!this.cap.allow(family, labels)) return false;
    c.labels(...labels).inc(by);
    return true;
  }

  private observeSeconds(h: Histogram<string>, family: string, labels: string[], ns: bigint): void {
    if (ns < 0n || !this.cap.allow(family, labels)) return;
    h.labels(...labels).observe(Number(ns) / 1e9);
  }
}
