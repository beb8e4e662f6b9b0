/**
 * `svctrace replay`: plays a recording's events back at their recorded pace
 * (or faster), to the terminal or as a live-looking WebSocket stream. A
 * damaged or cut recording plays up to its last intact chunk, then says
 * where it stopped.
 */
import { svctrace } from '../gen/svctrace';
import { SvctraceError } from '../errors';
import { iterRecording, Recording } from './reader';

import pb = svctrace.v1;
import { parseDecimal } from '../decimal';

export type Speed = number | 'max';

export function parseSpeed(s: string): Speed {
  if (s === 'max') return 'max';
  const n = parseDecimal(s);
  // Below 1/1000 a second of recording takes over a quarter of an hour.
  if (!Number.isFinite(n) || n < 0.001 || n > 1e6) throw new SvctraceError('BAD_INPUT', `--speed must be a number from 0.001 to 1000000, or 'max', not '${s}'`);
  return n;
}

function tsOf(e: pb.IEvent): bigint {
  return BigInt(String(e.tsNs ?? 0));
}

/**
 * Delivers events in batches, sleeping so that their spacing is the
 * recorded one divided by `speed`. Returns the recording (with problems).
 */
export async function replay(path: string, speed: Speed, deliver: (events: pb.Event[]) => Promise<void> | void, shouldStop: () => boolean = () => false): Promise<Recording> {
  const it = iterRecording(path);
  try {
    let baseTs: bigint | null = null;
    const baseWall = Date.now();
    for (;;) {
      const r = it.next();
      if (r.done) return r.value;
      const events = r.value.events;
      if (!events.length) continue;
      if (speed === 'max') {
        // A promise: the output is behind (a slow reader of stdout), waited for.
        await deliver(events);
        await new Promise((res) => setImmediate(res));
      } else {
        // Deliver in runs of events that are due at the same time.
        let i = 0;
        while (i < events.length) {
          if (shouldStop()) break;
          const ts = tsOf(events[i]!);
          baseTs ??= ts;
          const dueMs = Number(ts - baseTs) / 1e6 / speed;
          const wait = baseWall + dueMs - Date.now();
          if (wait > 1) {
            // In steps of a second at most: a stop is seen within one, and an
            // event due later than a step is not delivered before its time.
            await new Promise((res) => setTimeout(res, Math.min(wait, 1000)));
            if (wait > 1000) continue;
          }
          let j = i + 1;
          while (j < events.length && Number(tsOf(events[j]!) - baseTs) / 1e6 / speed <= Date.now() - baseWall) j++;
          await deliver(events.slice(i, j));
          i = j;
        }
      }
      if (shouldStop()) return r.value.rec;
    }
  } finally {
    // Stopped early, or an output that threw: the file is closed.
    it.return({ eventCount: 0, eventChunks: 0, chunks: 0, size: 0, validBytes: 0, problems: [] });
  }
}
