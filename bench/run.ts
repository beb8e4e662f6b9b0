/**
 * `npm run bench`: every benchmark, each comparing side by side in one run,
 * each printing a table and writing JSON to bench-results/. Not part of the
 * test suite. Flags: --quick (shorter runs), --only NAME[,NAME] (pipeline,
 * datapath, kernelcost, replay, memory, startup), --timeout SECONDS (per benchmark).
 *
 * Each benchmark runs in its own child process (this file with --child), so
 * one that crashes or hangs is reported as such (table + bench-results/run.json)
 * and the next one still runs.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { benchPipeline } from './pipeline';
import { benchDatapath } from './datapath';
import { benchReplay } from './replay';
import { benchMemory } from './memory';
import { benchStartup } from './startup';
import { benchKernelCost } from './kernel-cost';
import { cleanupStaleLabs } from '../src/lab/lab';
import { crashReason, table, waitUntil, writeResult } from './common';

const BENCHES = { startup: benchStartup, pipeline: benchPipeline, datapath: benchDatapath, kernelcost: benchKernelCost, replay: benchReplay, memory: benchMemory } as const;
type Name = keyof typeof BENCHES;

function arg(flag: string): string | undefined {
  const i = process.argv.indexOf(flag);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

/** In the child: run one benchmark and exit (exit also tears down any lab it left up). */
async function child(name: Name, quick: boolean): Promise<never> {
  // Asked to stop (timeout): exit so the lab's exit hook removes its namespaces.
  process.once('SIGTERM', () => process.exit(124));
  await BENCHES[name]({ quick });
  process.exit(0);
}

interface Outcome {
  name: string;
  status: 'ok' | 'failed' | 'crashed' | 'timeout';
  reason?: string;
  seconds: number;
}

let interrupted = false;

/**
 * The V8 flags svctrace runs with (its launcher's `#!` line: a smaller heap
 * and young generation, traded for CPU): the benchmarks that run the live
 * pipeline in their own process (LIKE_A_TRACE) measure it as a trace runs,
 * not with Node's defaults (as they did before the twenty-fourth pass).
 * Not the others: replay keeps whole captures decoded in memory, and
 * memory and startup launch svctrace itself.
 */
export function launcherV8Flags(launcher = path.resolve(__dirname, '..', '..', 'bin', 'svctrace.js')): string[] {
  const first = fs.readFileSync(launcher, 'utf8').split('\n', 1)[0] ?? '';
  if (!first.startsWith('#!')) return [];
  return first.split(/\s+/).filter((a) => /^--[a-z][a-z0-9-]*(=\S+)?$/.test(a));
}

const LIKE_A_TRACE = new Set<Name>(['pipeline', 'datapath', 'kernelcost']);

async function runOne(name: Name, quick: boolean, timeoutS: number): Promise<Outcome> {
  const t0 = Date.now();
  // Own process group, so whatever it started (serve, wrk) can be ended with it.
  const flags = LIKE_A_TRACE.has(name) ? launcherV8Flags() : [];
  const c = spawn(process.execPath, [...flags, __filename, '--child', name, ...(quick ? ['--quick'] : [])], { stdio: ['ignore', 'inherit', 'pipe'], detached: true });
  let stderr = '';
  c.stderr!.on('data', (d: Buffer) => {
    process.stderr.write(d);
    stderr = (stderr + d.toString()).slice(-20_000);
  });
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  c.once('exit', (code, signal) => (exit = { code, signal }));
  // Its own group does not get the terminal's Ctrl-C: pass it on as a stop.
  const onInt = () => {
    interrupted = true;
    c.kill('SIGTERM');
  };
  process.on('SIGINT', onInt);
  const inTime = await waitUntil(() => exit !== undefined, timeoutS * 1000, 200);
  if (!inTime) {
    c.kill('SIGTERM');
    await waitUntil(() => exit !== undefined, 10_000, 100);
  }
  try {
    process.kill(-c.pid!, 'SIGKILL'); // leftovers of that group only
  } catch {
    // group already empty
  }
  await waitUntil(() => exit !== undefined, 5000, 100);
  process.off('SIGINT', onInt);
  const seconds = (Date.now() - t0) / 1000;
  if (!inTime) {
    cleanupStaleLabs();
    return { name, status: 'timeout', reason: `no result within ${timeoutS} s`, seconds };
  }
  if (exit!.code === 0) return { name, status: 'ok', seconds };
  cleanupStaleLabs();
  const why = crashReason(exit!.code, exit!.signal, stderr);
  // exit code 1 with a message is the benchmark reporting its own error; anything else is a crash.
  const failed = exit!.code === 1 && !/out of memory/.test(why ?? '');
  return { name, status: failed ? 'failed' : 'crashed', reason: why, seconds };
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) {
    console.error('bench: needs root (it loads BPF programs and builds the lab)');
    process.exit(77);
  }
  const quick = process.argv.includes('--quick');
  const childName = arg('--child');
  if (childName) await child(childName as Name, quick);
  const only = (arg('--only') ?? Object.keys(BENCHES).join(',')).split(',');
  const timeoutS = Number(arg('--timeout') ?? (quick ? 300 : 900));
  for (const name of only) {
    if (!(name in BENCHES)) {
      console.error(`bench: unknown benchmark '${name}' (${Object.keys(BENCHES).join(', ')})`);
      process.exit(2);
    }
  }
  const outcomes: Outcome[] = [];
  for (const name of only as Name[]) {
    const o = await runOne(name, quick, timeoutS);
    outcomes.push(o);
    if (interrupted) o.reason = 'interrupted (Ctrl-C)';
    // A benchmark that did not finish wrote nothing: its file says why instead of holding an old result.
    if (o.status !== 'ok') writeResult(name, { status: o.status, reason: o.reason });
    if (interrupted) break;
  }
  console.log(`\nBenchmarks (${quick ? 'quick' : 'full'}, ${timeoutS} s limit each)`);
  console.log(table(['benchmark', 'status', 'seconds', 'reason'], outcomes.map((o) => [o.name, o.status, o.seconds.toFixed(0), o.reason ?? ''])));
  console.log(`-> ${writeResult('run', { quick, timeoutS, outcomes })}`);
  process.exit(outcomes.every((o) => o.status === 'ok') ? 0 : 1);
}

// Run, not imported (a unit test reads launcherV8Flags).
if (require.main === module) {
  main().catch((e) => {
    console.error(`bench: ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  });
}
