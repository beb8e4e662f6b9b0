/** Option parsing shared by the commands that trace (trace, serve, record). */
import { Command } from 'commander';
import { SvctraceError } from '../errors';
import { readSmallFile } from '../small-file';
import { DEFAULT_DETAIL_RATE, DEFAULT_RING_BUFFER_BYTES, DEFAULT_STATS_INTERVAL_MS, MAX_SNAPLEN } from '../events/layout';
import { parseNodePortSpec, parseServiceSpec, ServiceSpec } from '../net/ipv4';
import { discover } from '../discovery/discover';
import { DiscoveredService, findByName, readersMissingText, tracedAddressesOf } from '../discovery/model';
import type { PipelineOptions } from '../pipeline/pipeline';
import { CURRENT_NETNS, resolveNetns } from '../netns/netns';
import { parseBackend } from '../tracer/backend';
import { parseDecimal } from '../decimal';

export function collect(value: string, previous: string[]): string[] {
  return previous.concat([value]);
}

export function parseDuration(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = parseDecimal(v);
  if (!Number.isFinite(n) || n <= 0 || n > 7 * 24 * 3600) throw new SvctraceError('BAD_INPUT', `--duration '${v}' must be a number of seconds > 0`);
  return n;
}

export interface SelectionOptions {
  kubeconfig?: string;
  allServices?: boolean;
  service: string[];
  nodeport: string[];
  netns: string[];
  allPackets?: boolean;
  backend?: string;
  ringBuffer?: string;
  statsInterval?: string;
  detailRate?: string;
}

/** --service / --nodeport / --netns, as every tracing command takes them. */
export function addSelectionOptions(cmd: Command): Command {
  return cmd
    .option('-s, --service <ip:port[/proto]|ns/name[:port]>', 'Service to trace (repeatable); names resolve through the node\'s kube-proxy rules', collect, [])
    .option('--all-services', 'trace every ClusterIP found in the kube-proxy rules')
    .option('--nodeport <port[/proto]>', 'NodePort to trace (repeatable)', collect, [])
    .option('--netns <name|path>', "network namespace of the node (repeatable; default: svctrace's own)", collect, [])
    .option('--kubeconfig <path>', 'name services and pods from the Kubernetes API (default: $KUBECONFIG, ~/.kube/config or in-cluster, if any)')
    .option('--backend <auto|netfilter|fentry|kprobe>', 'how the kernel side attaches: netfilter links (Linux >= 6.4), fentry/fexit on NAT\'s hook functions (older kernels with module BTF), or kprobes on them (5.10); auto picks the best this kernel offers (default: $SVCTRACE_BACKEND, else auto)')
    .option('--all-packets', 'an event for every packet at every hook, for evidence (default: the transitions — first packet at each hook and device, NAT, conntrack state changes, SYN/RST, drops, routes — with packets and bytes counted in the kernel)')
    .option('--ring-buffer <MiB>', 'kernel ring buffer size, a power of two (the one buffer while svctrace is behind; what does not fit is counted as lost)', String(DEFAULT_RING_BUFFER_BYTES / 2 ** 20))
    .option('--stats-interval <ms>', 'how often each active flow\'s packet and byte counters are reported', String(DEFAULT_STATS_INTERVAL_MS))
    .option(
      '--detail-rate <flows/s|all>',
      'new flows per second whose transitions are reported; past it a flow is counted only (packets, bytes, TCP flags, backend, drops: every flow is still shown), which keeps tracing a busy Service cheap. "all" (or 0): every flow in detail; --all-packets implies it',
      String(DEFAULT_DETAIL_RATE),
    );
}

/** IP:port specs parse directly; `ns/name[:port]` and --all-services resolve through the node's kube-proxy rules. */
export async function servicesFrom(opts: SelectionOptions): Promise<ServiceSpec[]> {
  const byName = opts.service.filter(isServiceName);
  const specs = [...opts.service.filter((s) => !isServiceName(s)).map(parseServiceSpec), ...opts.nodeport.map(parseNodePortSpec)];
  if (!byName.length && !opts.allServices) return specs;
  const netns = opts.netns.length ? resolveNetns(opts.netns[0]!) : CURRENT_NETNS;
  const d = await discover(netns);
  if (d.readersMissing) throw new SvctraceError('TOOL_MISSING', `${byName.length ? `'${byName[0]}'` : '--all-services'}: ${readersMissingText(d.readersMissing)}; trace by address instead (--service IP:port)`);
  // Every address kube-proxy DNATs for the Service: ClusterIP, externalIPs,
  // LoadBalancer IPs and NodePorts (on any node address), not the ClusterIP alone.
  const add = (s: DiscoveredService) => {
    for (const a of tracedAddressesOf(s)) {
      const spec = a.address === null ? parseNodePortSpec(`${a.port}/${a.proto}`) : parseServiceSpec(`${a.address}:${a.port}/${a.proto}`);
      const label = a.kind === 'nodeport' ? `NodePort ${a.port}/${a.proto}` : a.kind === 'external-ip' ? `external ${spec.text}` : spec.text;
      if (!specs.some((x) => x.address === spec.address && x.port === spec.port && x.proto === spec.proto)) specs.push({ ...spec, text: `${s.name} (${label})` });
    }
  };
  for (const ref of byName) {
    const found = findByName(d, ref);
    if (!found.length) throw new SvctraceError('BAD_INPUT', `no Service '${ref}' in the kube-proxy rules of ${netns} (${d.mode} mode, ${d.services.length} services)`);
    found.forEach(add);
  }
  if (opts.allServices) {
    if (!d.services.length) throw new SvctraceError('BAD_INPUT', `--all-services: no kube-proxy rules found in ${netns}`);
    d.services.forEach(add);
  }
  return specs;
}

function isServiceName(s: string): boolean {
  return /^[a-z0-9]([-a-z0-9]*[a-z0-9])?\/[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[A-Za-z0-9-]+)?$/.test(s);
}

/** --token or --token-file (first line), never both. */
export function readToken(opts: { token?: string; tokenFile?: string }): string | undefined {
  if (opts.token && opts.tokenFile) throw new SvctraceError('BAD_INPUT', 'give --token or --token-file, not both');
  if (opts.tokenFile) {
    const t = readSmallFile(opts.tokenFile, 'token file').toString('utf8').split('\n')[0]!.trim();
    if (!t) throw new SvctraceError('BAD_INPUT', `token file ${opts.tokenFile} is empty`);
    return t;
  }
  return opts.token;
}

/** Warnings go to stderr, one line each; the command goes on. */
export const warn = (w: string): void => {
  process.stderr.write(`svctrace: warning: ${w}\n`);
};

/** The pipeline's selection from the selection options: what every tracing command traces, and where. */
export function selectionOf(opts: SelectionOptions, services: ServiceSpec[]): PipelineOptions {
  return {
    services,
    netns: opts.netns,
    kubeconfig: opts.kubeconfig,
    allPackets: !!opts.allPackets,
    attachBackend: opts.backend === undefined ? undefined : parseBackend(opts.backend),
    ringBufferBytes: parseRingBuffer(opts.ringBuffer),
    statsIntervalMs: parseStatsInterval(opts.statsInterval),
    detailRate: parseDetailRate(opts.detailRate),
    onWarning: warn,
  };
}

/** --snaplen bytes: 0..MAX_SNAPLEN (what the kernel copies per event). */
export function parseSnaplen(v: string): number {
  const n = parseDecimal(v);
  if (!Number.isInteger(n) || n < 0 || n > MAX_SNAPLEN) throw new SvctraceError('BAD_INPUT', `--snaplen must be 0..${MAX_SNAPLEN}`);
  return n;
}

/** --ring-buffer MiB: a power of two from 1 MiB to 1 GiB. */
export function parseRingBuffer(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const mib = parseDecimal(v);
  if (!Number.isInteger(mib) || mib < 1 || mib > 1024 || (mib & (mib - 1)) !== 0) {
    throw new SvctraceError('BAD_INPUT', `--ring-buffer '${v}' must be a power of two number of MiB, 1..1024`);
  }
  return mib * 2 ** 20;
}

/** --stats-interval ms: 10 ms .. 1 h. */
export function parseStatsInterval(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const ms = parseDecimal(v);
  if (!Number.isFinite(ms) || ms < 10 || ms > 3_600_000) throw new SvctraceError('BAD_INPUT', `--stats-interval '${v}' must be a number of milliseconds, 10..3600000`);
  return ms;
}

/** --detail-rate flows/s: a whole number 0..1,000,000, or "all" (0: every flow in detail). */
export function parseDetailRate(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  if (v === 'all') return 0;
  const n = parseDecimal(v);
  if (!Number.isInteger(n) || n < 0 || n > 1_000_000) {
    throw new SvctraceError('BAD_INPUT', `--detail-rate '${v}' must be a whole number of new flows per second, 0..1000000, or 'all'`);
  }
  return n;
}
