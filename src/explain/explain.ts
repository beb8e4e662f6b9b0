/**
 * `svctrace explain`: the path the kernel will take for a Service on this
 * node — rule chain, each backend's probability, masquerade, NodePorts,
 * affinity, route and neighbour to each backend — the diagnoses that follow,
 * and with `watch` the live distribution compared with the rules.
 */
import crypto from 'node:crypto';
import { SvctraceError } from '../errors';
import type { Flow } from '../flows/types';
import { discover } from '../discovery/discover';
import { DiscoveredService, Discovery, findByAddress, findByName, readersMissingText } from '../discovery/model';
import { parseServiceSpec } from '../net/ipv4';
import { CURRENT_NETNS, resolveNetns, runInNetns } from '../netns/netns';
import { Pipeline } from '../pipeline/pipeline';
import { waitForStop } from '../pipeline/lifecycle';
import { ApiEndpoint, Cluster } from '../k8s/cluster';
import { BackendState, Diagnosis, diagnoseApi, diagnoseBackends, diagnoseConntrack, diagnoseRules, diagnoseTraffic, BackendView, ObservedTraffic, observeFlows, ProbeOutcome } from './diagnose';
import { backendView, conntrackPressure, neighbour, routeTo } from './node-state';

export interface ExplainOptions {
  target: string;
  netns?: string;
  watchSeconds?: number;
  /** Ends the watch before watchSeconds (the traffic to see is over); Ctrl-C does too. */
  watchUntil?: AbortSignal;
  probe?: boolean;
  /** Kubeconfig to ask the API with (default: $KUBECONFIG, ~/.kube/config, in-cluster; none = no API). */
  kubeconfig?: string;
  onWarning?: (m: string) => void;
}

export interface Explanation {
  target: string;
  netns: string;
  mode: Discovery['mode'];
  service?: DiscoveredService;
  backends: BackendState[];
  /** Endpoints the Kubernetes API lists for the Service, when a cluster answered. */
  api?: ApiEndpoint[];
  observed?: ObservedTraffic;
  diagnoses: Diagnosis[];
}

/**
 * The probe, run inside the namespace: a TCP connect from a given local
 * port, whose exit code says how it ended (0 accepted, 3 refused, 2 timed
 * out, 4 unreachable, 5 local port taken, 1 other). 5 s: a host that does
 * not answer ARP is reported unreachable after about 3 s of neighbour
 * probes; a filtered port only times out.
 */
const PROBE = `const s=require('net').connect({host:process.argv[1],port:Number(process.argv[2]),localPort:Number(process.argv[3])});s.setTimeout(5000);s.on('connect',()=>process.exit(0));s.on('error',(e)=>process.exit(e.code==='ECONNREFUSED'?3:e.code==='EHOSTUNREACH'||e.code==='ENETUNREACH'?4:e.code==='EADDRINUSE'?5:1));s.on('timeout',()=>process.exit(2));`;
const PROBE_OUTCOMES: Record<number, ProbeOutcome> = { 0: 'ok', 3: 'refused', 2: 'timeout', 4: 'unreachable' };

/**
 * Probes a backend's port. A timeout alone cannot tell a filtered port from
 * an address where no pod is left (a neighbour entry can still say
 * REACHABLE for a while after the pod went): a second connect, to port 1,
 * which nothing serves, is refused by a live host and unanswered otherwise.
 * A refusal is a TCP reset (nothing listens) or an ICMP port-unreachable
 * (a firewall's REJECT: a TCP stack never sends one); the socket says
 * ECONNREFUSED for both, conntrack tells them apart: a reset closes the
 * probe's entry, an ICMP error leaves it in SYN_SENT.
 */
async function probeBackend(netns: string, ip: string, port: number): Promise<ProbeOutcome> {
  const run = async (p: number): Promise<{ outcome: ProbeOutcome; localPort: number }> => {
    for (let attempt = 0; ; attempt++) {
      const localPort = 40_000 + crypto.randomInt(20_000);
      const code = (await runInNetns(netns, [process.execPath, '-e', PROBE, ip, String(p), String(localPort)])).code;
      if (code !== 5 || attempt >= 3) return { outcome: PROBE_OUTCOMES[code] ?? 'error', localPort };
    }
  };
  const first = await run(port);
  if (first.outcome === 'refused') return (await refusedByIcmp(netns, ip, port, first.localPort)) ? 'rejected' : 'refused';
  if (first.outcome !== 'timeout' || port === 1) return first.outcome;
  const other = (await run(1)).outcome;
  return other === 'refused' || other === 'ok' ? 'timeout' : 'silent';
}

/** The probe's conntrack entry is still waiting for an answer (SYN_SENT): the refusal was an ICMP error, not a reset. */
async function refusedByIcmp(netns: string, ip: string, port: number, localPort: number): Promise<boolean> {
  const r = await runInNetns(netns, ['conntrack', '-L', '-p', 'tcp', '-d', ip, '--dport', String(port), '--sport', String(localPort)]);
  return r.code === 0 && /\bSYN_SENT\b/.test(r.stdout);
}

/** Resolves `ns/name[:port]` or `IP:port[/proto]` to the discovered services it names. */
export function resolveTarget(d: Discovery, target: string): { services: DiscoveredService[]; label: string } {
  if (/^[^/\s:]+\/[^/\s]+$/.test(target) && !/^\d+\.\d+\.\d+\.\d+/.test(target)) {
    const services = findByName(d, target);
    if (!services.length) throw new SvctraceError('BAD_INPUT', `no Service '${target}' in this node's kube-proxy rules (${d.mode} mode, ${d.services.length} services)`);
    return { services, label: target };
  }
  const spec = parseServiceSpec(target);
  const s = findByAddress(d, spec.address!, spec.port, spec.proto);
  return { services: s ? [s] : [], label: `${spec.address}:${spec.port}/${spec.proto}` };
}

export async function explain(opts: ExplainOptions): Promise<Explanation[]> {
  const netns = opts.netns !== undefined ? resolveNetns(opts.netns) : CURRENT_NETNS;
  const d = await discover(netns);
  // Rules that could not be read are not missing rules: say which it is.
  if (d.unreadable) throw new SvctraceError('NOT_PERMITTED', `cannot read the node's kube-proxy rules (${d.unreadable}): run as root or with CAP_NET_ADMIN`);
  if (d.readersMissing) throw new SvctraceError('TOOL_MISSING', readersMissingText(d.readersMissing));
  const { services, label } = resolveTarget(d, opts.target);
  if (!services.length) {
    return [{ target: label, netns, mode: d.mode, backends: [], diagnoses: [...diagnoseRules(undefined, label, d.masqueradeRule), ...diagnoseConntrack(await conntrackPressure(netns))] }];
  }
  const pressure = await conntrackPressure(netns);
  const cluster = await Cluster.start({ kubeconfig: opts.kubeconfig, onWarning: opts.onWarning });
  const out: Explanation[] = [];
  const views = new Map<DiscoveredService, BackendView | undefined>();
  for (const svc of services) {
    const backends: BackendState[] = await Promise.all(
      svc.endpoints.map(async (e) => {
        const b: BackendState = { ip: e.ip, port: e.port, route: await routeTo(netns, e.ip), neighbour: await neighbour(netns, e.ip) };
        if (opts.probe && svc.proto === 'tcp') {
          b.probe = await probeBackend(netns, e.ip, e.port);
          // The probe made the node resolve the address: what ARP said is known now.
          if (b.probe !== 'ok') b.neighbour = await neighbour(netns, e.ip);
        }
        return b;
      }),
    );
    // Who holds each address here tells a gone pod from a deaf or misrouted one: looked up when something may have failed.
    const mayFail = opts.probe || opts.watchSeconds || backends.some((b) => (!b.route.ok && !b.route.unknown) || ['FAILED', 'INCOMPLETE'].includes(b.neighbour.state));
    const view = mayFail ? await backendView(netns, svc.endpoints.map((e) => ({ ip: e.ip, port: e.port, proto: svc.proto }))) : undefined;
    if (view) {
      for (const b of backends) {
        b.holder = view.holderOf(b.ip);
        b.replyPath = view.replyPathOf(b.ip, b.port);
        b.tunnel = view.tunnelOf(b.ip);
      }
    }
    views.set(svc, view);
    const api = cluster ? apiEndpointsFor(cluster, svc) : undefined;
    out.push({
      target: `${svc.clusterIP}:${svc.port}/${svc.proto}`,
      netns,
      mode: d.mode,
      service: svc,
      backends,
      api,
      diagnoses: [...diagnoseRules(svc, label, d.masqueradeRule), ...diagnoseBackends(svc, backends), ...diagnoseConntrack(pressure), ...(api ? diagnoseApi(svc, api) : [])],
    });
  }
  await cluster?.stop();
  if (opts.watchSeconds) await watch(out, netns, d, opts.watchSeconds, (s) => views.get(s), opts.onWarning, opts.watchUntil);
  return out;
}

function apiEndpointsFor(cluster: Cluster, svc: DiscoveredService): ApiEndpoint[] | undefined {
  const at = cluster.serviceAt(svc.clusterIP, svc.port, svc.proto);
  if (!at) return undefined;
  return cluster.endpoints(at.service.namespace, at.service.name, at.portName);
}

/** Traces the services for a while and adds what the traffic showed. */
async function watch(exps: Explanation[], netns: string, d: Discovery, seconds: number, viewOf: (s: DiscoveredService) => BackendView | undefined, onWarning?: (m: string) => void, until?: AbortSignal): Promise<void> {
  const svcs = exps.map((e) => e.service!).filter(Boolean);
  if (!svcs.length) return;
  // Flows that ended early (their conntrack address taken by the next connection) leave the table: kept here.
  const ended: Flow[] = [];
  const pipeline = await Pipeline.start(
    {
      services: svcs.map((s) => parseServiceSpec(`${s.clusterIP}:${s.port}/${s.proto}`)),
      netns: [netns],
      discovery: d,
      // Only the flows are compared with the rules: no names from the API, no rule paths (no marking table in the node).
      kubeconfig: false,
      ruleTrace: false,
      closeGraceMs: 3_600_000, // every flow of the window stays for the comparison
      onWarning,
    },
    () => [{ name: 'watch', write: () => undefined, expired: (fs) => ended.push(...fs) }],
  );
  const startedAt = Date.now();
  await waitForStop(seconds, until);
  // What the traffic showed is over the time watched (Ctrl-C or `until` may end it early).
  const watched = Math.max(1, Math.round((Date.now() - startedAt) / 1000));
  // Taken after the stop: its drain delivers what the window's last packets
  // left in the ring and the listeners (the table outlives the stop, and a
  // flow it expires meanwhile is in `ended`, not in both).
  await pipeline.stop();
  const flows = [...ended, ...pipeline.flows.flows()];
  for (const e of exps) {
    const s = e.service;
    if (!s) continue;
    e.observed = observeFlows(s, flows, watched);
    // The traffic's diagnoses of a backend replace a guess from its probe with what the kernel saw (same code: one of them).
    const seen = diagnoseTraffic(s, e.observed, viewOf(s));
    e.diagnoses = [...e.diagnoses.filter((x) => !seen.some((y) => y.code === x.code && y.object === x.object)), ...seen];
  }
}

function pct(p: number): string {
  return `${(100 * p).toFixed(1)}%`;
}

export function formatExplanation(e: Explanation): string {
  const L: string[] = [];
  const s = e.service;
  if (!s) {
    L.push(`${e.target}: not a Service on this node (kube-proxy mode: ${e.mode}, namespace ${e.netns})`);
  } else {
    L.push(`${s.name}  ${s.clusterIP}:${s.port}/${s.proto}  (kube-proxy ${s.source} mode, namespace ${e.netns})`);
    const chainPath =
      !s.chain && s.rejects
        ? s.source === 'iptables'
          ? 'KUBE-SERVICES in the filter table REJECTs it (no endpoints): connections are refused'
          : '@no-endpoint-services -> reject-chain (no endpoints): connections are refused'
        : !s.chain
          ? 'no service chain found: nothing DNATs it'
          : s.source === 'iptables' ? `KUBE-SERVICES -> ${s.chain} -> KUBE-SEP-*`
          : s.source === 'ipvs' ? `IPVS virtual service ${s.clusterIP}:${s.port} (${s.chain.replace('ipvs ', 'scheduler ')}) -> real servers`
          : `services -> @service-ips -> ${s.chain} -> endpoint-*`;
    L.push(`  rules: ${chainPath}`);
    L.push(`  masquerade: ${s.masqueradeUnless ? `connections from outside ${s.masqueradeUnless} to the ClusterIP are masqueraded` : 'ClusterIP traffic is not masqueraded'}`);
    L.push(`  NodePorts: ${s.nodePorts.length ? `${s.nodePorts.join(', ')}${s.nodePortMasquerade ? ' (masqueraded: pods see the node, not the client)' : ' (client address kept)'}` : 'none'}`);
    L.push(`  session affinity: ${s.affinitySeconds ? `ClientIP, ${s.affinitySeconds} s` : 'none'}`);
    L.push(`  backends (${s.endpoints.length}):${s.endpoints.length ? '' : ' none'}`);
    s.endpoints.forEach((ep, i) => {
      const b = e.backends[i];
      const route = !b ? '' : b.route.ok ? `dev ${b.route.dev}${b.route.gateway ? ` via ${b.route.gateway}` : ''}${b.route.src ? ` src ${b.route.src}` : ''}` : b.route.unknown ? `route unknown (${b.route.error})` : `NO ROUTE (${b.route.error})`;
      const neigh = b ? `neighbour ${b.neighbour.state}` : '';
      const probe = b?.probe === undefined ? '' : b.probe === 'ok' ? ', TCP connect ok' : `, TCP connect ${b.probe.toUpperCase()}`;
      const obs = e.observed?.backends.find((o) => o.backend === `${ep.ip}:${ep.port}`);
      const seen = e.observed ? `  observed ${obs?.flows ?? 0} of ${e.observed.flows}` : '';
      const apiEp = e.api?.find((a) => a.ip === ep.ip && a.port === ep.port);
      const pod = apiEp?.pod ? `  pod ${apiEp.pod}${apiEp.ready ? '' : ' (not ready)'}${apiEp.terminating ? ' (terminating)' : ''}` : '';
      L.push(`    ${`${ep.ip}:${ep.port}`.padEnd(21)} ${pct(ep.probability).padStart(6)}  ${ep.chain}  route: ${route}, ${neigh}${probe}${pod}${seen}`);
    });
  }
  if (e.api) L.push(`  Kubernetes API: ${e.api.length} endpoints in the EndpointSlices (${e.api.filter((a) => a.ready && !a.terminating).length} ready)`);
  if (e.observed) L.push(`  watched ${e.observed.seconds} s: ${e.observed.flows} new connections, ${e.observed.masqueraded} masqueraded, ${e.observed.notDnated} not DNATed`);
  L.push(e.diagnoses.length ? '  diagnoses:' : '  diagnoses: none');
  for (const d of e.diagnoses) {
    L.push(`    [${d.severity.toUpperCase()}] ${d.code}${d.layer ? ` (${d.layer})` : ''}${d.object ? ` ${d.object}` : ''}: ${d.summary}`);
    for (const ev of d.evidence) L.push(`        evidence: ${ev}`);
  }
  return L.join('\n');
}
