/**
 * The kube-proxy rule path of each new connection, one of two ways:
 * observed, with nftables tracing (a RuleMarker table marks the first packet
 * of each connection and the tracer reads the kernel's trace messages), or,
 * for iptables-legacy rules (not nftables rules, so tracing cannot see them),
 * inferred from the DNAT target and the node's rules.
 */
import { findByAddress, type Discovery } from '../discovery/model';
import type { FlowTable } from '../flows/flow-table';
import type { Ingested } from '../flows/types';
import type { RuleTrace } from '../events/decode';
import type { ServiceSpec } from '../net/ipv4';
import type { AttachedNetns, Tracer } from '../tracer/tracer';
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

export interface RulePathOptions {
  /** false: no rule paths at all. */
  enabled: boolean;
  discovery: Discovery;
  table: FlowTable;
}

export class RulePaths {
  private constructor(
    private readonly table: FlowTable,
    private readonly inferFrom: Discovery | undefined,
    private marker: RuleMarker | undefined,
    private readonly discovery: Discovery,
  ) {}

  /** Paths are being observed (nftables tracing installed in some namespace): a new connection's comes as a message of its own, after its first events. */
  private installed = false;

  get observing(): boolean {
    return this.installed && this.marker !== undefined;
  }

  /** How rule paths will be found here; nothing is installed until `observe`. */
  static plan(opts: RulePathOptions): RulePaths {
    const inferFrom = opts.enabled && opts.discovery.backend === 'legacy' ? opts.discovery : undefined;
    return new RulePaths(opts.table, inferFrom, opts.enabled && !inferFrom ? new RuleMarker() : undefined, opts.discovery);
  }

  /**
   * With nftables tracing: reads trace messages in each attached namespace
   * and installs the marking table there. On failure nothing stays
   * installed and the trace goes on without rule paths (a warning says so).
   */
  observe(tracer: Tracer, attached: AttachedNetns[], services: ServiceSpec[], onTraced: (items: Ingested[]) => void, onWarning: (m: string) => void): void {
    const marker = this.marker;
    if (!marker) return;
    try {
      // The node's namespace sees connections to the Service addresses; a
      // traced pod's namespace sees them arrive at the backends, after DNAT:
      // there the backends' addresses are marked (a drop in the pod's own
      // firewall is then named too).
      const backends = this.backendTargets(services);
      attached.forEach((a, i) => {
        const targets = i === 0 ? services : backends;
        if (!targets.length) return;
        tracer.traceRules(a.path, (traces: RuleTrace[]) => onTraced(this.table.ingestRuleTraces(traces)));
        marker.install(a.path, targets);
        this.installed = true;
      });
      installMarkerCleanup(marker);
    } catch (e) {
      marker.removeAll();
      this.marker = undefined;
      this.installed = false;
      onWarning(`rule paths will not be shown: nftables tracing unavailable (${e instanceof Error ? e.message.split('\n')[0] : String(e)})`);
    }
  }

  /** The endpoints (ip:port) of the traced Services, as the node's rules list them. */
  private backendTargets(services: ServiceSpec[]): ServiceSpec[] {
    const out: ServiceSpec[] = [];
    for (const spec of services) {
      const svc = spec.address ? findByAddress(this.discovery, spec.address, spec.port, spec.proto) : this.discovery.services.find((x) => x.nodePorts.includes(spec.port) && x.proto === spec.proto);
      for (const ep of svc?.endpoints ?? []) {
        if (!out.some((o) => o.address === ep.ip && o.port === ep.port && o.proto === spec.proto)) out.push({ ...spec, address: ep.ip, port: ep.port, text: `${ep.ip}:${ep.port}/${spec.proto}` });
      }
    }
    return out;
  }

  /** Inferred rule-path events for the flows among `items` that just got their DNAT target (iptables-legacy only). */
  inferred(items: Ingested[]): Ingested[] {
    return this.inferFrom ? inferRulePaths(this.table, this.inferFrom, items) : [];
  }

  /** Removes the marking tables. */
  stop(): void {
    if (!this.marker) return;
    this.marker.removeAll();
    markers.delete(this.marker);
    this.installed = false;
  }
}
