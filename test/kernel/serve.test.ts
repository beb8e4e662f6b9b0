/**
 * `svctrace serve` in the lab: a WebSocket client that knows only the .proto
 * file (protobufjs reflection) sees the DNAT, conntrack and veth events of a
 * curl to the ClusterIP within 200 ms of the request.
 */
import { IPS_ASSURED } from '../../src/events/conntrack';
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, ChildProcess } from 'node:child_process';
import path from 'node:path';
import protobuf from 'protobufjs';
import WebSocket from 'ws';
import { kernelTest, IS_ROOT } from '../helpers/kernel';
import { waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { ended } from '../helpers/child';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const CLI = path.join(ROOT, 'bin', 'svctrace.js');
const PROTO = path.join(ROOT, 'src', 'proto', 'svctrace', 'v1', 'svctrace.proto');

interface Received {
  at: number;
  ev: { kind?: string; stage?: string; packet?: { dst?: string }; conntrack?: { status?: number }; device?: { netns?: string; name?: string } };
}

describe('svctrace serve (kernel)', () => {
  let lab: Lab;
  let child: ChildProcess | undefined;
  before(async () => {
    if (IS_ROOT) lab = await Lab.up();
  });
  after(async () => {
    child?.kill('SIGTERM');
    await lab?.down();
  });

  kernelTest('a .proto-only client sees DNAT, conntrack and veth events within 200 ms', async () => {
    const web = lab.service('web');
    child = spawn(process.execPath, [CLI, 'serve', '--netns', lab.nodeNetns, '--service', `${web.clusterIP}:80`, '--listen', '127.0.0.1:0'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr!.on('data', (d) => (err += d));
    assert.ok(await waitFor(() => /streaming at (ws:\S+) /.test(err), 10_000), `serve did not start: ${err}`);
    const url = /streaming at (ws:\S+) /.exec(err)![1]!;

    const root = await protobuf.load(PROTO);
    const ServerMessage = root.lookupType('svctrace.v1.ServerMessage');
    const received: Received[] = [];
    let hello: Record<string, unknown> | undefined;
    const ws = new WebSocket(url, ['svctrace.v1']);
    ws.on('message', (data) => {
      const msg = ServerMessage.toObject(ServerMessage.decode(data as Buffer), { enums: String, longs: String, oneofs: true }) as {
        body: string;
        hello?: Record<string, unknown>;
        events?: { events: Received['ev'][] };
      };
      if (msg.body === 'hello') hello = msg.hello;
      if (msg.body === 'events') for (const ev of msg.events!.events) received.push({ at: Date.now(), ev });
    });
    await new Promise((r, j) => ws.once('open', r).once('error', j));
    assert.ok(await waitFor(() => hello !== undefined, 3000));
    assert.deepEqual(hello!.services, ['10.96.0.100:80/tcp']);

    const t0 = Date.now();
    const r = await lab.curl(`http://${web.clusterIP}/`);
    const tCurl = Date.now();
    assert.ok(r.ok, r.stderr);
    const pod = lab.pods.find((p) => p.name === lab.served.at(-1)!.pod)!;
    const want = () => ({
      dnat: received.find((x) => x.ev.stage === 'STAGE_DNAT' && x.ev.packet?.dst === pod.ip),
      conntrack: received.find((x) => ((x.ev.conntrack?.status ?? 0) & IPS_ASSURED) !== 0),
      veth: received.find((x) => x.ev.kind === 'EVENT_KIND_DEV_RECV' && x.ev.device?.netns === pod.netns && x.ev.device?.name === 'eth0'),
    });
    await waitFor(() => Object.values(want()).every(Boolean), 1000, 5);
    const got = want();
    for (const [what, x] of Object.entries(got)) {
      assert.ok(x, `no ${what} event`);
      assert.ok(x.at - tCurl <= 200, `${what} event arrived ${x.at - tCurl} ms after the request (curl took ${tCurl - t0} ms)`);
    }
    ws.close();
    child.kill('SIGINT');
    const code = await ended(child);
    child = undefined;
    assert.equal(code, 0, err);
    assert.match(err, /summary: 1 flows/);
  });

  kernelTest('classic failures seen live reach clients as Diagnosis messages', async () => {
    const closed = lab.service('closed');
    const serve = spawn(process.execPath, [CLI, 'serve', '--netns', lab.nodeNetns, '--service', 'default/closed', '--listen', '127.0.0.1:0'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    serve.stderr!.on('data', (d) => (err += d));
    try {
      assert.ok(await waitFor(() => /streaming at (ws:\S+) /.test(err), 10_000), err);
      const url = /streaming at (ws:\S+) /.exec(err)![1]!;
      const ServerMessage = (await protobuf.load(PROTO)).lookupType('svctrace.v1.ServerMessage');
      const diagnoses: Array<{ code?: string; service?: string; summary?: string }> = [];
      const ws = new WebSocket(url, ['svctrace.v1']);
      ws.on('message', (data) => {
        const m = ServerMessage.toObject(ServerMessage.decode(data as Buffer), { oneofs: true }) as { body: string; diagnosis?: { code?: string } };
        if (m.body === 'diagnosis') diagnoses.push(m.diagnosis!);
      });
      await new Promise((r, j) => ws.once('open', r).once('error', j));
      for (let i = 0; i < 2; i++) assert.equal((await lab.curl(`http://${closed.clusterIP}/`)).ok, false);
      assert.ok(await waitFor(() => diagnoses.some((d) => d.code === 'BACKEND_NOT_LISTENING'), 15_000), JSON.stringify(diagnoses));
      const d = diagnoses.find((x) => x.code === 'BACKEND_NOT_LISTENING')!;
      assert.equal(d.service, `${closed.clusterIP}:80/tcp`);
      assert.match(d.summary!, /TCP RST/);
      assert.ok(!diagnoses.some((x) => x.code === 'REPLY_PATH_BROKEN'), 'a reset is not a broken reply path');
      ws.close();
    } finally {
      serve.kill('SIGINT');
      await new Promise((r) => serve.once('exit', r));
    }
  });
});
