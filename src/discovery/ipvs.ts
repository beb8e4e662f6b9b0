/**
 * Reads kube-proxy's IPVS mode from `ipvsadm -Ln`: each virtual service
 * (a ClusterIP:port or NodePort) with its real servers; a real server's
 * probability is its weight over the sum (rr and wrr balance by weight).
 */
import { DiscoveredService, Discovery } from './model';

export function parseIpvsadm(text: string): Discovery {
  const services: DiscoveredService[] = [];
  let cur: DiscoveredService | null = null;
  const weights: number[] = [];
  const finish = () => {
    if (!cur) return;
    const total = weights.reduce((a, b) => a + b, 0);
    cur.endpoints.forEach((e, i) => (e.probability = total ? weights[i]! / total : 1 / cur!.endpoints.length));
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
