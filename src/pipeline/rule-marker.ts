/**
 * Marks the first packet of each new connection to the traced services with
 * `meta nftrace set 1`, from a tiny nftables table svctrace adds in the
 * traced namespace and removes on exit, so the kernel reports the rules those
 * packets meet (iptables-nft rules are nftables rules too). Priority -150:
 * after conntrack (-200, so `ct state new` is known), before NAT (-100).
 */
import fs from 'node:fs';
import { ServiceSpec } from '../net/ipv4';
import { runInNetnsSync } from '../netns/netns';
import { MARKER_TABLE_PREFIX } from '../flows/classify';

const MARKER_TABLE = new RegExp(`^${MARKER_TABLE_PREFIX}(\\d+)$`);

/**
 * Marker tables whose svctrace is gone (killed with -9, or its namespace
 * helper died): the table outlives the process, and its chains keep
 * marking packets for a trace no one reads. Given `nft -j list tables`
 * output, the names to delete: ours by name, with no live process of that
 * PID, or a live one that is not svctrace (the PID was reused).
 */
export function staleMarkerTables(nftJson: string, alive: (pid: number) => boolean): string[] {
  let doc: { nftables?: Array<{ table?: { family?: string; name?: string } }> };
  try {
    doc = JSON.parse(nftJson);
  } catch {
    return [];
  }
  const out: string[] = [];
  for (const item of doc.nftables ?? []) {
    const t = item.table;
    const m = t?.family === 'ip' && t.name ? MARKER_TABLE.exec(t.name) : null;
    if (m && Number(m[1]) !== process.pid && !alive(Number(m[1]))) out.push(t!.name!);
  }
  return out;
}

/** A process with this PID runs svctrace (its command line names it). */
export function svctraceAlive(pid: number): boolean {
  try {
    return fs
      .readFileSync(`/proc/${pid}/cmdline`, 'utf8')
      .split('\0')
      .some((a) => /(^|\/)svctrace(\.js)?$/.test(a));
  } catch {
    return false;
  }
}

export function markerTableName(): string {
  return `${MARKER_TABLE_PREFIX}${process.pid}`;
}

/** Synchronous: removal also runs on process exit. */
function nft(netnsPath: string, args: string[], input?: string): void {
  runInNetnsSync(netnsPath, ['nft', ...args], { input });
}

/**
 * New connections marked for tracing per second, per service and hook (with
 * a burst as large). Each traced packet costs about ten netlink messages,
 * built by the kernel in the packet's path: tracing every new connection
 * took a fifth of a busy Service's short-connection rate (datapath
 * benchmark). An incident's connections are well within it; past it, a
 * storm's connections have no observed rule path (their flows and events
 * are unchanged), and the kube-proxy path of a backend is the same for all.
 */
export const MARKED_CONNECTIONS_PER_SECOND = 100;

export function markerScript(table: string, services: ServiceSpec[]): string {
  const mark = `ct state new limit rate ${MARKED_CONNECTIONS_PER_SECOND}/second burst ${MARKED_CONNECTIONS_PER_SECOND} packets meta nftrace set 1`;
  const rules = services.map((s) => (s.address ? `ip daddr ${s.address} ${s.proto} dport ${s.port} ${mark}` : `fib daddr type local ${s.proto} dport ${s.port} ${mark}`));
  const chain = (name: string, hook: string) => [`\tchain ${name} {`, `\t\ttype filter hook ${hook} priority -150; policy accept;`, ...rules.map((r) => `\t\t${r}`), '\t}'];
  return [`table ip ${table} {`, `\tcomment "svctrace: marks traced connections for nftables tracing; removed when svctrace exits"`, ...chain('prerouting', 'prerouting'), ...chain('output', 'output'), '}', ''].join('\n');
}

export class RuleMarker {
  private readonly installed: string[] = [];
  readonly table = markerTableName();

  /** Adds the marking table in a namespace (first removing those of dead svctrace processes); throws if nft is missing or refuses. */
  install(netnsPath: string, services: ServiceSpec[]): void {
    this.removeStale(netnsPath);
    this.remove(netnsPath, true);
    nft(netnsPath, ['-f', '-'], markerScript(this.table, services));
    this.installed.push(netnsPath);
  }

  /** Tables left by svctrace processes that are gone; returns the names removed. */
  removeStale(netnsPath: string): string[] {
    let listed: string;
    try {
      listed = runInNetnsSync(netnsPath, ['nft', '-j', 'list', 'tables']);
    } catch {
      return [];
    }
    const stale = staleMarkerTables(listed, svctraceAlive);
    for (const name of stale) {
      try {
        nft(netnsPath, ['delete', 'table', 'ip', name]);
      } catch {
        // removed by someone else meanwhile
      }
    }
    return stale;
  }

  private remove(netnsPath: string, quiet: boolean): void {
    try {
      nft(netnsPath, ['delete', 'table', 'ip', this.table]);
    } catch (e) {
      if (!quiet) throw e;
    }
  }

  /** Removes every table it added (synchronous: also runs on process exit). */
  removeAll(): void {
    for (const ns of this.installed.splice(0)) this.remove(ns, true);
  }
}
