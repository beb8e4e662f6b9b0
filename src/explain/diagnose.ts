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
    | 'NEIGHBOUR_FAILED'
    | 'NO_ROUTE'
    | 'TUNNEL_BROKEN'
    | 'MTU_MISMATCH'
    | 'NO_LOCAL_ENDPOINTS'
    | 'ENDPOINTS_MISMATCH'
    | 'IPVS_NOT_FORWARDED';
  severity: 'error' | 'warning' | 'info';
  /** Where the fault is: what to look at, and who fixes it. */
  layer?: 'rules' | 'conntrack' | 'routing' | 'neighbour' | 'pod-firewall' | 'application';
  /** What is at fault: `backend IP:port`, `rule CHAIN`, `service NAME`, `namespace NAME`. */
  object?: string;
  summary: string;
  evidence: string[];
}

/**
 * refused: a TCP reset (nothing listens). rejected: refused by an ICMP
 * port-unreachable, which a TCP stack never sends: a firewall's REJECT.
 * silent: timed out on the port and on port 1 too: no live host answers.
 */
export type ProbeOutcome = 'ok' | 'refused' | 'rejected' | 'timeout' | 'unreachable' | 'silent' | 'error';

/**
 * Who holds a backend's address on this node: the network namespace of a
 * local pod with that address (its name), null when no namespace on this
 * node has it (for an address on a local pod subnet: the pod is gone), or
 * undefined when that cannot be told (a remote backend, no named namespaces).
 */
export type HolderOf = (ip: string) => string | null | undefined;

/** What the node's state says about backends, for judging their traffic (node-state backendView). */
export interface BackendView {
  holderOf: HolderOf;
  /** The node's route to a backend, when looked up. */
  routeOf(ip: string): RouteInfo | undefined;
  /** For a local pod: the interface its answers to the node leave by, and the one holding its address. */
  replyPathOf(ip: string, port: number): ReplyPath | undefined;
  /** A backend the node reaches through a tunnel (another node's pod over an overlay). */
  tunnelOf(ip: string): Tunnel | undefined;
}

export interface Tunnel {
  dev: string;
  kind: string;
  remote?: string;
  gateway: string;
  /** The neighbour state of the gateway across the tunnel (FAILED: nothing answers through it). */
  gatewayNeighbour?: string;
  /** The tunnel's MTU, and the largest MTU of the bridges this node's pods hang off. */
  mtu?: number;
  podMtu?: number;
}

/** Pods that send bigger packets than a tunnel carries: it works only while path MTU discovery does. */
function tunnelMtu(at: string, t: Tunnel): Diagnosis | undefined {
  if (!t.mtu || !t.podMtu || t.podMtu <= t.mtu) return undefined;
  return {
    code: 'MTU_MISMATCH',
    object: `tunnel ${t.dev}`,
    severity: 'warning',
    layer: 'routing',
    summary: `pods here send packets of up to ${t.podMtu} bytes, the ${t.kind} tunnel ${t.dev} to ${at}'s node carries ${t.mtu}: large packets work only while ICMP "fragmentation needed" reaches the pods (path MTU discovery); set the pods' MTU to ${t.mtu} or less`,
    evidence: [`MTU ${t.mtu} on ${t.dev}; MTU ${t.podMtu} on this node's pod bridge`],
  };
}

function tunnelBroken(at: string, t: Tunnel, evidence: string[], failed?: string): Diagnosis {
  return {
    code: 'TUNNEL_BROKEN',
    object: `tunnel ${t.dev}`,
    severity: 'error',
    layer: 'routing',
    summary: `${failed ? `${failed} got no reply: ` : ''}${at} is on another node, reached through the ${t.kind} tunnel ${t.dev}${t.remote ? ` to ${t.remote}` : ''}, and nothing answers through it (not even the other node's tunnel address ${t.gateway}): the overlay is broken (the underlay path, its UDP port filtered, the other end down)`,
    evidence: [...evidence, `route to ${at.split(':')[0]}: via ${t.gateway} dev ${t.dev} (${t.kind})`, ...(t.gatewayNeighbour ? [`neighbour ${t.gateway} on ${t.dev}: ${t.gatewayNeighbour}`] : [])],
  };
}


/** Where a local pod sends what it answers to the node. */
export interface ReplyPath {
  dev: string;
  /** The interface holding the pod's address (where requests arrive). */
  expected: string;
  netns: string;
}

const UNKNOWN_VIEW: BackendView = { holderOf: () => undefined, routeOf: () => undefined, replyPathOf: () => undefined, tunnelOf: () => undefined };

/** A pod that answers the node out of another interface than the one its address (and the requests) are on. */
function replyRouted(at: string, p: ReplyPath | undefined, evidence: string[], failed?: string): Diagnosis | undefined {
  if (!p || p.dev === p.expected) return undefined;
  return {
    code: 'REPLY_PATH_BROKEN',
    object: `backend ${at}`,
    severity: 'error',
    layer: 'routing',
    summary: `${failed ? `${failed} got no reply: ` : ''}the pod at ${at} (${p.netns}) routes what it answers to the node out of ${p.dev}, not ${p.expected} where the requests arrive: its replies take another path (a policy or asymmetric route in the pod)`,
    evidence: [...evidence, `in ${p.netns}: ip route get <node> from ${at.replace(':', ' sport ')}: dev ${p.dev}; the address is on ${p.expected}`],
  };
}

export interface BackendState {
  ip: string;
  port: number;
  route: RouteInfo;
  neighbour: NeighbourInfo;
  /**
   * --probe: how a TCP connection from the node to the backend ended:
   * accepted, refused (RST: nothing listens), rejected (ICMP: a firewall),
   * timed out (a DROP somewhere on the way), unreachable (no host answers:
   * EHOSTUNREACH), or another error. Undefined when not probed.
   */
  probe?: ProbeOutcome;
  /** The local pod namespace holding the address (HolderOf); undefined when not told. */
  holder?: string | null;
  /** For a local pod: where it sends its answers to the node (BackendView.replyPathOf). */
  replyPath?: ReplyPath;
  /** For a backend behind a tunnel (BackendView.tunnelOf). */
  tunnel?: Tunnel;
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
  /** Client addresses, at most MAX_CLIENTS_PER_BACKEND of them. */
  clients: Set<string>;
  /** Unanswered flows with a kernel drop, by drop reason (the evidence of where they stopped). */
  droppedBy?: Map<string, number>;
  /** Rules that dropped them where the backend receives them (nftables trace in a traced pod namespace). */
  dropRules?: Set<string>;
  /** Unanswered flows with an ICMP error, by error (port-unreachable, host-unreachable, ...). */
  icmpBy?: Map<string, number>;
  /** Unanswered flows whose every drop was of a reply (the backend answered), by where: "REASON at DEV in NETNS". */
  replyDroppedAt?: Map<string, number>;
  /** Flows (answered or not) with packets dropped as too big for the path (PKT_TOO_BIG), and where. */
  tooBig?: number;
  tooBigAt?: Set<string>;
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
      code: 'RULES_MISSING', layer: 'rules', object: `service ${target}`,
      severity: 'error',
      summary: `no kube-proxy rule matches ${target} on this node: packets to it are not DNATed (the Service is missing from the rules, or kube-proxy is not running or not synced)`,
      evidence: ['no KUBE-SERVICES rule (iptables) or service-ips element (nftables) for this address and port'],
    }];
  }
  const out: Diagnosis[] = [];
  // A Local NodePort without a local endpoint has no real server here by design: NO_LOCAL_ENDPOINTS says so.
  if ((svc.rejects || svc.endpoints.length === 0) && !svc.noLocalEndpoints) {
    out.push({
      code: 'NO_ENDPOINTS', layer: 'rules', object: `service ${svc.name}`,
      severity: 'error',
      // IPVS answers a virtual service without real servers with an ICMP
      // port unreachable (ip_vs_leave in ip_vs_core.c): refused, too.
      summary: `${svc.name} has no endpoints: ${svc.rejects ? 'kube-proxy REJECTs new connections (clients see "connection refused")' : svc.source === 'ipvs' ? 'IPVS has no real server for it and refuses new connections with an ICMP port unreachable (clients see "connection refused")' : 'kube-proxy drops new connections (clients time out)'}; check the pods' readiness and the EndpointSlices`,
      evidence: [svc.rejects ? `REJECT rule for ${svc.clusterIP}:${svc.port} ("has no endpoints")` : svc.source === 'ipvs' ? `IPVS virtual service ${svc.clusterIP}:${svc.port} has no real server` : `${svc.chain} has no endpoint rule`],
    });
  }
  if (svc.affinitySeconds) {
    out.push({
      code: 'SESSION_AFFINITY', layer: 'rules', object: `service ${svc.name}`,
      severity: 'info',
      summary: `sessionAffinity: ClientIP (${svc.affinitySeconds} s): each client sticks to one backend, so few clients make an uneven distribution`,
      evidence: [
        svc.source === 'ipvs'
          ? `IPVS virtual service ${svc.clusterIP}:${svc.port} is persistent (ipvsadm: persistent ${svc.affinitySeconds})`
          : svc.source === 'nftables'
            ? `${svc.chain} keeps each client's endpoint in an affinity set (timeout ${svc.affinitySeconds} s)`
            : `-m recent --rcheck --seconds ${svc.affinitySeconds} rules in ${svc.chain}`,
      ],
    });
  }
  if (svc.nodePorts.length && svc.nodePortMasquerade) {
    out.push({
      code: 'CLIENT_IP_HIDDEN', layer: 'rules', object: `service ${svc.name}`,
      severity: 'info',
      summary: `NodePort ${svc.nodePorts.join(',')} traffic is masqueraded: pods see this node's address, not the client (externalTrafficPolicy: Cluster); use Local to keep the client IP`,
      evidence: ['the NodePort chain jumps to KUBE-MARK-MASQ / mark-for-masquerade for every packet'],
    });
  }
  if (svc.noLocalEndpoints) {
    out.push({
      code: 'NO_LOCAL_ENDPOINTS',
      layer: 'rules',
      object: `service ${svc.name}`,
      severity: 'error',
      summary: `NodePort ${svc.nodePorts.join(',')} has externalTrafficPolicy: Local and no endpoint on this node: ${svc.source === 'ipvs' ? 'IPVS has no real server for it here and refuses NodePort connections that arrive here (ICMP port unreachable)' : 'kube-proxy drops NodePort traffic that arrives here'} (a load balancer must not send it here: its health check on healthCheckNodePort says so)`,
      evidence: [
        svc.source === 'ipvs'
          ? `IPVS virtual service ${svc.clusterIP}:${svc.port} has no real server; port ${svc.port} is in KUBE-NODE-PORT-LOCAL-${svc.proto.toUpperCase()} (externalTrafficPolicy=local)`
          : `"${svc.name} has no local endpoints" DROP for NodePort ${svc.nodePorts.join(',')} (KUBE-EXTERNAL-SERVICES)`,
      ],
    });
  }
  if ((svc.masqueradeUnless || svc.nodePortMasquerade) && !masqueradeRule) {
    out.push({
      code: 'MASQUERADE_RULE_MISSING', layer: 'rules', object: 'rule KUBE-POSTROUTING / masquerading',
      severity: 'warning',
      summary: 'packets are marked for masquerade but no MASQUERADE rule acts on the mark: replies from pods may not come back the way the request went',
      evidence: ['KUBE-MARK-MASQ / mark-for-masquerade present, no MASQUERADE in KUBE-POSTROUTING / masquerading'],
    });
  }
  return out;
}

/**
 * A rule checked against itself: an endpoint chain whose DNAT target is not
 * the endpoint it was written for (its own hairpin rule, or its name in
 * nftables mode). The rule is wrong, not the pod. One per endpoint.
 */
export function diagnoseRuleConsistency(svc: DiscoveredService): Diagnosis[] {
  return svc.endpoints
    .filter((ep) => ep.ruleAddress && ep.ruleAddress !== ep.ip)
    .map((ep) => ({
      code: 'STALE_RULE' as const,
      object: `rule ${ep.chain}`,
      severity: 'error' as const,
      layer: 'rules' as const,
      summary: `${ep.chain} DNATs to ${ep.ip}:${ep.port}, but the same chain's own hairpin rule names ${ep.ruleAddress}: the rule is wrong (edited by hand, or left stale), not the pod; kube-proxy would DNAT to ${ep.ruleAddress}:${ep.port}`,
      evidence: [`${ep.chain}: DNAT to ${ep.ip}:${ep.port}`, `${ep.chain}: masquerade for source ${ep.ruleAddress} (the endpoint the rule was written for)`],
    }));
}

function isStale(svc: DiscoveredService, ip: string, port: number): boolean {
  return svc.endpoints.some((ep) => ep.ip === ip && ep.port === port && ep.ruleAddress !== undefined && ep.ruleAddress !== ep.ip);
}

/** Nothing answers at an address: whose fault it is depends on who holds it. */
function noAnswer(svc: DiscoveredService, at: string, ip: string, holder: string | null | undefined, neighbourFailed: boolean, evidence: string[]): Diagnosis {
  if (holder && neighbourFailed) {
    return {
      code: 'NEIGHBOUR_FAILED',
      object: `backend ${at}`,
      severity: 'error',
      layer: 'neighbour',
      summary: `the pod at ${ip} is on this node (${holder}) but does not answer ARP from it: its interface is down or ignores ARP, or its veth is detached from the bridge`,
      evidence: [...evidence, `${ip} is an address of ${holder}`],
    };
  }
  if (holder) {
    return {
      code: 'REPLY_PATH_BROKEN',
      object: `backend ${at}`,
      severity: 'error',
      layer: 'routing',
      summary: `the pod at ${ip} is on this node (${holder}) and answers ARP, but never answers TCP, not even with a refusal: its replies take another path (a route in the pod, an asymmetric route) or it drops everything`,
      evidence: [...evidence, `${ip} is an address of ${holder}`],
    };
  }
  return {
    code: 'GHOST_BACKEND',
    object: `backend ${at}`,
    severity: 'error',
    layer: 'neighbour',
    summary: `${svc.name} DNATs to ${at}, where no host answers: a stale ("ghost") endpoint — the pod is gone or its address moved, yet the rules still send it connections`,
    evidence: [...evidence, ...(holder === null ? [`no pod namespace on this node has ${ip}`] : [])],
  };
}

/**
 * Each backend, from the node's point of view; the probe's outcome tells the
 * faults apart (one diagnosis per backend, the most specific):
 * - its rule disagrees with itself (STALE_RULE, rules): the rule is wrong;
 * - the node has no usable route to it (NO_ROUTE, routing);
 * - nothing answers at the address: the pod is gone (GHOST_BACKEND), is here
 *   but deaf to ARP (NEIGHBOUR_FAILED), or answers ARP and nothing else
 *   (REPLY_PATH_BROKEN);
 * - the connection is refused by a TCP reset (BACKEND_NOT_LISTENING, application);
 * - it is rejected by ICMP, or times out while the host answers elsewhere
 *   (BACKEND_FILTERED, pod firewall).
 */
export function diagnoseBackends(svc: DiscoveredService, backends: BackendState[]): Diagnosis[] {
  const out: Diagnosis[] = diagnoseRuleConsistency(svc);
  backends.forEach((b) => {
    const at = `${b.ip}:${b.port}`;
    if (isStale(svc, b.ip, b.port)) return; // said above: the rule, not the address
    const probe = b.probe === undefined || b.probe === 'silent' ? [] : [`TCP connect from the node: ${b.probe === 'ok' ? 'accepted' : b.probe}`];
    if (!b.route.ok && !b.route.unknown) {
      out.push({
        code: 'NO_ROUTE',
        object: `backend ${at}`,
        severity: 'error',
        layer: 'routing',
        summary: `this node has no usable route to the backend ${at} (${b.route.error}): the kernel drops connections the rules send there`,
        evidence: [`ip route get ${b.ip}: ${b.route.error}`, ...probe],
      });
      return;
    }
    const neighbourFailed = ['FAILED', 'INCOMPLETE'].includes(b.neighbour.state);
    const noHost: string[] = [];
    if (neighbourFailed) noHost.push(`neighbour ${b.neighbour.state} (nothing answers ARP for ${b.ip})`);
    if (b.probe === 'unreachable') noHost.push(`TCP connect to ${at}: host unreachable`);
    if (b.probe === 'silent') noHost.push(`no answer at ${b.ip}, on port ${b.port} nor on port 1 (a live host refuses that)`);
    const misrouted = (b.probe === 'timeout' || b.probe === 'silent') && !neighbourFailed ? replyRouted(at, b.replyPath, [`neighbour ${b.neighbour.state}`, ...probe]) : undefined;
    const mtu = b.tunnel ? tunnelMtu(at, b.tunnel) : undefined;
    if (mtu && !out.some((d) => d.code === mtu.code && d.object === mtu.object)) out.push(mtu);
    if (b.tunnel && (b.probe === 'silent' || b.probe === 'unreachable' || ['FAILED', 'INCOMPLETE'].includes(b.tunnel.gatewayNeighbour ?? ''))) {
      out.push(tunnelBroken(at, b.tunnel, probe));
    } else if (misrouted) {
      out.push(misrouted);
    } else if (noHost.length) {
      out.push(noAnswer(svc, at, b.ip, b.holder, neighbourFailed, [...noHost, ...probe]));
    } else if (b.probe === 'refused') {
      out.push({
        code: 'BACKEND_NOT_LISTENING',
        object: `backend ${at}`,
        severity: 'error',
        layer: 'application',
        summary: `the pod at ${b.ip} is there, but a connection to port ${b.port} was reset: nothing listens on it (wrong targetPort, the app is down)`,
        evidence: [`neighbour ${b.neighbour.state}`, ...probe],
      });
    } else if (b.probe === 'rejected') {
      out.push({
        code: 'BACKEND_FILTERED',
        object: `backend ${at}`,
        severity: 'error',
        layer: 'pod-firewall',
        summary: `the pod at ${b.ip} is there, but a connection to port ${b.port} was refused with an ICMP port-unreachable, which a TCP stack never sends: a firewall REJECTs it (a NetworkPolicy, the pod's own rules)`,
        evidence: [`neighbour ${b.neighbour.state}`, ...probe],
      });
    } else if (b.probe === 'timeout') {
      out.push({
        code: 'BACKEND_FILTERED',
        object: `backend ${at}`,
        severity: 'error',
        layer: 'pod-firewall',
        summary: `the pod at ${b.ip} is there (it refuses other ports), but a connection to port ${b.port} times out: something drops it on the way in (a NetworkPolicy, the pod's own firewall)`,
        evidence: [`neighbour ${b.neighbour.state}`, ...probe],
      });
    } else if (b.probe === 'error') {
      out.push({ code: 'GHOST_BACKEND', object: `backend ${at}`, severity: 'error', layer: 'routing', summary: `${svc.name} DNATs to ${at}, which this node cannot connect to`, evidence: probe });
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
  return [{ code: 'CONNTRACK_PRESSURE', layer: 'conntrack', object: 'conntrack table', severity: 'error', summary: 'conntrack is under pressure: new connections are dropped or fail to insert (timeouts, resets under load)', evidence: ev }];
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

/**
 * A netfilter rule's DROP: by its reason, or before Linux 5.17 (no
 * reasons: UNKNOWN) by the function that freed the packet, the one place
 * netfilter frees what a rule dropped.
 */
function isNetfilterDrop(name: string): boolean {
  return name === 'NETFILTER_DROP' || name.endsWith('@nf_hook_slow');
}

/** Drop reasons that say where a packet could not go. */
const NEIGHBOUR_DROPS = new Set(['NEIGH_FAILED', 'NEIGH_QUEUEFULL', 'NEIGH_DEAD', 'NEIGH_CREATEFAIL']);
const ROUTE_DROPS = new Set(['IP_INNOROUTES', 'IP_OUTNOROUTES', 'IP_INADDRERRORS', 'IP_RPFILTER', 'BLACKHOLE']);

/**
 * Diagnoses from live flows, one per backend and fault, resting on what the
 * kernel said about them: resets, drops (by reason: a firewall, ARP, no
 * route), ICMP errors; only unanswered flows with none of these are guessed
 * at (REPLY_PATH_BROKEN). `holderOf` tells a gone pod from a local one.
 */
export function diagnoseTraffic(svc: DiscoveredService, t: ObservedTraffic, view: BackendView = UNKNOWN_VIEW): Diagnosis[] {
  const holderOf = view.holderOf;
  const out: Diagnosis[] = [];
  // A Service without endpoints is not DNATed by design: kube-proxy REJECTs
  // it in the filter table (NO_ENDPOINTS says so). Only a Service whose rules
  // should DNAT and did not is missing rules.
  if (t.notDnated > 0 && !(svc.rejects || svc.endpoints.length === 0)) {
    // IPVS rewrites a connection's conntrack entry only as it sends the
    // packet to the real server (ip_vs_nat_xmit): one it cannot route there
    // is dropped first and looks un-DNATed, though the virtual service is
    // in place. The real servers the node has no route to say why.
    const unroutable = svc.source === 'ipvs' ? svc.endpoints.filter((e) => view.routeOf(e.ip)?.ok === false) : [];
    for (const e of unroutable) {
      const error = view.routeOf(e.ip)!.error;
      out.push({
        code: 'NO_ROUTE',
        object: `backend ${e.ip}:${e.port}`,
        severity: 'error',
        layer: 'routing',
        summary: `${t.notDnated} of ${t.flows} connections to ${svc.clusterIP}:${svc.port} left no trace of IPVS's DNAT: this node has no usable route to the real server ${e.ip}:${e.port} (${error}), and IPVS drops a connection it cannot route before it rewrites conntrack`,
        evidence: [`ip route get ${e.ip}: ${error}`, `IPVS virtual service ${svc.clusterIP}:${svc.port} has real server ${e.ip}:${e.port}`, `${t.notDnated} flows with the ClusterIP still as destination after the NAT hooks`],
      });
    }
    if (unroutable.length) {
      // NO_ROUTE above says why
    } else if (svc.source === 'ipvs') {
      // The virtual service is there (ipvsadm lists it): the rules are not
      // missing. IPVS itself did not forward these, for a reason the node's
      // routes do not show: one is a SYN that reuses the conntrack entry of
      // a closing connection to the same client port, which IPVS drops
      // (conn_reuse_mode) and the client retransmits.
      out.push({
        code: 'IPVS_NOT_FORWARDED', layer: 'rules', object: `service ${svc.name}`, severity: 'warning',
        summary: `${t.notDnated} of ${t.flows} connections to ${svc.clusterIP}:${svc.port} showed no DNAT by IPVS, though its virtual service is in place and every real server is routable: IPVS did not forward them (their timelines show where they stopped)`,
        evidence: [`IPVS virtual service ${svc.clusterIP}:${svc.port} with ${svc.endpoints.length} real server(s)`, `${t.notDnated} flows with the ClusterIP still as destination after the NAT hooks`],
      });
    } else {
      out.push({ code: 'RULES_MISSING', layer: 'rules', object: `service ${svc.name}`, severity: 'error', summary: `${t.notDnated} of ${t.flows} connections to ${svc.clusterIP}:${svc.port} were not DNATed`, evidence: ['after-DNAT hook saw the ClusterIP still as destination'] });
    }
  }
  for (const b of t.backends) {
    const [ip, portText] = b.backend.split(':') as [string, string];
    const unanswered = b.flows - b.answered - b.resets;
    const failed = `${unanswered} of ${b.flows} connections to ${b.backend}`;
    if (isStale(svc, ip, Number(portText))) {
      // The rule is wrong: what happens at the wrong address is its consequence.
      const ep = svc.endpoints.find((e) => e.ip === ip && e.port === Number(portText))!;
      out.push({
        code: 'STALE_RULE',
        object: `rule ${ep.chain}`,
        severity: 'error',
        layer: 'rules',
        summary: `${ep.chain} DNATs to ${b.backend}, but its own hairpin rule names ${ep.ruleAddress}: ${b.flows} connections went to the wrong address (${unanswered + b.resets} failed)`,
        evidence: [`${ep.chain}: DNAT to ${b.backend}, hairpin rule for ${ep.ruleAddress}`, `${b.flows} flows DNATed to ${b.backend}, ${b.answered} answered`],
      });
      continue;
    }
    if (b.resets > 0) {
      out.push({ code: 'BACKEND_NOT_LISTENING', layer: 'application', object: `backend ${b.backend}`, severity: 'error', summary: `${b.backend} refused ${b.resets} connection(s): a TCP RST in answer to the SYN, so nothing listens on that port in the pod (wrong targetPort, or the app is down)`, evidence: [`${b.resets} SYN answered by RST from the backend`] });
    }
    if (b.tooBig) {
      // The kernel dropped packets of these flows as larger than the next hop's MTU, and they kept coming.
      const where = [...(b.tooBigAt ?? [])];
      out.push({
        code: 'MTU_MISMATCH',
        object: `backend ${b.backend}`,
        severity: 'error',
        layer: 'routing',
        summary: `${b.tooBig} of ${b.flows} connections to ${b.backend} lost packets too big for the path (PKT_TOO_BIG${where.length ? ` ${where.join(', ')}` : ''}) and the sender kept sending them: path MTU discovery is broken (ICMP "fragmentation needed" blocked on its way to the sender), or an MTU is larger than the path's; small exchanges work, large ones hang`,
        evidence: [`${b.tooBig} flows with PKT_TOO_BIG drops`, ...where.map((w) => `dropped ${w}`)],
      });
      continue;
    }
    if (unanswered <= 0 || b.flows <= 0) continue;
    const drops = [...(b.droppedBy ?? new Map<string, number>())];
    const icmp = [...(b.icmpBy ?? new Map<string, number>())];
    const evidence = [
      `${unanswered} flows without SEEN_REPLY`,
      ...drops.map(([r, n]) => `${n} of them dropped with reason ${r}`),
      ...icmp.map(([r, n]) => `${n} of them answered with ICMP ${r}`),
      ...[...(b.dropRules ?? [])].map((r) => `dropped where the backend receives it by ${r}`),
    ];
    const said = `${drops.map(([r, n]) => `${r} in ${n}`).concat(icmp.map(([r, n]) => `ICMP ${r} in ${n}`)).join(', ')}`;
    const route = view.routeOf(ip);
    const misrouted = replyRouted(b.backend, view.replyPathOf(ip, Number(portText)), evidence, failed);
    const tunnel = view.tunnelOf(ip);
    if (tunnel && (!drops.length || drops.some(([r]) => NEIGHBOUR_DROPS.has(r)) || ['FAILED', 'INCOMPLETE'].includes(tunnel.gatewayNeighbour ?? ''))) {
      out.push(tunnelBroken(b.backend, tunnel, evidence, failed));
    } else if (misrouted) {
      out.push(misrouted);
    } else if (route && !route.ok) {
      out.push({
        code: 'NO_ROUTE',
        object: `backend ${b.backend}`,
        severity: 'error',
        layer: 'routing',
        summary: `${failed} got no reply: this node has no usable route to the backend (${route.error})${said ? `; the kernel dropped them (${said})` : ''}`,
        evidence: [`ip route get ${ip}: ${route.error}`, ...evidence],
      });
    } else if (drops.some(([r]) => NEIGHBOUR_DROPS.has(r)) || icmp.some(([r]) => r === 'host unreachable')) {
      const d = noAnswer(svc, b.backend, ip, holderOf(ip), true, evidence);
      out.push({ ...d, summary: `${failed} got no reply (${said}): ${d.summary}` });
    } else if (b.replyDroppedAt && !drops.some(([r]) => isNetfilterDrop(r))) {
      // The backend answered; the kernel dropped the answers on their way back (not a firewall: that is the pod's own filtering).
      const where = [...b.replyDroppedAt];
      out.push({
        code: 'REPLY_PATH_BROKEN',
        object: `backend ${b.backend}`,
        severity: 'error',
        layer: 'routing',
        summary: `${failed} got no reply: the backend answered, but its replies were dropped on their way back (${where.map(([w, n]) => `${w}: ${n}`).join(', ')}): they take another path than the requests came by`,
        evidence: [...evidence, ...where.map(([w, n]) => `${n} flows' replies dropped: ${w}`)],
      });
    } else if (drops.some(([r]) => ROUTE_DROPS.has(r)) || icmp.some(([r]) => r === 'net unreachable')) {
      out.push({ code: 'NO_ROUTE', object: `backend ${b.backend}`, severity: 'error', layer: 'routing', summary: `${failed} got no reply: the kernel found no usable route for them (${said})`, evidence });
    } else if (drops.length || icmp.length) {
      // The kernel said where they stopped: cite it, not three guesses.
      const rules = [...(b.dropRules ?? [])];
      const rejected = icmp.some(([r]) => r === 'port unreachable' || r.includes('prohibited'));
      out.push({
        code: 'BACKEND_FILTERED',
        object: `backend ${b.backend}`,
        severity: 'error',
        layer: 'pod-firewall',
        summary: `${failed} got no reply: ${rejected ? 'a firewall rejected them' : 'the kernel dropped their packets'} (${said})${rules.length ? `, by ${rules.join('; ')}` : ''}`,
        evidence,
      });
    } else if (holderOf(ip) === null) {
      // The address is on this node's pod subnet and no namespace here has
      // it: nothing can answer, whatever path replies would take.
      out.push(noAnswer(svc, b.backend, ip, null, false, [`${unanswered} flows without SEEN_REPLY, none dropped on this node's traced path`]));
    } else {
      const holder = holderOf(ip);
      out.push({
        code: 'REPLY_PATH_BROKEN',
        object: `backend ${b.backend}`,
        severity: 'error',
        layer: 'routing',
        summary: `${failed} got no reply (conntrack never reached SEEN_REPLY) and no drop was seen: ${holder ? `the pod is on this node (${holder}), so its replies take another path` : 'the backend is gone, or its replies take another path'}`,
        evidence: [`${unanswered} flows without SEEN_REPLY, none dropped on this node's traced path`, ...(holder ? [`${ip} is an address of ${holder}`] : [])],
      });
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
        code: 'SKEWED_DISTRIBUTION', layer: 'rules', object: `service ${svc.name}`,
        severity: svc.affinitySeconds ? 'info' : 'warning',
        summary: svc.affinitySeconds
          ? `new connections are unevenly spread, as sessionAffinity: ClientIP makes them (${clientCount(t)} client addresses)`
          : `new connections are spread unevenly compared with the rules' probabilities (chi-square ${x2.toFixed(1)} > ${crit}, p < 0.001)`,
        evidence: withEndpoints.map((e, i) => `${e.ip}:${e.port}: ${observed[i]} of ${total} (expected ${(100 * e.probability).toFixed(1)}%)`),
      });
    }
  }
  // "All traffic lands on one pod": few connections carrying many requests each.
  const busiest = t.backends.reduce((m, b) => Math.max(m, b.maxPacketsPerFlow), 0);
  if (t.flows > 0 && t.flows <= withEndpoints.length * 2 && busiest >= 20) {
    out.push({
      code: 'CONNECTION_REUSE', layer: 'application', object: `service ${svc.name}`,
      severity: 'info',
      summary: `only ${t.flows} connection(s) in ${t.seconds} s carried the traffic (up to ${busiest} packets each): kube-proxy balances connections, not requests, so keep-alive clients stay on one pod`,
      evidence: t.backends.map((b) => `${b.backend}: ${b.flows} flows, busiest ${b.maxPacketsPerFlow} packets`),
    });
  }
  return out;
}

/** Client addresses seen, summed over backends ("at least" once a backend's count reached the cap). */
function clientCount(t: ObservedTraffic): string {
  const n = t.backends.reduce((s, b) => s + b.clients.size, 0);
  return t.backends.some((b) => b.clients.size >= MAX_CLIENTS_PER_BACKEND) ? `at least ${n}` : String(n);
}

/** What a judgement reads of a flow (a live flow, or one the table already forgot). */
export type ObservedFlow = Pick<Flow, 'orig' | 'reply' | 'dnat' | 'masqueraded' | 'status' | 'backendRefused' | 'drops' | 'replyDrops' | 'backendDropRule' | 'icmpErrors' | 'packets'>;

/**
 * Client addresses kept per backend (for the count sessionAffinity's skew
 * quotes): a node serving many clients reports "at least" this many, and the
 * observer's memory stays bounded whatever the number of flows.
 */
export const MAX_CLIENTS_PER_BACKEND = 1024;

/**
 * What the flows to one service showed, per backend, added up one flow at a
 * time: the live diagnoser folds each flow in as it is judged and keeps no
 * flow (a storm's flows, held until a window closed, were most of its heap).
 */
export class TrafficObserver {
  private flows = 0;
  private notDnated = 0;
  private masqueraded = 0;
  private readonly byBackend = new Map<string, ObservedBackend>();

  constructor(readonly svc: DiscoveredService) {}

  /** Whether the flow is to this service (its original destination). */
  matches(f: ObservedFlow): boolean {
    return f.orig.daddr === this.svc.clusterIP && f.orig.dport === this.svc.port;
  }

  /** Adds a flow to this service (others are ignored). */
  add(f: ObservedFlow): void {
    if (!this.matches(f)) return;
    this.flows++;
    if (!f.dnat) {
      this.notDnated++;
      return;
    }
    if (f.masqueraded) this.masqueraded++;
    const key = `${f.reply.saddr}:${f.reply.sport}`;
    let b = this.byBackend.get(key);
    if (!b) this.byBackend.set(key, (b = emptyBackend(key)));
    b.flows++;
    // Refused: reset in answer to the SYN. A reset after the handshake is an abort by a backend that listens (answered).
    if (f.backendRefused) b.resets++;
    else if (f.status & IPS_SEEN_REPLY) b.answered++;
    else {
      if (f.drops.length && f.replyDrops && f.replyDrops.length && f.drops.every((r) => f.replyDrops!.some((w) => w.startsWith(`${r} at `)))) {
        b.replyDroppedAt ??= new Map();
        for (const w of f.replyDrops) b.replyDroppedAt.set(w, (b.replyDroppedAt.get(w) ?? 0) + 1);
      }
      if (f.drops.length) {
        b.droppedBy ??= new Map();
        for (const r of new Set(f.drops)) b.droppedBy.set(r, (b.droppedBy.get(r) ?? 0) + 1);
        if (f.backendDropRule) (b.dropRules ??= new Set()).add(f.backendDropRule);
      }
      if (f.icmpErrors.length) {
        b.icmpBy ??= new Map();
        for (const r of new Set(f.icmpErrors)) b.icmpBy.set(r, (b.icmpBy.get(r) ?? 0) + 1);
      }
    }
    if (f.drops.includes('PKT_TOO_BIG')) {
      b.tooBig = (b.tooBig ?? 0) + 1;
      for (const w of f.replyDrops ?? []) if (w.startsWith('PKT_TOO_BIG at ')) (b.tooBigAt ??= new Set()).add(w.slice('PKT_TOO_BIG '.length));
    }
    b.maxPacketsPerFlow = Math.max(b.maxPacketsPerFlow, f.packets[0] + f.packets[1]);
    if (b.clients.size < MAX_CLIENTS_PER_BACKEND) b.clients.add(f.orig.saddr);
  }

  /** What was added, over `seconds`. */
  observed(seconds: number): ObservedTraffic {
    return { seconds, flows: this.flows, notDnated: this.notDnated, backends: [...this.byBackend.values()], masqueraded: this.masqueraded };
  }
}

function emptyBackend(backend: string): ObservedBackend {
  return { backend, flows: 0, answered: 0, resets: 0, maxPacketsPerFlow: 0, clients: new Set() };
}

/** What a set of flows to one service showed, per backend. */
export function observeFlows(svc: DiscoveredService, flows: readonly ObservedFlow[], seconds: number): ObservedTraffic {
  const o = new TrafficObserver(svc);
  for (const f of flows) o.add(f);
  return o.observed(seconds);
}

/** Several observations of one service as one, over `seconds` (the live diagnoser's last minute, from its windows). */
export function mergeObserved(ts: readonly ObservedTraffic[], seconds: number): ObservedTraffic {
  const byBackend = new Map<string, ObservedBackend>();
  const out: ObservedTraffic = { seconds, flows: 0, notDnated: 0, backends: [], masqueraded: 0 };
  const addCounts = (into: Map<string, number> | undefined, from: Map<string, number> | undefined) => {
    if (!from) return into;
    const m = into ?? new Map<string, number>();
    for (const [k, n] of from) m.set(k, (m.get(k) ?? 0) + n);
    return m;
  };
  const union = (into: Set<string> | undefined, from: Set<string> | undefined, max = Infinity) => {
    if (!from) return into;
    const s = into ?? new Set<string>();
    for (const k of from) if (s.size < max) s.add(k);
    return s;
  };
  for (const t of ts) {
    out.flows += t.flows;
    out.notDnated += t.notDnated;
    out.masqueraded += t.masqueraded;
    for (const b of t.backends) {
      let m = byBackend.get(b.backend);
      if (!m) byBackend.set(b.backend, (m = emptyBackend(b.backend)));
      m.flows += b.flows;
      m.answered += b.answered;
      m.resets += b.resets;
      m.maxPacketsPerFlow = Math.max(m.maxPacketsPerFlow, b.maxPacketsPerFlow);
      union(m.clients, b.clients, MAX_CLIENTS_PER_BACKEND);
      m.droppedBy = addCounts(m.droppedBy, b.droppedBy);
      m.icmpBy = addCounts(m.icmpBy, b.icmpBy);
      m.replyDroppedAt = addCounts(m.replyDroppedAt, b.replyDroppedAt);
      m.dropRules = union(m.dropRules, b.dropRules);
      m.tooBigAt = union(m.tooBigAt, b.tooBigAt);
      if (b.tooBig) m.tooBig = (m.tooBig ?? 0) + b.tooBig;
    }
  }
  out.backends = [...byBackend.values()];
  return out;
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
      code: 'ENDPOINTS_MISMATCH', layer: 'rules', object: `service ${svc.name}`,
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
      code: 'ENDPOINTS_MISMATCH', layer: 'rules', object: `service ${svc.name}`,
      severity: 'error',
      summary: `the API lists ready endpoints of ${svc.name} that this node's rules do not have: ${missing.join(', ')} (kube-proxy not synced on this node)`,
      evidence: missing.map((k) => `${k}${known.get(k)?.pod ? ` (${known.get(k)!.pod})` : ''}: ready in the EndpointSlice, no rule`),
    });
  }
  return out;
}
