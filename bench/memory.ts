/**
 * Memory under a storm: `svctrace serve` (its own process, RSS sampled every
 * second from /proc) tracing the web ClusterIP while wrk opens new
 * connections as fast as the lab allows, with one WebSocket client that
 * never reads. The RSS must plateau; losses are counted, never a crash.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import WebSocket from 'ws';
import { Lab } from '../src/lab/lab';
import { runIn } from '../src/lab/exec';
import { parseWrk } from './datapath';
import { fmt, rssOf, sleep, table, writeResult } from './common';

const CLI = path.resolve(__dirname, '..', '..', 'bin', 'svctrace.js');

export async function benchMemory(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 15 : 60;
  const lab = await Lab.up();
  await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000']);
  // Run it the way the installed command runs: with the flags of its #! line.
  const shebangFlags = (/^#!.*\bnode\b(.*)$/m.exec(fs.readFileSync(CLI, 'utf8').split('\n')[0]!)?.[1] ?? '').trim().split(/\s+/).filter(Boolean);
  const serve = spawn(process.execPath, [...shebangFlags, CLI, 'serve', '--netns', lab.nodeNetns, '--service', '10.96.0.100:80', '--listen', '127.0.0.1:0'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  serve.stderr!.on('data', (d) => (err += d));
  try {
    while (!/streaming at (ws:\S+) /.test(err)) {
      if (serve.exitCode !== null) throw new Error(`serve exited: ${err}`);
      await sleep(50);
    }
    const url = /streaming at (ws:\S+) /.exec(err)![1]!;
    const slow = new WebSocket(url, ['svctrace.v1']);
    await new Promise((r, j) => slow.once('open', r).once('error', j));
    (slow as unknown as { _socket: { pause(): void } })._socket.pause();
    const samples: Array<{ t: number; rssMB: number }> = [];
    const t0 = Date.now();
    const sampler = setInterval(() => samples.push({ t: (Date.now() - t0) / 1000, rssMB: rssOf(serve.pid!) / 1e6 }), 1000);
    const storm = await runIn(lab.clientNetns, ['wrk', '-t2', '-c64', `-d${seconds}s`, '-H', 'Connection: close', 'http://10.96.0.100/'], { timeoutMs: (seconds + 60) * 1000 });
    clearInterval(sampler);
    const w = parseWrk(storm.stdout);
    const alive = serve.exitCode === null;
    const half = samples.slice(Math.floor(samples.length / 2));
    const firstHalf = samples.slice(0, Math.floor(samples.length / 2));
    const plateau = Math.max(...half.map((s) => s.rssMB));
    const firstMax = Math.max(...firstHalf.map((s) => s.rssMB));
    slow.terminate();
    serve.kill('SIGINT');
    await new Promise((r) => serve.once('exit', r));
    const summaryLine = /summary: .*\n(?:.*\n)*?\s+events: .*/.exec(err)?.[0] ?? '';
    console.log(`\nMemory under a storm of new connections (${seconds}s, wrk -c64 Connection: close, one client that never reads)`);
    console.log(
      table(
        ['new conn/s', 'RSS max 1st half MB', 'RSS max 2nd half MB (plateau)', 'growth 2nd vs 1st', 'serve alive'],
        [[fmt(w.rps), firstMax.toFixed(0), plateau.toFixed(0), `${(((plateau - firstMax) / firstMax) * 100).toFixed(1)}%`, String(alive)]],
      ),
    );
    console.log(summaryLine.split('\n').map((l) => `  serve: ${l.trim()}`).join('\n'));
    const result = { seconds, connectionsPerSecond: w.rps, samples, plateauMB: plateau, firstHalfMaxMB: firstMax, alive, serveSummary: summaryLine };
    console.log(`-> ${writeResult('memory', result)}`);
    return result;
  } finally {
    if (serve.exitCode === null) serve.kill('SIGKILL');
    await lab.down();
  }
}
