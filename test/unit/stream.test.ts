/**
 * The streaming server with a synthetic event source: filters, backpressure,
 * authentication, origin checks, limits and hostile input.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { spawn } from 'node:child_process';
import WebSocket from 'ws';
import { EventEmitter } from 'node:events';
import { Hub } from '../../src/stream/hub';
import { ClientConn } from '../../src/stream/client-conn';
import { DEFAULT_LIMITS } from '../../src/stream/limits';
import { parseListen, StreamServer } from '../../src/stream/server';
import { compileFilter } from '../../src/stream/filter';
import { eventsFrame, encodeEvents, frameMemory, serverFrame } from '../../src/stream/frames';
import { SvctraceError } from '../../src/errors';
import { svctrace } from '../../src/gen/svctrace';
import { connect } from '../../src/client/node';
import { makeEvent, RawClient, selfSignedCert, syntheticSource } from '../helpers/stream';
import { waitFor } from '../helpers/flows';
import { ended } from '../helpers/child';

import pb = svctrace.v1;

function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    http.get(url, { headers }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    }).on('error', reject);
  });
}

describe('frames', () => {
  it('an events frame built from pre-encoded events decodes as a ServerMessage with those events', () => {
    const events = [makeEvent(1), makeEvent(2, { stage: pb.Stage.STAGE_DROP, dropReasonName: 'NO_SOCKET' })];
    const msg = pb.ServerMessage.decode(eventsFrame([encodeEvents(events).bytes]));
    assert.equal(msg.version, pb.ProtocolVersion.PROTOCOL_VERSION_1);
    assert.equal(msg.body, 'events');
    assert.equal(msg.events!.events!.length, 2);
    assert.equal(msg.events!.events![1]!.dropReasonName, 'NO_SOCKET');
    assert.equal(msg.events!.events![0]!.summary, events[0]!.summary);
  });

  it('a batch\'s own frame is the frame of its bytes, at every length of the header\'s varint', () => {
    // EventBatch lengths of 1, 2, 3 and 4 varint bytes (< 128, < 16 KiB, < 2 MiB, more).
    for (const n of [0, 1, 60, 12_000, 22_000]) {
      const events = Array.from({ length: n }, (_, i) => makeEvent(i));
      const batch = encodeEvents(events);
      assert.deepEqual(Buffer.from(batch.frame), Buffer.from(eventsFrame([batch.bytes])), `${n} events`);
      assert.equal(batch.bytes.buffer, batch.frame.buffer, 'the bytes are a view of the frame');
      assert.equal(pb.ServerMessage.decode(batch.frame).events?.events?.length ?? 0, n);
    }
  });

  it('a batch\'s frame is its own buffer: encoding the next batches leaves it intact, and the memory it keeps is near its size', () => {
    const first = encodeEvents(Array.from({ length: 500 }, (_, i) => makeEvent(i)));
    const copy = Buffer.from(first.frame);
    const later = [10, 3000, 1, 500].map((n) => encodeEvents(Array.from({ length: n }, (_, i) => makeEvent(10_000 + i, { summary: 'y'.repeat(i % 50) }))));
    assert.deepEqual(Buffer.from(first.frame), copy, 'the first frame is unchanged');
    for (const b of [first, ...later]) {
      assert.notEqual(b.frame.buffer, copy.buffer);
      assert.ok(later.every((x) => x === b || x.frame.buffer !== b.frame.buffer), 'no two frames share a buffer');
      const memory = frameMemory(b.frame);
      assert.ok(memory >= b.frame.byteLength);
      // Sized from the batches before it, with a quarter more; one event more than the estimate grows it (a batch of 1: the floor).
      if (b.count >= 500) assert.ok(memory <= b.frame.byteLength * 2, `${memory} bytes kept for a frame of ${b.frame.byteLength}`);
    }
  });

  it('a diagnosis carries its layer to clients', () => {
    const msg = pb.ServerMessage.decode(serverFrame({ diagnosis: { code: 'BACKEND_FILTERED', layer: 'pod-firewall', severity: 'error', service: 's', summary: 'x' } }));
    assert.equal(msg.diagnosis!.layer, 'pod-firewall');
  });
});

describe('stream server', () => {
  let server: StreamServer;
  let url: string;
  before(async () => {
    server = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0', limits: { stuckAfterMs: 1500, maxQueueBytes: 512 * 1024, highWaterBytes: 256 * 1024 } });
    url = server.url();
  });
  after(async () => {
    await server.close();
  });

  it('two clients with different filters each get exactly their events', async () => {
    const a = new RawClient(url);
    const b = new RawClient(url);
    await Promise.all([a.opened, b.opened]);
    a.send({ subscribe: { filter: { services: ['10.96.0.10:53/udp'] } } });
    b.send({ subscribe: { filter: { backends: ['10.244.1.10'], kinds: [pb.EventKind.EVENT_KIND_NETFILTER] } } });
    await new Promise((r) => setTimeout(r, 100));
    const events = Array.from({ length: 300 }, (_, i) => makeEvent(i));
    server.publish(events);
    const wantA = events.filter((e) => e.service === '10.96.0.10:53/udp').length;
    const wantB = events.filter((e) => e.backend === '10.244.1.10:8080').length;
    assert.ok(await waitFor(() => a.eventCount === wantA && b.eventCount === wantB, 3000), `a ${a.eventCount}/${wantA} b ${b.eventCount}/${wantB}`);
    assert.ok(a.events.every((e) => e.service === '10.96.0.10:53/udp'));
    assert.ok(b.events.every((e) => e.backend === '10.244.1.10:8080'));
    // Each run of wanted events travels as one range of the encoded batch: the same events, in order.
    assert.deepEqual(a.events.map((e) => Number(e.flowId)), events.filter((e) => e.service === '10.96.0.10:53/udp').map((e) => Number(e.flowId)));
    assert.deepEqual(b.events.map((e) => Number(e.flowId)), events.filter((e) => e.backend === '10.244.1.10:8080').map((e) => Number(e.flowId)));
    a.ws.close();
    b.ws.close();
  });

  it('a client that does not read: memory stays bounded, the fast client gets everything, the slow one is told and then dropped', async () => {
    const fast = new RawClient(url);
    const slow = new RawClient(url);
    const stuck = new RawClient(url);
    fast.keepEvents = false;
    await Promise.all([fast.opened, slow.opened, stuck.opened]);
    // "Never reads": stop reading from the TCP socket.
    (slow.ws as unknown as { _socket: { pause(): void } })._socket.pause();
    (stuck.ws as unknown as { _socket: { pause(): void } })._socket.pause();
    const rssBefore = process.memoryUsage().rss;
    const N = 200_000;
    const padding = 'x'.repeat(200);
    let peakRss = rssBefore;
    let peakQueued = 0;
    let peakBuffered = 0;
    for (let i = 0; i < N; i += 1000) {
      server.publish(Array.from({ length: 1000 }, (_, j) => makeEvent(i + j, { summary: padding })));
      await new Promise((r) => setImmediate(r));
      for (const c of server.hub.clientList()) {
        peakQueued = Math.max(peakQueued, c.queuedBytes);
        peakBuffered = Math.max(peakBuffered, c.bufferedAmount);
      }
      if (i % 20_000 === 0) peakRss = Math.max(peakRss, process.memoryUsage().rss);
    }
    assert.ok(await waitFor(() => fast.eventCount === N, 20_000), `fast client got ${fast.eventCount}/${N}`);
    peakRss = Math.max(peakRss, process.memoryUsage().rss);
    // ~50 MB of frames went out. What the server holds per client is bounded
    // by its limits (the exact guarantee); the whole process stays bounded
    // too (a loose check: this process also generates and decodes them all).
    const limits = server.hub.limits;
    // (the queue keeps its newest frame even when that one alone is over the limit)
    assert.ok(peakQueued <= limits.maxQueueBytes + 1024 * 1024, `a client's queue reached ${peakQueued} bytes`);
    assert.ok(peakBuffered <= limits.highWaterBytes + 1024 * 1024, `a socket buffered ${peakBuffered} bytes`);
    const growthMB = (peakRss - rssBefore) / 1e6;
    assert.ok(growthMB < 300, `RSS grew by ${growthMB.toFixed(0)} MB`);
    // The slow client catches up and learns what it missed.
    (slow.ws as unknown as { _socket: { resume(): void } })._socket.resume();
    // (It reads its whole backlog first: seconds, on a busy machine.)
    assert.ok(await waitFor(() => slow.statuses.some((s) => Number(s.dropped) > 0), 20_000), 'slow client saw dropped > 0');
    const clients = server.hub.clientList();
    assert.ok(clients.some((c) => c.dropped > 0));
    // The stuck client is disconnected, with a reason.
    assert.ok(await waitFor(() => server.hub.clientCount <= 2, 10_000), 'stuck client was disconnected');
    fast.ws.close();
    slow.ws.close();
    stuck.ws.terminate();
  });

  it('a client closed as too slow gets a last Status first: what it read and what that Status says it missed add up to what it was offered', async () => {
    // (A long grace: a loaded machine's client reads its backlog before the socket is cut.)
    const tight = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0', limits: { stuckAfterMs: 300, maxQueueBytes: 128 * 1024, highWaterBytes: 64 * 1024, closeGraceMs: 15_000 } });
    const c = new RawClient(tight.url());
    c.keepEvents = false;
    try {
      await c.opened;
      (c.ws as unknown as { _socket: { pause(): void } })._socket.pause();
      assert.ok(await waitFor(() => tight.hub.clientList().length > 0, 3000));
      const conn = tight.hub.clientList()[0]!;
      const padding = 'x'.repeat(200);
      let offered = 0;
      for (let i = 0; i < 400 && !conn.closed; i++) {
        offered += 500;
        tight.publish(Array.from({ length: 500 }, (_, j) => makeEvent(i * 500 + j, { summary: padding })));
        await new Promise((r) => setTimeout(r, 5));
      }
      assert.ok(await waitFor(() => conn.closed, 10_000), 'closed as too slow');
      (c.ws as unknown as { _socket: { resume(): void } })._socket.resume();
      assert.ok(await waitFor(() => c.closed !== null, 10_000), 'the client saw the close');
      assert.equal(c.closed!.code, 4008, `closed with ${JSON.stringify(c.closed)}`);
      const last = c.statuses.at(-1)!;
      assert.ok(Number(last.dropped) > 0);
      assert.equal(c.eventCount + Number(last.dropped), offered, `read ${c.eventCount} + missed ${last.dropped} (last Status) != offered ${offered}`);
    } finally {
      c.ws.terminate();
      await tight.close();
    }
  });

  it('every event a client took is sent or counted as missed, also when it leaves with a full queue; client_queues keeps what departed clients missed', async () => {
    const base = url.replace('ws://', 'http://').replace('/v1/events', '');
    const lostInMetrics = async () => Number(/^svctrace_events_lost_total\{stage="client_queues"\} (\d+)$/m.exec((await get(`${base}/metrics`)).body)?.[1] ?? NaN);
    const before = server.hub.clientsDropped();
    const c = new RawClient(url);
    await c.opened;
    (c.ws as unknown as { _socket: { pause(): void } })._socket.pause();
    assert.ok(await waitFor(() => server.hub.clientList().length > 0, 3000));
    const conn = server.hub.clientList().reduce((a, b) => (b.id > a.id ? b : a));
    const padding = 'x'.repeat(200);
    let offered = 0;
    // (Counted as offered only while it is connected: a slow machine may disconnect it as too slow first.)
    for (let i = 0; i < 40; i++) {
      if (!conn.closed) offered += 1000;
      server.publish(Array.from({ length: 1000 }, (_, j) => makeEvent(i * 1000 + j, { summary: padding })));
      await new Promise((r) => setImmediate(r));
    }
    if (!conn.closed) offered += 7;
    server.publish(Array.from({ length: 7 }, (_, j) => makeEvent(40_000 + j))); // a small batch: still pending, not yet a frame
    assert.ok(conn.closed || conn.queuedBytes > 0, 'the client has frames queued when it leaves (or was already disconnected with them, too slow)');
    c.ws.terminate();
    assert.ok(await waitFor(() => conn.closed, 5000), 'the server saw the client leave');
    assert.equal(conn.sent + conn.dropped, offered, `sent ${conn.sent} + dropped ${conn.dropped} != offered ${offered}`);
    assert.ok(conn.dropped > 0);
    // The departed client's misses stay counted, in the hub and in /metrics.
    assert.ok(server.hub.clientsDropped() - before >= conn.dropped, `client_queues went from ${before} to ${server.hub.clientsDropped()}, the client that left missed ${conn.dropped}`);
    assert.ok((await lostInMetrics()) >= conn.dropped);
  });

  it('garbage from one client gets errors; the server keeps serving others', async () => {
    const good = new RawClient(url);
    const bad = new RawClient(url);
    await Promise.all([good.opened, bad.opened]);
    bad.ws.send(crypto.randomBytes(200));
    bad.ws.send('{"subscribe": "text frame"}');
    bad.ws.send(pb.ClientMessage.encode({ subscribe: { filter: { services: Array.from({ length: 1000 }, (_, i) => `s${i}`) } } }).finish());
    bad.ws.send(Buffer.from([0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]));
    assert.ok(await waitFor(() => bad.errors.length >= 3, 3000), `errors: ${bad.errors.map((e) => e.code)}`);
    assert.ok(bad.errors.some((e) => e.code === 'BAD_FILTER' && /at most/.test(e.message!)));
    assert.ok(bad.errors.some((e) => e.code === 'BAD_MESSAGE'));
    assert.equal(bad.closed, null, 'a bad message does not close the connection');
    // A frame over the size limit closes only that connection, and its sender is told why.
    const huge = new RawClient(url);
    await huge.opened;
    huge.ws.send(Buffer.alloc(200 * 1024));
    assert.ok(await waitFor(() => huge.closed !== null, 3000));
    assert.equal(huge.closed!.code, 1009);
    assert.ok(huge.errors.some((e) => e.code === 'TOO_BIG' && /at most 65536 bytes/.test(e.message!)), `errors: ${JSON.stringify(huge.errors)}`);
    // Far beyond it, ws cuts the connection itself (1009 still).
    const giant = new RawClient(url);
    await giant.opened;
    giant.ws.send(Buffer.alloc(2 * 1024 * 1024));
    assert.ok(await waitFor(() => giant.closed !== null, 3000));
    assert.equal(giant.closed!.code, 1009);
    server.publish([makeEvent(7)]);
    assert.ok(await waitFor(() => good.eventCount === 1, 3000), 'the good client still gets events');
    good.ws.close();
    bad.ws.close();
  });

  it('ping/pong, pause/resume and the typed client', async () => {
    const seen: pb.Event[] = [];
    const c = await connect({ url, filter: { dropsOnly: true } }, { events: (e) => seen.push(...e) });
    assert.equal(c.hello?.services?.length, 2);
    await c.sync();
    server.publish([makeEvent(1), makeEvent(2, { stage: pb.Stage.STAGE_DROP })]);
    assert.ok(await waitFor(() => seen.length === 1, 3000));
    c.pause();
    await c.sync();
    server.publish([makeEvent(3, { stage: pb.Stage.STAGE_DROP })]);
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(seen.length, 1, 'paused');
    c.resume();
    await c.sync();
    server.publish([makeEvent(4, { stage: pb.Stage.STAGE_DROP })]);
    assert.ok(await waitFor(() => seen.length === 2, 3000));
    c.close();
  });

  it('/healthz and /metrics', async () => {
    const base = url.replace('ws://', 'http://').replace('/v1/events', '');
    assert.deepEqual(await get(`${base}/healthz`), { status: 200, body: 'ok\n' });
    const m = await get(`${base}/metrics`);
    assert.equal(m.status, 200);
    assert.match(m.body, /^svctrace_events_total \d+$/m);
    assert.match(m.body, /# TYPE svctrace_client_events_dropped_total counter/);
    assert.equal((await get(`${base}/v1/events`)).status, 426);
    assert.equal((await get(`${base}/nope`)).status, 404);
  });

  it('a client turned away (the server is full) that sends a bad frame before the close is dropped; the server lives on', async () => {
    const full = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0', limits: { maxClients: 1 } });
    const uncaught: unknown[] = [];
    const onUncaught = (e: unknown) => uncaught.push(e);
    process.on('uncaughtException', onUncaught);
    try {
      const first = new RawClient(full.url());
      await first.opened;
      const port = Number(new URL(full.url()).port);
      const sock = net.connect(port, '127.0.0.1');
      let got = '';
      sock.on('data', (d) => (got += d.toString('latin1')));
      sock.on('error', () => undefined);
      const closed = new Promise((r) => sock.on('close', r));
      await new Promise((r) => sock.once('connect', r));
      sock.write(
        `GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
          `Sec-WebSocket-Key: ${crypto.randomBytes(16).toString('base64')}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: svctrace.v1\r\n\r\n`,
      );
      assert.ok(await waitFor(() => got.includes('101 Switching Protocols'), 3000), `upgrade answered: ${JSON.stringify(got.slice(0, 80))}`);
      // An unmasked frame: a client must mask, the server's parser fails on it.
      sock.write(Buffer.from([0x82, 0x01, 0x00]));
      await Promise.race([closed, new Promise((r) => setTimeout(r, 3000))]);
      await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(uncaught.map(String), [], 'no uncaught error in the server');
      assert.equal(full.hub.clientCount, 1);
      assert.equal((await get(`http://127.0.0.1:${port}/healthz`)).status, 200);
      first.ws.close();
      sock.destroy();
    } finally {
      process.off('uncaughtException', onUncaught);
      await full.close();
    }
  });

  it('watch --duration: the server closing ends it at once, with its reason and exit 7 (STREAM), not at the duration', async () => {
    const srv = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0' });
    const cli = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');
    const w = spawn(process.execPath, [cli, 'watch', srv.url(), '--duration', '60'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    w.stderr!.on('data', (d) => (err += d));
    w.stdout!.resume();
    const exited = ended(w); // 'close': its stderr read to the end, before it is matched
    try {
      assert.ok(await waitFor(() => err.includes('connected to'), 10_000), `watch connected: ${err}`);
      const closedAt = Date.now();
      await srv.close();
      const code = await Promise.race([exited, new Promise<'running'>((r) => setTimeout(() => r('running'), 10_000))]);
      assert.equal(code, 7, `watch ended with STREAM after the server closed: ${err}`);
      assert.ok(Date.now() - closedAt < 10_000);
      assert.match(err, /server closed the stream/);
    } finally {
      if (w.exitCode === null) w.kill('SIGKILL');
    }
  });

  it('DNS rebinding: a request whose Host is a foreign name is refused, addresses and localhost are not', async () => {
    const port = new URL(url).port;
    const base = `http://127.0.0.1:${port}`;
    assert.equal((await get(`${base}/metrics`, { Host: `evil.example:${port}` })).status, 403);
    assert.equal((await get(`${base}/healthz`, { Host: `evil.example:${port}` })).status, 403);
    await assert.rejects(new RawClient(url, { headers: { Host: `evil.example:${port}`, Origin: `http://evil.example:${port}` } }).opened, /HTTP 403/);
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`, `10.0.0.5:${port}`]) assert.equal((await get(`${base}/metrics`, { Host: host })).status, 200, host);
    const named = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0', allowHosts: ['svctrace.internal'] });
    try {
      const p = new URL(named.url()).port;
      assert.equal((await get(`http://127.0.0.1:${p}/metrics`, { Host: `svctrace.internal:${p}` })).status, 200);
      assert.equal((await get(`http://127.0.0.1:${p}/metrics`, { Host: `other.internal:${p}` })).status, 403);
    } finally {
      await named.close();
    }
  });

  it('malformed HTTP gets a status line: 431 for a huge URL or header, 400 for TE+CL', async () => {
    const port = Number(new URL(url).port);
    const raw = (req: string) =>
      new Promise<string>((resolve) => {
        let got = '';
        const s = net.connect(port, '127.0.0.1', () => s.write(req));
        s.on('data', (d) => (got += d));
        s.on('close', () => resolve(got));
        s.on('error', () => resolve(got));
        setTimeout(() => s.destroy(), 3000).unref();
      });
    assert.match(await raw(`GET /${'a'.repeat(100 * 1024)} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`), /^HTTP\/1\.1 431 /);
    assert.match(await raw(`GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'b'.repeat(20 * 1024)}\r\n\r\n`), /^HTTP\/1\.1 431 /);
    assert.match(await raw('POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n'), /^HTTP\/1\.1 400 /);
    assert.equal((await get(`${url.replace('ws://', 'http://').replace('/v1/events', '')}/healthz`)).status, 200, 'still serving');
  });

  it('refuses a browser from another origin', async () => {
    const evil = new RawClient(url, { headers: { Origin: 'http://evil.example' } });
    await assert.rejects(evil.opened, /HTTP 403/);
    const same = new RawClient(url, { headers: { Origin: url.replace('ws://', 'http://').replace('/v1/events', '') } });
    await same.opened;
    same.ws.close();
  });
});

describe('stream server with a token', () => {
  const token = crypto.randomBytes(16).toString('hex');
  let server: StreamServer;
  before(async () => {
    const page = (req: http.IncomingMessage, res: http.ServerResponse) => {
      if (req.url !== '/') return false;
      res.writeHead(200, { 'content-type': 'text/html' }).end('<form>token</form>');
      return true;
    };
    server = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0', token, staticHandler: page });
  });

  it('the dashboard page loads without the token (its form asks for it); the stream and /metrics do not', async () => {
    const base = server.url().replace('ws://', 'http://').replace('/v1/events', '');
    const page = await get(`${base}/`);
    assert.equal(page.status, 200);
    assert.match(page.body, /token/);
    assert.equal((await get(`${base}/metrics`)).status, 401);
    assert.equal((await get(`${base}/nothing-here`)).status, 401);
  });
  after(async () => {
    await server.close();
  });

  it('no token or a wrong token: 401 before the upgrade', async () => {
    await assert.rejects(new RawClient(server.url()).opened, /HTTP 401/);
    await assert.rejects(new RawClient(server.url(), { headers: { Authorization: 'Bearer wrong-token-000000' } }).opened, /HTTP 401/);
    const base = server.url().replace('ws://', 'http://').replace('/v1/events', '');
    assert.equal((await get(`${base}/metrics`)).status, 401);
    assert.equal((await get(`${base}/healthz`)).status, 200);
  });

  it('the right token as a header or as a subprotocol', async () => {
    const h = new RawClient(server.url(), { headers: { Authorization: `Bearer ${token}` } });
    await h.opened;
    h.ws.close();
    const c = await connect({ url: server.url(), token });
    assert.ok(c.hello);
    c.close();
  });

  it('listening beyond loopback without a token is refused before binding', async () => {
    await assert.rejects(StreamServer.start(syntheticSource(), { listen: '0.0.0.0:0' }), (e: unknown) => e instanceof SvctraceError && /needs --token/.test(e.message));
    await assert.rejects(StreamServer.start(syntheticSource(), { listen: 'nonsense' }), /HOST:PORT/);
  });
});

describe('stream server over TLS', () => {
  it('serves wss:// with --tls-cert/--tls-key and the client connects', async () => {
    const { dir, cert, key } = selfSignedCert('localhost');
    const server = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0', tls: { cert, key } });
    try {
      assert.match(server.url(), /^wss:\/\//);
      const ws = new WebSocket(server.url(), ['svctrace.v1'], { ca: cert });
      const hello = await new Promise<pb.ServerMessage>((resolve, reject) => {
        ws.once('message', (d) => resolve(pb.ServerMessage.decode(d as Buffer)));
        ws.once('error', reject);
      });
      assert.equal(hello.body, 'hello');
      ws.close();
    } finally {
      await server.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('hub: a client reading too slowly for control frames', () => {
  it('misses flow updates, counted in its Status; diagnoses still reach it', async () => {
    const flows: pb.IFlow[] = [{ id: 1 }, { id: 2 }];
    const hub = new Hub({ ...syntheticSource(), takeChangedFlows: (wanted) => (wanted ? flows : []), packetsDropped: () => 7 }, { flowsEveryMs: 10, statusEveryMs: 60_000 });
    const got: pb.ServerMessage[] = [];
    const ws = Object.assign(new EventEmitter(), {
      readyState: WebSocket.OPEN,
      bufferedAmount: 0,
      send: (b: Uint8Array) => void got.push(pb.ServerMessage.decode(b)),
      close: () => undefined,
      terminate: () => undefined,
    });
    try {
      const c = hub.add(ws as unknown as WebSocket, 'test');
      assert.ok(c);
      ws.emit('message', Buffer.from(pb.ClientMessage.encode({ subscribe: { flows: true } }).finish()), true);
      assert.ok(await waitFor(() => got.some((m) => m.flows), 2000), 'flow updates reach a client that reads');
      ws.bufferedAmount = hub.limits.highWaterBytes; // its send buffer at the mark: it reads too slowly
      const before = got.length;
      assert.ok(await waitFor(() => c.flowUpdatesDropped >= 4, 2000), `flow updates skipped and counted (${c.flowUpdatesDropped})`);
      assert.equal(got.slice(before).filter((m) => m.flows).length, 0, 'none sent above the mark');
      hub.broadcastDiagnoses([{ code: 'NO_ENDPOINTS', service: '10.96.0.100:80/tcp', summary: 'x' }]);
      assert.ok(got.slice(before).some((m) => m.diagnosis?.code === 'NO_ENDPOINTS'), 'a diagnosis goes out above the mark');
      ws.bufferedAmount = 0;
      hub.sendStatus();
      const status = got.filter((m) => m.status).at(-1)?.status;
      assert.ok(status && Number(status.flowUpdatesDropped) >= 4, `Status tells the client what it missed: ${JSON.stringify(status)}`);
      assert.equal(Number(status.packetsDropped), 7, "and the kernel's count of dropped packets");
    } finally {
      hub.close();
    }
  });
});

describe('a client cut off with frames still in its send buffer', () => {
  it('the events of frames the socket never wrote are missed, not sent', () => {
    /** A socket whose send buffer holds what it was handed until `write` lets it out, framed as ws frames it. */
    const wire = (n: number) => n + (n < 126 ? 2 : n < 65536 ? 4 : 10);
    const frames: number[] = [];
    const ws = Object.assign(new EventEmitter(), {
      readyState: WebSocket.OPEN as number,
      bufferedAmount: 0,
      send(b: Uint8Array) {
        frames.push(wire(b.byteLength));
        this.bufferedAmount += wire(b.byteLength);
      },
      close(_code: number, reason: string) {
        this.bufferedAmount += wire(2 + Buffer.byteLength(reason));
        this.readyState = WebSocket.CLOSING;
      },
      terminate: () => undefined,
    });
    const c = new ClientConn(1, ws as unknown as WebSocket, 'test', { ...DEFAULT_LIMITS }, { onClose: () => undefined, localNode: 'n1' });
    for (let b = 0; b < 3; b++) {
      c.offer(encodeEvents(Array.from({ length: 100 }, (_, i) => makeEvent(b * 100 + i))));
      c.flush();
    }
    assert.equal(frames.length, 3);
    assert.equal(c.sent, 300, 'handed to the socket');
    ws.bufferedAmount -= frames[0]! + frames[1]!; // the socket wrote the first two frames, not the third
    c.closeWith(4000, 'TOO_SLOW', 'client read too slowly');
    assert.deepEqual([c.sent, c.dropped], [200, 100], 'the third frame never reached the client');
  });
});

describe('compileFilter', () => {
  const junk = (f: pb.IFilter, re: RegExp) =>
    assert.throws(() => compileFilter(f, 64, 'node-a'), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT' && re.test(e.message));

  it('refuses junk rather than compiling a filter that matches nothing (or everything)', () => {
    junk({ kinds: [9999 as pb.EventKind] }, /not an event kind/);
    junk({ kinds: [-1 as pb.EventKind] }, /not an event kind/);
    junk({ kinds: [0] }, /not an event kind/);
    junk({ backends: ['not-an-ip:zz'] }, /not IP or IP:port/);
    junk({ backends: ['10.244.1.10:0'] }, /not IP or IP:port/);
    junk({ backends: ['10.244.1.10:70000'] }, /not IP or IP:port/);
    junk({ namespaces: [''] }, /empty entry/);
    junk({ services: ['  '] }, /empty entry/);
    junk({ nodes: [''] }, /empty entry/);
  });

  it('takes what the filters name', () => {
    const f = compileFilter({ kinds: [pb.EventKind.EVENT_KIND_DROP], backends: ['10.244.1.10', '10.244.1.11:8080'] }, 64, 'node-a');
    assert.equal(f({ kind: pb.EventKind.EVENT_KIND_DROP, backend: '10.244.1.10:8080' }), true);
    assert.equal(f({ kind: pb.EventKind.EVENT_KIND_DROP, backend: '10.244.1.11:8080' }), true);
    assert.equal(f({ kind: pb.EventKind.EVENT_KIND_DROP, backend: '10.244.1.12:8080' }), false);
    assert.equal(f({ kind: pb.EventKind.EVENT_KIND_NETFILTER, backend: '10.244.1.10:8080' }), false);
  });
});

describe('parseListen', () => {
  it('takes HOST:PORT with an IPv4 address, a host name or a bracketed IPv6 address; refuses junk', () => {
    assert.deepEqual(parseListen('127.0.0.1:7643'), { host: '127.0.0.1', port: 7643 });
    assert.deepEqual(parseListen('localhost:0'), { host: 'localhost', port: 0 });
    assert.deepEqual(parseListen('[::1]:80'), { host: '::1', port: 80 });
    for (const bad of ['[]:80', '[zz]:1', '*:80', ':80', '127.0.0.1', '127.0.0.1:99999', 'a b:80', '-host:80'])
      assert.throws(() => parseListen(bad), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT', bad);
  });
});
