/**
 * The classic Service failures, each with the evidence that proves it. Pure
 * functions over what discovery, the node's kernel and (with --watch) live
 * flows showed; the explain command gathers the inputs.
 */
import { DiscoveredService } from '../discovery/model';
import type { Flow } from '../flows/types';
import type { ApiEndpoint } from '../k8s/cluster';
import { IPS_SEEN_REPLY } from '../events/conntrack';
import { ConntrackPressure, NeighbourInfo, RouteInfo } from './node-state';

export interface Diagnosis {
  code:
    | 'NO_ENDPOINTS'
    | 'RULES_MISSING'
    | 'GHOST_BACKEND'
    | 'SESSION_AFFINITY'
    | 'CONNECTION_REUSE'
    | 'SKEWED_DISTRIBUTION'
    | 'CONNTRACK_PRESSURE'
    | 'CLIENT_IP_HIDDEN'
    | 'MASQUERADE_RULE_MISSING'
    | 'BACKEND_NOT_LISTENING'
    | 'BACKEND_FILTERED'
    | 'STALE_RULE'
    | 'REPLY_PATH_BROKEN'
    | 'ENDPOINTS_MISMATCH';
  severity: 'error' | 'warning' | 'info';
  /** Where the fault is: what to look at, and who fixes it. */
  layer?: 'rules' | 'conntrack' | 'routing' | 'neighbour' | 'pod-firewall' | 'application';
  summary: string;
  evidence: string[];
}

/** silent: timed out on the port and on port 1 too: no live host answers at the address. */
export type ProbeOutcome = 'ok' | 'refused' | 'timeout' | 'unreachable' | 'silent' | 'error';

export interface BackendState {
  ip: string;
  port: number;
  route: RouteInfo;
  neighbour: NeighbourInfo;
  /**
   * --probe: how a TCP connection from the node to the backend ended:
   * accepted, refused (RST: nothing listens, or a REJECT), timed out (a DROP
   * somewhere on the way), unreachable (no host answers: EHOSTUNREACH), or
   * another error. Undefined when not probed.
   */
  probe?: ProbeOutcome;
}

/** Flows seen live for one backend (explain --watch). */
export interface ObservedBackend {
  backend: string;
  flows: number;
  /** Flows the backend answered (SEEN_REPLY). */
  answered: number;
  resets: number;
  /** Packets carried by the busiest flow (connection reuse shows as a few flows with many requests). */
  maxPacketsPerFlow: number;
  clients: Set<string>;
  /** Unanswered flows with a kernel drop, by drop reason (the evidence of where they stopped). */
  droppedBy?: Map<string, number>;
  /** Rules that dropped them where the backend receives them (nftables trace in a traced pod namespace). */
  dropRules?: Set<string>;
}

export interface ObservedTraffic {
  seconds: number;
  flows: number;
  notDnated: number;
  backends: ObservedBackend[];
  masqueraded: number;
}

export function diagnoseRules(svc: DiscoveredService | undefined, target: string, masqueradeRule: boolean): Diagnosis[] {
  if (!svc) {
    return [{
      code: 'RULES_MISSING', layer: 'rules',
      severity: 'error',
      summary: `no kube-proxy rule matches ${target} on this node: packets to it are not DNATed (the Service is missing from the rules, or kube-proxy is not running or not synced)`,
      evidence: ['no KUBE-SERVICES rule (iptables) or service-ips element (nftables) for this address and port'],
    }];
  }
  const out: Diagnosis[] = [];
  if (svc.rejects || svc.endpoints.length === 0) {
    out.push({
      code: 'NO_ENDPOINTS', layer: 'rules',
      severity: 'error',
      summary: `${svc.name} has no endpoints: kube-proxy ${svc.rejects ? 'REJECTs' : 'drops'} new connections (clients see "connection refused"); check the pods' readiness and the EndpointSlices`,
      evidence: [svc.rejects ? `REJECT rule for ${svc.clusterIP}:${svc.port} ("has no endpoints")` : `${svc.chain} has no endpoint rule`],
    });
  }
  if (svc.affinitySeconds) {
    out.push({
      code: 'SESSION_AFFINITY', layer: 'rules',
      severity: 'info',
      summary: `sessionAffinity: ClientIP (${svc.affinitySeconds} s): each client sticks to one backend, so few clients make an uneven distribution`,
      evidence: [`-m recent --rcheck --seconds ${svc.affinitySeconds} rules in ${svc.chain}`],
    });
  }
  if (svc.nodePorts.length && svc.nodePortMasquerade) {
    out.push({
      code: 'CLIENT_IP_HIDDEN', layer: 'rules',
      severity: 'info',
      summary: `NodePort ${svc.nodePorts.join(',')} traffic is masqueraded: pods see this node's address, not the client (externalTrafficPolicy: Cluster); use Local to keep the client IP`,
      evidence: ['the NodePort chain jumps to KUBE-MARK-MASQ / mark-for-masquerade for every packet'],
    });
  }
  if ((svc.masqueradeUnless || svc.nodePortMasquerade) && !masqueradeRule) {
    out.push({
      code: 'MASQUERADE_RULE_MISSING', layer: 'rules',
      severity: 'warning',
      summary: 'packets are marked for masquerade but no MASQUERADE rule acts on the mark: replies from pods may not come back the way the request went',
      evidence: ['KUBE-MARK-MASQ / mark-for-masquerade present, no MASQUERADE in KUBE-POSTROUTING / masquerading'],
    });
  }
  return out;
}

/**
 * Each backend, from the node's point of view; the probe's outcome tells the
 * faults apart (one diagnosis per backend, the most specific):
 * - its rule disagrees with itself (STALE_RULE, rules): the rule is wrong;
 * - nothing answers at the address (GHOST_BACKEND, routing/neighbour);
 * - the connection is refused (BACKEND_NOT_LISTENING, application);
 * - the host answers ARP but the connection times out (BACKEND_FILTERED, pod firewall).
 */
export function diagnoseBackends(svc: DiscoveredService, backends: BackendState[]): Diagnosis[] {
  const out: Diagnosis[] = [];
  backends.forEach((b, i) => {
    const ep = svc.endpoints[i];
    const at = `${b.ip}:${b.port}`;
    const probe = b.probe === undefined || b.probe === 'silent' ? [] : [`TCP connect from the node: ${b.probe === 'ok' ? 'accepted' : b.probe}`];
    if (ep?.ruleAddress && ep.ruleAddress !== ep.ip) {
      out.push({
        code: 'STALE_RULE',
        severity: 'error',
        layer: 'rules',
        summary: `${ep.chain} DNATs to ${at}, but the same chain's own hairpin rule names ${ep.ruleAddress}: the rule is wrong (edited by hand, or left stale), not the pod; kube-proxy would DNAT to ${ep.ruleAddress}:${b.port}`,
        evidence: [`${ep.chain}: DNAT to ${at}`, `${ep.chain}: masquerade for source ${ep.ruleAddress} (the endpoint the rule was written for)`, ...probe],
      });
      return;
    }
    const noHost: string[] = [];
    if (!b.route.ok) noHost.push(`no route: ${b.route.error}`);
    if (['FAILED', 'INCOMPLETE'].includes(b.neighbour.state)) noHost.push(`neighbour ${b.neighbour.state} (nothing answers ARP for ${b.ip})`);
    if (b.probe === 'unreachable') noHost.push(`TCP connect to ${at}: host unreachable`);
    if (b.probe === 'silent') noHost.push(`no answer at ${b.ip}, on port ${b.port} nor on port 1 (a live host refuses that): no host there, or one that drops everything`);
    if (noHost.length) {
      out.push({
        code: 'GHOST_BACKEND',
        severity: 'error',
        layer: b.route.ok ? 'neighbour' : 'routing',
        summary: `${svc.name} DNATs to ${at}, where no host answers: a stale ("ghost") endpoint — the pod is gone or its address moved, yet the rules still send it connections`,
        evidence: [...noHost, ...probe],
      });
    } else if (b.probe === 'refused') {
      out.push({
        code: 'BACKEND_NOT_LISTENING',
        severity: 'error',
        layer: 'application',
        summary: `the pod at ${b.ip} is there, but a connection to port ${b.port} was refused: nothing listens on it (wrong targetPort, the app is down) or the pod REJECTs it`,
        evidence: [`neighbour ${b.neighbour.state}`, ...probe],
      });
    } else if (b.probe === 'timeout') {
      out.push({
        code: 'BACKEND_FILTERED',
        severity: 'error',
        layer: 'pod-firewall',
        summary: `the pod at ${b.ip} is there (it refuses other ports), but a connection to port ${b.port} times out: something drops it on the way in (a NetworkPolicy, the pod's own firewall)`,
        evidence: [`neighbour ${b.neighbour.state}`, ...probe],
      });
    } else if (b.probe === 'error') {
      out.push({ code: 'GHOST_BACKEND', severity: 'error', layer: 'routing', summary: `${svc.name} DNATs to ${at}, which this node cannot connect to`, evidence: probe });
    }
  });
  return out;
}

export function diagnoseConntrack(p: ConntrackPressure | null): Diagnosis[] {
  if (!p) return [];
  const ev: string[] = [];
  if (p.max && p.count / p.max >= 0.9) ev.push(`nf_conntrack_count ${p.count} of nf_conntrack_max ${p.max} (${((100 * p.count) / p.max).toFixed(0)}%)`);
  if (p.insertFailed) ev.push(`insert_failed=${p.insertFailed}`);
  if (p.drop) ev.push(`drop=${p.drop}`);
  if (p.earlyDrop) ev.push(`early_drop=${p.earlyDrop}`);
  if (!ev.length) return [];
  return [{ code: 'CONNTRACK_PRESSURE', layer: 'conntrack', severity: 'error', summary: 'conntrack is under pressure: new connections are dropped or fail to insert (timeouts, resets under load)', evidence: ev }];
}

/** Chi-square statistic of observed new flows per backend vs the rules' probabilities. */
export function chiSquare(observed: number[], probabilities: number[]): number {
  const n = observed.reduce((a, b) => a + b, 0);
  let x2 = 0;
  observed.forEach((o, i) => {
    const e = n * (probabilities[i] ?? 0);
    if (e > 0) x2 += ((o - e) * (o - e)) / e;
  });
  return x2;
}

/** Upper-tail critical values of chi-square at p = 0.001, by degrees of freedom. */
const CHI2_P001 = [0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59];

export function diagnoseTraffic(svc: DiscoveredService, t: ObservedTraffic): Diagnosis[] {
  const out: Diagnosis[] = [];
  // A Service without endpoints is not DNATed by design: kube-proxy REJECTs
  // it in the filter table (NO_ENDPOINTS says so). Only a Service whose rules
  // should DNAT and did not is missing rules.
  if (t.notDnated > 0 && !(svc.rejects || svc.endpoints.length === 0)) {
    out.push({ code: 'RULES_MISSING', layer: 'rules', severity: 'error', summary: `${t.notDnated} of ${t.flows} connections to ${svc.clusterIP}:${svc.port} were not DNATed`, evidence: ['after-DNAT hook saw the ClusterIP still as destination'] });
  }
  for (const b of t.backends) {
    if (b.resets > 0) {
      out.push({ code: 'BACKEND_NOT_LISTENING', layer: 'application', severity: 'error', summary: `${b.backend} answered ${b.resets} connection(s) with a TCP RST: nothing listens on that port in the pod (wrong targetPort, or the app is down)`, evidence: [`${b.resets} RST from the backend`] });
    }
    const unanswered = b.flows - b.answered - b.resets;
    if (unanswered > 0 && b.flows > 0) {
      const drops = [...(b.droppedBy ?? new Map<string, number>())];
      if (drops.length) {
        // The kernel said where they stopped: cite it, not three guesses.
        const rules = [...(b.dropRules ?? [])];
        out.push({
          code: 'BACKEND_FILTERED',
          severity: 'error',
          layer: 'pod-firewall',
          summary: `${unanswered} of ${b.flows} connections to ${b.backend} got no reply: the kernel dropped their packets (${drops.map(([r, n]) => `${r} in ${n}`).join(', ')})${rules.length ? `, by ${rules.join('; ')}` : ''}`,
          evidence: [`${unanswered} flows without SEEN_REPLY`, ...drops.map(([r, n]) => `${n} of them dropped with reason ${r} (trace the Service to see where)`), ...rules.map((r) => `dropped where the backend receives it by ${r}`)],
        });
      } else {
        out.push({ code: 'REPLY_PATH_BROKEN', severity: 'error', layer: 'routing', summary: `${unanswered} of ${b.flows} connections to ${b.backend} got no reply (conntrack never reached SEEN_REPLY) and no drop was seen: the backend is gone, or its replies take another path`, evidence: [`${unanswered} flows without SEEN_REPLY, none dropped on this node's traced path`] });
      }
    }
  }
  const withEndpoints = svc.endpoints.filter((e) => e.probability > 0);
  const observed = withEndpoints.map((e) => t.backends.find((b) => b.backend === `${e.ip}:${e.port}`)?.flows ?? 0);
  const total = observed.reduce((a, b) => a + b, 0);
  if (withEndpoints.length > 1 && total >= 5 * withEndpoints.length) {
    const x2 = chiSquare(observed, withEndpoints.map((e) => e.probability));
    const crit = CHI2_P001[Math.min(withEndpoints.length - 1, CHI2_P001.length - 1)]!;
    if (x2 > crit) {
      out.push({
        code: 'SKEWED_DISTRIBUTION', layer: 'rules',
        severity: svc.affinitySeconds ? 'info' : 'warning',
        summary: svc.affinitySeconds
          ? `new connections are unevenly spread, as sessionAffinity: ClientIP makes them (${t.backends.reduce((s, b) => s + b.clients.size, 0)} client addresses)`
          : `new connections are spread unevenly compared with the rules' probabilities (chi-square ${x2.toFixed(1)} > ${crit}, p < 0.001)`,
        evidence: withEndpoints.map((e, i) => `${e.ip}:${e.port}: ${observed[i]} of ${total} (expected ${(100 * e.probability).toFixed(1)}%)`),
      });
    }
  }
  // "All traffic lands on one pod": few connections carrying many requests each.
  const busiest = t.backends.reduce((m, b) => Math.max(m, b.maxPacketsPerFlow), 0);
  if (t.flows > 0 && t.flows <= withEndpoints.length * 2 && busiest >= 20) {
    out.push({
      code: 'CONNECTION_REUSE', layer: 'application',
      severity: 'info',
      summary: `only ${t.flows} connection(s) in ${t.seconds} s carried the traffic (up to ${busiest} packets each): kube-proxy balances connections, not requests, so keep-alive clients stay on one pod`,
      evidence: t.backends.map((b) => `${b.backend}: ${b.flows} flows, busiest ${b.maxPacketsPerFlow} packets`),
    });
  }
  return out;
}

/** What a set of flows to one service showed, per backend. */
export function observeFlows(svc: DiscoveredService, flows: Flow[], seconds: number): ObservedTraffic {
  const mine = flows.filter((f) => f.orig.daddr === svc.clusterIP && f.orig.dport === svc.port);
  const byBackend = new Map<string, ObservedBackend>();
  let notDnated = 0;
  let masqueraded = 0;
  for (const f of mine) {
    if (!f.dnat) {
      notDnated++;
      continue;
    }
    if (f.masqueraded) masqueraded++;
    const key = `${f.reply.saddr}:${f.reply.sport}`;
    let b = byBackend.get(key);
    if (!b) byBackend.set(key, (b = { backend: key, flows: 0, answered: 0, resets: 0, maxPacketsPerFlow: 0, clients: new Set() }));
    b.flows++;
    if (f.reset) b.resets++;
    else if (f.status & IPS_SEEN_REPLY) b.answered++;
    else if (f.drops.length) {
      b.droppedBy ??= new Map();
      for (const r of new Set(f.drops)) b.droppedBy.set(r, (b.droppedBy.get(r) ?? 0) + 1);
      if (f.backendDropRule) (b.dropRules ??= new Set()).add(f.backendDropRule);
    }
    b.maxPacketsPerFlow = Math.max(b.maxPacketsPerFlow, f.packets[0] + f.packets[1]);
    b.clients.add(f.orig.saddr);
  }
  return { seconds, flows: mine.length, notDnated, backends: [...byBackend.values()], masqueraded };
}

/** The Kubernetes API (EndpointSlices) against this node's rules. */
export function diagnoseApi(svc: DiscoveredService, api: ApiEndpoint[]): Diagnosis[] {
  const key = (ip: string, port: number) => `${ip}:${port}`;
  const ready = new Set(api.filter((e) => e.ready && !e.terminating).map((e) => key(e.ip, e.port)));
  const known = new Map(api.map((e) => [key(e.ip, e.port), e]));
  const rules = new Set(svc.endpoints.map((e) => key(e.ip, e.port)));
  const out: Diagnosis[] = [];
  const stale = [...rules].filter((k) => !ready.has(k));
  const missing = [...ready].filter((k) => !rules.has(k));
  if (stale.length) {
    out.push({
      code: 'ENDPOINTS_MISMATCH', layer: 'rules',
      severity: 'error',
      summary: `this node's rules still send ${svc.name} connections to ${stale.join(', ')}, which the API no longer lists as ready: stale rules (kube-proxy has not synced) — or a ghost endpoint`,
      evidence: stale.map((k) => {
        const e = known.get(k);
        return e ? `${k}${e.pod ? ` (${e.pod})` : ''}: ready=${e.ready} terminating=${e.terminating} in the EndpointSlice` : `${k}: in no EndpointSlice of the Service`;
      }),
    });
  }
  if (missing.length) {
    out.push({
      code: 'ENDPOINTS_MISMATCH', layer: 'rules',
      severity: 'error',
      summary: `the API lists ready endpoints of ${svc.name} that this node's rules do not have: ${missing.join(', ')} (kube-proxy not synced on this node)`,
      evidence: missing.map((k) => `${k}${known.get(k)?.pod ? ` (${known.get(k)!.pod})` : ''}: ready in the EndpointSlice, no rule`),
    });
  }
  return out;
}
