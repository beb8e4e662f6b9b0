/**
 * svctrace next to svctrace: on a node the DaemonSet agent is always running
 * when someone types `svctrace trace`. Two `trace` and one `serve` on the same
 * lab node namespace each see every connection; each sits at its own
 * netfilter priorities around NAT (the kernel allows one BPF program per hook
 * and priority), and nothing is left attached when they end.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { ChildProcess, spawn } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { kernelTest, IS_ROOT, netfilterLinks } from '../helpers/kernel';
import { TIME_SCALE, waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { curlEach } from '../helpers/lab-traffic';

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');

interface Proc {
  child: ChildProcess;
  out: string;
  err: string;
  exit?: number | null;
}

function start(args: string[]): Proc {
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const p: Proc = { child, out: '', err: '' };
  child.stdout!.on('data', (d) => (p.out += d));
  child.stderr!.on('data', (d) => (p.err += d));
  child.once('exit', (code) => (p.exit = code));
  return p;
}

function get(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http.get(url, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve(body));
    }).on('error', reject);
  });
}

describe('several svctrace processes on one namespace (kernel)', () => {
  let lab: Lab | undefined;
  const procs: Proc[] = [];
  before(async () => {
    if (IS_ROOT) lab = await Lab.up();
  });
  after(async () => {
    for (const p of procs) if (p.exit === undefined) p.child.kill('SIGKILL');
    await lab?.down();
  });

  kernelTest('two trace and one serve each see every connection, at priorities of their own', async () => {
    assert.ok(lab);
    const web = lab.service('web');
    const linksBefore = netfilterLinks().length;
    const sel = ['--netns', lab.nodeNetns, '--service', `${web.clusterIP}:80`];
    const serve = start(['serve', ...sel, '--listen', '127.0.0.1:0']);
    procs.push(serve);
    assert.ok(await waitFor(() => /streaming at ws:/.test(serve.err) || serve.exit !== undefined, 15_000), `serve: ${serve.err}`);
    const traces = [start(['trace', ...sel, '-o', 'json']), start(['trace', ...sel, '-o', 'json'])];
    procs.push(...traces);
    for (const t of traces) assert.ok(await waitFor(() => /tracing /.test(t.err) || t.exit !== undefined, 15_000), `trace did not start: ${t.err}`);
    for (const p of procs) assert.equal(p.exit, undefined, `exited early: ${p.err}`);

    // Each holds its own eight links; netfilter links at distinct
    // priorities per hook (fentry programs stack on NAT's functions).
    const links = netfilterLinks();
    assert.equal(links.length - linksBefore, 24, `eight links per process: ${JSON.stringify(links)}; processes ${procs.map((p) => p.child.pid).join(', ')}`);
    const perHook = new Map<number, number[]>();
    for (const l of links) if (l.hook !== undefined) perHook.set(l.hook, [...(perHook.get(l.hook) ?? []), l.prio!]);
    for (const [hook, prios] of perHook) assert.equal(new Set(prios).size, prios.length, `hook ${hook}: two programs at one priority`);

    const N = 30;
    await curlEach(lab, `http://${web.clusterIP}/`, N);

    // serve: every connection, by backend, in /metrics.
    const base = /streaming at ws:\/\/(\S+?)\/v1\/events /.exec(serve.err)![1]!;
    const counted = async () =>
      (await get(`http://${base}/metrics`))
        .split('\n')
        .filter((l) => l.startsWith('svctrace_connections_total{'))
        .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
    let seen = 0;
    for (const deadline = Date.now() + 10_000 * TIME_SCALE; seen < N && Date.now() < deadline; ) {
      seen = await counted();
      if (seen < N) await new Promise((r) => setTimeout(r, 200));
    }
    assert.equal(seen, N, 'serve saw every connection');

    // Each trace: every connection DNATed, in its own JSON lines (complete
    // lines only: a trace may be mid-write).
    const dnated = (t: Proc) => {
      const flows = new Set<string>();
      for (const line of t.out.slice(0, t.out.lastIndexOf('\n') + 1).split('\n')) {
        if (!line) continue;
        const ev = JSON.parse(line) as { flowId?: string; stage?: string; afterNat?: boolean };
        if (ev.stage === 'STAGE_DNAT' && ev.afterNat) flows.add(ev.flowId!);
      }
      return flows.size;
    };
    await waitFor(() => traces.every((t) => dnated(t) >= N), 5_000);
    for (const [i, t] of traces.entries()) assert.equal(dnated(t), N, `trace ${i + 1} saw every connection DNATed`);

    for (const p of procs) p.child.kill('SIGINT');
    assert.ok(await waitFor(() => procs.every((p) => p.exit !== undefined), 15_000), 'all ended on SIGINT');
    for (const p of procs) assert.equal(p.exit, 0, p.err);
    assert.equal(netfilterLinks().length, linksBefore, 'no link left attached');
  });
});
