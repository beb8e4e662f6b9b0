/**
 * The README's first command (`npm run demo`: set-up, then `svctrace demo`)
 * as a user sees it: every request of the built-in lab has its timeline,
 * from the match to the reply, with the rule path in its place; the
 * NodePort's masquerade and the Service without endpoints (diagnosed) show; nothing is
 * lost; and the lab is gone afterwards. (The set-up half runs first in
 * `npm test` itself.)
 */
import { describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { kernelTest, netnsList } from '../helpers/kernel';
import { ended } from '../helpers/child';

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');

/** The timeline lines of each flow by its header: `[flow N] ...`, then its `  [N] +T ms label ...` lines as `label T`. */
function timelines(out: string): Map<string, string[]> {
  const byId = new Map<string, { header: string; lines: string[] }>();
  for (const line of out.split('\n')) {
    const header = /^\[flow (\d+)\] (.*)$/.exec(line);
    if (header) byId.set(header[1]!, { header: header[2]!, lines: [] });
    const entry = /^ {2}\[(\d+)\] \+ *([-\d.]+)ms (\S+)/.exec(line);
    if (entry) byId.get(entry[1]!)?.lines.push(`${entry[3]} ${entry[2]}`);
  }
  return new Map([...byId.values()].map((f) => [f.header, f.lines]));
}

describe('svctrace demo (kernel)', () => {
  kernelTest('every request\'s path from the ClusterIP to the pod and back, the rule path in its place, nothing lost, the lab torn down', async () => {
    const REQUESTS = 3;
    const child = spawn(process.execPath, [CLI, 'demo', '--requests', String(REQUESTS)], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout!.on('data', (d) => (out += d));
    child.stderr!.on('data', (d) => (err += d));
    const killer = setTimeout(() => child.kill('SIGINT'), 150_000);
    const code = await ended(child);
    clearTimeout(killer);
    assert.equal(code, 0, `demo failed: ${err}\n${out}`);

    const flows = timelines(out);
    const labelsOf = (f: string[]) => f.map((l) => l.split(' ')[0]);
    const clusterIp = [...flows].filter(([h]) => h.includes('-> 10.96.0.100:80 '));
    assert.equal(clusterIp.length, REQUESTS, `one flow per curl to the ClusterIP:\n${out}`);
    for (const [h, f] of clusterIp) {
      for (const l of ['match', 'rules', 'dnat', 'route', 'device', 'reply']) assert.ok(labelsOf(f).includes(l), `${h}: no ${l} line in ${f.join(', ')}`);
      assert.equal(labelsOf(f)[0], 'match', `${h} begins with its match`);
    }
    // Each connection's end line, with its counters from the kernel (a TCP
    // connection ends at TIME_WAIT: conntrack's destroy comes much later).
    for (const [h] of clusterIp) {
      const id = new RegExp(`^\\[flow (\\d+)\\] ${h.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`, 'm').exec(out)?.[1];
      assert.match(out, new RegExp(`^  \\[${id}\\] flow ${id} done after [\\d.]+ms: backend 10\\.244\\.1\\.1\\d:8080 \\(svt-[^)]+-pod\\d\\), [1-9]\\d* pkts/\\d+ B out, [1-9]\\d* pkts/\\d+ B back$`, 'm'), `${h}: no end line`);
    }
    // Every observed rule path is told at its flow's first packet, and
    // printed right after the match (its message is read a few ms later:
    // the text output holds a new flow for it). One flow may have waited
    // longer than the hold on a loaded machine.
    const withRules = [...flows.values()].filter((f) => labelsOf(f).includes('rules'));
    assert.ok(withRules.length >= REQUESTS, `rule paths: ${withRules.length}\n${out}`);
    for (const f of withRules) assert.ok(f.some((l) => l === 'rules 0.000'), `a rule path not at the first packet: ${f.join(', ')}`);
    const misplaced = withRules.filter((f) => labelsOf(f)[1] !== 'rules');
    assert.ok(misplaced.length <= 1, `rule paths printed below later lines:\n${misplaced.map((f) => f.join(', ')).join('\n')}`);

    // The NodePort from the client: masqueraded, and the reply goes back to the client.
    assert.match(out, /MASQUERADE\/SNAT @ POST_ROUTING 101: backend sees 10\.244\.1\.1:\d+ \(not the client 10\.250\.0\.2:\d+\)/);
    // The Service without endpoints: diagnosed from the rules, and its
    // connection's REJECT told as such; no other Service is diagnosed.
    const diagnoses = out.split('\n').filter((l) => l.startsWith('[diagnosis]'));
    assert.deepEqual(diagnoses.map((l) => /\] ([A-Z_]+) .*? ([\d.]+:\d+\/\w+)/.exec(l)?.slice(1).join(' ')), ['NO_ENDPOINTS 10.96.0.200:80/tcp'], diagnoses.join('\n'));
    assert.match(out, /-> 10\.96\.0\.200:80[^\n]*\n(?: {2}\[\d+\][^\n]*\n)*? {2}\[\d+\] +\+ *[\d.]+ms ICMP +ICMP destination unreachable/);
    assert.match(out, /rejected by table filter chain KUBE-SERVICES/);

    assert.match(out, /lost: 0\n/, 'no event lost');
    const nodeNs = /node (svt-\d+-[0-9a-f]+)-node;/.exec(out)?.[1];
    assert.ok(nodeNs, 'the lab names its namespaces');
    assert.match(out, /lab torn down \(0 namespaces left\)/);
    assert.deepEqual(netnsList().filter((n) => n.startsWith(`${nodeNs}-`)), []);
  }, { timeout: 180_000 });

  kernelTest('Ctrl-C in the middle: it stops at its next step and tears the lab down (the default action left it all behind)', async () => {
    const child = spawn(process.execPath, [CLI, 'demo', '--requests', '1000'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout!.on('data', (d) => (out += d));
    child.stderr!.on('data', (d) => (err += d));
    const killer = setTimeout(() => child.kill('SIGKILL'), 120_000);
    const deadline = Date.now() + 60_000;
    while (!/^\$ curl /m.test(out) && child.exitCode === null && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    assert.match(out, /^\$ curl /m, `the demo never sent a request: ${err}\n${out}`);
    child.kill('SIGINT');
    const code = await ended(child);
    clearTimeout(killer);
    assert.equal(code, 0, `${err}\n${out}`);
    assert.match(out, /^interrupted: stopping after this step, then tearing the lab down$/m);
    assert.ok((out.match(/^\$ curl /gm) ?? []).length < 1000, 'stopped, not run to its end');
    assert.match(out, /lab torn down \(0 namespaces left\)/);
    const nodeNs = /node (svt-\d+-[0-9a-f]+)-node;/.exec(out)?.[1];
    assert.ok(nodeNs);
    assert.deepEqual(netnsList().filter((n) => n.startsWith(`${nodeNs}-`)), []);
  }, { timeout: 150_000 });
});
