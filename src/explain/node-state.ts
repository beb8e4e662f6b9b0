/** What the node's kernel says about reaching each backend, and conntrack's pressure, read in the traced namespace. */
import fs from 'node:fs';
import path from 'node:path';
import { NETNS_RUN_DIR, runInNetns } from '../netns/netns';
import type { BackendView } from './diagnose';

export interface RouteInfo {
  ok: boolean;
  dev?: string;
  gateway?: string;
  src?: string;
  error?: string;
  /** The lookup itself failed (no kernel answer: `ip` gave no parsable output): nothing is known about the route. */
  unknown?: boolean;
}

/**
 * The kernel's answer in `ip -j route get` output: a route, or the reason
 * there is none (an "RTNETLINK answers: ..." error, a blackhole,
 * unreachable or prohibit route). undefined when the output holds no
 * answer (the command failed some other way).
 */
export function parseRouteGet(r: { code: number; stdout: string; stderr: string }): RouteInfo | undefined {
  if (r.code !== 0) {
    const m = /RTNETLINK answers: (.+)/.exec(r.stderr);
    return m ? { ok: false, error: m[1]!.trim() } : undefined;
  }
  try {
    const [route] = JSON.parse(r.stdout) as Array<{ dev?: string; gateway?: string; prefsrc?: string; type?: string }>;
    if (!route) return undefined;
    if (route.type === 'unreachable' || route.type === 'blackhole' || route.type === 'prohibit') return { ok: false, error: route.type };
    return { ok: true, dev: route.dev, gateway: route.gateway, src: route.prefsrc };
  } catch {
    return undefined;
  }
}

/**
 * The node's route to `ip`. A lookup that brings no kernel answer is tried
 * once more, then said to be unknown, never "no route": on a loaded node
 * one came back empty (exit 2, nothing on stderr) and the live diagnoser
 * called two routable backends unroutable.
 */
export async function routeTo(netns: string, ip: string): Promise<RouteInfo> {
  let r = await runInNetns(netns, ['ip', '-j', 'route', 'get', ip]);
  let answer = parseRouteGet(r);
  if (!answer) {
    r = await runInNetns(netns, ['ip', '-j', 'route', 'get', ip]);
    answer = parseRouteGet(r);
  }
  return answer ?? { ok: false, unknown: true, error: `route lookup failed: ${r.stderr.trim() || `ip exited ${r.code}`}` };
}

export interface NeighbourInfo {
  /** REACHABLE, STALE, DELAY, PROBE, FAILED, INCOMPLETE, PERMANENT, NOARP, or NONE when there is no entry. */
  state: string;
  lladdr?: string;
}

export async function neighbour(netns: string, ip: string): Promise<NeighbourInfo> {
  const r = await runInNetns(netns, ['ip', '-j', 'neigh', 'show', 'to', ip]);
  if (r.code !== 0) return { state: 'UNKNOWN' };
  try {
    const list = JSON.parse(r.stdout || '[]') as Array<{ state?: string[]; lladdr?: string }>;
    const n = list[0];
    if (!n) return { state: 'NONE' };
    return { state: (n.state ?? ['NONE']).join(','), lladdr: n.lladdr };
  } catch {
    return { state: 'UNKNOWN' };
  }
}

export interface ConntrackPressure {
  count: number;
  max: number;
  insertFailed: number;
  drop: number;
  earlyDrop: number;
}

export async function conntrackPressure(netns: string): Promise<ConntrackPressure | null> {
  const [count, max, stats] = await Promise.all([
    runInNetns(netns, ['cat', '/proc/sys/net/netfilter/nf_conntrack_count']),
    runInNetns(netns, ['cat', '/proc/sys/net/netfilter/nf_conntrack_max']),
    runInNetns(netns, ['conntrack', '-S']),
  ]);
  if (count.code !== 0 || max.code !== 0) return null;
  return { count: Number(count.stdout.trim()), max: Number(max.stdout.trim()), ...parseConntrackStats(stats.stdout) };
}

/** Sums `conntrack -S` counters over CPUs. */
export function parseConntrackStats(text: string): { insertFailed: number; drop: number; earlyDrop: number } {
  const sum = (key: string) => [...text.matchAll(new RegExp(`\\b${key}=(\\d+)`, 'g'))].reduce((n, m) => n + Number(m[1]), 0);
  return { insertFailed: sum('insert_failed'), drop: sum('drop'), earlyDrop: sum('early_drop') };
}

/** A network device's kind (vxlan, geneve, bridge, veth...) and, for a tunnel, its remote end. */
export interface LinkInfo {
  kind?: string;
  remote?: string;
  mtu?: number;
}

export async function linkInfo(netns: string, dev: string): Promise<LinkInfo> {
  const r = await runInNetns(netns, ['ip', '-j', '-d', 'link', 'show', 'dev', dev]);
  try {
    const [l] = JSON.parse(r.stdout) as Array<{ mtu?: number; linkinfo?: { info_kind?: string; info_data?: { remote?: string } } }>;
    return { kind: l?.linkinfo?.info_kind, remote: l?.linkinfo?.info_data?.remote, mtu: l?.mtu };
  } catch {
    return {};
  }
}

const TUNNEL_KINDS = new Set(['vxlan', 'geneve', 'ipip', 'gre', 'gretap', 'sit', 'wireguard']);

/** The largest MTU of the bridges in a namespace (the pod network of a bridge CNI): what its pods are set to send. */
async function podBridgeMtu(netns: string): Promise<number | undefined> {
  const r = await runInNetns(netns, ['ip', '-j', 'link', 'show', 'type', 'bridge']);
  try {
    const mtus = (JSON.parse(r.stdout) as Array<{ mtu?: number }>).map((l) => l.mtu ?? 0).filter((m) => m > 0);
    return mtus.length ? Math.max(...mtus) : undefined;
  } catch {
    return undefined;
  }
}

/** A local pod's address: the named namespace and the interface that hold it. */
export interface AddressHolder {
  netns: string;
  ifname: string;
}

/**
 * The named network namespaces of this machine (/run/netns: where CNI
 * plugins put pods' namespaces) by the IPv4 addresses they hold. The
 * namespace being explained is left out. Read-only: `ip -j addr` in each.
 */
export async function addressesOfNamedNetns(exceptPath: string): Promise<Map<string, AddressHolder>> {
  const out = new Map<string, AddressHolder>();
  let names: string[];
  try {
    names = fs.readdirSync(NETNS_RUN_DIR);
  } catch {
    return out;
  }
  let except: number | undefined;
  try {
    except = fs.statSync(exceptPath).ino;
  } catch {
    except = undefined;
  }
  await Promise.all(
    names.map(async (name) => {
      const file = path.join(NETNS_RUN_DIR, name);
      try {
        if (fs.statSync(file).ino === except) return;
      } catch {
        return;
      }
      const r = await runInNetns(file, ['ip', '-j', '-4', 'addr', 'show']);
      if (r.code !== 0) return;
      try {
        for (const link of JSON.parse(r.stdout) as Array<{ ifname?: string; addr_info?: Array<{ local?: string }> }>) {
          if (link.ifname === 'lo' || !link.ifname) continue;
          for (const a of link.addr_info ?? []) if (a.local) out.set(a.local, { netns: name, ifname: link.ifname });
        }
      } catch {
        // a namespace that vanished meanwhile
      }
    }),
  );
  return out;
}

/**
 * The node's view of backends (see BackendView): its route to each; who
 * holds each address here, only for a backend the node reaches directly (a
 * route with no gateway: a local pod's subnet; a routed one is on another
 * node, whatever namespaces exist here); and for a local pod, which
 * interface it sends its answers to the node out of (`ip route get` in the
 * pod, from the backend's address and port).
 */
export async function backendView(netns: string, endpoints: Array<{ ip: string; port: number; proto?: string }>, previous?: BackendView): Promise<BackendView> {
  const ips = [...new Set(endpoints.map((e) => e.ip))];
  // A route that could not be looked up is not known (a refresh keeps the last answer): no diagnosis rests on it.
  const looked = await Promise.all(ips.map(async (ip) => [ip, await routeTo(netns, ip)] as const));
  const routes = new Map<string, RouteInfo>();
  for (const [ip, r] of looked) {
    const known = r.unknown ? previous?.routeOf(ip) : r;
    if (known) routes.set(ip, known);
  }
  const byAddress = await addressesOfNamedNetns(netns);
  const local = (ip: string) => {
    const r = routes.get(ip);
    return r?.ok && !r.gateway ? byAddress.get(ip) : undefined;
  };
  const replyDevs = new Map<string, string>();
  await Promise.all(
    endpoints.map(async (e) => {
      const h = local(e.ip);
      const to = routes.get(e.ip)?.src;
      if (!h || !to) return;
      const r = await runInNetns(path.join(NETNS_RUN_DIR, h.netns), ['ip', '-j', 'route', 'get', to, 'from', e.ip, 'ipproto', e.proto ?? 'tcp', 'sport', String(e.port)]);
      try {
        const dev = (JSON.parse(r.stdout) as Array<{ dev?: string }>)[0]?.dev;
        if (r.code === 0 && dev) replyDevs.set(`${e.ip}:${e.port}`, dev);
      } catch {
        // no answer: nothing said
      }
    }),
  );
  // The devices the node reaches backends by: a tunnel is another node's pod.
  const devs = [...new Set([...routes.values()].filter((r) => r.ok && r.dev).map((r) => r.dev!))];
  const links = new Map(await Promise.all(devs.map(async (d) => [d, await linkInfo(netns, d)] as const)));
  const gateways = new Map(
    await Promise.all(
      [...new Set([...routes.values()].filter((r) => r.ok && r.gateway && TUNNEL_KINDS.has(links.get(r.dev!)?.kind ?? '')).map((r) => r.gateway!))].map(
        async (g) => [g, await neighbour(netns, g)] as const,
      ),
    ),
  );
  const podMtu = gateways.size ? await podBridgeMtu(netns) : undefined;
  return {
    routeOf: (ip) => routes.get(ip),
    tunnelOf: (ip) => {
      const r = routes.get(ip);
      const l = r?.ok && r.dev ? links.get(r.dev) : undefined;
      if (!r?.gateway || !l?.kind || !TUNNEL_KINDS.has(l.kind)) return undefined;
      return { dev: r.dev!, kind: l.kind, remote: l.remote, gateway: r.gateway, gatewayNeighbour: gateways.get(r.gateway)?.state, mtu: l.mtu, podMtu };
    },
    holderOf: (ip) => {
      const r = routes.get(ip);
      if (!r?.ok || r.gateway) return undefined;
      return byAddress.get(ip)?.netns ?? null;
    },
    replyPathOf: (ip, port) => {
      const h = local(ip);
      const dev = replyDevs.get(`${ip}:${port}`);
      return h && dev ? { dev, expected: h.ifname, netns: h.netns } : undefined;
    },
  };
}
