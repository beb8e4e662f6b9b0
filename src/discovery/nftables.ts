/**
 * Reads kube-proxy's nftables-mode rules (`nft list table ip kube-proxy`):
 * the service-ips / service-nodeports verdict maps, service-* chains with
 * their `numgen random mod N vmap` endpoint choice (1/N each), endpoint-*
 * chains' DNAT, affinity sets, masquerade jumps, and no-endpoint-services.
 */
import { DiscoveredService, Discovery } from './model';

/** Chain name -> its rule lines (text inside `chain NAME { ... }`). */
function chains(text: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let cur: string | null = null;
  let depth = 0;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (cur === null) {
      const m = /^chain (\S+) \{$/.exec(line);
      if (m) {
        cur = m[1]!;
        depth = 1;
        out.set(cur, []);
      }
      continue;
    }
    depth += (line.match(/\{/g) ?? []).length - (line.match(/\}/g) ?? []).length;
    if (depth <= 0) {
      cur = null;
      continue;
    }
    out.get(cur)!.push(line);
  }
  return out;
}

/** "service-HASH-ns/name/proto/portname" -> parts. */
function nameParts(chain: string): { ns: string; name: string; proto: string; portName: string } {
  const m = /^(?:service|external|endpoint)-[A-Z0-9]+-([^/]+)\/([^/]+)\/([^/]+)\/([^_]*)/.exec(chain);
  return m ? { ns: m[1]!, name: m[2]!, proto: m[3]!, portName: m[4]! } : { ns: '', name: '', proto: '', portName: '' };
}

function parseTimeout(s: string): number | undefined {
  const m = /timeout (\d+)([smhd]?)/.exec(s);
  if (!m) return undefined;
  const mult = { '': 1, s: 1, m: 60, h: 3600, d: 86400 }[m[2] as '' | 's' | 'm' | 'h' | 'd'];
  return Number(m[1]) * mult;
}

export function parseNftKubeProxy(text: string): Discovery {
  const warnings: string[] = [];
  const ch = chains(text);
  const services: DiscoveredService[] = [];
  const byChain = new Map<string, DiscoveredService>();
  const elemRe = /(\d+\.\d+\.\d+\.\d+) \. (tcp|udp|sctp) \. (\d+)(?: comment "([^"]*)")? : goto (\S+?)(?:,|\s|$)/g;
  const externals: Array<{ ip: string; port: number; proto: string; parts: ReturnType<typeof nameParts> }> = [];

  // service-ips: which ClusterIP:port goes to which service chain; no-endpoint-services: REJECTs.
  const sections = text.split(/\n\s*map /);
  for (const sec of sections) {
    const mapName = /^(\S+) \{/.exec(sec)?.[1];
    if (mapName !== 'service-ips' && mapName !== 'no-endpoint-services') continue;
    for (const m of sec.matchAll(elemRe)) {
      const [, ip, proto, port, comment, target] = m;
      const parts = nameParts(target!);
      const named = /^([^/\s]+)\/([^:\s]+):?(\S*)$/.exec(comment ?? '');
      if (!parts.ns && named) Object.assign(parts, { ns: named[1]!, name: named[2]!, portName: named[3]! });
      const reject = mapName === 'no-endpoint-services' || target === 'reject-chain';
      // externalIPs / LoadBalancer IPs go to the Service's external-* chain: an address of that Service, not a Service.
      if (target!.startsWith('external-')) {
        externals.push({ ip: ip!, port: Number(port), proto: proto!, parts });
        continue;
      }
      let s = services.find((x) => x.clusterIP === ip && x.port === Number(port) && x.proto === proto);
      if (!s) {
        s = {
          name: parts.ns ? `${parts.ns}/${parts.name}:${parts.portName}` : target!,
          namespace: parts.ns,
          service: parts.name,
          portName: parts.portName,
          clusterIP: ip!,
          port: Number(port),
          proto: proto as DiscoveredService['proto'],
          nodePorts: [],
          endpoints: [],
          chain: reject ? '' : target!,
          rejects: reject,
          nodePortMasquerade: false,
          source: 'nftables',
        };
        services.push(s);
      }
      if (reject) s.rejects = true;
      else byChain.set(target!, s);
    }
  }

  for (const e of externals) {
    const s = services.find((x) => x.namespace === e.parts.ns && x.service === e.parts.name && x.portName === e.parts.portName && x.proto === e.proto);
    if (s && e.ip !== s.clusterIP && !(s.externalIPs ??= []).includes(e.ip)) s.externalIPs.push(e.ip);
  }

  const affinityTimeouts = new Map<string, number>();
  for (const m of text.matchAll(/set (affinity-\S+) \{([^}]*)\}/g)) {
    const t = parseTimeout(m[2]!);
    if (t) affinityTimeouts.set(m[1]!, t);
  }

  for (const [chainName, s] of byChain) {
    const rules = ch.get(chainName) ?? [];
    const endpointChains: string[] = [];
    let mod = 0;
    for (const r of rules) {
      const masq = /ip saddr != (\S+) jump mark-for-masquerade/.exec(r);
      if (masq) s.masqueradeUnless = masq[1];
      const aff = /ip saddr @(affinity-\S+) goto (endpoint-\S+)/.exec(r);
      if (aff) {
        s.affinitySeconds = affinityTimeouts.get(aff[1]!) ?? s.affinitySeconds ?? 10800;
        continue;
      }
      const ng = /numgen random mod (\d+) vmap \{(.*)\}/.exec(r);
      if (ng) {
        mod = Number(ng[1]);
        for (const e of ng[2]!.matchAll(/\d+ : goto (endpoint-\S+?)(?:,|\s|$)/g)) endpointChains.push(e[1]!);
        continue;
      }
      const single = /^goto (endpoint-\S+)$/.exec(r);
      if (single) endpointChains.push(single[1]!);
    }
    for (const ep of endpointChains) {
      const dnat = (ch.get(ep) ?? []).map((r) => /dnat to (\d+\.\d+\.\d+\.\d+):(\d+)/.exec(r)).find(Boolean);
      if (!dnat) {
        warnings.push(`${ep}: no dnat rule found`);
        continue;
      }
      s.endpoints.push({ ip: dnat[1]!, port: Number(dnat[2]), probability: 1 / Math.max(mod, endpointChains.length, 1), chain: ep });
    }
  }

  // NodePorts: service-nodeports map -> external-* chain (masquerade) -> service-* chain.
  for (const sec of sections) {
    if (!/^service-nodeports \{/.test(sec)) continue;
    for (const m of sec.matchAll(/(tcp|udp|sctp) \. (\d+) : goto (\S+?)(?:,|\s|$)/g)) {
      const target = m[3]!;
      let svcChain = target;
      if (target.startsWith('external-')) {
        const ext = ch.get(target) ?? [];
        svcChain = ext.map((r) => /goto (service-\S+)/.exec(r)?.[1]).find(Boolean) ?? '';
        const s = byChain.get(svcChain);
        if (s && ext.some((r) => /^jump mark-for-masquerade$/.test(r))) s.nodePortMasquerade = true;
      }
      const svc = byChain.get(svcChain);
      if (svc && !svc.nodePorts.includes(Number(m[2]))) svc.nodePorts.push(Number(m[2]));
    }
  }

  const masqueradeRule = (ch.get('masquerading') ?? []).some((r) => /masquerade/.test(r));
  return { mode: ch.size ? 'nftables' : 'none', services, masqueradeRule, warnings };
}
