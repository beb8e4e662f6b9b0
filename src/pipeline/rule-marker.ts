/**
 * Marks the first packet of each new connection to the traced services with
 * `meta nftrace set 1`, from a tiny nftables table svctrace adds in the
 * traced namespace and removes on exit, so the kernel reports the rules those
 * packets meet (iptables-nft rules are nftables rules too). Priority -150:
 * after conntrack (-200, so `ct state new` is known), before NAT (-100).
 */
import { ServiceSpec } from '../net/ipv4';
import { runInNetnsSync } from '../netns/netns';

export function markerTableName(): string {
  return `svctrace_${process.pid}`;
}

/** Synchronous: removal also runs on process exit. */
function nft(netnsPath: string, args: string[], input?: string): void {
  runInNetnsSync(netnsPath, ['nft', ...args], { input });
}

export function markerScript(table: string, services: ServiceSpec[]): string {
  const rules = services.map((s) =>
    s.address
      ? `ip daddr ${s.address} ${s.proto} dport ${s.port} ct state new meta nftrace set 1`
      : `fib daddr type local ${s.proto} dport ${s.port} ct state new meta nftrace set 1`,
  );
  const chain = (name: string, hook: string) => [`\tchain ${name} {`, `\t\ttype filter hook ${hook} priority -150; policy accept;`, ...rules.map((r) => `\t\t${r}`), '\t}'];
  return [`table ip ${table} {`, `\tcomment "svctrace: marks traced connections for nftables tracing; removed when svctrace exits"`, ...chain('prerouting', 'prerouting'), ...chain('output', 'output'), '}', ''].join('\n');
}

export class RuleMarker {
  private readonly installed: string[] = [];
  readonly table = markerTableName();

  /** Adds the marking table in a namespace; throws if nft is missing or refuses. */
  install(netnsPath: string, services: ServiceSpec[]): void {
    this.remove(netnsPath, true);
    nft(netnsPath, ['-f', '-'], markerScript(this.table, services));
    this.installed.push(netnsPath);
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
