/**
 * What the JavaScript pipeline costs per real connection, stage by stage.
 * Captures the addon's batches while wrk runs short connections (and then
 * keep-alive requests) through the lab, then replays the captured bytes
 * through the same code the pipeline runs (decodeBatch, ChannelMerge ->
 * FlowTable.ingest and expiry, the stream's encodeItems), several passes,
 * timed on one thread. A replay does no I/O and waits on nothing, so unlike
 * req/s ratios its times barely depend on the neighbours: it shows what a
 * change to the decoder, the model or the encoder buys, per event and per
 * connection, on the records real traffic makes (the pipeline benchmark's
 * synthetic source writes one record kind of 1000 long-lived flows).
 * The best pass is reported: noise only ever adds time.
 *
 * To profile a stage: `SVT_REPLAY_SAVE=/tmp/short.rec node dist/bench/run.js
 * --only replay` keeps the short connections' capture (a file of the batches
 * as the addon gave them), and `node --cpu-prof dist/bench/replay.js
 * /tmp/short.rec` replays it with no kernel and no lab (a profiler started
 * before the BPF programs load makes their load fail). `node
 * dist/bench/replay.js /tmp/short.rec 15 ../other-checkout` compares two
 * built trees on the capture, side by side in one process.
 */
import fs from 'node:fs';
import path from 'node:path';
import { Lab } from '../src/lab/lab';
import { runIn } from '../src/lab/exec';
import { Tracer } from '../src/tracer/tracer';
import { ChannelMerge } from '../src/tracer/channel-merge';
import { decodeBatch, type DecodedBatch } from '../src/events/decode';
import { Channel } from '../src/events/layout';
import { FlowTable } from '../src/flows/flow-table';
import type { Ingested } from '../src/flows/types';
import { NetnsNames } from '../src/flows/netns-names';
import { encodeItems } from '../src/stream/frames';
import { parseServiceSpec } from '../src/net/ipv4';
import { parseWrk } from './datapath';
import { NETNS_RUN_DIR } from '../src/netns/netns';
import { fmt, sleep, table, writeResult } from './common';

interface Captured {
  buf: Uint8Array;
  channel: number;
}

/** Captured bytes are bounded: past this the capture stops keeping batches (and says so). */
const CAPTURE_MAX_BYTES = 512 << 20;

type Conn = 'short' | 'keepalive';

interface StageTimes {
  decode: number;
  model: number;
  encode: number;
}

async function capture(lab: Lab, conn: Conn, seconds: number): Promise<{ batches: Captured[]; connections: number; requests: number; truncated: boolean; dropReasons: Record<string, string>; names: NetnsNames }> {
  const tracer = Tracer.open();
  const batches: Captured[] = [];
  let bytes = 0;
  let truncated = false;
  try {
    tracer.setServices([parseServiceSpec('10.96.0.100:80')]);
    const names = new NetnsNames();
    const a = tracer.attachNetns(lab.nodeNetns);
    names.remember(a.netnsIno, lab.nodeNetns);
    tracer.start(
      () => undefined,
      undefined,
      (buf, channel) => {
        if (bytes + buf.byteLength > CAPTURE_MAX_BYTES) {
          truncated = true;
          return;
        }
        bytes += buf.byteLength;
        batches.push({ buf: Uint8Array.prototype.slice.call(buf), channel });
      },
    );
    await sleep(200);
    const args = ['wrk', '-t1', '-c16', `-d${seconds}s`];
    if (conn === 'short') args.push('-H', 'Connection: close');
    const w = parseWrk((await runIn(lab.clientNetns, [...args, 'http://10.96.0.100/'], { timeoutMs: (seconds + 30) * 1000 })).stdout);
    // The last connections' ends come by conntrack netlink (TIME_WAIT of 2 s in the lab's node).
    await sleep(conn === 'short' ? 3000 : 300);
    return { batches, connections: conn === 'short' ? w.requests : 16, requests: w.requests, truncated, dropReasons: tracer.dropReasons(), names };
  } finally {
    tracer.close();
  }
}

/**
 * One pass over the captured batches, each stage timed on its own, batch
 * by batch as the pipeline goes: a batch is decoded, merged into the flow
 * table, its items encoded, and all of it let go before the next (holding
 * a whole capture's records would make the GC, not the code, the cost).
 */
export function replay(batches: Captured[], dropReasons: Record<string, string>, names: NetnsNames): StageTimes & { events: number; items: number } {
  const table = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], dropReasons, netnsName: (ino) => names.name(ino) });
  const out: Ingested[][] = [];
  const merge = new ChannelMerge((b) => {
    out.push(table.ingest(b.events, b.stats));
    table.takeRetired();
  });
  const times: StageTimes = { decode: 0, model: 0, encode: 0 };
  let events = 0;
  let items = 0;
  let lastTs = 0n;
  let expiredAt = 0n;
  const encodeOut = () => {
    for (const batch of out) if (batch.length) items += encodeItems(batch).count;
    out.length = 0;
  };
  for (const c of batches) {
    const t0 = process.hrtime.bigint();
    const batch = decodeBatch(c.buf);
    const t1 = process.hrtime.bigint();
    if (c.channel === Channel.NETLINK) merge.netlink(batch, 0);
    else merge.ring(batch, 0);
    const last = batch.events.length ? batch.events[batch.events.length - 1]!.tsNs : 0n;
    if (last > lastTs) lastTs = last;
    // The pipeline expires once a second, on the kernel time delivered.
    if (lastTs - expiredAt >= 1_000_000_000n) {
      table.expire(lastTs, Number(lastTs / 1_000_000n));
      expiredAt = lastTs;
    }
    const t2 = process.hrtime.bigint();
    encodeOut();
    const t3 = process.hrtime.bigint();
    times.decode += Number(t1 - t0);
    times.model += Number(t2 - t1);
    times.encode += Number(t3 - t2);
    events += batch.events.length + batch.stats.length;
  }
  const t2 = process.hrtime.bigint();
  merge.release(true, 0);
  const t3 = process.hrtime.bigint();
  encodeOut();
  times.model += Number(t3 - t2);
  times.encode += Number(process.hrtime.bigint() - t3);
  return { ...times, events, items };
}

export async function benchReplay(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 3 : 6;
  const passes = opts.quick ? 3 : 7;
  const lab = await Lab.up({ requestLog: false }); // nothing here reads lab.served
  // As in datapath.ts: ports in TIME_WAIT reused (lab client namespace only).
  await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65000', 'net.ipv4.tcp_timestamps=2']);
  const results: Record<string, unknown> = {};
  const rows: string[][] = [];
  try {
    for (const conn of ['short', 'keepalive'] as const) {
      const c = await capture(lab, conn, seconds);
      await lab.reapConntrack();
      if (conn === 'short' && process.env.SVT_REPLAY_SAVE) save(process.env.SVT_REPLAY_SAVE, c);
      const best: StageTimes = { decode: Infinity, model: Infinity, encode: Infinity };
      let events = 0;
      let items = 0;
      for (let i = 0; i < passes; i++) {
        const r = replay(c.batches, c.dropReasons, c.names);
        for (const k of ['decode', 'model', 'encode'] as const) best[k] = Math.min(best[k], r[k]);
        events = r.events;
        items = r.items;
      }
      const total = best.decode + best.model + best.encode;
      const perEvent = (ns: number) => (events ? ns / events : 0);
      const perConn = (ns: number) => (c.connections ? ns / c.connections / 1000 : 0);
      results[conn] = {
        connections: c.connections,
        requests: c.requests,
        records: events,
        items,
        truncated: c.truncated,
        nsPerRecord: { decode: perEvent(best.decode), model: perEvent(best.model), encode: perEvent(best.encode), total: perEvent(total) },
        usPerConnection: { decode: perConn(best.decode), model: perConn(best.model), encode: perConn(best.encode), total: perConn(total) },
      };
      for (const k of ['decode', 'model', 'encode'] as const) {
        rows.push([conn, k, fmt(perEvent(best[k])), conn === 'short' ? fmt(perConn(best[k]), 1) : '', conn === 'keepalive' ? fmt(perConn(best[k]), 1) : '']);
      }
      rows.push([conn, 'total', fmt(perEvent(total)), conn === 'short' ? fmt(perConn(total), 1) : '', conn === 'keepalive' ? fmt(perConn(total), 1) : '']);
      rows.push([conn, `(${fmt(events)} records, ${fmt(c.connections)} connections, ${fmt(c.requests)} requests${c.truncated ? ', capture truncated' : ''})`, '', '', '']);
      await sleep(500);
    }
  } finally {
    await lab.down();
  }
  console.log(`\nJavaScript cost per record and per connection, replayed (wrk -c16 ${seconds} s captured, best of ${passes} passes)`);
  console.log(table(['traffic', 'stage', 'ns/record', 'µs/short connection', 'µs/keep-alive connection'], rows));
  const file = writeResult('replay', { seconds, passes, ...results });
  console.log(`-> ${file}`);
  return results;
}

/** The file SVT_REPLAY_SAVE names: a JSON header line, then each batch as channel (u32), length (u32), bytes. */
function save(file: string, c: { batches: Captured[]; connections: number; dropReasons: Record<string, string> }): void {
  // The namespaces' names as they are now (the lab is still up), for a replay without the lab.
  const names: Array<[number, string]> = [];
  for (const n of fs.readdirSync(NETNS_RUN_DIR)) {
    try {
      names.push([fs.statSync(`${NETNS_RUN_DIR}/${n}`).ino, n]);
    } catch {
      // gone meanwhile
    }
  }
  const header = Buffer.from(JSON.stringify({ connections: c.connections, dropReasons: c.dropReasons, names }) + '\n');
  const parts: Uint8Array[] = [header];
  for (const b of c.batches) {
    const h = Buffer.alloc(8);
    h.writeUInt32LE(b.channel, 0);
    h.writeUInt32LE(b.buf.byteLength, 4);
    parts.push(h, b.buf);
  }
  fs.writeFileSync(file, Buffer.concat(parts));
  console.log(`capture of the short connections kept in ${file}`);
}

export function load(file: string): { batches: Captured[]; connections: number; dropReasons: Record<string, string>; names: NetnsNames } {
  const all = fs.readFileSync(file);
  const nl = all.indexOf(10);
  if (nl < 0) throw new Error(`${file}: not a replay capture (no header line)`);
  const header = JSON.parse(all.subarray(0, nl).toString('utf8')) as { connections: number; dropReasons: Record<string, string>; names: Array<[number, string]> };
  const names = new NetnsNames();
  for (const [ino, name] of header.names) names.remember(ino, name);
  const batches: Captured[] = [];
  for (let o = nl + 1; o < all.length; ) {
    if (o + 8 > all.length) throw new Error(`${file}: ends inside a batch header at byte ${o}`);
    const channel = all.readUInt32LE(o);
    const len = all.readUInt32LE(o + 4);
    if (o + 8 + len > all.length) throw new Error(`${file}: a batch of ${len} bytes runs past the end at byte ${o}`);
    batches.push({ channel, buf: all.subarray(o + 8, o + 8 + len) });
    o += 8 + len;
  }
  return { batches, connections: header.connections, dropReasons: header.dropReasons, names };
}

/**
 * Two trees side by side on one capture: this one and another checkout's
 * (built), loaded in one process, passes alternating, the best of each.
 */
function compareTrees(file: string, passes: number, otherRoot: string): void {
  const other = require(path.resolve(otherRoot, 'dist', 'bench', 'replay.js')) as { load: typeof load; replay: typeof replay };
  const trees = [
    { name: 'this tree', m: { load, replay }, best: { decode: Infinity, model: Infinity, encode: Infinity } },
    { name: otherRoot, m: other, best: { decode: Infinity, model: Infinity, encode: Infinity } },
  ];
  const captures = trees.map((t) => t.m.load(file));
  let events = 0;
  for (let i = 0; i < passes; i++) {
    trees.forEach((t, k) => {
      const c = captures[k]!;
      const r = t.m.replay(c.batches, c.dropReasons, c.names);
      events = r.events;
      for (const s of ['decode', 'model', 'encode'] as const) t.best[s] = Math.min(t.best[s], r[s]);
    });
  }
  for (const t of trees) console.log(`${t.name}: ns/record decode ${fmt(t.best.decode / events)}, model ${fmt(t.best.model / events)}, encode ${fmt(t.best.encode / events)} (best of ${passes})`);
}

if (require.main === module) {
  const [file, passesArg, otherRoot] = process.argv.slice(2);
  if (!file) {
    console.error('usage: node dist/bench/replay.js CAPTURE [PASSES] [OTHER_CHECKOUT]  (CAPTURE made with SVT_REPLAY_SAVE=CAPTURE node dist/bench/run.js --only replay; OTHER_CHECKOUT: a built tree to compare with, side by side)');
    process.exit(2);
  }
  try {
    const passes = Number(passesArg) || 5;
    if (otherRoot) {
      compareTrees(file, passes, otherRoot);
      process.exit(0);
    }
    const c = load(file);
    for (let i = 0; i < passes; i++) {
      const r = replay(c.batches, c.dropReasons, c.names);
      const per = (ns: number) => fmt(ns / r.events);
      console.log(`pass ${i + 1}: ${fmt(r.events)} records; ns/record decode ${per(r.decode)}, model ${per(r.model)}, encode ${per(r.encode)}; µs/connection ${fmt((r.decode + r.model + r.encode) / c.connections / 1000, 1)}`);
    }
  } catch (e) {
    console.error(`replay: ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  }
}
