/**
 * The relay against three real stream servers fed synthetic events (the
 * relay's logic needs no kernel; test/kernel/relay.test.ts runs it on real
 * node servers tracing the lab): events named by node, the nodes' states,
 * a node going down and coming back, and filters asked of the node servers.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import type WebSocket from 'ws';
import { StreamServer } from '../../src/stream/server';
import { Relay } from '../../src/relay/relay';
import { AgentLink } from '../../src/relay/agent-link';
import { WebSocketServer } from 'ws';
import { SILENT_CLOSE } from '../../src/client/client';
import net from 'node:net';
import { upstreamRequest } from '../../src/relay/upstream';
import { agentUrl, parseAgentsService } from '../../src/cli/commands/relay';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { serviceObjects, startFakeApi } from '../helpers/fake-apiserver';
import { connect, SvctraceClient } from '../../src/client/node';
import { SvctraceError } from '../../src/errors';
import { svctrace } from '../../src/gen/svctrace';
import { makeEvent, selfSignedCert, syntheticSource } from '../helpers/stream';
import { waitFor } from '../helpers/flows';

import pb = svctrace.v1;

describe('relay: what it asks of the node servers', () => {
  it('the filter all its clients share; everything when they differ; paused with no client', () => {
    const web = { services: ['10.96.0.100:80/tcp'] };
    assert.deepEqual(upstreamRequest([]), { paused: true, filter: null, flows: false });
    assert.deepEqual(upstreamRequest([{ filter: web, flows: false }, { filter: { services: ['10.96.0.100:80/tcp'], backends: [] }, flows: true }]), { paused: false, filter: web, flows: true });
    assert.deepEqual(upstreamRequest([{ filter: web, flows: false }, { filter: { services: ['10.96.0.10:53/udp'] }, flows: false }]).filter, null);
    assert.deepEqual(upstreamRequest([{ filter: web, flows: false }, { filter: null, flows: false }]).filter, null, 'a client that wants everything');
    assert.deepEqual(upstreamRequest([{ filter: {}, flows: false }]).filter, null, 'an empty filter is everything');
  });

  it('--agent takes ws(s)://HOST:PORT, the stream path added; anything else is a clear error', () => {
    assert.equal(agentUrl('ws://10.0.0.5:7643'), 'ws://10.0.0.5:7643/v1/events');
    assert.equal(agentUrl('wss://node-a:7643/v1/events'), 'wss://node-a:7643/v1/events');
    for (const bad of ['10.0.0.5:7643', 'http://10.0.0.5:7643', 'ws://10.0.0.5:7643/metrics', 'ws://']) {
      assert.throws(() => agentUrl(bad), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT', bad);
    }
  });
});

describe('relay: node servers found through the Kubernetes API', () => {
  it('--agents-service: the ready endpoints of the agents\' headless Service are the node servers', async () => {
    assert.deepEqual(parseAgentsService('svctrace/agents:stream'), { namespace: 'svctrace', name: 'agents', portName: 'stream' });
    assert.throws(() => parseAgentsService('agents'), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT');
    const node = await StreamServer.start({ ...syntheticSource(), node: 'node-x' }, { listen: '127.0.0.1:0' });
    const port = node.address().port;
    const objs = serviceObjects({
      namespace: 'svctrace', name: 'agents', clusterIP: 'None', port, portName: 'stream', targetPort: port,
      endpoints: [{ ip: '127.0.0.1', pod: 'svctrace-agent-x' }, { ip: '127.0.0.2', pod: 'svctrace-agent-gone', ready: false }],
    });
    const api = await startFakeApi({ services: [objs.service], endpointSlices: [objs.slice] });
    const cli = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');
    const relay = spawn(process.execPath, [cli, 'relay', '--agents-service', 'svctrace/agents:stream', '--kubeconfig', api.kubeconfig, '--listen', '127.0.0.1:0', '--duration', '20'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    relay.stderr!.on('data', (d) => (err += d));
    try {
      assert.ok(await waitFor(() => /node node-x \(ws:\/\/127\.0\.0\.1:\d+\/v1\/events\): connected/.test(err), 10_000), err);
      assert.doesNotMatch(err, /127\.0\.0\.2/, 'a not-ready endpoint is no node server');
    } finally {
      relay.kill('SIGTERM');
      await new Promise((r) => relay.once('exit', r));
      await api.close();
      await node.close();
    }
  });
});

describe('relay: a node server over wss://', () => {
  it('--agent-ca: the node server\'s own certificate is checked against it; without it the link stays down', async () => {
    const { dir, cert, key } = selfSignedCert('node-t');
    const node = await StreamServer.start({ ...syntheticSource(), node: 'node-t' }, { listen: '127.0.0.1:0', tls: { cert, key } });
    const trusting = await Relay.start({ agents: [{ url: node.url() }], agentCa: cert, serve: { listen: '127.0.0.1:0' } });
    const untrusting = await Relay.start({ agents: [{ url: node.url(), minBackoffMs: 50 }], serve: { listen: '127.0.0.1:0' } });
    try {
      assert.match(node.url(), /^wss:/);
      assert.ok(await waitFor(() => trusting.nodes()[0]!.state === 'connected', 5000), JSON.stringify(trusting.nodes()));
      assert.equal(trusting.nodes()[0]!.node, 'node-t');
      assert.ok(await waitFor(() => untrusting.nodes()[0]!.state === 'down' && untrusting.nodes()[0]!.reconnects! >= 1, 5000), JSON.stringify(untrusting.nodes()));
      assert.match(untrusting.nodes()[0]!.error!, /cannot connect/);
    } finally {
      await trusting.stop();
      await untrusting.stop();
      await node.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('relay over three node servers', () => {
  const AGENT_TOKEN = 'agent-token-0123456789';
  const RELAY_TOKEN = 'relay-token-0123456789';
  const NODES = ['node-a', 'node-b', 'node-c'];
  const servers: StreamServer[] = [];
  let relay: Relay;
  let client: SvctraceClient;
  const got: pb.Event[] = [];
  let status: pb.Status | undefined;
  let seq = 1;

  const startNode = (node: string, listen = '127.0.0.1:0') => StreamServer.start({ ...syntheticSource(), node }, { listen, token: AGENT_TOKEN });
  const publishAll = (n: number) => servers.forEach((s) => s.publish(Array.from({ length: n }, () => makeEvent(seq++))));
  const stateOf = (node: string) => relay.nodes().find((x) => x.node === node)?.state;

  before(async () => {
    for (const n of NODES) servers.push(await startNode(n));
    relay = await Relay.start({
      agents: servers.map((s) => ({ url: s.url(), minBackoffMs: 50, maxBackoffMs: 200 })),
      agentToken: AGENT_TOKEN,
      serve: { listen: '127.0.0.1:0', token: RELAY_TOKEN, limits: { statusEveryMs: 100 } },
    });
    assert.ok(await waitFor(() => NODES.every((n) => stateOf(n) === 'connected'), 5000), JSON.stringify(relay.nodes()));
    client = await connect({ url: relay.url(), token: RELAY_TOKEN }, { events: (es) => got.push(...es), status: (s) => (status = s) });
  });

  after(async () => {
    client?.close();
    await relay?.stop();
    for (const s of servers) await s.close();
  });

  it('Hello lists the nodes; every event names the node that saw it', async () => {
    assert.deepEqual(client.hello!.nodes!.map((n) => [n.node, n.state]), NODES.map((n) => [n, 'connected']));
    // Paused while the relay had no client; its first client resumes them (a round trip).
    assert.ok(await waitFor(() => servers.every((s) => s.hub.clientList()[0]?.paused === false), 5000));
    publishAll(5);
    assert.ok(await waitFor(() => got.length >= 15, 5000), `${got.length} events`);
    for (const n of NODES) assert.equal(got.filter((e) => e.node === n).length, 5, n);
    // /metrics says which node servers are up.
    const metrics = await new Promise<string>((resolve, reject) => {
      http.get(relay.url().replace(/^ws/, 'http').replace('/v1/events', '/metrics'), { headers: { authorization: `Bearer ${RELAY_TOKEN}` } }, (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => resolve(body));
      }).on('error', reject);
    });
    for (const n of NODES) assert.match(metrics, new RegExp(`svctrace_relay_node_up\\{node="${n}",url="ws://127\\.0\\.0\\.1:\\d+/v1/events"\\} 1`));
  });

  it('a filter shared by the relay\'s clients is applied by the node servers: the others send nothing', async () => {
    client.subscribe({ nodes: ['node-b'] });
    await client.sync();
    // The relay forwards the filter; each node server applies it (node-a and node-c match none of their own events).
    const sentBefore = servers.map((s) => s.hub.clientList()[0]!.sent);
    await new Promise((r) => setTimeout(r, 100));
    got.length = 0;
    publishAll(4);
    assert.ok(await waitFor(() => got.length >= 4, 5000));
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual([...new Set(got.map((e) => e.node))], ['node-b']);
    const sent = servers.map((s, i) => s.hub.clientList()[0]!.sent - sentBefore[i]!);
    assert.deepEqual(sent, [0, 4, 0], 'events each node server sent the relay');
    client.subscribe({});
    await client.sync();
  });

  it('a node server that goes away is down in Status, the others keep streaming; back, it is connected again', async () => {
    const c = servers[2]!;
    const port = c.address().port;
    await c.close();
    assert.ok(await waitFor(() => status?.nodes?.find((n) => n.node === 'node-c')?.state === 'down', 5000), JSON.stringify(status?.nodes));
    got.length = 0;
    servers.slice(0, 2).forEach((s) => s.publish([makeEvent(seq++)]));
    assert.ok(await waitFor(() => got.length >= 2, 5000));
    assert.deepEqual(got.map((e) => e.node).sort(), ['node-a', 'node-b']);

    servers[2] = await startNode('node-c', `127.0.0.1:${port}`);
    assert.ok(await waitFor(() => stateOf('node-c') === 'connected', 5000), JSON.stringify(relay.nodes()));
    assert.ok(relay.nodes().find((n) => n.node === 'node-c')!.reconnects! >= 1);
    got.length = 0;
    servers[2].publish([makeEvent(seq++)]);
    assert.ok(await waitFor(() => got.some((e) => e.node === 'node-c'), 5000));
  });

  it('with no client left, the node servers are paused', async () => {
    client.close();
    assert.ok(await waitFor(() => servers.every((s) => s.hub.clientList()[0]?.paused === true), 5000));
  });
});

describe('relay: a node server\'s losses stay counted across reconnects and restarts', () => {
  it('a frame from a node server that does not decode is counted lost (relay_upstream), and the link goes on', async () => {
    const server = await StreamServer.start({ ...syntheticSource(), node: 'node-x' }, { listen: '127.0.0.1:0' });
    const relay = await Relay.start({ agents: [{ url: server.url(), minBackoffMs: 50, maxBackoffMs: 200 }], serve: { listen: '127.0.0.1:0' } });
    try {
      assert.ok(await waitFor(() => relay.nodes()[0]?.state === 'connected' && server.hub.clientCount === 1, 5000), JSON.stringify(relay.nodes()));
      const link = server.hub.clientList()[0]! as unknown as { ws: WebSocket };
      link.ws.send(Buffer.from([0xff, 0xff, 0xff]), { binary: true }); // no ServerMessage
      assert.ok(await waitFor(() => (relay.lostByStage().relay_upstream ?? 0) === 1, 5000), JSON.stringify(relay.lostByStage()));
      assert.equal(relay.nodes()[0]?.state, 'connected');
    } finally {
      await relay.stop();
      await server.close();
    }
  });

  it('per stage and in total: kept while it is down, not counted twice when the same run comes back, added to when a new run starts from zero', async () => {
    const lossesOf = (ringBuffer: number) => ({ ...syntheticSource(), node: 'node-l', kernelLost: () => ringBuffer, lostByStage: () => ({ ring_buffer: ringBuffer, flow_table: 0 }) });
    let server = await StreamServer.start(lossesOf(5), { listen: '127.0.0.1:0', limits: { statusEveryMs: 50 } });
    const port = server.address().port;
    const relay = await Relay.start({ agents: [{ url: server.url(), minBackoffMs: 50, maxBackoffMs: 200 }], serve: { listen: '127.0.0.1:0' } });
    const state = () => relay.nodes()[0]?.state;
    try {
      assert.ok(await waitFor(() => relay.lostByStage().ring_buffer === 5, 5000), JSON.stringify(relay.lostByStage()));
      assert.equal(relay.kernelLost(), 5);
      // The same run, its connection cut (the relay is its client): back, its counts are not added twice.
      server.hub.clientList()[0]!.closeWith(4000, 'TEST', 'cut by the test');
      assert.ok(await waitFor(() => (relay.nodes()[0]?.reconnects ?? 0) >= 1 && state() === 'connected', 5000), JSON.stringify(relay.nodes()));
      await new Promise((r) => setTimeout(r, 200)); // a few Status messages of the same run
      assert.equal(relay.lostByStage().ring_buffer, 5);
      assert.equal(relay.kernelLost(), 5);
      // The node server goes away: what it lost is still counted while it is down.
      await server.close();
      assert.ok(await waitFor(() => state() === 'down', 5000));
      assert.equal(relay.lostByStage().ring_buffer, 5);
      assert.equal(relay.kernelLost(), 5);
      // A new run (restarted: counts from zero) adds its own.
      server = await StreamServer.start(lossesOf(2), { listen: `127.0.0.1:${port}`, limits: { statusEveryMs: 50 } });
      assert.ok(await waitFor(() => state() === 'connected' && relay.lostByStage().ring_buffer === 7, 5000), JSON.stringify(relay.lostByStage()));
      assert.equal(relay.kernelLost(), 7);
      // A node server no longer listed: its losses stay in the totals.
      relay.setAgents([]);
      assert.equal(relay.lostByStage().ring_buffer, 7);
      assert.equal(relay.kernelLost(), 7);
      // Listed again (the node back in the EndpointSlice), the same run: its counts carry on, not added twice.
      relay.setAgents([{ url: server.url(), minBackoffMs: 50, maxBackoffMs: 200 }]);
      assert.ok(await waitFor(() => state() === 'connected', 5000));
      await new Promise((r) => setTimeout(r, 200)); // a few Status messages of the same run
      assert.equal(relay.lostByStage().ring_buffer, 7);
      assert.equal(relay.kernelLost(), 7);
      relay.setAgents([]);
      assert.equal(relay.kernelLost(), 7);
    } finally {
      await relay.stop();
      await server.close();
    }
  });
});

describe('relay: a node server that goes silent', () => {
  /** A TCP proxy to a node server whose current connections can be cut dead: no FIN, no RST, nothing forwarded (a node powered off). */
  async function silencingProxy(target: number): Promise<{ port: number; silence(): void; close(): Promise<void> }> {
    const live = new Set<net.Socket>();
    const server = net.createServer((inbound) => {
      const outbound = net.connect(target, '127.0.0.1');
      for (const s of [inbound, outbound]) {
        live.add(s);
        s.on('error', () => undefined);
        s.on('close', () => live.delete(s));
      }
      inbound.pipe(outbound);
      outbound.pipe(inbound);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return {
      port: (server.address() as net.AddressInfo).port,
      silence: () => {
        for (const s of live) {
          s.unpipe();
          s.pause();
        }
      },
      close: async () => {
        for (const s of live) s.destroy();
        await new Promise<void>((r) => server.close(() => r()));
      },
    };
  }

  it('no message for the silence limit: down with the reason, then reconnected', async () => {
    const node = await StreamServer.start({ ...syntheticSource(), node: 'node-q' }, { listen: '127.0.0.1:0' });
    const proxy = await silencingProxy(node.address().port);
    const states: string[] = [];
    const link = new AgentLink(
      { url: `ws://127.0.0.1:${proxy.port}/v1/events`, silenceLimitMs: 1500, minBackoffMs: 50 },
      { events: () => undefined, flows: () => undefined, diagnosis: () => undefined, changed: (l) => states.push(l.stateName()) },
    );
    try {
      link.start();
      assert.ok(await waitFor(() => link.stateName() === 'connected', 5000), 'connected through the proxy');
      proxy.silence();
      assert.ok(await waitFor(() => states.includes('down'), 6000), `down after the silence (states: ${states.join(', ')})`);
      assert.match(link.nodeState().error ?? '', /no message from the server for 1\.5 s/);
      assert.ok(await waitFor(() => link.stateName() === 'connected' && link.reconnects >= 1, 5000), 'a new connection after the dead one');
    } finally {
      link.stop();
      await proxy.close();
      await node.close();
    }
  });

  it('no Hello within the connect timeout: down with the reason, and retried', async () => {
    const mute = net.createServer((s) => s.on('error', () => undefined)); // takes the connection, never answers
    await new Promise<void>((r) => mute.listen(0, '127.0.0.1', r));
    const port = (mute.address() as net.AddressInfo).port;
    const link = new AgentLink(
      { url: `ws://127.0.0.1:${port}/v1/events`, connectTimeoutMs: 300, minBackoffMs: 50 },
      { events: () => undefined, flows: () => undefined, diagnosis: () => undefined, changed: (l) => states.push(l.stateName()) },
    );
    const states: string[] = [];
    try {
      link.start();
      assert.ok(await waitFor(() => link.reconnects >= 2, 5000), 'retried after each timeout');
      assert.ok(states.length >= 1 && states.every((x) => x === 'down'), `down, never connected: ${states.join(', ')}`);
      assert.match(link.nodeState().error ?? '', /no answer from ws:\/\/127\.0\.0\.1:\d+\/v1\/events within 0\.3 s/);
    } finally {
      link.stop();
      mute.close();
    }
  });

  /** A TCP server that takes connections and never answers (no HTTP upgrade), counting what it accepted and saw closed. */
  async function muteTcp(): Promise<{ url: string; accepted: () => number; closedBySide: () => number; close(): Promise<void> }> {
    const sockets: net.Socket[] = [];
    let closed = 0;
    const server = net.createServer((s) => {
      sockets.push(s);
      s.resume(); // reads, so the client's end is seen
      s.on('error', () => undefined);
      s.on('close', () => closed++);
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return {
      url: `ws://127.0.0.1:${(server.address() as net.AddressInfo).port}/v1/events`,
      accepted: () => sockets.length,
      closedBySide: () => closed,
      close: async () => {
        for (const s of sockets) s.destroy();
        await new Promise<void>((r) => server.close(() => r()));
      },
    };
  }

  it('stop() during a connect under way lets the socket go at once, reporting nothing', async () => {
    const mute = await muteTcp();
    const states: string[] = [];
    const link = new AgentLink(
      { url: mute.url, connectTimeoutMs: 60_000 },
      { events: () => undefined, flows: () => undefined, diagnosis: () => undefined, changed: (l) => states.push(l.stateName()) },
    );
    try {
      link.start();
      assert.ok(await waitFor(() => mute.accepted() === 1, 5000), 'the connect reached the server');
      link.stop();
      // Without the cancel, the socket stayed until the connect timeout (60 s here).
      assert.ok(await waitFor(() => mute.closedBySide() === 1, 2000), 'the socket was let go within 2 s of stop()');
      await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual(states, [], 'a stop is not a node going down');
      assert.equal(link.reconnects, 0, 'and is not retried');
    } finally {
      link.stop();
      await mute.close();
    }
  });

  it('a plain connect aborted by its signal fails as ABORTED and lets the socket go', async () => {
    const mute = await muteTcp();
    try {
      const ac = new AbortController();
      // A timeout, so that a cancel that does nothing fails the test instead of hanging it.
      const pending = connect({ url: mute.url, signal: ac.signal, connectTimeoutMs: 5000 });
      assert.ok(await waitFor(() => mute.accepted() === 1, 5000), 'the connect reached the server');
      ac.abort();
      await assert.rejects(pending, (e: Error & { code?: string }) => e.code === 'ABORTED' && /cancelled/.test(e.message));
      assert.ok(await waitFor(() => mute.closedBySide() === 1, 2000), 'the socket was let go');
      const aborted = new AbortController();
      aborted.abort();
      await assert.rejects(connect({ url: mute.url, signal: aborted.signal, connectTimeoutMs: 5000 }), (e: Error & { code?: string }) => e.code === 'ABORTED');
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(mute.accepted(), 1, 'a signal aborted already opens no connection');
    } finally {
      await mute.close();
    }
  });

  /** A WebSocket server that says Hello and then nothing: no Status, no pong. */
  async function helloThenNothing(): Promise<{ url: string; closedBySide: () => number; close(): Promise<void> }> {
    const wss = new WebSocketServer({ host: '127.0.0.1', port: 0 });
    await new Promise<void>((r) => wss.once('listening', () => r()));
    let closed = 0;
    wss.on('connection', (ws) => {
      ws.send(pb.ServerMessage.encode({ hello: { serverVersion: 'test', node: 'mute' } }).finish());
      ws.on('close', () => closed++);
    });
    return {
      url: `ws://127.0.0.1:${(wss.address() as net.AddressInfo).port}/v1/events`,
      closedBySide: () => closed,
      close: () => new Promise<void>((r) => wss.close(() => r())),
    };
  }

  it('a plain client: silence is told once, as SILENT_CLOSE with its reason, and the socket let go of', async () => {
    const mute = await helloThenNothing();
    const closes: Array<[number, string]> = [];
    try {
      const client = await connect({ url: mute.url, silenceLimitMs: 300 }, { close: (code, reason) => closes.push([code, reason]) });
      assert.ok(client.hello);
      assert.ok(await waitFor(() => closes.length > 0, 5000), 'silence noticed');
      assert.ok(await waitFor(() => mute.closedBySide() === 1, 5000), 'the server saw the socket go');
      await new Promise((r) => setTimeout(r, 300));
      assert.deepEqual(closes, [[SILENT_CLOSE, 'no message from the server for 0.3 s: connection presumed dead']]);
    } finally {
      await mute.close();
    }
  });

  it('a filter the server never confirms: connect fails, the socket is let go of, and no close is told after the failure', async () => {
    const mute = await helloThenNothing();
    const closes: number[] = [];
    try {
      await assert.rejects(
        connect({ url: mute.url, filter: { services: ['10.96.0.100:80/tcp'] } }, { close: (code) => closes.push(code) }),
        (e: Error & { code?: string }) => e.code === 'TIMEOUT',
      );
      assert.ok(await waitFor(() => mute.closedBySide() === 1, 5000), 'the server saw the socket go');
      await new Promise((r) => setTimeout(r, 200));
      assert.deepEqual(closes, [], 'the rejection alone tells the end');
    } finally {
      await mute.close();
    }
  });

  it('a client holding its reading is not taken as silent; released, the Status keeps it alive', async () => {
    const node = await StreamServer.start({ ...syntheticSource(), node: 'node-h' }, { listen: '127.0.0.1:0', limits: { statusEveryMs: 100 } });
    const url = `ws://127.0.0.1:${node.address().port}/v1/events`;
    const closes: string[] = [];
    const client = await connect({ url, silenceLimitMs: 1000 }, { close: (code, reason) => closes.push(`${code}: ${reason}`) });
    try {
      assert.ok(client.holdReading());
      await new Promise((r) => setTimeout(r, 2500));
      assert.deepEqual(closes, [], 'held: no silence counted');
      client.releaseReading();
      await new Promise((r) => setTimeout(r, 1500));
      assert.deepEqual(closes, [], 'released: the Status every 100 ms keeps it alive');
    } finally {
      client.close();
      await node.close();
    }
  });
});
