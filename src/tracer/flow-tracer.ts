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
  private readonly expiryTimer: NodeJS.Timeout;

  private constructor(
    session: TraceSession,
    table: FlowTable,
    names: NetnsNames,
    /** Backend address -> the pod namespace it was seen in (outlives expired flows). */
    private readonly backendNetns: Map<string, string>,
    private readonly onExpired?: (flows: Flow[]) => void,
  ) {
    this.session = session;
    this.table = table;
    this.names = names;
    this.expiryTimer = setInterval(() => this.expireNow(), 1000);
    this.expiryTimer.unref();
  }

  static start(opts: FlowTracerOptions): FlowTracer {
    const names = new NetnsNames();
    const table = new FlowTable({
      services: opts.services,
      dropReasons: loadBinding().dropReasons(),
      netnsName: (ino) => names.name(ino),
      closeGraceMs: opts.closeGraceMs,
      maxFlows: opts.maxFlows,
    });
    const backendNetns = new Map<string, string>();
    // Batches arrive from the event loop, never during start(): `session` is
    // assigned before the first one.
    const session = TraceSession.start({
      services: opts.services,
      netns: opts.netns,
      onEvents: (events) => {
        const items = table.ingest(events);
        for (const { flow } of items) {
          if (flow.backendNetns && flow.dnat) backendNetns.set(flow.reply.saddr, flow.backendNetns);
        }
        opts.onIngested?.(items);
      },
    });
    for (const a of session.tracer.attached) names.remember(a.netnsIno, a.path.startsWith('/run/netns/') ? a.path.slice(11) : a.path);
    return new FlowTracer(session, table, names, backendNetns, opts.onExpired);
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
