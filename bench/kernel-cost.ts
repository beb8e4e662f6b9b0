/**
 * Kernel cost per request: how much BPF time svctrace's programs spend per
 * keep-alive request and per short connection (one request each,
 * `Connection: close`), program by program, tracing this service and
 * tracing another one. The kernel's own run-time counters (kernel.bpf_stats_enabled,
 * on for this benchmark only and restored after) are read with `bpftool
 * prog show -j` before and after each wrk run; only the programs this run
 * loaded count. Less sensitive to a noisy machine than req/s ratios: it is
 * CPU time spent in our programs, not throughput.
 */
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';
import { Lab } from '../src/lab/lab';
import { runIn } from '../src/lab/exec';
import { Pipeline } from '../src/pipeline/pipeline';
import { parseServiceSpec } from '../src/net/ipv4';
import { parseWrk } from './datapath';
import { fmt, sleep, table, writeResult } from './common';

const STATS_SYSCTL = '/proc/sys/kernel/bpf_stats_enabled';

interface ProgRun {
  ns: number;
  runs: number;
}

function ourPrograms(ids: Set<number>): Map<string, ProgRun> {
  const out = new Map<string, ProgRun>();
  const progs = JSON.parse(execFileSync('bpftool', ['prog', 'show', '-j'], { encoding: 'utf8' })) as Array<{ id: number; name?: string; run_time_ns?: number; run_cnt?: number }>;
  for (const p of progs) {
    if (!ids.has(p.id) || !p.name) continue;
    const r = out.get(p.name) ?? { ns: 0, runs: 0 };
    r.ns += p.run_time_ns ?? 0;
    r.runs += p.run_cnt ?? 0;
    out.set(p.name, r);
  }
  return out;
}

function programIds(): Set<number> {
  const progs = JSON.parse(execFileSync('bpftool', ['prog', 'show', '-j'], { encoding: 'utf8' })) as Array<{ id: number; name?: string }>;
  return new Set(progs.filter((p) => p.name?.startsWith('svt_')).map((p) => p.id));
}

type Mode = 'traced' | 'other';
type Conn = 'keepalive' | 'short';
const CONNS: Conn[] = ['keepalive', 'short'];
const MODES: Mode[] = ['traced', 'other'];

export async function benchKernelCost(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 4 : 8;
  const rounds = opts.quick ? 1 : 3;
  const before = fs.readFileSync(STATS_SYSCTL, 'utf8').trim();
  const lab = await Lab.up();
  const totals = Object.fromEntries(
    CONNS.map((c) => [c, Object.fromEntries(MODES.map((m) => [m, { requests: 0, progs: new Map<string, ProgRun>() }]))]),
  ) as Record<Conn, Record<Mode, { requests: number; progs: Map<string, ProgRun> }>>;
  // Restored however the run ends: the benchmark runner stops a child that
  // runs out of time with SIGTERM and process.exit, which skips `finally`.
  const restore = () => fs.writeFileSync(STATS_SYSCTL, before);
  process.once('exit', restore);
  try {
    fs.writeFileSync(STATS_SYSCTL, '1');
    // Short connections reuse ports in TIME_WAIT (see datapath.ts; lab client namespace only).
    await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000', 'net.ipv4.tcp_timestamps=2']);
    for (let r = 0; r < rounds; r++) {
      for (const conn of CONNS) for (const mode of MODES) {
        const existing = programIds();
        const p = await Pipeline.start({ services: [parseServiceSpec(mode === 'traced' ? '10.96.0.100:80' : '10.96.0.150:80')], netns: [lab.nodeNetns], kubeconfig: false });
        try {
          const ids = new Set([...programIds()].filter((id) => !existing.has(id)));
          await sleep(300);
          const a = ourPrograms(ids);
          const out = await runIn(lab.clientNetns, ['wrk', '-t1', '-c16', `-d${seconds}s`, ...(conn === 'short' ? ['-H', 'Connection: close'] : []), 'http://10.96.0.100/'], { timeoutMs: (seconds + 30) * 1000 });
          const b = ourPrograms(ids);
          const w = parseWrk(out.stdout);
          if (!(w.requests > 0)) throw new Error(`wrk made no requests (${mode}): ${out.stderr.trim() || out.stdout.trim()}`);
          const total = totals[conn][mode];
          total.requests += w.requests;
          for (const [name, after] of b) {
            const t = total.progs.get(name) ?? { ns: 0, runs: 0 };
            t.ns += after.ns - (a.get(name)?.ns ?? 0);
            t.runs += after.runs - (a.get(name)?.runs ?? 0);
            total.progs.set(name, t);
          }
        } finally {
          await p.stop();
        }
        await lab.reapConntrack();
      }
    }
  } finally {
    restore();
    process.removeListener('exit', restore);
    await lab.down();
  }
  const result: Record<string, unknown> = { seconds, rounds };
  for (const conn of CONNS) for (const mode of MODES) {
    const t = totals[conn][mode];
    const rows: string[][] = [];
    let nsPerReq = 0;
    let runsPerReq = 0;
    for (const [name, p] of [...t.progs].sort()) {
      nsPerReq += p.ns / t.requests;
      runsPerReq += p.runs / t.requests;
      rows.push([name, (p.runs / t.requests).toFixed(2), p.runs ? fmt(p.ns / p.runs) : '-', fmt(p.ns / t.requests)]);
    }
    rows.push(['total', runsPerReq.toFixed(2), '', fmt(nsPerReq)]);
    const what = conn === 'short' ? 'short connection (one request each)' : 'keep-alive request';
    console.log(`\nKernel time per ${what}, ${mode === 'traced' ? 'tracing this service' : 'tracing another service'} (bpf_stats, wrk -c16, ${rounds} x ${seconds} s, ${fmt(t.requests)} requests)`);
    console.log(table(['program', 'runs/request', 'ns/run', 'ns/request'], rows));
    // Keep-alive rows keep their earlier keys (traced, other); short ones are short.traced, short.other.
    const r = { requests: t.requests, nsPerRequest: nsPerReq, programs: Object.fromEntries(t.progs) };
    if (conn === 'keepalive') result[mode] = r;
    else ((result.short ??= {}) as Record<string, unknown>)[mode] = r;
  }
  console.log(`-> ${writeResult('kernel-cost', result)}`);
  return result;
}
