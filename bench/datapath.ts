/**
 * Datapath overhead: wrk in the lab's client namespace against the web
 * ClusterIP (3 backends), short connections and keep-alive, with the tracer
 * off, tracing this service, and tracing another service only (the cost for
 * untraced traffic). Configurations are interleaved and repeated; medians.
 */
import { Lab } from '../src/lab/lab';
import { run, runIn } from '../src/lab/exec';
import { Pipeline } from '../src/pipeline/pipeline';
import { parseServiceSpec } from '../src/net/ipv4';
import { fmt, median, sleep, table, writeResult } from './common';

interface WrkResult {
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
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? NaN);
  const p50 = /^\s+50%\s+(\S+)/m.exec(out)?.[1] ?? '';
  const p99 = /^\s+99%\s+(\S+)/m.exec(out)?.[1] ?? '';
  const err = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
  const errors = (err ? Number(err[1]) + Number(err[2]) + Number(err[3]) + Number(err[4]) : 0) + non2xx;
  return { rps, p50ms: toMs(p50), p99ms: toMs(p99), errors };
}

async function wrk(lab: Lab, seconds: number, short: boolean): Promise<WrkResult> {
  const args = ['wrk', '-t1', '-c16', `-d${seconds}s`, '--latency'];
  if (short) args.push('-H', 'Connection: close');
  args.push('http://10.96.0.100/');
  const r = await runIn(lab.clientNetns, args, { timeoutMs: (seconds + 30) * 1000 });
  return parseWrk(r.stdout);
}

type Mode = 'off' | 'traced' | 'other';

export async function benchDatapath(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 3 : 8;
  const rounds = opts.quick ? 1 : 3;
  const lab = await Lab.up();
  // Short connections: let the client reuse ports in TIME_WAIT (lab client only).
  await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000']);
  const results: Record<string, Record<Mode, WrkResult[]>> = { short: { off: [], traced: [], other: [] }, keepalive: { off: [], traced: [], other: [] } };
  try {
    for (let round = 0; round < rounds; round++) {
      for (const conn of ['short', 'keepalive'] as const) {
        for (const mode of ['off', 'traced', 'other'] as Mode[]) {
          let tracer: Pipeline | undefined;
          if (mode !== 'off') {
            const svc = mode === 'traced' ? '10.96.0.100:80' : '10.96.0.150:80';
            tracer = await Pipeline.start({ services: [parseServiceSpec(svc)], netns: [lab.nodeNetns], kubeconfig: false });
          }
          await sleep(200);
          results[conn]![mode].push(await wrk(lab, seconds, conn === 'short'));
          await tracer?.stop();
          await lab.reapConntrack();
          await sleep(500);
        }
      }
    }
  } finally {
    await lab.down();
  }
  const summary: Record<string, Record<Mode, { rps: number; p50ms: number; p99ms: number; errors: number }>> = {};
  const rows: Array<Array<string>> = [];
  for (const conn of ['short', 'keepalive'] as const) {
    summary[conn] = {} as Record<Mode, WrkResult>;
    for (const mode of ['off', 'traced', 'other'] as Mode[]) {
      const rs = results[conn]![mode];
      summary[conn]![mode] = {
        rps: median(rs.map((r) => r.rps)),
        p50ms: median(rs.map((r) => r.p50ms)),
        p99ms: median(rs.map((r) => r.p99ms)),
        errors: rs.reduce((n, r) => n + r.errors, 0),
      };
    }
    const off = summary[conn]!.off.rps;
    for (const mode of ['off', 'traced', 'other'] as Mode[]) {
      const s = summary[conn]![mode];
      rows.push([conn, mode === 'off' ? 'tracer off' : mode === 'traced' ? 'tracing this service' : 'tracing another service', fmt(s.rps), `${((100 * s.rps) / off).toFixed(1)}%`, s.p50ms.toFixed(2), s.p99ms.toFixed(2), String(s.errors)]);
    }
  }
  console.log(`\nDatapath overhead (wrk -c16, ${seconds}s x ${rounds} rounds, medians; ClusterIP with 3 Node.js pods)`);
  console.log(table(['connections', 'mode', 'req/s', 'of off', 'p50 ms', 'p99 ms', 'errors'], rows));
  const result = { seconds, rounds, summary, raw: results };
  console.log(`-> ${writeResult('datapath', result)}`);
  void run;
  return result;
}
