/**
 * Generates kube-proxy's iptables-mode NAT rules (as `iptables-save` text)
 * for the lab's Services: the same chains, comments, marks and the same
 * `statistic --probability` chaining kube-proxy writes, so the lab's kernel
 * takes the path a real node's kernel takes.
 */
import crypto from 'node:crypto';

export interface KubeEndpoint {
  ip: string;
  port: number;
}

export interface KubeService {
  namespace: string;
  name: string;
  portName: string;
  clusterIP: string;
  port: number;
  proto: 'tcp' | 'udp';
  nodePort?: number;
  endpoints: KubeEndpoint[];
}

export const MASQ_MARK = '0x4000/0x4000';

const BASE32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

function base32(buf: Buffer): string {
  let bits = 0;
  let value = 0;
  let out = '';
  for (const byte of buf) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  return out;
}

/** kube-proxy's chain-name hash: base32(sha256(key))[0:16]. */
function chainHash(key: string): string {
  return base32(crypto.createHash('sha256').update(key).digest()).slice(0, 16);
}

export function svcPortName(s: KubeService): string {
  return `${s.namespace}/${s.name}:${s.portName}`;
}

export function svcChain(s: KubeService): string {
  return `KUBE-SVC-${chainHash(svcPortName(s) + s.proto)}`;
}

export function extChain(s: KubeService): string {
  return `KUBE-EXT-${chainHash(svcPortName(s) + s.proto)}`;
}

export function sepChain(s: KubeService, ep: KubeEndpoint): string {
  return `KUBE-SEP-${chainHash(svcPortName(s) + s.proto + `${ep.ip}:${ep.port}`)}`;
}

/** kube-proxy's probability for endpoint i of n: 1/(n-i), printed with 11 decimals. */
export function endpointProbability(i: number, n: number): string {
  return (1 / (n - i)).toFixed(11);
}

/**
 * Renders the nat table. `clusterCIDR` is the pod range: traffic to a
 * ClusterIP from outside it is masqueraded (kube-proxy's --cluster-cidr);
 * `masquerade: false` leaves KUBE-POSTROUTING without its MASQUERADE rule.
 */
export function renderNatTable(services: KubeService[], opts: { clusterCIDR: string; masquerade?: boolean }): string {
  const chains = new Set<string>(['KUBE-SERVICES', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ', 'KUBE-NODEPORTS']);
  const rules: string[] = [
    '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
    `-A KUBE-MARK-MASQ -j MARK --set-xmark ${MASQ_MARK}`,
    `-A KUBE-POSTROUTING -m mark ! --mark ${MASQ_MARK} -j RETURN`,
    '-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0',
  ];
  if (opts.masquerade !== false) {
    rules.push('-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully');
  }
  for (const s of services) {
    const name = svcPortName(s);
    const svc = svcChain(s);
    const p = s.proto;
    if (s.endpoints.length === 0) {
      // kube-proxy puts "has no endpoints" REJECTs in the filter table; the
      // lab renders them in renderFilterTable.
      continue;
    }
    chains.add(svc);
    rules.push(
      `-A KUBE-SERVICES -d ${s.clusterIP}/32 -p ${p} -m comment --comment "${name} cluster IP" -m ${p} --dport ${s.port} -j ${svc}`,
      `-A ${svc} ! -s ${opts.clusterCIDR} -d ${s.clusterIP}/32 -p ${p} -m comment --comment "${name} cluster IP" -m ${p} --dport ${s.port} -j KUBE-MARK-MASQ`,
    );
    if (s.nodePort) {
      const ext = extChain(s);
      chains.add(ext);
      rules.push(
        `-A KUBE-NODEPORTS -p ${p} -m comment --comment "${name}" -m ${p} --dport ${s.nodePort} -j ${ext}`,
        `-A ${ext} -m comment --comment "masquerade traffic for ${name} external destinations" -j KUBE-MARK-MASQ`,
        `-A ${ext} -j ${svc}`,
      );
    }
    s.endpoints.forEach((ep, i) => {
      const sep = sepChain(s, ep);
      chains.add(sep);
      const last = i === s.endpoints.length - 1;
      const stat = last ? '' : ` -m statistic --mode random --probability ${endpointProbability(i, s.endpoints.length)}`;
      rules.push(`-A ${svc} -m comment --comment "${name} -> ${ep.ip}:${ep.port}"${stat} -j ${sep}`);
      rules.push(
        `-A ${sep} -s ${ep.ip}/32 -m comment --comment "${name}" -j KUBE-MARK-MASQ`,
        `-A ${sep} -p ${p} -m comment --comment "${name}" -m ${p} -j DNAT --to-destination ${ep.ip}:${ep.port}`,
      );
    });
  }
  rules.push(
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS',
  );
  return ['*nat', ...[...chains].map((c) => `:${c} - [0:0]`), ...rules, 'COMMIT', ''].join('\n');
}

/** kube-proxy's filter-table REJECTs for Services that have no endpoints. */
export function renderFilterTable(services: KubeService[]): string {
  const rules: string[] = [
    '-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
  ];
  for (const s of services) {
    if (s.endpoints.length > 0) continue;
    rules.push(
      `-A KUBE-SERVICES -d ${s.clusterIP}/32 -p ${s.proto} -m comment --comment "${svcPortName(s)} has no endpoints" -m ${s.proto} --dport ${s.port} -j REJECT --reject-with icmp-port-unreachable`,
    );
  }
  return ['*filter', ':KUBE-SERVICES - [0:0]', ...rules, 'COMMIT', ''].join('\n');
}
