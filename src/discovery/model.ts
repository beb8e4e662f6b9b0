/** What svctrace learns about Services from a node's kube-proxy rules. */

export interface DiscoveredEndpoint {
  ip: string;
  port: number;
  /** Chance a new connection picks this endpoint, from the rules (0..1). */
  probability: number;
  /** The rule chain that DNATs to it: KUBE-SEP-* (iptables) or endpoint-* (nftables). */
  chain: string;
  /** The endpoint address the chain's own hairpin (masquerade) rule names: kube-proxy writes the same one as the DNAT target. */
  ruleAddress?: string;
}

export interface DiscoveredService {
  /** "ns/name:portName" from kube-proxy's comments, when present. */
  name: string;
  namespace: string;
  service: string;
  portName: string;
  clusterIP: string;
  port: number;
  proto: 'tcp' | 'udp' | 'sctp';
  nodePorts: number[];
  /** externalIPs and LoadBalancer ingress IPs kube-proxy DNATs for it (on the Service's port). */
  externalIPs?: string[];
  endpoints: DiscoveredEndpoint[];
  /** KUBE-SVC-* or service-* chain. */
  chain: string;
  /** sessionAffinity: ClientIP, with its timeout, when the rules pin clients (-m recent). */
  affinitySeconds?: number;
  /** The rules REJECT connections: the Service has no endpoints. */
  rejects: boolean;
  /** Traffic to the ClusterIP from outside this range is masqueraded (kube-proxy --cluster-cidr). */
  masqueradeUnless?: string;
  /** NodePort traffic is masqueraded (externalTrafficPolicy: Cluster). */
  nodePortMasquerade: boolean;
  /** externalTrafficPolicy: Local with no endpoint on this node: the rules drop NodePort traffic here. */
  noLocalEndpoints?: boolean;
  source: 'iptables' | 'nftables' | 'ipvs';
}

export interface Discovery {
  mode: 'iptables' | 'nftables' | 'ipvs' | 'none';
  /** iptables mode: whether the rules live in nf_tables (iptables-nft) or in the legacy x_tables. */
  backend?: 'nft' | 'legacy';
  services: DiscoveredService[];
  /** Whether the MASQUERADE rule for marked packets is present. */
  masqueradeRule: boolean;
  warnings: string[];
  /** Set when the rules could not be read at all (not root): why. "mode none" then means nothing. */
  unreadable?: string;
  /** Set when none of the commands that read the rules is installed: which were looked for. "mode none" then means nothing. */
  readersMissing?: string[];
}

/** What to say when no command that reads the rules is installed. */
export function readersMissingText(looked: string[]): string {
  return `cannot read the node's kube-proxy rules: none of ${looked.join(', ')} is installed (Debian: apt-get install iptables nftables ipvsadm; the svctrace image has them)`;
}

/** "ns/name:port" or "ns/name" -> the services it names. */
export function findByName(d: Discovery, ref: string): DiscoveredService[] {
  const m = /^([^/\s]+)\/([^:\s]+)(?::(\S+))?$/.exec(ref);
  if (!m) return [];
  return d.services.filter((s) => s.namespace === m[1] && s.service === m[2] && (m[3] === undefined || s.portName === m[3] || String(s.port) === m[3]));
}

export function findByAddress(d: Discovery, ip: string, port: number, proto: string): DiscoveredService | undefined {
  return d.services.find((s) => s.clusterIP === ip && s.port === port && s.proto === proto);
}

/** The Service kube-proxy DNATs this address for: by its ClusterIP, or one of its externalIPs / LoadBalancer IPs. */
export function findByAnyAddress(d: Discovery, ip: string, port: number, proto: string): DiscoveredService | undefined {
  return findByAddress(d, ip, port, proto) ?? d.services.find((s) => s.externalIPs?.includes(ip) && s.port === port && s.proto === proto);
}

/**
 * Every address kube-proxy DNATs for a Service, as "IP:port/proto" (its
 * ClusterIP, externalIPs, LoadBalancer IPs) and "nodeport PORT/proto" (on any
 * of the node's addresses): tracing a Service by name or --all-services
 * covers them all, not only its ClusterIP.
 */
export function tracedAddressesOf(s: DiscoveredService): Array<{ kind: 'cluster-ip' | 'external-ip' | 'nodeport'; address: string | null; port: number; proto: DiscoveredService['proto'] }> {
  const out: Array<{ kind: 'cluster-ip' | 'external-ip' | 'nodeport'; address: string | null; port: number; proto: DiscoveredService['proto'] }> = [
    { kind: 'cluster-ip', address: s.clusterIP, port: s.port, proto: s.proto },
  ];
  for (const ip of s.externalIPs ?? []) if (ip !== s.clusterIP) out.push({ kind: 'external-ip', address: ip, port: s.port, proto: s.proto });
  for (const np of s.nodePorts) out.push({ kind: 'nodeport', address: null, port: np, proto: s.proto });
  return out;
}
