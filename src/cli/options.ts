/** Option parsing shared by the commands that trace (trace, serve). */
import fs from 'node:fs';
import { Command } from 'commander';
import { SvctraceError } from '../errors';
import { parseNodePortSpec, parseServiceSpec, ServiceSpec } from '../net/ipv4';

export function collect(value: string, previous: string[]): string[] {
  return previous.concat([value]);
}

export function parseDuration(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0 || n > 7 * 24 * 3600) throw new SvctraceError('BAD_INPUT', `--duration '${v}' must be a number of seconds > 0`);
  return n;
}

export interface SelectionOptions {
  service: string[];
  nodeport: string[];
  netns: string[];
  allPackets?: boolean;
}

/** --service / --nodeport / --netns, as every tracing command takes them. */
export function addSelectionOptions(cmd: Command): Command {
  return cmd
    .option('-s, --service <ip:port[/proto]>', 'ClusterIP service to trace (repeatable)', collect, [])
    .option('--nodeport <port[/proto]>', 'NodePort to trace (repeatable)', collect, [])
    .option('--netns <name|path>', "network namespace of the node (repeatable; default: svctrace's own)", collect, [])
    .option('--all-packets', 'an event for every packet at every hook (default: the transitions — first packets, SYN/FIN/RST, drops — plus one per packet for counting)');
}

export function servicesFrom(opts: SelectionOptions): ServiceSpec[] {
  return [...opts.service.map(parseServiceSpec), ...opts.nodeport.map(parseNodePortSpec)];
}

/** --token or --token-file (first line), never both. */
export function readToken(opts: { token?: string; tokenFile?: string }): string | undefined {
  if (opts.token && opts.tokenFile) throw new SvctraceError('BAD_INPUT', 'give --token or --token-file, not both');
  if (opts.tokenFile) {
    try {
      const t = fs.readFileSync(opts.tokenFile, 'utf8').split('\n')[0]!.trim();
      if (!t) throw new SvctraceError('BAD_INPUT', `token file ${opts.tokenFile} is empty`);
      return t;
    } catch (e) {
      if (e instanceof SvctraceError) throw e;
      throw new SvctraceError('BAD_INPUT', `cannot read token file ${opts.tokenFile}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
  }
  return opts.token;
}
