/** Collecting a Pipeline's output in tests (FlowLog.add is a sink's write). */
import { svctrace } from '../../src/gen/svctrace';
import type { Flow, Ingested } from '../../src/flows/types';

import pb = svctrace.v1;

export class FlowLog {
  readonly events = new Map<number, pb.IEvent[]>();
  readonly flows = new Map<number, Flow>();
  /** Every event in arrival order. */
  readonly all: pb.IEvent[] = [];

  add = (items: Ingested[]): void => {
    for (const { flow, event } of items) {
      this.all.push(event);
      this.flows.set(flow.id, flow);
      const list = this.events.get(flow.id) ?? [];
      list.push(event);
      this.events.set(flow.id, list);
    }
  };

  /** The flow whose client port (as sent) is `port` and whose service address is `dst`. */
  flowByClientPort(port: number, dst?: string): Flow | undefined {
    return [...this.flows.values()].find((f) => f.orig.sport === port && (dst === undefined || f.orig.daddr === dst));
  }

  eventsOf(f: Flow): pb.IEvent[] {
    return this.events.get(f.id) ?? [];
  }

  stages(f: Flow, stage: pb.Stage): pb.IEvent[] {
    return this.eventsOf(f).filter((e) => e.stage === stage);
  }
}

/**
 * How much slower than this machine the test host is: the VM matrix sets
 * SVT_TEST_TIME_SCALE for emulated guests. Readiness waits and test
 * timeouts stretch by it; what the tests assert does not change.
 */
export const TIME_SCALE = Math.max(1, Number(process.env.SVT_TEST_TIME_SCALE) || 1);

/** Polls `cond` until it holds or ms (times TIME_SCALE) pass. */
export async function waitFor(cond: () => boolean, ms: number, step = 50): Promise<boolean> {
  const end = Date.now() + ms * TIME_SCALE;
  while (Date.now() < end) {
    if (cond()) return true;
    await new Promise((r) => setTimeout(r, step));
  }
  return cond();
}

/**
 * Waits until `read()` has not changed for quietMs (at most ms, both times
 * TIME_SCALE): the records traffic left behind (its FINs, the counters a
 * connection's end writes) have all come in. Returns whether it settled.
 */
export async function settled(read: () => number, quietMs = 300, ms = 5000): Promise<boolean> {
  const end = Date.now() + ms * TIME_SCALE;
  let last = read();
  let since = Date.now();
  while (Date.now() < end) {
    await new Promise((r) => setTimeout(r, 50));
    const now = read();
    if (now !== last) {
      last = now;
      since = Date.now();
    } else if (Date.now() - since >= quietMs * TIME_SCALE) {
      return true;
    }
  }
  return false;
}
