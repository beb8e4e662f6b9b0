/**
 * The storm, shared by the memory benchmark and test/kernel/storm.test.ts:
 * `svctrace serve` in its own process, launched the way the installed
 * command is (with the flags of bin/svctrace.js's #! line), one WebSocket
 * client that never reads, and wrk opening new connections (Connection:
 * close) to the web ClusterIP from the lab's client namespace.
 */
import { ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import WebSocket from 'ws';
import { Lab } from '../src/lab/lab';
import { runIn } from '../src/lab/exec';
import { crashReason, waitUntil, withDeadline } from './common';

export const CLI = path.resolve(__dirname, '..', '..', 'bin', 'svctrace.js');

/** The node flags of the #! line (e.g. --max-old-space-size=128), and that heap limit in MB. */
export function shebang(): { flags: string[]; maxOldSpaceMB: number | undefined } {
  const first = fs.readFileSync(CLI, 'utf8').split('\n')[0]!;
  const flags = (/^#!.*\bnode\b(.*)$/.exec(first)?.[1] ?? '').trim().split(/\s+/).filter(Boolean);
  const m = flags.map((f) => /^--max-old-space-size=(\d+)$/.exec(f)).find(Boolean);
  return { flags, maxOldSpaceMB: m ? Number(m[1]) : undefined };
}

export interface ServeProc {
  child: ChildProcess;
  url: string;
  stderr(): string;
  /** Set once it exited. */
  exit?: { code: number | null; signal: NodeJS.Signals | null };
  /** Why it ended badly (OOM, signal, non-zero exit), if it did. */
  crash(): string | undefined;
}

/**
 * Starts `serve` tracing the web ClusterIP; resolves once it streams, within
 * `startMs` (a test in an emulated guest passes its scaled deadline: there
 * loading and attaching took longer than 15 s).
 */
export async function startServe(lab: Lab, startMs = 15_000): Promise<ServeProc> {
  const { flags } = shebang();
  const child = spawn(process.execPath, [...flags, CLI, 'serve', '--netns', lab.nodeNetns, '--service', '10.96.0.100:80', '--listen', '127.0.0.1:0'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr!.on('data', (d) => (err += d));
  const proc: ServeProc = {
    child,
    url: '',
    stderr: () => err,
    crash: () => (proc.exit ? crashReason(proc.exit.code, proc.exit.signal, err) : undefined),
  };
  child.once('exit', (code, signal) => (proc.exit = { code, signal }));
  const up = await waitUntil(() => /streaming at (ws:\S+) /.test(err) || proc.exit !== undefined, startMs, 20);
  const url = /streaming at (ws:\S+) /.exec(err)?.[1];
  if (!up || !url) {
    if (!proc.exit) child.kill('SIGKILL');
    throw new Error(`serve did not start within ${startMs / 1000} s: ${err.trim() || '(no output)'}`);
  }
  proc.url = url;
  return proc;
}

/** SIGINT, then up to `ms` for it to exit (SIGKILL after that). Returns its stderr. */
export async function stopServe(proc: ServeProc, ms = 15_000): Promise<{ clean: boolean; why?: string; code?: number | null; stderr: string }> {
  if (!proc.exit) {
    proc.child.kill('SIGINT');
    if (!(await waitUntil(() => proc.exit !== undefined, ms, 20))) {
      proc.child.kill('SIGKILL');
      await waitUntil(() => proc.exit !== undefined, 5000, 20);
      return { clean: false, why: `did not exit within ${ms / 1000} s of SIGINT`, stderr: proc.stderr() };
    }
  }
  const why = proc.crash();
  return { clean: !why, why, code: proc.exit?.code, stderr: proc.stderr() };
}

/** A client that subscribes and then never reads: its TCP window fills, the server must bound what it keeps for it. */
export async function neverReadingClient(url: string): Promise<WebSocket> {
  const ws = new WebSocket(url, ['svctrace.v1']);
  await withDeadline(new Promise((r, j) => ws.once('open', r).once('error', j)), 10_000, 'WebSocket open');
  // ws exposes no public way to stop reading; pausing its socket does.
  (ws as unknown as { _socket: { pause(): void } })._socket.pause();
  return ws;
}

export interface Wrk {
  /** Resolves with wrk's stdout when it ends (its own -d, or stop()). */
  done: Promise<string>;
  stop(): void;
}

/**
 * wrk -t2 -c64 with Connection: close in the lab's client namespace, as fast
 * as the lab allows. Spawned (not execFile) so a storm can be cut short when
 * serve dies; `ip netns exec` execs wrk, so the PID is wrk's own.
 */
export async function startStorm(lab: Lab, seconds: number): Promise<Wrk> {
  // New connections at this rate need ports in TIME_WAIT reused, with
  // timestamps the pods' TIME_WAIT sockets accept (see datapath.ts; lab
  // client namespace only).
  await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000', 'net.ipv4.tcp_timestamps=2']);
  const child = spawn('ip', ['netns', 'exec', lab.clientNetns, 'wrk', '-t2', '-c64', `-d${seconds}s`, '-H', 'Connection: close', 'http://10.96.0.100/'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  const done = new Promise<string>((resolve) => {
    // 'close', not 'exit': 'exit' can come before the pipe's last data.
    child.once('close', () => resolve(out));
    child.once('error', (e) => resolve(`wrk: ${e.message}`));
  });
  // wrk stops itself after -d; this deadline only guards against a wedged wrk.
  const guard = setTimeout(() => child.kill('SIGKILL'), (seconds + 30) * 1000);
  void done.then(() => clearTimeout(guard));
  return { done, stop: () => child.exitCode === null && child.kill('SIGINT') };
}

/** What serve's summary (stderr, after SIGINT) says: flows seen and events lost. */
export function parseServeSummary(stderr: string): { flows?: number; flowsUnseen?: number; resets?: number; lost?: number; eventsLine?: string } {
  const flows = /^summary: (\d+) flows/m.exec(stderr);
  const resets = /^summary: \d+ flows \(\d+ closed\), (\d+) reset/m.exec(stderr);
  const unseen = /^summary: .*; (\d+) more flows lost whole \((\d+) of them reset/m.exec(stderr);
  const ev = /^\s*(events: .*lost: (\d+).*)$/m.exec(stderr);
  return { flows: flows ? Number(flows[1]) : undefined, flowsUnseen: flows ? Number(unseen?.[1] ?? 0) : undefined, resets: resets ? Number(resets[1]) + Number(unseen?.[2] ?? 0) : undefined, lost: ev ? Number(ev[2]) : undefined, eventsLine: ev?.[1] };
}

/**
 * The flows serve saw against the connections of a storm. Every connection
 * wrk opened is a flow: the ones the pods served, and the ones wrk saw fail
 * (connect/read errors, timeouts), which a pod never logged. Flows seen must
 * fall within 1% of that range, or the shortfall be counted as lost: the
 * kernel counts the flows none of whose records fit the ring buffer
 * (flows_unseen). A connection attempt reset before a pod served it is a
 * flow of its own (a conntrack entry: the client's SYN that met a pod port
 * still in TIME_WAIT, answered with a challenge ACK, reset, and sent again as
 * a new entry), not a served connection: flows with a reset widen the range.
 * More is a flow model that split connections.
 */
export function flowAccount(c: { served: number; failed: number; flows: number; unseen: number; resets: number }): {
  /** Served connections serve has no flow for. */
  short: number;
  /** ... of which the kernel did not count as lost whole. */
  uncounted: number;
  /** Flows (seen or counted lost) past every connection: split connections. */
  extra: number;
  /** Seen within 1%. */
  matched: boolean;
  /** Seen, or counted as lost, within 1%. */
  counted: boolean;
} {
  const short = Math.max(0, c.served - c.flows);
  const uncounted = Math.max(0, short - c.unseen);
  const extra = Math.max(0, c.flows + c.unseen - (c.served + c.failed + c.resets));
  const margin = c.served * 0.01;
  return { short, uncounted, extra, matched: short <= margin && extra <= margin, counted: uncounted <= margin && extra <= margin };
}

/**
 * Events the hub dropped for its connected clients (from /metrics). Undefined
 * when serve does not answer within 10 s or has no client any more: a client
 * stuck too long is disconnected and leaves the list, so callers poll and
 * keep the largest count.
 */
export async function hubDropped(proc: ServeProc): Promise<number | undefined> {
  const url = proc.url.replace(/^ws/, 'http').replace('/v1/events', '/metrics');
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(10_000) });
    const samples = [...(await r.text()).matchAll(/^svctrace_client_events_dropped_total\{[^}]*\} (\d+)$/gm)];
    return samples.length ? samples.reduce((n, m) => n + Number(m[1]), 0) : undefined;
  } catch {
    return undefined;
  }
}
