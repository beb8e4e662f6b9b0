/**
 * Kernel cost per request: how much BPF time svctrace's programs spend per
 * keep-alive request, program by program, tracing this service and tracing
 * another one. The kernel's own run-time counters (kernel.bpf_stats_enabled,
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

export async function benchKernelCost(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 4 : 8;
  const rounds = opts.quick ? 1 : 3;
  const before = fs.readFileSync(STATS_SYSCTL, 'utf8').trim();
  const lab = await Lab.up();
  const totals: Record<Mode, { requests: number; progs: Map<string, ProgRun> }> = {
    traced: { requests: 0, progs: new Map() },
    other: { requests: 0, progs: new Map() },
  };
  // Restored however the run ends: the benchmark runner stops a child that
  // runs out of time with SIGTERM and process.exit, which skips `finally`.
  const restore = () => fs.writeFileSync(STATS_SYSCTL, before);
  process.once('exit', restore);
  try {
    fs.writeFileSync(STATS_SYSCTL, '1');
    for (let r = 0; r < rounds; r++) {
      for (const mode of ['traced', 'other'] as Mode[]) {
        const existing = programIds();
        const p = await Pipeline.start({ services: [parseServiceSpec(mode === 'traced' ? '10.96.0.100:80' : '10.96.0.150:80')], netns: [lab.nodeNetns], kubeconfig: false });
        try {
          const ids = new Set([...programIds()].filter((id) => !existing.has(id)));
          await sleep(300);
          const a = ourPrograms(ids);
          const out = await runIn(lab.clientNetns, ['wrk', '-t1', '-c16', `-d${seconds}s`, 'http://10.96.0.100/'], { timeoutMs: (seconds + 30) * 1000 });
          const b = ourPrograms(ids);
          const w = parseWrk(out.stdout);
          if (!(w.requests > 0)) throw new Error(`wrk made no requests (${mode}): ${out.stderr.trim() || out.stdout.trim()}`);
          totals[mode].requests += w.requests;
          for (const [name, after] of b) {
            const t = totals[mode].progs.get(name) ?? { ns: 0, runs: 0 };
            t.ns += after.ns - (a.get(name)?.ns ?? 0);
            t.runs += after.runs - (a.get(name)?.runs ?? 0);
            totals[mode].progs.set(name, t);
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
  for (const mode of ['traced', 'other'] as Mode[]) {
    const t = totals[mode];
    const rows: string[][] = [];
    let nsPerReq = 0;
    let runsPerReq = 0;
    for (const [name, p] of [...t.progs].sort()) {
      nsPerReq += p.ns / t.requests;
      runsPerReq += p.runs / t.requests;
      rows.push([name, (p.runs / t.requests).toFixed(2), p.runs ? fmt(p.ns / p.runs) : '-', fmt(p.ns / t.requests)]);
    }
    rows.push(['total', runsPerReq.toFixed(2), '', fmt(nsPerReq)]);
    console.log(`\nKernel time per keep-alive request, ${mode === 'traced' ? 'tracing this service' : 'tracing another service'} (bpf_stats, wrk -c16, ${rounds} x ${seconds} s, ${fmt(t.requests)} requests)`);
    console.log(table(['program', 'runs/request', 'ns/run', 'ns/request'], rows));
    result[mode] = { requests: t.requests, nsPerRequest: nsPerReq, programs: Object.fromEntries(t.progs) };
  }
  console.log(`-> ${writeResult('kernel-cost', result)}`);
  return result;
}
