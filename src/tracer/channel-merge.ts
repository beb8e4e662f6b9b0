/**
 * Puts the two kernel channels in one order. The BPF ring buffer and the
 * conntrack netlink socket are read by different threads, so a flow's end
 * (its destroy message and final counters, from netlink) can reach
 * JavaScript before the flow's own first events (from the ring). Netlink
 * batches are held until the ring has delivered everything up to their time
 * (both carry the kernel's CLOCK_MONOTONIC), or the ring is idle, or a short
 * bound passes. Memory is bounded: at most maxHeld batches wait.
 */
import type { DecodedBatch } from '../events/decode';

function maxTs(b: DecodedBatch): bigint {
  let m = 0n;
  for (const e of b.events) if (e.tsNs > m) m = e.tsNs;
  for (const s of b.stats) if (s.tsNs > m) m = s.tsNs;
  return m;
}

export class ChannelMerge {
  private readonly held: Array<{ batch: DecodedBatch; maxTs: bigint; atMs: number }> = [];
  private ringHighTs = 0n;

  constructor(
    private readonly emit: (b: DecodedBatch) => void,
    private readonly maxHoldMs = 500,
    private readonly maxHeld = 256,
  ) {}

  /** The latest kernel time the ring has delivered (0 before its first batch). */
  get ringTime(): bigint {
    return this.ringHighTs;
  }

  /** Batches waiting for the ring to catch up. */
  get holding(): number {
    return this.held.length;
  }

  ring(b: DecodedBatch, nowMs = Date.now()): void {
    const m = maxTs(b);
    if (m > this.ringHighTs) this.ringHighTs = m;
    this.emit(b);
    this.release(false, nowMs);
  }

  /**
   * Records made now from the kernel's state map (the idle sweep's final
   * counters, a snapshot): emitted at once, and they say nothing of how far
   * the ring has delivered. Stamped with the time they were read, they
   * raised the ring's time to now while the ring was still behind, and
   * with it everything that waits for the ring: held netlink batches were
   * let go out of order, and flows and rule traces that wait for their
   * events (deliveredThrough) stopped waiting.
   */
  state(b: DecodedBatch, nowMs = Date.now()): void {
    this.emit(b);
    this.release(false, nowMs);
  }

  netlink(b: DecodedBatch, nowMs = Date.now()): void {
    this.held.push({ batch: b, maxTs: maxTs(b), atMs: nowMs });
    this.release(false, nowMs);
  }

  /** Emits what may go now; `ringIdle`: the ring has delivered everything produced so far. */
  release(ringIdle: boolean, nowMs = Date.now()): void {
    while (this.held.length) {
      const h = this.held[0]!;
      const due = ringIdle || h.maxTs <= this.ringHighTs || nowMs - h.atMs >= this.maxHoldMs || this.held.length > this.maxHeld;
      if (!due) break;
      this.held.shift();
      this.emit(h.batch);
    }
  }
}
