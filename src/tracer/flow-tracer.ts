/**
 * Kernel events -> flows: a TraceSession feeding a FlowTable, with namespace
 * names resolved, closed flows expired on a timer, and the backend -> pod
 * namespace mapping remembered for summaries. Used by `trace`, the demo and
 * the tests (which assert on its flows against the lab's ground truth).
 */
import { loadBinding } from '../native/binding';
import { Flow, FlowTable, Ingested, FlowSummary } from '../flows/flow-table';
import { NetnsNames } from '../flows/netns-names';
import { ServiceSpec } from '../net/ipv4';
import { TraceSession } from './session';
import { TracerStats } from './tracer';

export interface FlowTracerOptions {
  services: ServiceSpec[];
  netns: string[];
  onIngested?: (items: Ingested[]) => void;
  onExpired?: (flows: Flow[]) => void;
  closeGraceMs?: number;
  maxFlows?: number;
}

export class FlowTracer {
  readonly table: FlowTable;
  readonly names: NetnsNames;
  readonly session: TraceSession;
  /** Every flow ever seen, kept only when asked (tests, demo). */
  private readonly backendNetns = new Map<string, string>();
  private expiryTimer: NodeJS.Timeout;

  private constructor(session: TraceSession, table: FlowTable, names: NetnsNames) {
    this.session = session;
    this.table = table;
    this.names = names;
    this.expiryTimer = setInterval(() => this.expireNow(), 1000);
    this.expiryTimer.unref();
  }

  private onExpired?: (flows: Flow[]) => void;

  static start(opts: FlowTracerOptions): FlowTracer {
    const names = new NetnsNames();
    const table = new FlowTable({
      services: opts.services,
      dropReasons: loadBinding().dropReasons(),
      netnsName: (ino) => names.name(ino),
      closeGraceMs: opts.closeGraceMs,
      maxFlows: opts.maxFlows,
    });
    let self: FlowTracer | undefined;
    const pending: Ingested[][] = [];
    const session = TraceSession.start({
      services: opts.services,
      netns: opts.netns,
      onEvents: (events) => {
        const items = table.ingest(events);
        for (const { flow } of items) {
          if (flow.backendNetns && flow.dnat) self?.backendNetns.set(flow.reply.saddr, flow.backendNetns);
        }
        if (!self) pending.push(items);
        else opts.onIngested?.(items);
      },
    });
    self = new FlowTracer(session, table, names);
    self.onExpired = opts.onExpired;
    for (const p of pending) opts.onIngested?.(p);
    return self;
  }

  /** The pod namespace a backend address was seen in, if any. */
  backendName(addr: string): string | undefined {
    return this.backendNetns.get(addr);
  }

  expireNow(): Flow[] {
    const gone = this.table.expire(process.hrtime.bigint());
    if (gone.length) this.onExpired?.(gone);
    return gone;
  }

  stats(): TracerStats {
    return this.session.stats();
  }

  async stop(): Promise<{ summary: FlowSummary; stats: TracerStats }> {
    clearInterval(this.expiryTimer);
    const stats = await this.session.stop();
    return { summary: this.table.summary(), stats };
  }
}
