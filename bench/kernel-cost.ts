/**
 * Kernel cost per request: how much BPF time svctrace's programs spend per
 * keep-alive request and per short connection (one request each,
 * `Connection: close`), program by program, tracing this service and
 * tracing another one. The kernel's own run-time counters (kernel.bpf_stats_enabled,
 * on for this benchmark only and restored after) are read with `bpftool
 * prog show -j` before and after each wrk run; only the programs this run
 * loaded count. Less sensitive to a noisy machine than req/s ratios: it is
 * CPU time spent in our programs, not throughput. The same runs also give
 * svctrace's user-space CPU per request, thread by thread (bench/thread-cpu):
 * what the trace costs the node beside its programs.
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { Lab } from '../src/lab/lab';
import { runIn } from '../src/lab/exec';
import { Pipeline } from '../src/pipeline/pipeline';
import { parseServiceSpec } from '../src/net/ipv4';
import { parseWrk } from './datapath';
import { fmt, rotate, sleep, table, writeResult } from './common';
import { cpuBetween, threadCpu } from './thread-cpu';

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

/** traced: this service at the default detail budget; tracedAll: every flow in detail (--detail-rate all); other: another service. */
type Mode = 'traced' | 'tracedAll' | 'other';
type Conn = 'keepalive' | 'short';
const CONNS: Conn[] = ['keepalive', 'short'];
const MODES: Mode[] = ['traced', 'tracedAll', 'other'];
const MODE_LABELS: Record<Mode, string> = { traced: 'tracing this service', tracedAll: 'tracing this service, --detail-rate all', other: 'tracing another service' };

/** What one or more wrk runs cost: requests, BPF time per program, user-space CPU per thread role. */
interface Cost {
  requests: number;
  progs: Map<string, ProgRun>;
  user: Map<string, number>;
}

const newCost = (): Cost => ({ requests: 0, progs: new Map(), user: new Map() });

/**
 * A lab with the kernel's BPF run-time counters on, for `body`. The counters'
 * setting is restored however the run ends: the benchmark runner stops a
 * child that runs out of time with SIGTERM and process.exit, which skips
 * `finally`.
 */
async function withStatsLab<T>(body: (lab: Lab) => Promise<T>): Promise<T> {
  const before = fs.readFileSync(STATS_SYSCTL, 'utf8').trim();
  const restore = () => fs.writeFileSync(STATS_SYSCTL, before);
  process.once('exit', restore);
  const lab = await Lab.up({ requestLog: false }); // nothing here reads lab.served
  try {
    fs.writeFileSync(STATS_SYSCTL, '1');
    // Short connections reuse ports in TIME_WAIT (see datapath.ts; lab client namespace only).
    await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000', 'net.ipv4.tcp_timestamps=2']);
    return await body(lab);
  } finally {
    restore();
    process.removeListener('exit', restore);
    await lab.down();
  }
}

/**
 * One wrk run to the web ClusterIP with a pipeline of `P` tracing `service`,
 * its cost added into `into`: BPF time of the programs this pipeline loaded,
 * and this process's threads' CPU (with 300 ms after the run: the
 * pipeline's backlog is part of its cost).
 */
async function measureRun(lab: Lab, P: typeof Pipeline, service: string, conn: Conn, seconds: number, into: Cost, detailRate?: number): Promise<void> {
  const existing = programIds();
  const p = await P.start({ services: [parseServiceSpec(service)], netns: [lab.nodeNetns], kubeconfig: false, detailRate });
  try {
    const ids = new Set([...programIds()].filter((id) => !existing.has(id)));
    await sleep(300);
    const a = ourPrograms(ids);
    const cpuA = threadCpu();
    const out = await runIn(lab.clientNetns, ['wrk', '-t1', '-c16', `-d${seconds}s`, ...(conn === 'short' ? ['-H', 'Connection: close'] : []), 'http://10.96.0.100/'], { timeoutMs: (seconds + 30) * 1000 });
    const b = ourPrograms(ids);
    await sleep(300);
    const cpuB = threadCpu();
    const w = parseWrk(out.stdout);
    if (!(w.requests > 0)) throw new Error(`wrk made no requests (tracing ${service}): ${out.stderr.trim() || out.stdout.trim()}`);
    into.requests += w.requests;
    for (const [name, after] of b) {
      const t = into.progs.get(name) ?? { ns: 0, runs: 0 };
      t.ns += after.ns - (a.get(name)?.ns ?? 0);
      t.runs += after.runs - (a.get(name)?.runs ?? 0);
      into.progs.set(name, t);
    }
    for (const [role, s] of cpuBetween(cpuA, cpuB)) into.user.set(role, (into.user.get(role) ?? 0) + s);
  } finally {
    await p.stop();
  }
  await lab.reapConntrack();
}

export async function benchKernelCost(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 4 : 8;
  const rounds = opts.quick ? 1 : 3;
  const totals = Object.fromEntries(CONNS.map((c) => [c, Object.fromEntries(MODES.map((m) => [m, newCost()]))])) as Record<Conn, Record<Mode, Cost>>;
  await withStatsLab(async (lab) => {
    for (let r = 0; r < rounds; r++) {
      for (const conn of CONNS) for (const mode of rotate(MODES, r)) await measureRun(lab, Pipeline, mode === 'other' ? '10.96.0.150:80' : '10.96.0.100:80', conn, seconds, totals[conn][mode], mode === 'tracedAll' ? 0 : undefined);
    }
  });
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
    console.log(`\nKernel time per ${what}, ${MODE_LABELS[mode]} (bpf_stats, wrk -c16, ${rounds} x ${seconds} s, ${fmt(t.requests)} requests)`);
    console.log(table(['program', 'runs/request', 'ns/run', 'ns/request'], rows));
    // The same runs' user-space CPU, by thread (10 ms ticks: a role under
    // a few ticks per run reads as noise).
    const userRows = [...t.user].filter(([, s]) => s > 0).sort((x, y) => y[1] - x[1]);
    const userNs = userRows.reduce((n, [, s]) => n + (s * 1e9) / t.requests, 0);
    console.log(`svctrace's threads, CPU per ${conn === 'short' ? 'connection' : 'request'} (same runs, /proc/self/task, 300 ms of backlog after each)`);
    console.log(table(['thread', 'ns/request'], [...userRows.map(([role, s]) => [role, fmt((s * 1e9) / t.requests)]), ['total', fmt(userNs)]]));
    // Keep-alive rows keep their earlier keys (traced, other); short ones are short.traced, short.other.
    const r = { requests: t.requests, nsPerRequest: nsPerReq, programs: Object.fromEntries(t.progs), userNsPerRequest: userNs, userThreadsNsPerRequest: Object.fromEntries(userRows.map(([role, s]) => [role, (s * 1e9) / t.requests])) };
    if (conn === 'keepalive') result[mode] = r;
    else ((result.short ??= {}) as Record<string, unknown>)[mode] = r;
  }
  console.log(`-> ${writeResult('kernel-cost', result)}`);
  return result;
}

/**
 * Kernel time and svctrace's user-space CPU per short connection of two
 * built trees (this one and `otherRoot`), their pipelines taking turns on
 * one lab, `rounds` x 3 s each: what a change buys, side by side in one
 * run. Each tree loads its own addon, and so its own programs. `detail`:
 * every flow in detail ('all'), or the default budget ('default'), where
 * most flows of a busy service are counted only. (A string, not an
 * optional rate: an `undefined` rate for "the default" met a parameter
 * default of 0, and the eighteenth pass's "default budget" runs traced
 * every flow in detail.)
 */
export async function compareTrees(otherRoot: string, rounds: number, detail: 'all' | 'default' = 'all'): Promise<void> {
  const detailRate = detail === 'all' ? 0 : undefined;
  const roots = [path.resolve(__dirname, '..', '..'), path.resolve(otherRoot)];
  const trees = roots.map((root) => {
    const { Pipeline: P } = require(path.join(root, 'dist/src/pipeline/pipeline.js')) as { Pipeline: typeof Pipeline };
    return { root, Pipeline: P, ...newCost() };
  });
  await withStatsLab(async (lab) => {
    for (let r = 0; r < rounds; r++) for (const t of r % 2 ? [...trees].reverse() : trees) await measureRun(lab, t.Pipeline, '10.96.0.100:80', 'short', 3, t, detailRate);
  });
  const names = [...new Set(trees.flatMap((t) => [...t.progs.keys()]))].sort();
  const per = (t: (typeof trees)[number], name?: string) =>
    fmt((name ? t.progs.get(name)?.ns ?? 0 : [...t.progs.values()].reduce((n, s) => n + s.ns, 0)) / t.requests);
  const how = detail === 'all' ? 'with every flow in detail' : 'at the default detail budget';
  console.log(`Kernel time per short connection, ns, tracing this service ${how} (${rounds} x 3 s each, taking turns)`);
  console.log(table(['program', ...trees.map((t) => path.basename(t.root))], [...names.map((n) => [n, ...trees.map((t) => per(t, n))]), ['total', ...trees.map((t) => per(t))], ['connections', ...trees.map((t) => fmt(t.requests))]]));
  // The same runs' user-space CPU, thread by thread (see benchKernelCost).
  const roles = [...new Set(trees.flatMap((t) => [...t.user.keys()]))].sort();
  const userPer = (t: (typeof trees)[number], role?: string) => fmt(((role ? t.user.get(role) ?? 0 : [...t.user.values()].reduce((n, x) => n + x, 0)) * 1e9) / t.requests);
  console.log(`svctrace's threads, CPU per short connection, ns (same runs)`);
  console.log(table(['thread', ...trees.map((t) => path.basename(t.root))], [...roles.map((r) => [r, ...trees.map((t) => userPer(t, r))]), ['total', ...trees.map((t) => userPer(t))]]));
}

if (require.main === module) {
  const args = process.argv.slice(2);
  const budget = args.includes('--default-budget');
  const [otherRoot, roundsArg] = args.filter((a) => a !== '--default-budget');
  if (!otherRoot || (roundsArg !== undefined && !(Number(roundsArg) > 0))) {
    console.error('usage: node dist/bench/kernel-cost.js OTHER_CHECKOUT [ROUNDS] [--default-budget]  (as root; OTHER_CHECKOUT: a built tree to compare this one with, side by side; every flow in detail unless --default-budget)');
    process.exit(2);
  }
  compareTrees(otherRoot, Number(roundsArg) || 4, budget ? 'default' : 'all').then(
    () => process.exit(0),
    (e) => {
      console.error(`kernel-cost: ${e instanceof Error ? e.message : String(e)}`);
      process.exit(1);
    },
  );
}
