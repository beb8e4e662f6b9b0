/**
 * Datapath overhead: wrk in the lab's client namespace against the web
 * ClusterIP (3 backends), short connections and keep-alive, with the tracer
 * off, tracing this service, and tracing another service only (the cost for
 * untraced traffic). Each tracing run sits between two tracer-off runs and
 * is compared with their mean (the rate drifts on these shared machines);
 * the ratios' median over rounds is reported, beside the drift between
 * neighbouring off runs (the noise floor).
 * While tracing, the tracer's counters are read before and after each wrk
 * run: kernel events per connection and per request (keep-alive: the
 * connections are wrk's -c), and events lost. Each row is checked against
 * its target (see TARGETS).
 */
import { kernelLosses, totalLost } from '../src/tracer/losses';
import { Lab } from '../src/lab/lab';
import { runIn } from '../src/lab/exec';
import { Pipeline } from '../src/pipeline/pipeline';
import type { TracerStats } from '../src/tracer/tracer';
import { parseServiceSpec } from '../src/net/ipv4';
import { fmt, median, rotate, sleep, table, withDeadline, writeResult } from './common';

const CONNS = 16;

interface WrkResult {
  requests: number;
  rps: number;
  p50ms: number;
  p99ms: number;
  errors: number;
}

function toMs(v: string): number {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(v.trim());
  if (!m) return NaN;
  const n = Number(m[1]);
  return m[2] === 'us' ? n / 1000 : m[2] === 'ms' ? n : m[2] === 's' ? n * 1000 : n * 60_000;
}

export function parseWrk(out: string): WrkResult {
  const requests = Number(/(\d+) requests in /.exec(out)?.[1] ?? NaN);
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? NaN);
  const p50 = /^\s+50%\s+(\S+)/m.exec(out)?.[1] ?? '';
  const p99 = /^\s+99%\s+(\S+)/m.exec(out)?.[1] ?? '';
  const err = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
  const errors = (err ? Number(err[1]) + Number(err[2]) + Number(err[3]) + Number(err[4]) : 0) + non2xx;
  return { requests, rps, p50ms: toMs(p50), p99ms: toMs(p99), errors };
}

export async function wrk(lab: Lab, seconds: number, short: boolean): Promise<WrkResult> {
  const args = ['wrk', '-t1', `-c${CONNS}`, `-d${seconds}s`, '--latency'];
  if (short) args.push('-H', 'Connection: close');
  args.push('http://10.96.0.100/');
  const r = await runIn(lab.clientNetns, args, { timeoutMs: (seconds + 30) * 1000 });
  return parseWrk(r.stdout);
}

/**
 * The one place this benchmark starts tracing: the same Pipeline every
 * command composes, with no sinks; its default detail budget unless
 * `detailRate` says otherwise (0: every flow in detail).
 */
function startTracing(service: string, netns: string, detailRate?: number): Promise<{ stats(): TracerStats; stop(): Promise<unknown> }> {
  return Pipeline.start({ services: [parseServiceSpec(service)], netns: [netns], kubeconfig: false, detailRate });
}

/** off; tracing this service (the default detail budget); tracing it with every flow in detail (--detail-rate all); tracing another service. */
type Mode = 'off' | 'traced' | 'tracedAll' | 'other';
const MODES: Mode[] = ['off', 'traced', 'tracedAll', 'other'];
const TRACING_MODES: Mode[] = ['traced', 'tracedAll', 'other'];
const MODE_LABELS: Record<Mode, string> = {
  off: 'tracer off',
  traced: 'tracing this service',
  tracedAll: 'this service, --detail-rate all',
  other: 'tracing another service',
};

type Conn = 'short' | 'keepalive';

interface Run extends WrkResult {
  kernelEvents?: number;
  recordsRead?: number;
  lost?: number;
  /** Tracked flows started during the run, and those of them counted only (over the detail budget). */
  flows?: number;
  countedOnly?: number;
}

/** A tracing run's rate and p99 as ratios to the mean of the tracer-off runs next to it. */
interface Paired {
  ofOff: number;
  p99OfOff: number;
}

/** Targets as fractions of "tracer off" (req/s), and p99 as a ratio to off's. */
const TARGETS: Record<Conn, Partial<Record<Mode, { rps: number; p99?: number }>>> = {
  keepalive: { traced: { rps: 0.97, p99: 1.1 }, tracedAll: { rps: 0.97, p99: 1.1 }, other: { rps: 0.99 } },
  short: { traced: { rps: 0.95 }, tracedAll: { rps: 0.95 }, other: { rps: 0.99 } },
};

const lostOf = (s: TracerStats) => totalLost(kernelLosses(s));

export async function benchDatapath(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 3 : 8;
  const rounds = opts.quick ? 1 : 3;
  const lab = await Lab.up({ requestLog: false }); // nothing here reads lab.served
  // Short connections: let the client reuse ports in TIME_WAIT, with timestamps
  // that grow across connections (no random offset per connection), so a pod's
  // TIME_WAIT socket accepts the new SYN instead of stalling it for a second:
  // without it the tracer-off rate fell from 5k to 2k req/s after one round
  // and every row measured the collisions (lab client only).
  await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000', 'net.ipv4.tcp_timestamps=2']);
  const results: Record<Conn, Record<Mode, Run[]>> = { short: { off: [], traced: [], tracedAll: [], other: [] }, keepalive: { off: [], traced: [], tracedAll: [], other: [] } };
  // Each tracing mode's run is compared with the tracer-off runs just before
  // and after it (a sandwich: off, mode, off, mode, ..., off). On these shared
  // machines the rate of the same configuration drifts by 10-20% within a
  // minute (measured: tracer off from 48 to 62 us of CPU per keep-alive
  // request across 12 runs with nothing else of ours running); a mode
  // compared with offs minutes away measured that drift, not the tracer.
  const paired: Record<Conn, Record<Mode, Paired[]>> = { short: { off: [], traced: [], tracedAll: [], other: [] }, keepalive: { off: [], traced: [], tracedAll: [], other: [] } };
  /** How far apart two tracer-off runs next to each other are: the noise the ratios stand on. */
  const offDrift: Record<Conn, number[]> = { short: [], keepalive: [] };
  const once = async (conn: Conn, mode: Mode): Promise<Run> => {
    const tracer = mode === 'off' ? undefined : await startTracing(mode === 'other' ? '10.96.0.150:80' : '10.96.0.100:80', lab.nodeNetns, mode === 'tracedAll' ? 0 : undefined);
    await sleep(200);
    const before = tracer?.stats();
    const w: Run = await wrk(lab, seconds, conn === 'short');
    // Events of the last connections arrive just after wrk ends (conntrack destroy: ~2 s in the lab).
    if (tracer) await sleep(conn === 'short' ? 2500 : 300);
    const after = tracer?.stats();
    if (before && after) {
      w.kernelEvents = after.kernelEvents - before.kernelEvents;
      w.recordsRead = after.recordsRead - before.recordsRead;
      w.lost = lostOf(after) - lostOf(before);
      w.flows = after.flowsStarted - before.flowsStarted;
      w.countedOnly = after.flowsCountedOnly - before.flowsCountedOnly;
    }
    results[conn][mode].push(w);
    if (tracer) await withDeadline(tracer.stop(), 15_000, 'tracer stop');
    await lab.reapConntrack();
    // As long a pause after an off run as after a tracing one (whose stop
    // takes about a second): the sandwich's runs are evenly spaced.
    await sleep(tracer ? 500 : 1500);
    return w;
  };
  try {
    for (let round = 0; round < rounds; round++) {
      for (const conn of ['short', 'keepalive'] as const) {
        // The tracing modes take turns going first from round to round.
        let offBefore = await once(conn, 'off');
        for (const mode of rotate(TRACING_MODES, round)) {
          const w = await once(conn, mode);
          const offAfter = await once(conn, 'off');
          const offRps = (offBefore.rps + offAfter.rps) / 2;
          const offP99 = (offBefore.p99ms + offAfter.p99ms) / 2;
          paired[conn][mode].push({ ofOff: w.rps / offRps, p99OfOff: w.p99ms / offP99 });
          offDrift[conn].push(Math.abs(offAfter.rps / offBefore.rps - 1));
          offBefore = offAfter;
        }
      }
    }
  } finally {
    await lab.down();
  }
  const summary = {} as Record<Conn, Record<Mode, Record<string, number | boolean | undefined>>>;
  const rows: Array<Array<string>> = [];
  for (const conn of ['short', 'keepalive'] as const) {
    summary[conn] = {} as Record<Mode, Record<string, number>>;
    for (const mode of MODES) {
      const rs = results[conn][mode];
      const rps = median(rs.map((r) => r.rps));
      const p99 = median(rs.map((r) => r.p99ms));
      const p50 = median(rs.map((r) => r.p50ms));
      // Off: 1 by definition; its row's ratio column shows the drift between neighbouring off runs instead.
      const pairs = paired[conn][mode];
      const ofOff = mode === 'off' ? 1 : median(pairs.map((x) => x.ofOff));
      const p99OfOff = mode === 'off' ? 1 : median(pairs.map((x) => x.p99OfOff));
      const drift = mode === 'off' ? median(offDrift[conn]) : undefined;
      const errors = rs.reduce((n, r) => n + r.errors, 0);
      const traced = rs.filter((r) => r.kernelEvents !== undefined);
      // Keep-alive: one connection per wrk connection; short: one per request.
      const perConn = traced.length ? median(traced.map((r) => r.kernelEvents! / (conn === 'short' ? r.requests : CONNS))) : undefined;
      const perReq = traced.length ? median(traced.map((r) => r.kernelEvents! / r.requests)) : undefined;
      const lost = traced.length ? traced.reduce((n, r) => n + r.lost!, 0) : undefined;
      const flows = traced.reduce((n, r) => n + (r.flows ?? 0), 0);
      const countedOnly = flows ? traced.reduce((n, r) => n + (r.countedOnly ?? 0), 0) / flows : undefined;
      const target = TARGETS[conn][mode];
      const met = target ? ofOff >= target.rps && (target.p99 === undefined || p99OfOff <= target.p99) : undefined;
      summary[conn][mode] = {
        rps,
        p50ms: p50,
        p99ms: p99,
        errors,
        ofOff,
        p99OfOff,
        offDrift: drift,
        eventsPerConnection: perConn,
        eventsPerRequest: perReq,
        lost,
        countedOnlyShare: countedOnly,
        met,
      };
      const t = target ? `>= ${target.rps * 100}%${target.p99 ? `, p99 <= ${Math.round(target.p99 * 100)}%` : ''}` : '';
      rows.push([
        conn,
        MODE_LABELS[mode],
        fmt(rps),
        drift === undefined ? `${(100 * ofOff).toFixed(1)}%` : `±${(100 * drift).toFixed(1)}%`,
        p50.toFixed(2),
        p99.toFixed(2),
        mode === 'off' ? '' : `${(100 * p99OfOff).toFixed(0)}%`,
        perConn === undefined ? '' : perConn.toFixed(1),
        perReq === undefined ? '' : perReq.toFixed(2),
        lost === undefined ? '' : String(lost),
        countedOnly === undefined ? '' : `${(100 * countedOnly).toFixed(0)}%`,
        String(errors),
        t,
        met === undefined ? '' : met ? 'met' : 'MISSED',
      ]);
    }
  }
  console.log(`\nDatapath overhead (wrk -c${CONNS}, ${seconds}s x ${rounds} rounds; ClusterIP with 3 Node.js pods)`);
  console.log('"of off": each run against the mean of the tracer-off runs just before and after it, median over rounds;');
  console.log('on the off row, the median drift between two neighbouring off runs (the noise those ratios stand on)');
  console.log(table(['connections', 'mode', 'req/s', 'of off', 'p50 ms', 'p99 ms', 'p99 of off', 'events/conn', 'events/req', 'lost', 'counted only', 'errors', 'target', ''], rows));
  const result = { seconds, rounds, targets: TARGETS, summary, raw: results, paired, offDrift };
  console.log(`-> ${writeResult('datapath', result)}`);
  return result;
}
