/**
 * Pipeline throughput: how many events/s the chain kernel ring buffer ->
 * addon -> JS decode -> flow model -> protobuf encode -> one WebSocket client
 * sustains without loss, stage by stage, next to a plain C consumer of the
 * same ring buffer fed by the same in-kernel source (bench/ringbuf-baseline.c).
 * Method for all: emit bursts that fit the ring, keep at most two bursts in
 * flight, count what arrives at the end of the chain.
 */
import { execFileSync, fork } from 'node:child_process';
import path from 'node:path';
import { loadBinding, NativeTracer } from '../src/native/binding';
import { decodeBatch } from '../src/events/decode';
import { FlowTable } from '../src/flows/flow-table';
import { parseServiceSpec } from '../src/net/ipv4';
import { StreamServer } from '../src/stream/server';
import { fmt, sleep, table, writeResult } from './common';

const BURST = 16384;
const FLOWS = 1000;
const BASELINE = path.resolve(__dirname, '..', '..', 'build', 'svctrace-ringbuf-baseline');

type Stage = 'native' | 'decode' | 'flows' | 'websocket';

interface StageResult {
  stage: Stage;
  events: number;
  seconds: number;
  eventsPerSecond: number;
  lost: number;
}

async function runStage(stage: Stage, total: number): Promise<StageResult> {
  const binding = loadBinding();
  const tracer: NativeTracer = new binding.Tracer({ benchSource: true });
  tracer.load();
  const table = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')] });
  let server: StreamServer | undefined;
  let clientCount = 0;
  let child: ReturnType<typeof fork> | undefined;
  if (stage === 'websocket') {
    server = await StreamServer.start({ services: ['10.96.0.100:80/tcp'], kernelLost: () => 0, activeFlows: () => table.size, dropsByReason: () => ({}) }, { listen: '127.0.0.1:0' });
    child = fork(path.join(__dirname, 'ws-counter.js'), [server.url()], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    child.on('message', (m: { received?: number; ready?: boolean }) => {
      if (typeof m.received === 'number') clientCount = m.received;
    });
    await new Promise<void>((r) => child!.once('message', () => r()));
  }
  let arrived = 0;
  tracer.start((buf, count) => {
    if (stage === 'native') {
      arrived += count;
      return;
    }
    const events = decodeBatch(buf).events;
    if (stage === 'decode') {
      arrived += events.length;
      return;
    }
    const items = table.ingest(events);
    if (stage === 'flows') {
      arrived += items.length;
      return;
    }
    server!.publish(items.map((i) => i.event));
  });
  const done = () => (stage === 'websocket' ? clientCount : arrived);
  let emitted = 0;
  const t0 = process.hrtime.bigint();
  while (emitted < total) {
    const n = Math.min(BURST, total - emitted);
    // Keep at most two bursts in flight (the ring holds about three).
    while (emitted - done() > BURST) await new Promise((r) => setImmediate(r));
    tracer.benchEmit(n, FLOWS);
    emitted += n;
  }
  while (done() < total) await sleep(1);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const st = tracer.stats();
  const hubDropped = server ? server.hub.clientList().reduce((n, c) => n + c.dropped, 0) : 0;
  tracer.close();
  child?.kill();
  await server?.close();
  return { stage, events: total, seconds, eventsPerSecond: total / seconds, lost: st.ringbufLost + st.readerLostAtClose + hubDropped };
}

function baseline(total: number): { eventsPerSecond: number; seconds: number; lost: number } {
  return JSON.parse(execFileSync(BASELINE, [String(total), String(BURST), String(FLOWS)], { encoding: 'utf8' }));
}

export async function benchPipeline(opts: { quick: boolean }): Promise<object> {
  const total = opts.quick ? 200_000 : 1_000_000;
  const base = baseline(total * 2);
  const stages: StageResult[] = [];
  for (const s of ['native', 'decode', 'flows', 'websocket'] as Stage[]) stages.push(await runStage(s, total));
  const rows = [
    ['C consumer (baseline)', fmt(base.eventsPerSecond), '100%', String(base.lost)],
    ...stages.map((s) => [`node: ${s.stage === 'native' ? 'addon -> JS callback' : s.stage === 'decode' ? '+ decode' : s.stage === 'flows' ? '+ flow model + proto' : '+ encode + WebSocket client'}`, fmt(s.eventsPerSecond), `${((100 * s.eventsPerSecond) / base.eventsPerSecond).toFixed(1)}%`, String(s.lost)]),
  ];
  console.log(`\nPipeline throughput (${fmt(total)} events, ${FLOWS} flows, bursts of ${BURST})`);
  console.log(table(['chain', 'events/s', 'of baseline', 'lost'], rows));
  const result = { total, baseline: base, stages };
  console.log(`-> ${writeResult('pipeline', result)}`);
  return result;
}
