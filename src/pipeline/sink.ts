/**
 * Where ingested events go: a sink per output (text timeline, JSON lines,
 * stream hub, recording, live diagnoser). Sinks are isolated from each
 * other: one that throws is reported and the others still get every batch.
 */
import type { Flow, Ingested } from '../flows/types';

export interface Sink {
  /** Names the sink in warnings ("text", "stream", ...). */
  readonly name: string;
  /** A batch of ingested events, in kernel order; must not block. */
  write(items: Ingested[]): void;
  /** Flows the table just expired (closed past the grace period, idle, or evicted by the cap). */
  expired?(flows: Flow[]): void;
  /** The trace ended: every event was written; flush and release. */
  close?(): void | Promise<void>;
}

/**
 * What a sink throws when it failed on events it has already counted as
 * lost in a stage of its own (the recording's `recording`): the sink set
 * reports the failure and does not count those events a second time in
 * internal_error (a recording's bad event was counted in both).
 */
export class CountedSinkFailure extends Error {
  constructor(readonly failure: unknown) {
    super(failure instanceof Error ? failure.message : String(failure));
    this.name = 'CountedSinkFailure';
  }
}

/** A pipeline's sinks, called in order, each in isolation. */
export class SinkSet {
  private readonly failures = new Map<Sink, number>();
  private lost = 0;

  constructor(
    private readonly sinks: readonly Sink[],
    private readonly onWarning: (message: string) => void,
  ) {}

  write(items: Ingested[]): void {
    for (const s of this.sinks) {
      try {
        s.write(items);
      } catch (e) {
        // Which of them it wrote before it threw is its own business: none
        // is known to be in its output, unless it counted them itself.
        if (!(e instanceof CountedSinkFailure)) this.lost += items.length;
        this.failed(s, 'write', e);
      }
    }
  }

  expired(flows: Flow[]): void {
    for (const s of this.sinks) {
      try {
        s.expired?.(flows);
      } catch (e) {
        // Its flow lines and end-of-flow counts: each flow one record lost.
        if (!(e instanceof CountedSinkFailure)) this.lost += flows.length;
        this.failed(s, 'expired', e);
      }
    }
  }

  /** Events (and expired flows) an output failed on, once per output that failed (stage internal_error). */
  get lostEvents(): number {
    return this.lost;
  }

  /** Closes every sink in order; a failing close does not skip the next. */
  async close(): Promise<void> {
    for (const s of this.sinks) {
      try {
        await s.close?.();
      } catch (e) {
        this.failed(s, 'close', e);
      }
    }
    for (const [s, n] of this.failures) if (n > 1) this.onWarning(`${s.name} output failed ${n} times in all`);
  }

  /** The first failure of a sink is reported; later ones are counted (a sink failing per batch would flood stderr). */
  private failed(s: Sink, during: string, e: unknown): void {
    const n = (this.failures.get(s) ?? 0) + 1;
    this.failures.set(s, n);
    if (n === 1) this.onWarning(`${s.name} output failed (${during}): ${e instanceof Error ? e.message : String(e)}; the other outputs go on`);
  }
}
