/**
 * What a change does to the traced Service's rate: two built checkouts
 * (this one and another) trace the lab's web Service in turn, each in its
 * own process with its own launcher's V8 flags, every tracing run between
 * two tracer-off runs (off, A, off, B, off, ...; who goes first alternates
 * by round) and compared with their mean, the median over rounds reported.
 * The kernel-cost comparison (one process, pipelines taking turns) says
 * where CPU goes; this says whether the traced traffic feels it.
 *
 *   node dist/bench/datapath-compare.js OTHER_CHECKOUT [ROUNDS] [--keepalive]
 */
import { fork, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { Lab } from '../src/lab/lab';
import { runIn } from '../src/lab/exec';
import { launcherV8Flags } from './run';
import { median, sleep, table, withDeadline, writeResult } from './common';
import { wrk } from './datapath';

const SECONDS = 5;

async function startTree(root: string, netns: string): Promise<ChildProcess> {
  const child = fork(path.join(__dirname, 'trace-child.js'), [root, netns, '10.96.0.100:80'], { execArgv: launcherV8Flags(path.join(root, 'bin', 'svctrace.js')), stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  const ready = new Promise<void>((resolve, reject) => {
    child.once('message', () => resolve());
    child.once('exit', (code, signal) => reject(new Error(`the tracer of ${root} exited (${signal ?? code}) before it was ready`)));
  });
  try {
    await withDeadline(ready, 30_000, `tracer of ${root} start`);
  } catch (e) {
    child.kill('SIGKILL');
    throw e;
  }
  return child;
}

async function stopTree(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  try {
    await withDeadline(exited, 15_000, 'tracer stop');
  } catch {
    child.kill('SIGKILL');
    await exited;
  }
}

async function compare(otherRoot: string, rounds: number, short: boolean): Promise<void> {
  const roots = [path.resolve(__dirname, '..', '..'), path.resolve(otherRoot)];
  const lab = await Lab.up({ requestLog: false });
  const ratios: number[][] = roots.map(() => []);
  const drift: number[] = [];
  try {
    // As the datapath benchmark: ports in TIME_WAIT reused, timestamps that grow (lab client only).
    await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000', 'net.ipv4.tcp_timestamps=2']);
    const off = async () => {
      const w = await wrk(lab, SECONDS, short);
      await lab.reapConntrack();
      await sleep(1500);
      return w.rps;
    };
    await off(); // the lab's first run is a warm-up, slower than the rest
    let before = await off();
    for (let r = 0; r < rounds; r++) {
      for (const i of r % 2 ? [1, 0] : [0, 1]) {
        const child = await startTree(roots[i]!, lab.nodeNetns);
        let rps: number;
        try {
          await sleep(200);
          rps = (await wrk(lab, SECONDS, short)).rps;
        } finally {
          await stopTree(child);
        }
        await lab.reapConntrack();
        await sleep(500);
        const after = await off();
        ratios[i]!.push(rps / ((before + after) / 2));
        drift.push(Math.abs(after / before - 1));
        console.log(`round ${r + 1}: ${path.basename(roots[i]!)} ${Math.round(rps)} req/s, ${((100 * rps) / ((before + after) / 2)).toFixed(1)}% of the off runs beside it`);
        before = after;
      }
    }
  } finally {
    await lab.down();
  }
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  console.log(`\n${short ? 'Short connections' : 'Keep-alive requests'} to the traced Service, each checkout tracing in its own process (wrk -c16, ${SECONDS} s x ${rounds} rounds)`);
  console.log(table(['checkout', 'of off (median)', 'each round'], roots.map((root, i) => [path.basename(root), pct(median(ratios[i]!)), ratios[i]!.map(pct).join(' ')])));
  console.log(`drift between neighbouring off runs: median ±${pct(median(drift))}`);
  console.log(`-> ${writeResult('datapath-compare', { short, seconds: SECONDS, rounds, roots, ratios, drift })}`);
}

if (require.main === module) {
  const args = process.argv.slice(2);
  const keepalive = args.includes('--keepalive');
  const [otherRoot, roundsArg] = args.filter((a) => a !== '--keepalive');
  if (!otherRoot || (roundsArg !== undefined && !(Number(roundsArg) > 0))) {
    console.error('usage: node dist/bench/datapath-compare.js OTHER_CHECKOUT [ROUNDS] [--keepalive]  (as root; OTHER_CHECKOUT: a built tree to compare this one with)');
    process.exit(2);
  }
  compare(otherRoot, Number(roundsArg) || 6, !keepalive).then(
    () => process.exit(0),
    (e) => {
      console.error(`datapath-compare: ${e instanceof Error ? e.message : String(e)}`);
      process.exit(1);
    },
  );
}
