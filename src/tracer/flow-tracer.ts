/**
 * Kernel events -> flows: a TraceSession feeding a FlowTable, with namespace
 * names resolved, closed flows expired on a timer, and the backend -> pod
 * namespace mapping remembered for summaries. Used by `trace`, `serve`, the
 * demo and the tests (which assert on its flows against the lab's ground
 * truth).
 */
import { loadBinding } from '../native/binding';
import { Flow, FlowTable, Ingested, FlowSummary, flowToProto, serviceLabel } from '../flows/flow-table';
import { NetnsNames } from '../flows/netns-names';
import { ServiceSpec } from '../net/ipv4';
import type { HubSource } from '../stream/hub';
import type { svctrace } from '../gen/svctrace';
import type { Cluster } from '../k8s/cluster';
import { podUidsByNetns } from '../k8s/pod-netns';
import type { Discovery } from '../discovery/model';
import { PROTO_NAMES } from '../events/conntrack';
import { TraceSession } from './session';
import { RuleMarker } from './rule-marker';

/** Marking tables still installed; removed on process exit whatever happens. */
const markers = new Set<RuleMarker>();
let markerExitHook = false;

function installMarkerCleanup(m: RuleMarker): void {
  markers.add(m);
  if (markerExitHook) return;
  markerExitHook = true;
  process.once('exit', () => {
    for (const x of markers) x.removeAll();
  });
}
import { TracerStats } from './tracer';
import { kernelLosses, StageLosses, totalLost } from './losses';

export interface FlowTracerOptions {
  services: ServiceSpec[];
  netns: string[];
  onIngested?: (items: Ingested[]) => void;
  onExpired?: (flows: Flow[]) => void;
  closeGraceMs?: number;
  maxFlows?: number;
  snaplen?: number;
  allPackets?: boolean;
  /** Size of the kernel ring buffer in bytes (a power of two; default 64 MiB). */
  ringBufferBytes?: number;
  /** How often an active flow's counters are reported (default 1000 ms). */
  statsIntervalMs?: number;
  /** Observe the kube-proxy rule path of each new connection with nftables tracing (default true; needs nft). */
  ruleTrace?: boolean;
  /** Told once when rule tracing cannot run here (e.g. nft missing). */
  onWarning?: (message: string) => void;
  /** Names from the Kubernetes API for events (service_name, backend_pod). */
  cluster?: Cluster | null;
  /** The node's kube-proxy rules: with iptables-legacy, rule paths are inferred from them. */
  discovery?: Discovery;
}

/** State the event callback fills before the FlowTracer object exists. */
interface Shared {
  /** Backend address -> the pod namespace it was seen in (outlives expired flows). */
  backendNetns: Map<string, string>;
  /** Flows changed since the last flow update was taken. */
  changed: Map<number, Flow>;
}

/** Rule paths inferred from the DNAT target, for flows that just got theirs. */
function inferRulePaths(table: FlowTable, d: Discovery, items: Ingested[]): Ingested[] {
  const out: Ingested[] = [];
  for (const { flow } of items) {
    if (!flow.dnat || flow.rulePath.length) continue;
    const svc = d.services.find((s) => s.clusterIP === flow.orig.daddr && s.port === flow.orig.dport) ?? d.services.find((s) => s.nodePorts.includes(flow.orig.dport));
    const ep = svc?.endpoints.find((e) => e.ip === flow.reply.saddr && e.port === flow.reply.sport);
    if (!svc || !ep) continue;
    const head = svc.nodePorts.includes(flow.orig.dport) && svc.clusterIP !== flow.orig.daddr ? ['KUBE-SERVICES', 'KUBE-NODEPORTS'] : ['KUBE-SERVICES'];
    const r = table.inferRulePath(flow, [...head, svc.chain, ep.chain], 'iptables-legacy rules cannot be traced');
    if (r) out.push(r);
  }
  return out;
}

/** API names per flow, looked up once (not per event): the lookups walk every Service and slice. */
const apiNames = new WeakMap<Flow, { service?: string; pod?: string; podLooked: boolean }>();

/** Names an event from the API: the Service's name and the backend pod. */
function nameEvent(cluster: Cluster, f: Flow, e: svctrace.v1.IEvent): void {
  let n = apiNames.get(f);
  if (!n) {
    const at = cluster.serviceAt(f.orig.daddr, f.orig.dport, PROTO_NAMES[f.proto] ?? '');
    n = { service: at ? `${at.service.namespace}/${at.service.name}:${at.portName}` : undefined, podLooked: false };
    apiNames.set(f, n);
  }
  if (f.dnat && !n.podLooked) {
    n.pod = cluster.podAt(f.reply.saddr);
    n.podLooked = true;
  }
  if (n.service) e.serviceName = n.service;
  if (n.pod) e.backendPod = n.pod;
}

export class FlowTracer {
  private readonly expiryTimer: NodeJS.Timeout;

  private constructor(
    readonly session: TraceSession,
    readonly table: FlowTable,
    readonly names: NetnsNames,
    private readonly shared: Shared,
    private readonly onExpired?: (flows: Flow[]) => void,
    private readonly marker?: RuleMarker,
  ) {
    this.expiryTimer = setInterval(() => this.expireNow(), 1000);
    this.expiryTimer.unref();
  }

  static start(opts: FlowTracerOptions): FlowTracer {
    const names = new NetnsNames();
    if (opts.cluster) {
      // On a node: a pod's namespace is named after the pod, via its cgroup's pod UID.
      const cluster = opts.cluster;
      names.fallback = (ino) => {
        const uid = podUidsByNetns().get(ino);
        const pod = uid ? cluster.podByUid(uid) : undefined;
        return pod ? `pod ${pod}` : undefined;
      };
    }
    const table = new FlowTable({
      services: opts.services,
      dropReasons: loadBinding().dropReasons(),
      netnsName: (ino) => names.name(ino),
      closeGraceMs: opts.closeGraceMs,
      maxFlows: opts.maxFlows,
    });
    const shared: Shared = { backendNetns: new Map(), changed: new Map() };
    // iptables-legacy rules are not nftables rules: tracing cannot see them.
    const inferFrom = opts.ruleTrace !== false && opts.discovery?.backend === 'legacy' ? opts.discovery : undefined;
    const session = TraceSession.start({
      services: opts.services,
      netns: opts.netns,
      snaplen: opts.snaplen,
      allPackets: opts.allPackets,
      ringBufferBytes: opts.ringBufferBytes,
      statsIntervalMs: opts.statsIntervalMs,
      onEvents: (batch) => {
        const items = table.ingest(batch.events, batch.stats);
        if (inferFrom) items.push(...inferRulePaths(table, inferFrom, items));
        for (const { flow, event } of items) {
          if (flow.backendNetns && flow.dnat) shared.backendNetns.set(flow.reply.saddr, flow.backendNetns);
          shared.changed.set(flow.id, flow);
          if (opts.cluster) nameEvent(opts.cluster, flow, event);
        }
        opts.onIngested?.(items);
      },
    });
    for (const a of session.tracer.attached) names.remember(a.netnsIno, a.path.startsWith('/run/netns/') ? a.path.slice('/run/netns/'.length) : a.path);
    let marker: RuleMarker | undefined;
    if (opts.ruleTrace !== false && !inferFrom) {
      marker = new RuleMarker();
      try {
        for (const a of session.tracer.attached) {
          session.tracer.traceRules(a.path, (traces) => {
            const items = table.ingestRuleTraces(traces);
            if (opts.cluster) for (const { flow, event } of items) nameEvent(opts.cluster, flow, event);
            if (items.length) opts.onIngested?.(items);
          });
          marker.install(a.path, opts.services);
        }
        installMarkerCleanup(marker);
      } catch (e) {
        marker.removeAll();
        marker = undefined;
        opts.onWarning?.(`rule paths will not be shown: nftables tracing unavailable (${e instanceof Error ? e.message.split('\n')[0] : String(e)})`);
      }
    }
    return new FlowTracer(session, table, names, shared, opts.onExpired, marker);
  }

  /** The pod namespace a backend address was seen in, if any. */
  backendName(addr: string): string | undefined {
    return this.shared.backendNetns.get(addr);
  }

  /** The streaming server's view of this tracer. */
  hubSource(): HubSource {
    return {
      services: this.session.services.map(serviceLabel),
      kernelLost: () => totalLost(this.losses()),
      lostByStage: () => this.losses(),
      activeFlows: () => this.table.size,
      dropsByReason: () => this.table.summary().dropsByReason,
      takeChangedFlows: () => {
        const out: svctrace.v1.IFlow[] = [...this.shared.changed.values()].map(flowToProto);
        this.shared.changed.clear();
        return out;
      },
    };
  }

  expireNow(): Flow[] {
    const gone = this.table.expire(process.hrtime.bigint());
    if (gone.length) this.onExpired?.(gone);
    return gone;
  }

  stats(): TracerStats {
    return this.session.stats();
  }

  /** Events lost so far, per stage (kernel, addon, flow table). */
  losses(): Partial<StageLosses> {
    return { ...kernelLosses(this.stats()), flow_table: this.table.summary().evicted };
  }

  async stop(): Promise<{ summary: FlowSummary; stats: TracerStats }> {
    clearInterval(this.expiryTimer);
    if (this.marker) {
      this.marker.removeAll();
      markers.delete(this.marker);
    }
    const stats = await this.session.stop();
    return { summary: this.table.summary(), stats };
  }
}
