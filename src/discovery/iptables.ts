/**
 * Reads kube-proxy's iptables-mode rules from `iptables-save` output: the
 * KUBE-SERVICES -> KUBE-SVC-* -> KUBE-SEP-* chains with their comments, the
 * chained `statistic --probability` values (turned into each endpoint's
 * effective probability), `-m recent` session affinity, KUBE-NODEPORTS /
 * KUBE-EXT-*, the masquerade marks, and the filter table's REJECTs for
 * Services without endpoints.
 */
import { DiscoveredService, Discovery } from './model';

/** Splits an iptables-save rule line into arguments, honouring double quotes. */
export function splitRule(line: string): string[] {
  const out: string[] = [];
  let cur = '';
  let quoted = false;
  let has = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (c === '\\' && quoted && i + 1 < line.length) {
      cur += line[++i];
      continue;
    }
    if (c === '"') {
      quoted = !quoted;
      has = true;
      continue;
    }
    if (c === ' ' && !quoted) {
      if (has || cur) out.push(cur);
      cur = '';
      has = false;
      continue;
    }
    cur += c;
  }
  if (has || cur) out.push(cur);
  return out;
}

export interface Rule {
  chain: string;
  args: string[];
  opt(name: string): string | undefined;
  has(name: string): boolean;
  negated(name: string): boolean;
  target?: string;
  comment?: string;
}

export function parseRule(line: string): Rule | null {
  const a = splitRule(line);
  if (a[0] !== '-A' || !a[1]) return null;
  const args = a.slice(2);
  const opt = (name: string) => {
    const i = args.indexOf(name);
    return i >= 0 ? args[i + 1] : undefined;
  };
  return {
    chain: a[1],
    args,
    opt,
    has: (name) => args.includes(name),
    negated: (name) => {
      const i = args.indexOf(name);
      return i > 0 && args[i - 1] === '!';
    },
    target: opt('-j'),
    comment: opt('--comment'),
  };
}

function tables(save: string): Map<string, Rule[]> {
  const out = new Map<string, Rule[]>();
  let table = '';
  for (const line of save.split('\n')) {
    if (line.startsWith('*')) table = line.slice(1).trim();
    else if (line.startsWith('-A ')) {
      const r = parseRule(line);
      if (r) out.set(table, [...(out.get(table) ?? []), r]);
    }
  }
  return out;
}

/** "ns/name:port cluster IP" -> [ns, name, port]. */
function nameOf(comment: string | undefined): [string, string, string] {
  const m = /^([^/\s]+)\/([^:\s]+):?(\S*)/.exec(comment ?? '');
  return m ? [m[1]!, m[2]!, m[3]!] : ['', '', ''];
}

function addr(v: string | undefined): string {
  return (v ?? '').replace(/\/32$/, '');
}

export function parseIptablesSave(save: string): Discovery {
  const t = tables(save);
  const nat = t.get('nat') ?? [];
  const filter = t.get('filter') ?? [];
  const byChain = new Map<string, Rule[]>();
  for (const r of nat) byChain.set(r.chain, [...(byChain.get(r.chain) ?? []), r]);
  const warnings: string[] = [];
  const services: DiscoveredService[] = [];
  const byChainName = new Map<string, DiscoveredService>();

  for (const r of byChain.get('KUBE-SERVICES') ?? []) {
    if (!r.target?.startsWith('KUBE-SVC-') || !r.opt('-d')) continue;
    const [ns, svc, portName] = nameOf(r.comment);
    const proto = (r.opt('-p') ?? 'tcp') as DiscoveredService['proto'];
    const s: DiscoveredService = {
      name: ns ? `${ns}/${svc}:${portName}` : r.target,
      namespace: ns,
      service: svc,
      portName,
      clusterIP: addr(r.opt('-d')),
      port: Number(r.opt('--dport') ?? 0),
      proto,
      nodePorts: [],
      endpoints: [],
      chain: r.target,
      rejects: false,
      nodePortMasquerade: false,
      source: 'iptables',
    };
    // Endpoints: statistic rules chain the probabilities; affinity rules come first.
    let remaining = 1;
    for (const sr of byChain.get(r.target) ?? []) {
      if (sr.target === 'KUBE-MARK-MASQ') {
        if (sr.negated('-s')) s.masqueradeUnless = sr.opt('-s');
        continue;
      }
      if (!sr.target?.startsWith('KUBE-SEP-')) continue;
      if (sr.has('recent') || sr.has('--rcheck')) {
        const secs = Number(sr.opt('--seconds'));
        if (secs) s.affinitySeconds = secs;
        continue;
      }
      const p = sr.opt('--probability');
      const chosen = p !== undefined ? remaining * Number(p) : remaining;
      remaining -= chosen;
      const dnat = (byChain.get(sr.target) ?? []).find((x) => x.target === 'DNAT');
      const dest = dnat?.opt('--to-destination') ?? '';
      const m = /^([\d.]+):(\d+)$/.exec(dest);
      if (!m) {
        warnings.push(`${sr.target}: no DNAT --to-destination found`);
        continue;
      }
      // kube-proxy's hairpin rule: -A KUBE-SEP-X -s <endpoint>/32 -j KUBE-MARK-MASQ.
      const hairpin = (byChain.get(sr.target) ?? []).find((x) => x.target === 'KUBE-MARK-MASQ' && x.opt('-s'));
      const ruleAddress = hairpin ? addr(hairpin.opt('-s')) : undefined;
      s.endpoints.push({ ip: m[1]!, port: Number(m[2]), probability: chosen, chain: sr.target, ...(ruleAddress ? { ruleAddress } : {}) });
    }
    services.push(s);
    byChainName.set(r.target, s);
  }

  // externalIPs and LoadBalancer IPs: KUBE-SERVICES -d IP --dport P -j KUBE-EXT-*
  // ("ns/name:port external IP" / "loadbalancer IP"), on the Service's port.
  for (const r of byChain.get('KUBE-SERVICES') ?? []) {
    if (!r.target?.startsWith('KUBE-EXT-') || !r.opt('-d')) continue;
    const ext = byChain.get(r.target) ?? [];
    const svcChain = ext.find((x) => x.target?.startsWith('KUBE-SVC-'))?.target;
    const [ns, svc, portName] = nameOf(r.comment);
    const port = Number(r.opt('--dport') ?? 0);
    const s = (svcChain ? byChainName.get(svcChain) : undefined) ?? services.find((x) => x.namespace === ns && x.service === svc && x.portName === portName && x.port === port);
    const ip = addr(r.opt('-d'));
    if (s && ip !== s.clusterIP && !(s.externalIPs ??= []).includes(ip)) s.externalIPs.push(ip);
  }

  // NodePorts: KUBE-NODEPORTS -> KUBE-EXT-* (masquerade) -> KUBE-SVC-*.
  for (const r of byChain.get('KUBE-NODEPORTS') ?? []) {
    const ext = r.target;
    if (!ext) continue;
    const extRules = byChain.get(ext) ?? [];
    const svcChain = ext.startsWith('KUBE-SVC-') ? ext : extRules.find((x) => x.target?.startsWith('KUBE-SVC-'))?.target;
    const s = svcChain ? byChainName.get(svcChain) : undefined;
    if (!s) continue;
    // kube-proxy writes a NodePort more than once (e.g. one rule per traffic policy / source): list it once.
    const port = Number(r.opt('--dport') ?? 0);
    if (!s.nodePorts.includes(port)) s.nodePorts.push(port);
    // Every packet marked (policy Cluster); policy Local marks only the node's own traffic (--src-type LOCAL).
    if (extRules.some((x) => x.target === 'KUBE-MARK-MASQ' && !x.opt('-s') && !x.opt('--src-type'))) s.nodePortMasquerade = true;
  }

  // Services without endpoints: kube-proxy REJECTs them in the filter table.
  for (const r of filter) {
    if (r.chain !== 'KUBE-SERVICES' || r.target !== 'REJECT') continue;
    const [ns, svc, portName] = nameOf(r.comment);
    const ip = addr(r.opt('-d'));
    const port = Number(r.opt('--dport') ?? 0);
    const proto = (r.opt('-p') ?? 'tcp') as DiscoveredService['proto'];
    let s = services.find((x) => x.clusterIP === ip && x.port === port && x.proto === proto);
    if (!s) {
      s = {
        name: `${ns}/${svc}:${portName}`, namespace: ns, service: svc, portName, clusterIP: ip, port, proto,
        nodePorts: [], endpoints: [], chain: '', rejects: true, nodePortMasquerade: false, source: 'iptables',
      };
      services.push(s);
    }
    s.rejects = true;
  }

  // externalTrafficPolicy: Local without a local endpoint: kube-proxy drops its NodePorts in the filter
  // table (KUBE-EXTERNAL-SERVICES ... --dport NODEPORT -j DROP); before 1.24, in a nat KUBE-XLB-* chain
  // (-j KUBE-MARK-DROP). Both say "has no local endpoints" in their comment.
  for (const r of [...filter, ...nat]) {
    if (!r.comment?.includes('has no local endpoints') || (r.target !== 'DROP' && r.target !== 'KUBE-MARK-DROP')) continue;
    const [ns, svc, portName] = nameOf(r.comment);
    const nodePort = Number(r.opt('--dport') ?? 0);
    for (const s of services) {
      if (s.namespace !== ns || s.service !== svc || (portName && s.portName !== portName) || !s.nodePorts.length) continue;
      if (!nodePort || s.nodePorts.includes(nodePort)) s.noLocalEndpoints = true;
    }
  }

  const masqueradeRule = (byChain.get('KUBE-POSTROUTING') ?? []).some((r) => r.target === 'MASQUERADE');
  const mode = nat.some((r) => r.chain === 'KUBE-SERVICES') ? 'iptables' : 'none';
  return { mode, services, masqueradeRule, warnings };
}
