/**
 * `svctrace relay` over real node servers: three `svctrace serve` agents
 * (NODE_NAME node-a and node-c on one lab's node namespace, node-b on a
 * second lab's), each with a token, and the relay CLI in front of them with
 * its own. One client of the relay sees every connection of both labs,
 * labelled with the nodes that traced it; killing node-c's agent marks it
 * down while the others stream on, and restarting it brings it back.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { kernelTest, IS_ROOT } from '../helpers/kernel';
import { waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { connect, SvctraceClient } from '../../src/client/node';
import { svctrace } from '../../src/gen/svctrace';

import pb = svctrace.v1;

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');
const AGENT_TOKEN = 'agent-token-lab-0123456789';
const RELAY_TOKEN = 'relay-token-lab-0123456789';

interface Proc {
  child: ChildProcess;
  err: string;
  exit?: number | null;
}

function start(args: string[], env: Record<string, string> = {}): Proc {
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env } });
  const p: Proc = { child, err: '' };
  child.stderr!.on('data', (d) => (p.err += d));
  child.once('exit', (code) => (p.exit = code));
  return p;
}

describe('svctrace relay over three node servers (kernel)', () => {
  let labA: Lab | undefined;
  let labB: Lab | undefined;
  let dir = '';
  const procs: Proc[] = [];
  let client: SvctraceClient | undefined;

  before(async () => {
    if (!IS_ROOT) return;
    labA = await Lab.up();
    labB = await Lab.up();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-relay-'));
    fs.writeFileSync(path.join(dir, 'agent-token'), `${AGENT_TOKEN}\n`);
  });
  after(async () => {
    client?.close();
    for (const p of procs) if (p.exit === undefined) p.child.kill('SIGKILL');
    await labA?.down();
    await labB?.down();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  /** A node server on a lab's node namespace, tracing its web Service; resolves with its stream URL. */
  async function agent(lab: Lab, node: string, listen = '127.0.0.1:0'): Promise<{ proc: Proc; url: string }> {
    const web = lab.service('web');
    const proc = start(['serve', '--netns', lab.nodeNetns, '--service', `${web.clusterIP}:80`, '--listen', listen, '--token-file', path.join(dir, 'agent-token')], { NODE_NAME: node });
    procs.push(proc);
    assert.ok(await waitFor(() => /streaming at ws:/.test(proc.err) || proc.exit !== undefined, 20_000), `serve ${node}: ${proc.err}`);
    const url = /streaming at (ws:\/\/\S+\/v1\/events)/.exec(proc.err)?.[1];
    assert.ok(url, `serve ${node} did not say where it streams: ${proc.err}`);
    return { proc, url };
  }

  kernelTest('one client of the relay sees every connection of every node, labelled; a node down and back', async () => {
    assert.ok(labA && labB);
    const a = await agent(labA, 'node-a');
    const b = await agent(labB, 'node-b');
    let c = await agent(labA, 'node-c');
    const cPort = new URL(c.url).port;
    const relay = start([
      'relay', '--agent', a.url, '--agent', b.url, '--agent', c.url,
      '--agent-token-file', path.join(dir, 'agent-token'), '--listen', '127.0.0.1:0', '--token', RELAY_TOKEN,
    ]);
    procs.push(relay);
    assert.ok(await waitFor(() => /relaying 3 node server\(s\) at ws:/.test(relay.err) || relay.exit !== undefined, 15_000), `relay: ${relay.err}`);
    const relayUrl = /at (ws:\/\/\S+\/v1\/events)/.exec(relay.err)![1]!;

    const events: pb.Event[] = [];
    let status: pb.Status | undefined;
    client = await connect({ url: relayUrl, token: RELAY_TOKEN }, { events: (es) => events.push(...es), status: (s) => (status = s) });
    const nodeState = (n: string) => status?.nodes?.find((x) => x.node === n)?.state;
    assert.ok(await waitFor(() => ['node-a', 'node-b', 'node-c'].every((n) => nodeState(n) === 'connected'), 15_000), `nodes: ${JSON.stringify(status?.nodes)}; relay: ${relay.err}`);
    // The relay's first client resumes the node servers (paused while nobody listened): give that a moment.
    await new Promise((r) => setTimeout(r, 500));

    // Connections in each lab, identified by the client port the pod saw.
    const curl = async (lab: Lab, n: number) => {
      const ports: number[] = [];
      for (let i = 0; i < n; i++) {
        const r = await lab.curl(`http://${lab.service('web').clusterIP}/`);
        assert.ok(r.ok, r.stderr);
        ports.push(Number(/client=[\d.]+:(\d+)/.exec(r.body)![1]));
      }
      return ports;
    };
    // A connection a node traced: its DNAT event (after NAT, the pod as destination) from that node.
    const traced = (node: string, port: number) =>
      events.some((e) => e.node === node && e.stage === pb.Stage.STAGE_DNAT && e.afterNat && e.conntrack?.original?.srcPort === port);

    const portsA = await curl(labA, 5);
    const portsB = await curl(labB, 5);
    assert.ok(
      await waitFor(() => portsA.every((p) => traced('node-a', p) && traced('node-c', p)) && portsB.every((p) => traced('node-b', p)), 15_000),
      `every connection from its nodes: ${JSON.stringify([...new Set(events.map((e) => e.node))])}, ${events.length} events`,
    );
    // Each lab's connections only from the agents tracing it (the labs' addresses are alike: told apart by client port, where not shared by chance).
    assert.ok(!portsB.filter((p) => !portsA.includes(p)).some((p) => traced('node-a', p) || traced('node-c', p)), "lab B's connections reported by lab A's agents");
    assert.ok(!portsA.filter((p) => !portsB.includes(p)).some((p) => traced('node-b', p)), "lab A's connections reported by lab B's agent");

    // node-c's agent goes away: down; node-a and node-b stream on.
    c.proc.child.kill('SIGTERM');
    assert.ok(await waitFor(() => nodeState('node-c') === 'down', 15_000), `nodes: ${JSON.stringify(status?.nodes)}`);
    const afterA = await curl(labA, 3);
    const afterB = await curl(labB, 3);
    assert.ok(await waitFor(() => afterA.every((p) => traced('node-a', p)) && afterB.every((p) => traced('node-b', p)), 15_000), 'the others kept streaming');
    assert.ok(!afterA.some((p) => traced('node-c', p)));

    // Back on its port: the relay reconnects (backoff), node-c streams again.
    c = await agent(labA, 'node-c', `127.0.0.1:${cPort}`);
    assert.ok(await waitFor(() => nodeState('node-c') === 'connected', 20_000), `nodes: ${JSON.stringify(status?.nodes)}; relay: ${relay.err}`);
    assert.ok(Number(status!.nodes!.find((n) => n.node === 'node-c')!.reconnects) >= 1);
    await new Promise((r) => setTimeout(r, 500));
    const back = await curl(labA, 3);
    assert.ok(await waitFor(() => back.every((p) => traced('node-c', p) && traced('node-a', p)), 15_000), 'node-c is back');
    assert.match(relay.err, /node node-c \(ws:\/\/127\.0\.0\.1:\d+\/v1\/events\): down/);

    client.close();
    client = undefined;
    for (const p of procs) if (p.exit === undefined) p.child.kill('SIGTERM');
    assert.ok(await waitFor(() => procs.every((p) => p.exit !== undefined), 20_000), 'every process ended');
    for (const p of procs) assert.ok(p.exit === 0 || p.exit === null, `${p.err}`);
  });
});
