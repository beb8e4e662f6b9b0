/**
 * Pipeline throughput: how many events/s the chain kernel ring buffer ->
 * addon -> JS decode -> flow model -> protobuf encode -> one WebSocket client
 * sustains without loss, stage by stage, next to a plain C consumer of the
 * same ring buffer fed by the same in-kernel source (bench/ringbuf-baseline.c).
 * Method for all: emit bursts that fit the ring, keep at most two bursts in
 * flight (arrived + counted lost), count what arrives at the end of the
 * chain. Losses (ring buffer, addon reader, hub per client) are reported, and
 * a stage that stops making progress for 3 s ends, the rest counted lost.
 */
import { execFileSync, fork } from 'node:child_process';
import path from 'node:path';
import { loadBinding, NativeTracer } from '../src/native/binding';
import { Tracer } from '../src/tracer/tracer';
import { defaultBackend } from '../src/tracer/backend';
import { decodeBatch } from '../src/events/decode';
import { FlowTable } from '../src/flows/flow-table';
import { parseServiceSpec } from '../src/net/ipv4';
import { StreamServer } from '../src/stream/server';
import { fmt, table, waitUntil, withDeadline, writeResult } from './common';
import { cpuBetween, machineBusyBetween, machineCpu, MAIN_THREAD, threadCpu } from './thread-cpu';

const BURST = 16384;
const FLOWS = 1000;
const BASELINE = path.resolve(__dirname, '..', '..', 'build', 'svctrace-ringbuf-baseline');

type Stage = 'native' | 'decode' | 'flows' | 'websocket';

/** No event arrived (nor was counted lost) for this long: the rest is reported lost and the stage ends. */
const STALL_MS = 3000;
/** Hard cap on one stage, whatever happens. */
const STAGE_MS = 120_000;

interface StageResult {
  stage: Stage;
  events: number;
  arrived: number;
  seconds: number;
  eventsPerSecond: number;
  /** Counted by the tracer and the hub. */
  lost: { ringbuf: number; reader: number; hubClient: number };
  /** Emitted but neither arrived nor counted lost when the stage gave up waiting. */
  unaccounted: number;
  /**
   * CPU per event arrived, ns, while events flowed: this process's JS thread
   * and all its threads (the kernel source runs on the JS thread, as the C
   * baseline's runs on its consumer's). On these shared machines a rate
   * moves by a third from run to run with the neighbours' load; CPU spent
   * per event much less, so two trees compare on it.
   */
  cpuNsPerEvent: { jsThread: number; process: number };
  /**
   * Shares (0..1) of the stage's wall time: how much of it the JS thread
   * was busy, and how much of all the machine's cores were (every process:
   * the WebSocket client's, the kernel's socket copies). A JS thread busy
   * near 1 with cores to spare means the thread is the limit, not the
   * machine (twenty-third pass of docs/performance.md).
   */
  busy: { jsThread: number; machine: number };
}

function pct(share: number): string {
  return Number.isFinite(share) ? `${Math.round(share * 100)}%` : '?';
}

function lostTotal(s: StageResult): number {
  return s.lost.ringbuf + s.lost.reader + s.lost.hubClient + s.unaccounted;
}

export async function runStage(stage: Stage, total: number): Promise<StageResult> {
  const binding = loadBinding();
  const tracer: NativeTracer = new binding.Tracer({ backend: Tracer.backendFor(defaultBackend()).backend, benchSource: true });
  const table = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')] });
  let server: StreamServer | undefined;
  let clientCount = 0;
  let invalidFrames = 0;
  // The wait below sleeps until something may have changed (a batch
  // handled, the client's count, a 1 ms tick for the loss counters): a wait
  // that spun on setImmediate kept a core busy, one that the reader thread
  // and the client process need on these 2-core machines.
  let waiter: (() => void) | undefined;
  const wakeWaiter = () => {
    const w = waiter;
    waiter = undefined;
    w?.();
  };
  let child: ReturnType<typeof fork> | undefined;
  try {
    tracer.load();
    if (stage === 'websocket') {
      server = await StreamServer.start({ services: ['10.96.0.100:80/tcp'], kernelLost: () => 0, activeFlows: () => table.size, dropsByReason: () => ({}) }, { listen: '127.0.0.1:0' });
      child = fork(path.join(__dirname, 'ws-counter.js'), [server.url()], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      let ready = false;
      child.on('message', (m: { received?: number; invalid?: number; ready?: boolean }) => {
        if (m.ready) ready = true;
        if (typeof m.received === 'number') clientCount = m.received;
        if (typeof m.invalid === 'number') invalidFrames = m.invalid;
        wakeWaiter();
      });
      if (!(await waitUntil(() => ready || child!.exitCode !== null, 10_000))) throw new Error('WebSocket counter did not connect within 10 s');
      if (!ready) throw new Error(`WebSocket counter exited (${child.exitCode})`);
    }
    let arrived = 0;
    tracer.start((buf, count) => {
      if (stage === 'native') {
        arrived += count;
      } else {
        const batch = decodeBatch(buf);
        if (stage === 'decode') {
          arrived += batch.events.length;
        } else {
          const items = table.ingest(batch.events, batch.stats);
          if (stage === 'flows') arrived += items.length;
          else server!.publishItems(items);
        }
      }
      wakeWaiter();
    });
    const done = () => (stage === 'websocket' ? clientCount : arrived);
    const lost = () => {
      const st = tracer.stats();
      const hubClient = server ? server.hub.clientList().reduce((n, c) => n + c.dropped, 0) : 0;
      return { ringbuf: st.ringbufLost, reader: st.readerLostAtClose, hubClient };
    };
    // Events accounted for: arrived, or counted lost by the tracer or the hub.
    // Waiting on arrivals alone hangs forever once one event is dropped. The
    // loss counters (a call into the addon, a walk of the hub's clients) are
    // read at most every 10 ms (a stall is 3 s): read on every turn of the wait they
    // were 5% of the main thread the stage measures.
    let lossSeen = 0;
    let lossReadAt = 0;
    const accounted = () => {
      const now = performance.now();
      if (now - lossReadAt >= 10) {
        const l = lost();
        lossSeen = l.ringbuf + l.reader + l.hubClient;
        lossReadAt = now;
      }
      return done() + lossSeen;
    };
    const cpu0 = threadCpu();
    const machine0 = machineCpu();
    const t0 = process.hrtime.bigint();
    const stageEnd = Date.now() + STAGE_MS;
    let lastProgress = process.hrtime.bigint();
    let stalled = false;
    const waitAccounted = async (target: number) => {
      let last = accounted();
      let lastAt = Date.now();
      while (last < target) {
        if (Date.now() - lastAt > STALL_MS || Date.now() > stageEnd) return !(stalled = true);
        await new Promise<void>((r) => {
          const tick = setTimeout(wakeWaiter, 1);
          waiter = () => {
            clearTimeout(tick);
            r();
          };
        });
        const a = accounted();
        if (a !== last) {
          last = a;
          lastAt = Date.now();
          lastProgress = process.hrtime.bigint();
        }
      }
      return true;
    };
    let emitted = 0;
    while (emitted < total && !stalled) {
      const n = Math.min(BURST, total - emitted);
      // Keep at most two bursts in flight (the ring holds about three).
      if (!(await waitAccounted(emitted - BURST))) break;
      tracer.benchEmit(n, FLOWS);
      emitted += n;
    }
    await waitAccounted(emitted);
    const cpu = cpuBetween(cpu0, threadCpu());
    const machineBusy = machineBusyBetween(machine0, machineCpu());
    const wallSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
    if (invalidFrames) throw new Error(`the WebSocket client received ${invalidFrames} frames that are not ServerMessages of Events`);
    const seconds = Number(lastProgress - t0) / 1e9;
    const l = lost();
    const got = done();
    return {
      stage,
      events: total,
      arrived: got,
      seconds,
      eventsPerSecond: got / seconds,
      lost: l,
      unaccounted: Math.max(0, total - got - l.ringbuf - l.reader - l.hubClient),
      cpuNsPerEvent: {
        jsThread: got ? ((cpu.get(MAIN_THREAD) ?? 0) * 1e9) / got : NaN,
        process: got ? ([...cpu.values()].reduce((a, b) => a + b, 0) * 1e9) / got : NaN,
      },
      busy: { jsThread: (cpu.get(MAIN_THREAD) ?? 0) / wallSeconds, machine: machineBusy },
    };
  } finally {
    tracer.close();
    child?.kill();
    await withDeadline(server?.close() ?? Promise.resolve(), 5000, 'stream server close').catch(() => undefined);
  }
}

function baseline(total: number): { eventsPerSecond: number; seconds: number; lost: number } | { error: string } {
  try {
    return JSON.parse(execFileSync(BASELINE, [String(total), String(BURST), String(FLOWS)], { encoding: 'utf8', timeout: 60_000 }));
  } catch (e) {
    return { error: e instanceof Error ? e.message.split('\n')[0]! : String(e) };
  }
}

export async function benchPipeline(opts: { quick: boolean }): Promise<object> {
  const total = opts.quick ? 200_000 : 1_000_000;
  const base = baseline(total * 2);
  const baseRate = 'error' in base ? NaN : base.eventsPerSecond;
  const stages: StageResult[] = [];
  for (const s of ['native', 'decode', 'flows', 'websocket'] as Stage[]) stages.push(await runStage(s, total));
  const label = { native: 'addon -> JS callback', decode: '+ decode', flows: '+ flow model', websocket: '+ encode + WebSocket client' };
  const rows = [
    'error' in base ? ['C consumer (baseline)', `failed: ${base.error}`, '', '', '', '', '', ''] : ['C consumer (baseline)', fmt(base.eventsPerSecond), '100%', '', '', '', fmt(total * 2 - base.lost), String(base.lost)],
    ...stages.map((s) => [
      `node: ${label[s.stage]}`,
      fmt(s.eventsPerSecond),
      `${((100 * s.eventsPerSecond) / baseRate).toFixed(1)}%`,
      fmt(s.cpuNsPerEvent.jsThread),
      fmt(s.cpuNsPerEvent.process),
      `${pct(s.busy.jsThread)} / ${pct(s.busy.machine)}`,
      fmt(s.arrived),
      lostTotal(s) ? `${fmt(lostTotal(s))} (ring ${s.lost.ringbuf}, reader ${s.lost.reader}, hub ${s.lost.hubClient}, unaccounted ${s.unaccounted})` : '0',
    ]),
  ];
  console.log(`\nPipeline throughput (${fmt(total)} events, ${FLOWS} flows, bursts of ${BURST})`);
  console.log(table(['chain', 'events/s', 'of baseline', 'JS thread ns/event', 'process ns/event', 'busy: JS thread / machine', 'arrived', 'lost'], rows));
  const result = { total, baseline: base, stages };
  console.log(`-> ${writeResult('pipeline', result)}`);
  return result;
}
