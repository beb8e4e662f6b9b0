/** What the node's kernel says about reaching each backend, and conntrack's pressure, read in the traced namespace. */
import { runInNetns } from '../netns/netns';

export interface RouteInfo {
  ok: boolean;
  dev?: string;
  gateway?: string;
  src?: string;
  error?: string;
}

export interface NeighbourInfo {
  /** REACHABLE, STALE, DELAY, PROBE, FAILED, INCOMPLETE, PERMANENT, NOARP, or NONE when there is no entry. */
  state: string;
  lladdr?: string;
}

export async function routeTo(netns: string, ip: string): Promise<RouteInfo> {
  const r = await runInNetns(netns, ['ip', '-j', 'route', 'get', ip]);
  if (r.code !== 0) return { ok: false, error: (r.stderr.trim() || `exit ${r.code}`).replace(/^RTNETLINK answers: /, '') };
  try {
    const [route] = JSON.parse(r.stdout) as Array<{ dev?: string; gateway?: string; prefsrc?: string; type?: string }>;
    if (!route || route.type === 'unreachable' || route.type === 'blackhole' || route.type === 'prohibit') return { ok: false, error: route?.type ?? 'no route' };
    return { ok: true, dev: route.dev, gateway: route.gateway, src: route.prefsrc };
  } catch {
    return { ok: false, error: 'unparsable ip route output' };
  }
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
