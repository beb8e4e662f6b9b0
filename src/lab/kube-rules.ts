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
  /** The endpoint's pod runs on another node (default: on this one). externalTrafficPolicy: Local sends only to local ones. */
  remote?: boolean;
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
  /** sessionAffinity: ClientIP with this timeout (kube-proxy's -m recent rules). */
  affinitySeconds?: number;
  /** externalTrafficPolicy: Local keeps the client address (no masquerade of NodePort traffic). */
  externalTrafficPolicy?: 'Cluster' | 'Local';
}

export const MASQ_MARK = '0x4000/0x4000';

/**
 * What kube-proxy's nat table holds in every mode: the base chains' jumps
 * into KUBE-SERVICES and KUBE-POSTROUTING, the masquerade mark, and the
 * MASQUERADE of marked packets (unless `masquerade` is off, a fault).
 */
export function natScaffold(masquerade: boolean): string[] {
  return [
    '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
    '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
    `-A KUBE-MARK-MASQ -j MARK --set-xmark ${MASQ_MARK}`,
    `-A KUBE-POSTROUTING -m mark ! --mark ${MASQ_MARK} -j RETURN`,
    '-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0',
    ...(masquerade ? ['-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully'] : []),
  ];
}

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

export function svlChain(s: KubeService): string {
  return `KUBE-SVL-${chainHash(svcPortName(s) + s.proto)}`;
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
  const rules: string[] = natScaffold(opts.masquerade !== false);
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
      rules.push(`-A KUBE-NODEPORTS -p ${p} -m comment --comment "${name}" -m ${p} --dport ${s.nodePort} -j ${ext}`);
      if (s.externalTrafficPolicy !== 'Local') {
        rules.push(`-A ${ext} -m comment --comment "masquerade traffic for ${name} external destinations" -j KUBE-MARK-MASQ`);
        rules.push(`-A ${ext} -j ${svc}`);
      } else {
        // externalTrafficPolicy: Local, as kube-proxy writes it: pods and the
        // node itself use every endpoint; outside clients only this node's
        // (KUBE-SVL). With none here, the filter table drops NodePort traffic.
        const svl = svlChain(s);
        const local = s.endpoints.filter((ep) => !ep.remote);
        chains.add(svl);
        rules.push(
          `-A ${ext} -s ${opts.clusterCIDR} -m comment --comment "pod traffic for ${name} external destinations" -j ${svc}`,
          `-A ${ext} -m comment --comment "masquerade LOCAL traffic for ${name} external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
          `-A ${ext} -m comment --comment "route LOCAL traffic for ${name} external destinations" -m addrtype --src-type LOCAL -j ${svc}`,
          `-A ${ext} -j ${svl}`,
        );
        local.forEach((ep, i) => {
          const stat = i === local.length - 1 ? '' : ` -m statistic --mode random --probability ${endpointProbability(i, local.length)}`;
          rules.push(`-A ${svl} -m comment --comment "${name} -> ${ep.ip}:${ep.port}"${stat} -j ${sepChain(s, ep)}`);
        });
      }
    }
    if (s.affinitySeconds) {
      // Affinity: a client seen recently goes back to the same endpoint.
      for (const ep of s.endpoints) {
        const sep = sepChain(s, ep);
        rules.push(`-A ${svc} -m comment --comment "${name} -> ${ep.ip}:${ep.port}" -m recent --name ${sep} --mask 255.255.255.255 --rsource --rcheck --seconds ${s.affinitySeconds} --reap -j ${sep}`);
      }
    }
    s.endpoints.forEach((ep, i) => {
      const sep = sepChain(s, ep);
      chains.add(sep);
      const last = i === s.endpoints.length - 1;
      const stat = last ? '' : ` -m statistic --mode random --probability ${endpointProbability(i, s.endpoints.length)}`;
      rules.push(`-A ${svc} -m comment --comment "${name} -> ${ep.ip}:${ep.port}"${stat} -j ${sep}`);
      const recent = s.affinitySeconds ? ` -m recent --set --name ${sep} --mask 255.255.255.255 --rsource` : '';
      rules.push(
        `-A ${sep} -s ${ep.ip}/32 -m comment --comment "${name}" -j KUBE-MARK-MASQ`,
        `-A ${sep} -p ${p} -m comment --comment "${name}"${recent} -m ${p} -j DNAT --to-destination ${ep.ip}:${ep.port}`,
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
    if (s.endpoints.length > 0 && s.nodePort && s.externalTrafficPolicy === 'Local' && s.endpoints.every((ep) => ep.remote)) {
      rules.push(
        `-A KUBE-EXTERNAL-SERVICES -p ${s.proto} -m comment --comment "${svcPortName(s)} has no local endpoints" -m addrtype --dst-type LOCAL -m ${s.proto} --dport ${s.nodePort} -j DROP`,
      );
    }
    if (s.endpoints.length > 0) continue;
    rules.push(
      `-A KUBE-SERVICES -d ${s.clusterIP}/32 -p ${s.proto} -m comment --comment "${svcPortName(s)} has no endpoints" -m ${s.proto} --dport ${s.port} -j REJECT --reject-with icmp-port-unreachable`,
    );
  }
  rules.push('-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES');
  return ['*filter', ':KUBE-SERVICES - [0:0]', ':KUBE-EXTERNAL-SERVICES - [0:0]', ...rules, 'COMMIT', ''].join('\n');
}

// ---- nftables mode (kube-proxy --proxy-mode=nftables, table ip kube-proxy) ----

function nftBase(s: KubeService): string {
  return `${s.namespace}/${s.name}/${s.proto}/${s.portName}`;
}

export function nftServiceChain(s: KubeService): string {
  return `service-${chainHash(svcPortName(s) + s.proto).slice(0, 8)}-${nftBase(s)}`;
}

export function nftExternalChain(s: KubeService): string {
  return `external-${chainHash(svcPortName(s) + s.proto).slice(0, 8)}-${nftBase(s)}`;
}

export function nftEndpointChain(s: KubeService, ep: KubeEndpoint): string {
  return `endpoint-${chainHash(svcPortName(s) + s.proto + `${ep.ip}:${ep.port}`).slice(0, 8)}-${nftBase(s)}__${ep.ip}/${ep.port}`;
}

/** kube-proxy's nftables-mode table, as an `nft -f` script (it replaces any previous one). */
export function renderNftKubeProxy(services: KubeService[], opts: { clusterCIDR: string; masquerade?: boolean }): string {
  const withEp = services.filter((s) => s.endpoints.length);
  const noEp = services.filter((s) => !s.endpoints.length);
  const L: string[] = ['table ip kube-proxy', 'delete table ip kube-proxy', 'table ip kube-proxy {', '\tcomment "rules for kube-proxy"'];
  const chain = (name: string, lines: string[]) => L.push(`\tchain ${name} {`, ...lines.map((l) => `\t\t${l}`), '\t}');
  const map = (name: string, type: string, comment: string, elems: string[]) =>
    L.push(`\tmap ${name} {`, `\t\ttype ${type}`, `\t\tcomment "${comment}"`, ...(elems.length ? [`\t\telements = { ${elems.join(',\n\t\t\t     ')} }`] : []), '\t}');
  map('service-ips', 'ipv4_addr . inet_proto . inet_service : verdict', 'ClusterIP, ExternalIP and LoadBalancer IP traffic',
    withEp.map((s) => `${s.clusterIP} . ${s.proto} . ${s.port} : goto ${nftServiceChain(s)}`));
  map('service-nodeports', 'inet_proto . inet_service : verdict', 'NodePort traffic',
    withEp.filter((s) => s.nodePort).map((s) => `${s.proto} . ${s.nodePort} : goto ${nftExternalChain(s)}`));
  map('no-endpoint-services', 'ipv4_addr . inet_proto . inet_service : verdict', 'vmap to drop or reject packets to services with no endpoints',
    noEp.map((s) => `${s.clusterIP} . ${s.proto} . ${s.port} comment "${svcPortName(s)}" : goto reject-chain`));
  const noLocal = withEp.filter((s) => s.nodePort && s.externalTrafficPolicy === 'Local' && s.endpoints.every((ep) => ep.remote));
  map('no-endpoint-nodeports', 'inet_proto . inet_service : verdict', 'vmap to drop or reject packets to service nodeports with no endpoints',
    noLocal.map((s) => `${s.proto} . ${s.nodePort} comment "${svcPortName(s)}" : drop`));
  chain('nodeport-endpoints-check', ['fib daddr type local meta l4proto . th dport vmap @no-endpoint-nodeports']);
  chain('filter-input', ['type filter hook input priority 0; policy accept;', 'ct state new jump nodeport-endpoints-check']);
  chain('reject-chain', ['comment "helper for @no-endpoint-services / @no-endpoint-nodeports"', 'reject']);
  chain('filter-output', ['type filter hook output priority -110; policy accept;', 'ct state new jump service-endpoints-check']);
  chain('filter-forward', ['type filter hook forward priority -110; policy accept;', 'ct state new jump service-endpoints-check']);
  chain('service-endpoints-check', ['ip daddr . meta l4proto . th dport vmap @no-endpoint-services']);
  chain('mark-for-masquerade', ['mark set mark or 0x4000']);
  chain('masquerading', ['mark and 0x4000 == 0 return', 'mark set mark xor 0x4000', ...(opts.masquerade === false ? [] : ['masquerade fully-random'])]);
  chain('services', ['ip daddr . meta l4proto . th dport vmap @service-ips', 'fib daddr type local meta l4proto . th dport vmap @service-nodeports']);
  chain('nat-prerouting', ['type nat hook prerouting priority dstnat; policy accept;', 'jump services']);
  chain('nat-output', ['type nat hook output priority -100; policy accept;', 'jump services']);
  chain('nat-postrouting', ['type nat hook postrouting priority srcnat; policy accept;', 'jump masquerading']);
  for (const s of withEp) {
    const eps = s.endpoints.map((ep) => nftEndpointChain(s, ep));
    // sessionAffinity: ClientIP, as kube-proxy writes it: a timed set of
    // client addresses per endpoint, checked before the random pick and
    // updated by the endpoint chain.
    const affinity = (c: string) => `affinity-${c.slice('endpoint-'.length)}`;
    if (s.affinitySeconds) {
      for (const c of eps) L.push(`	set ${affinity(c)} {`, '		type ipv4_addr', '		flags dynamic,timeout', `		timeout ${s.affinitySeconds}s`, '	}');
    }
    const sticky = s.affinitySeconds ? eps.map((c) => `ip saddr @${affinity(c)} goto ${c}`) : [];
    const pick = eps.length === 1 ? `goto ${eps[0]}` : `numgen random mod ${eps.length} vmap { ${eps.map((c, i) => `${i} : goto ${c}`).join(', ')} }`;
    chain(nftServiceChain(s), [`ip daddr ${s.clusterIP} ${s.proto} dport ${s.port} ip saddr != ${opts.clusterCIDR} jump mark-for-masquerade`, ...sticky, pick]);
    if (s.nodePort && s.externalTrafficPolicy === 'Local') {
      // As kube-proxy writes it: pods and the node itself use every endpoint; outside clients only local ones.
      const local = s.endpoints.filter((ep) => !ep.remote);
      chain(nftExternalChain(s), [
        `ip saddr ${opts.clusterCIDR} goto ${nftServiceChain(s)} comment "short-circuit pod traffic"`,
        'fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"',
        `fib saddr type local goto ${nftServiceChain(s)} comment "short-circuit local traffic"`,
        ...(local.length ? [local.length === 1 ? `goto ${nftEndpointChain(s, local[0]!)}` : `numgen random mod ${local.length} vmap { ${local.map((ep, i) => `${i} : goto ${nftEndpointChain(s, ep)}`).join(', ')} }`] : []),
      ]);
    } else if (s.nodePort) {
      chain(nftExternalChain(s), ['jump mark-for-masquerade', `goto ${nftServiceChain(s)}`]);
    }
    s.endpoints.forEach((ep, i) =>
      chain(eps[i]!, [`ip saddr ${ep.ip} jump mark-for-masquerade`, ...(s.affinitySeconds ? [`update @${affinity(eps[i]!)} { ip saddr }`] : []), `meta l4proto ${s.proto} dnat to ${ep.ip}:${ep.port}`]),
    );
  }
  L.push('}', '');
  return L.join('\n');
}
