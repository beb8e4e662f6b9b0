/**
 * kube-proxy's IPVS mode for the lab's Services, rendered the way kube-proxy
 * programs a node (pkg/proxy/ipvs): every ClusterIP bound to the kube-ipvs0
 * dummy device (so the node accepts it as local), one IPVS virtual server
 * per ClusterIP:port and per node address:NodePort with the endpoints as
 * real servers in masquerade (NAT) mode, the KUBE-CLUSTER-IP and
 * KUBE-NODE-PORT-* ipsets (KUBE-NODE-PORT-LOCAL-*: externalTrafficPolicy
 * Local), and iptables nat rules that only mark for masquerade (the
 * balancing is IPVS's). With net.ipv4.vs.conntrack=1
 * IPVS keeps conntrack entries, so the reply tuple names the real server.
 * Pure: returns the inputs of `ipvsadm -R`, `ipset restore` and
 * `iptables-restore`, and the addresses for kube-ipvs0.
 */
import { KubeService, natScaffold } from './kube-rules';

export interface IpvsRendering {
  /** ClusterIPs to bind to kube-ipvs0 (/32 each). */
  addresses: string[];
  ipvsadm: string;
  ipset: string;
  iptables: string;
}

export const IPVS_DEVICE = 'kube-ipvs0';

/** `scheduler`: kube-proxy's --ipvs-scheduler (default rr). */
export function renderIpvs(services: KubeService[], opts: { clusterCIDR: string; nodeIPs: string[]; masquerade?: boolean; scheduler?: string }): IpvsRendering {
  const scheduler = opts.scheduler ?? 'rr';
  const addresses = [...new Set(services.map((s) => s.clusterIP))];
  const ipvs: string[] = [];
  const sets = {
    'KUBE-CLUSTER-IP': [] as string[],
    'KUBE-NODE-PORT-TCP': [] as string[],
    'KUBE-NODE-PORT-UDP': [] as string[],
    'KUBE-NODE-PORT-LOCAL-TCP': [] as string[],
    'KUBE-NODE-PORT-LOCAL-UDP': [] as string[],
  };
  const flag = (s: KubeService) => (s.proto === 'udp' ? '-u' : '-t');
  const virtual = (s: KubeService, vip: string, port: number, endpoints = s.endpoints) => {
    // sessionAffinity: ClientIP is IPVS persistence (-p seconds).
    ipvs.push(`-A ${flag(s)} ${vip}:${port} -s ${scheduler}${s.affinitySeconds ? ` -p ${s.affinitySeconds}` : ''}`);
    for (const ep of endpoints) ipvs.push(`-a ${flag(s)} ${vip}:${port} -r ${ep.ip}:${ep.port} -m -w 1`);
  };
  for (const s of services) {
    virtual(s, s.clusterIP, s.port);
    sets['KUBE-CLUSTER-IP'].push(`${s.clusterIP},${s.proto}:${s.port}`);
    if (s.nodePort) {
      const udp = s.proto === 'udp';
      // externalTrafficPolicy: Local: the NodePort's real servers are this
      // node's endpoints only (none: IPVS refuses with an ICMP port
      // unreachable), and its port skips the masquerade mark.
      const local = s.externalTrafficPolicy === 'Local';
      for (const ip of opts.nodeIPs) virtual(s, ip, s.nodePort, local ? s.endpoints.filter((ep) => !ep.remote) : s.endpoints);
      sets[udp ? 'KUBE-NODE-PORT-UDP' : 'KUBE-NODE-PORT-TCP'].push(String(s.nodePort));
      if (local) sets[udp ? 'KUBE-NODE-PORT-LOCAL-UDP' : 'KUBE-NODE-PORT-LOCAL-TCP'].push(String(s.nodePort));
    }
  }
  const ipset = [
    'create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 -exist',
    'create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist',
    'create KUBE-NODE-PORT-UDP bitmap:port range 0-65535 -exist',
    'create KUBE-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535 -exist',
    'create KUBE-NODE-PORT-LOCAL-UDP bitmap:port range 0-65535 -exist',
    ...Object.keys(sets).map((set) => `flush ${set}`),
    ...Object.entries(sets).flatMap(([set, members]) => members.map((m) => `add ${set} ${m}`)),
  ];
  const nat = [
    '*nat',
    ':KUBE-SERVICES - [0:0]',
    ':KUBE-POSTROUTING - [0:0]',
    ':KUBE-MARK-MASQ - [0:0]',
    ':KUBE-NODE-PORT - [0:0]',
    ...natScaffold(opts.masquerade !== false),
    `-A KUBE-SERVICES ! -s ${opts.clusterCIDR} -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ`,
    '-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT',
    '-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT',
    '-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN',
    '-A KUBE-NODE-PORT -p udp -m comment --comment "Kubernetes nodeport UDP port with externalTrafficPolicy=local" -m set --match-set KUBE-NODE-PORT-LOCAL-UDP dst -j RETURN',
    '-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ',
    '-A KUBE-NODE-PORT -p udp -m comment --comment "Kubernetes nodeport UDP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-UDP dst -j KUBE-MARK-MASQ',
    'COMMIT',
    '',
  ];
  return { addresses, ipvsadm: ipvs.join('\n') + '\n', ipset: ipset.join('\n') + '\n', iptables: nat.join('\n') };
}
