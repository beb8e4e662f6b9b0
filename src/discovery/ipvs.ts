/**
 * Reads kube-proxy's IPVS mode from `ipvsadm -Ln`: each virtual service
 * (a ClusterIP:port or NodePort) with its real servers and the share of new
 * connections each gets. That share depends on the scheduler, as IPVS's own
 * schedulers (net/netfilter/ipvs/ip_vs_*.c) use the weight:
 *  - weighted ones (wrr, wlc, sed, lblc, lblcr, mh, twos): by weight, over
 *    the sum of weights (wlc/sed/lblc balance active connections per weight:
 *    with even load, the same shares);
 *  - the others (rr, kube-proxy's default; lc, sh, dh, nq, fo, ovf): a
 *    weight above 0 takes part, and they share evenly. rr skips a server of
 *    weight 0 and ignores the weight otherwise.
 * A real server of weight 0 gets no new connection under any scheduler:
 * kube-proxy sets it for terminating endpoints (graceful termination).
 */
import { DiscoveredService, Discovery } from './model';
import { parseIptablesSave, parseRule } from './iptables';

const WEIGHTED_SCHEDULERS = new Set(['wrr', 'wlc', 'sed', 'lblc', 'lblcr', 'mh', 'twos']);

/** Each real server's share of new connections under `scheduler`. */
export function ipvsShares(scheduler: string, weights: readonly number[]): number[] {
  const live = weights.map((w) => Math.max(0, w));
  const byWeight = WEIGHTED_SCHEDULERS.has(scheduler);
  const parts = live.map((w) => (w > 0 ? (byWeight ? w : 1) : 0));
  const total = parts.reduce((a, b) => a + b, 0);
  return parts.map((p) => (total ? p / total : 0));
}

export function parseIpvsadm(text: string): Discovery {
  const services: DiscoveredService[] = [];
  let cur: DiscoveredService | null = null;
  const weights: number[] = [];
  const finish = () => {
    if (!cur) return;
    const shares = ipvsShares(cur.chain.replace(/^ipvs /, ''), weights);
    cur.endpoints.forEach((e, i) => (e.probability = shares[i]!));
    services.push(cur);
    weights.length = 0;
  };
  for (const line of text.split('\n')) {
    const v = /^(TCP|UDP|SCTP)\s+(\d+\.\d+\.\d+\.\d+):(\d+)\s+(\S+)(.*)$/.exec(line);
    if (v) {
      finish();
      const persistent = /persistent (\d+)/.exec(v[5] ?? '');
      cur = {
        name: `${v[2]}:${v[3]}`, namespace: '', service: '', portName: '', clusterIP: v[2]!, port: Number(v[3]),
        proto: v[1]!.toLowerCase() as DiscoveredService['proto'], nodePorts: [], endpoints: [], chain: `ipvs ${v[4]}`,
        rejects: false, nodePortMasquerade: false, source: 'ipvs',
        ...(persistent ? { affinitySeconds: Number(persistent[1]) } : {}),
      };
      continue;
    }
    const r = /^\s+->\s+(\d+\.\d+\.\d+\.\d+):(\d+)\s+(\S+)\s+(\d+)/.exec(line);
    if (r && cur) {
      cur.endpoints.push({ ip: r[1]!, port: Number(r[2]), probability: 0, chain: `${r[3]} weight ${r[4]}` });
      weights.push(Number(r[4]));
    }
  }
  finish();
  return { mode: services.length ? 'ipvs' : 'none', services, masqueradeRule: true, warnings: [] };
}

/**
 * IPVS balances, but kube-proxy's masquerading stays in iptables
 * (`iptables-save` of the node): the KUBE-POSTROUTING MASQUERADE rule, and
 * the mark for traffic to a ClusterIP from outside the cluster CIDR
 * (KUBE-SERVICES ! -s CIDR -m set --match-set KUBE-CLUSTER-IP dst,dst ->
 * KUBE-MARK-MASQ), which applies to every virtual service in that set.
 */
export function withIptablesMasquerade(d: Discovery, iptablesSave: string): Discovery {
  const mark = iptablesSave
    .split('\n')
    .filter((l) => l.startsWith('-A KUBE-SERVICES ') && /--match-set KUBE-CLUSTER-IP dst,dst/.test(l))
    .map(parseRule)
    .find((r) => r?.target === 'KUBE-MARK-MASQ' && r.negated('-s'));
  const unless = mark?.opt('-s');
  return {
    ...d,
    masqueradeRule: parseIptablesSave(iptablesSave).masqueradeRule,
    services: d.services.map((s) => (unless ? { ...s, masqueradeUnless: unless } : s)),
  };
}

/**
 * Which virtual services are NodePorts, and which of those keep
 * externalTrafficPolicy: Local, from kube-proxy's ipsets (`ipset save`):
 * KUBE-NODE-PORT-{TCP,UDP} hold every NodePort (their traffic is marked for
 * masquerade), KUBE-NODE-PORT-LOCAL-{TCP,UDP} the Local ones (exempt from
 * the mark). A Local NodePort's virtual service has only this node's
 * endpoints as real servers: none means IPVS refuses what arrives here.
 */
export function withIpvsNodePorts(d: Discovery, ipsetSave: string): Discovery {
  const members = new Map<string, Set<string>>();
  for (const line of ipsetSave.split('\n')) {
    const m = /^add (\S+) (\S+)/.exec(line);
    if (m) (members.get(m[1]!) ?? members.set(m[1]!, new Set()).get(m[1]!)!).add(m[2]!);
  }
  const has = (set: string, member: string) => members.get(set)?.has(member) ?? false;
  return {
    ...d,
    services: d.services.map((s) => {
      const suffix = s.proto.toUpperCase();
      const port = String(s.port);
      // A ClusterIP virtual service whose port happens to equal a NodePort is not one.
      if (!has(`KUBE-NODE-PORT-${suffix}`, port) || has('KUBE-CLUSTER-IP', `${s.clusterIP},${s.proto}:${port}`)) return s;
      const local = has(`KUBE-NODE-PORT-LOCAL-${suffix}`, port);
      return { ...s, nodePorts: [s.port], nodePortMasquerade: !local, ...(local && s.endpoints.length === 0 ? { noLocalEndpoints: true } : {}) };
    }),
  };
}
