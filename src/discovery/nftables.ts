/**
 * Reads kube-proxy's nftables-mode rules from libnftables' JSON
 * (`nft -j list table ip kube-proxy`), a machine format that is stable and
 * complete, unlike `nft list`'s text: the service-ips / service-nodeports /
 * no-endpoint-services verdict maps, service-* chains with their `numgen
 * random mod N` endpoint choice (1/N each), endpoint-* chains' DNAT,
 * affinity sets, masquerade jumps and the masquerading chain.
 */
import { DiscoveredService, Discovery } from './model';

/** One JSON expression or statement, as libnftables writes it. */
type Json = Record<string, unknown>;

interface NftDoc {
  chains: Map<string, Json[][]>;
  maps: Map<string, Array<[unknown, unknown]>>;
  sets: Map<string, Json>;
}

function isObj(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Chains (their rules' statement lists), verdict maps (their elements) and sets of `table ip kube-proxy`. */
function readDoc(json: string): NftDoc | undefined {
  let top: unknown;
  try {
    top = JSON.parse(json);
  } catch {
    return undefined;
  }
  const items = isObj(top) && Array.isArray(top.nftables) ? top.nftables : undefined;
  if (!items) return undefined;
  const doc: NftDoc = { chains: new Map(), maps: new Map(), sets: new Map() };
  for (const item of items) {
    if (!isObj(item)) continue;
    if (isObj(item.chain) && typeof item.chain.name === 'string' && item.chain.table === 'kube-proxy') {
      if (!doc.chains.has(item.chain.name)) doc.chains.set(item.chain.name, []);
    } else if (isObj(item.rule) && item.rule.table === 'kube-proxy' && typeof item.rule.chain === 'string' && Array.isArray(item.rule.expr)) {
      const list = doc.chains.get(item.rule.chain) ?? [];
      list.push(item.rule.expr.filter(isObj));
      doc.chains.set(item.rule.chain, list);
    } else if (isObj(item.map) && item.map.table === 'kube-proxy' && typeof item.map.name === 'string') {
      const elems = Array.isArray(item.map.elem) ? item.map.elem : [];
      doc.maps.set(item.map.name, elems.filter((e): e is [unknown, unknown] => Array.isArray(e) && e.length === 2));
    } else if (isObj(item.set) && item.set.table === 'kube-proxy' && typeof item.set.name === 'string') {
      doc.sets.set(item.set.name, item.set);
    }
  }
  return doc;
}

/** A verdict statement's target: {"goto": {"target": X}} or {"jump": ...}. */
function verdictTarget(v: unknown): string | undefined {
  if (!isObj(v)) return undefined;
  const g = (isObj(v.goto) ? v.goto : isObj(v.jump) ? v.jump : undefined) as Json | undefined;
  return typeof g?.target === 'string' ? g.target : undefined;
}

/** A map key: {"concat": [...]} (possibly wrapped in {"elem": {"val": ..., "comment": ...}}); returns its parts and comment. */
function mapKey(k: unknown): { parts: unknown[]; comment?: string } {
  let comment: string | undefined;
  if (isObj(k) && isObj(k.elem)) {
    if (typeof k.elem.comment === 'string') comment = k.elem.comment;
    k = k.elem.val;
  }
  if (isObj(k) && Array.isArray(k.concat)) return { parts: k.concat, comment };
  return { parts: [k], comment };
}

/** "service-HASH-ns/name/proto/portname" -> parts. */
function nameParts(chain: string): { ns: string; name: string; proto: string; portName: string } {
  const m = /^(?:service|external|endpoint)-[A-Z0-9]+-([^/]+)\/([^/]+)\/([^/]+)\/([^_]*)/.exec(chain);
  return m ? { ns: m[1]!, name: m[2]!, proto: m[3]!, portName: m[4]! } : { ns: '', name: '', proto: '', portName: '' };
}

/** `ip saddr != 10.244.0.0/16` as JSON: the prefix text, when this statement is that match. */
function saddrNotIn(st: Json): string | undefined {
  const m = isObj(st.match) ? st.match : undefined;
  if (!m || m.op !== '!=') return undefined;
  const left = isObj(m.left) && isObj(m.left.payload) ? m.left.payload : undefined;
  if (left?.protocol !== 'ip' || left.field !== 'saddr') return undefined;
  const p = isObj(m.right) && isObj(m.right.prefix) ? m.right.prefix : undefined;
  return p ? `${String(p.addr)}/${String(p.len)}` : typeof m.right === 'string' ? m.right : undefined;
}

/** `ip saddr 10.244.1.10` as JSON: the address. */
function saddrIs(st: Json): string | undefined {
  const m = isObj(st.match) ? st.match : undefined;
  const left = m && isObj(m.left) && isObj(m.left.payload) ? m.left.payload : undefined;
  return m?.op === '==' && left?.protocol === 'ip' && left.field === 'saddr' && typeof m.right === 'string' && !m.right.startsWith('@') ? m.right : undefined;
}

/** `ip saddr @affinity-X` as JSON: the set's name. */
function affinitySet(st: Json): string | undefined {
  const m = isObj(st.match) ? st.match : undefined;
  const left = m && isObj(m.left) && isObj(m.left.payload) ? m.left.payload : undefined;
  if (left?.protocol !== 'ip' || left.field !== 'saddr' || typeof m!.right !== 'string') return undefined;
  const r = m!.right;
  return r.startsWith('@affinity-') ? r.slice(1) : undefined;
}

export function parseNftKubeProxy(json: string): Discovery {
  const warnings: string[] = [];
  const doc = readDoc(json);
  if (!doc) return { mode: 'none', services: [], masqueradeRule: false, warnings: ['nft -j: not libnftables JSON'] };
  const services: DiscoveredService[] = [];
  const byChain = new Map<string, DiscoveredService>();
  const externals: Array<{ ip: string; proto: string; parts: ReturnType<typeof nameParts> }> = [];

  // service-ips: ClusterIP (and external IP) . proto . port -> chain; no-endpoint-services: REJECTs.
  for (const mapName of ['service-ips', 'no-endpoint-services']) {
    for (const [k, v] of doc.maps.get(mapName) ?? []) {
      const { parts: key, comment } = mapKey(k);
      const [ip, proto, port] = key;
      const target = verdictTarget(v);
      if (typeof ip !== 'string' || typeof proto !== 'string' || typeof port !== 'number' || !target) continue;
      const parts = nameParts(target);
      const named = /^([^/\s]+)\/([^:\s]+):?(\S*)$/.exec(comment ?? '');
      if (!parts.ns && named) Object.assign(parts, { ns: named[1]!, name: named[2]!, portName: named[3]! });
      // externalIPs / LoadBalancer IPs go to the Service's external-* chain: an address of that Service, not a Service.
      if (target.startsWith('external-')) {
        externals.push({ ip, proto, parts });
        continue;
      }
      const reject = mapName === 'no-endpoint-services' || target === 'reject-chain';
      let s = services.find((x) => x.clusterIP === ip && x.port === port && x.proto === proto);
      if (!s) {
        s = {
          name: parts.ns ? `${parts.ns}/${parts.name}:${parts.portName}` : target,
          namespace: parts.ns,
          service: parts.name,
          portName: parts.portName,
          clusterIP: ip,
          port,
          proto: proto as DiscoveredService['proto'],
          nodePorts: [],
          endpoints: [],
          chain: reject ? '' : target,
          rejects: reject,
          nodePortMasquerade: false,
          source: 'nftables',
        };
        services.push(s);
      }
      if (reject) s.rejects = true;
      else byChain.set(target, s);
    }
  }
  for (const e of externals) {
    const s = services.find((x) => x.namespace === e.parts.ns && x.service === e.parts.name && x.portName === e.parts.portName && x.proto === e.proto);
    if (s && e.ip !== s.clusterIP && !(s.externalIPs ??= []).includes(e.ip)) s.externalIPs.push(e.ip);
  }

  for (const [chainName, s] of byChain) {
    const endpointChains: string[] = [];
    let mod = 0;
    for (const rule of doc.chains.get(chainName) ?? []) {
      const last = rule.at(-1);
      for (const st of rule) {
        const net = saddrNotIn(st);
        if (net && verdictTarget(last) === 'mark-for-masquerade') s.masqueradeUnless = net;
      }
      const aff = rule.map(affinitySet).find(Boolean);
      if (aff && verdictTarget(last)?.startsWith('endpoint-')) {
        const timeout = doc.sets.get(aff)?.timeout;
        s.affinitySeconds = typeof timeout === 'number' ? timeout : s.affinitySeconds ?? 10800;
        continue;
      }
      const vmap = rule.map((st) => (isObj(st.vmap) ? st.vmap : undefined)).find(Boolean);
      const numgen = vmap && isObj(vmap.key) && isObj(vmap.key.numgen) ? vmap.key.numgen : undefined;
      if (vmap && numgen) {
        mod = typeof numgen.mod === 'number' ? numgen.mod : 0;
        const data = isObj(vmap.data) && Array.isArray(vmap.data.set) ? vmap.data.set : [];
        for (const pair of data) {
          const t = Array.isArray(pair) ? verdictTarget(pair[1]) : undefined;
          if (t?.startsWith('endpoint-')) endpointChains.push(t);
        }
        continue;
      }
      const single = verdictTarget(last);
      if (rule.length === 1 && single?.startsWith('endpoint-')) endpointChains.push(single);
    }
    for (const ep of endpointChains) {
      const dnat = (doc.chains.get(ep) ?? []).flat().map((st) => (isObj(st.dnat) ? st.dnat : undefined)).find(Boolean);
      if (!dnat || typeof dnat.addr !== 'string' || typeof dnat.port !== 'number') {
        warnings.push(`${ep}: no dnat rule found`);
        continue;
      }
      // What kube-proxy wrote the chain for: its hairpin rule (ip saddr
      // <endpoint> jump mark-for-masquerade) and its name (..._<ip>/<port>).
      const hairpin = (doc.chains.get(ep) ?? []).map((rule) => (verdictTarget(rule.at(-1)) === 'mark-for-masquerade' ? rule.map(saddrIs).find(Boolean) : undefined)).find(Boolean);
      const named = /__(\d+\.\d+\.\d+\.\d+)\/\d+$/.exec(ep)?.[1];
      const ruleAddress = hairpin && hairpin !== dnat.addr ? hairpin : named && named !== dnat.addr ? named : hairpin ?? named;
      s.endpoints.push({ ip: dnat.addr, port: dnat.port, probability: 1 / Math.max(mod, endpointChains.length, 1), chain: ep, ...(ruleAddress ? { ruleAddress } : {}) });
    }
  }

  // NodePorts: service-nodeports map (proto . port) -> external-* chain (masquerade) -> service-* chain.
  for (const [k, v] of doc.maps.get('service-nodeports') ?? []) {
    const [proto, port] = mapKey(k).parts;
    const target = verdictTarget(v);
    if (typeof port !== 'number' || typeof proto !== 'string' || !target) continue;
    let svcChain = target;
    if (target.startsWith('external-')) {
      const rules = doc.chains.get(target) ?? [];
      svcChain = rules.map((rule) => verdictTarget(rule.at(-1))).find((t) => t?.startsWith('service-')) ?? '';
      const s = byChain.get(svcChain);
      // Every packet marked (policy Cluster); policy Local marks only the node's own traffic (`fib saddr type local`).
      if (s && rules.some((rule) => rule.length === 1 && verdictTarget(rule[0]) === 'mark-for-masquerade')) s.nodePortMasquerade = true;
    }
    const svc = byChain.get(svcChain);
    if (svc && !svc.nodePorts.includes(port)) svc.nodePorts.push(port);
  }

  // externalTrafficPolicy: Local with no endpoint on this node: its NodePort is dropped (no-endpoint-nodeports, "ns/svc:port" : drop).
  for (const [k, v] of doc.maps.get('no-endpoint-nodeports') ?? []) {
    const { parts, comment } = mapKey(k);
    const port = parts[1];
    if (typeof port !== 'number' || !(isObj(v) && 'drop' in v)) continue;
    const s = services.find((x) => x.name === comment && x.nodePorts.includes(port));
    if (s) s.noLocalEndpoints = true;
  }

  const masqueradeRule = (doc.chains.get('masquerading') ?? []).some((rule) => rule.some((st) => 'masquerade' in st));
  return { mode: doc.chains.size ? 'nftables' : 'none', services, masqueradeRule, warnings };
}
