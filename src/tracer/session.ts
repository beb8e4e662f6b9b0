/**
 * A trace session: the orchestration shared by `trace`, `demo` and tests —
 * open the tracer, select services, attach to namespaces, deliver events,
 * stop on a deadline or a signal, and summarize.
 */
import { SvctraceError } from '../errors';
import { DecodedBatch } from '../events/decode';
import { ServiceSpec } from '../net/ipv4';
import { Tracer, TracerStats } from './tracer';

export interface SessionOptions {
  services: ServiceSpec[];
  /** Namespaces (names or paths) to attach the netfilter observers in. */
  netns: string[];
  onEvents: (batch: DecodedBatch) => void;
  /** Packet bytes to capture per event (0 = off, the default). */
  snaplen?: number;
  /** Every packet at every hook instead of the transitions. */
  allPackets?: boolean;
  /** Size of the kernel ring buffer in bytes (a power of two). */
  ringBufferBytes?: number;
  /** How often an active flow's counters are reported (ms). */
  statsIntervalMs?: number;
}

/** Kernel flow state with no packet for this long is expired (its end was never reported). */
const FLOW_STATE_IDLE_MS = 30 * 60_000;
const FLOW_STATE_SWEEP_MS = 30_000;

export class TraceSession {
  readonly tracer: Tracer;
  readonly services: ServiceSpec[];
  private stopped = false;
  private readonly sweepTimer: NodeJS.Timeout;

  private constructor(tracer: Tracer, services: ServiceSpec[]) {
    this.tracer = tracer;
    this.services = services;
    this.sweepTimer = setInterval(() => tracer.expireIdleFlows(FLOW_STATE_IDLE_MS), FLOW_STATE_SWEEP_MS);
    this.sweepTimer.unref();
  }

  /** Everything up to hooks attached; on failure nothing stays attached. */
  static start(opts: SessionOptions): TraceSession {
    if (opts.services.length === 0) throw new SvctraceError('BAD_INPUT', 'give at least one --service IP:port or --nodeport PORT');
    if (opts.netns.length === 0) throw new SvctraceError('BAD_INPUT', 'give at least one network namespace to attach in');
    const tracer = Tracer.open({ snaplen: opts.snaplen, allPackets: opts.allPackets, ringBufferBytes: opts.ringBufferBytes, statsIntervalMs: opts.statsIntervalMs });
    try {
      tracer.setServices(opts.services);
      for (const ns of opts.netns) tracer.attachNetns(ns);
      tracer.start(opts.onEvents);
    } catch (e) {
      tracer.close();
      throw e;
    }
    return new TraceSession(tracer, opts.services);
  }

  /** Service spec of an event's service_id (ids are 1-based indices). */
  serviceOf(id: number): ServiceSpec | undefined {
    return this.services[id - 1];
  }

  stats(): TracerStats {
    return this.tracer.stats();
  }

  /** Lets the reader hand over what the kernel still holds, then detaches. */
  async stop(): Promise<TracerStats> {
    if (!this.stopped) {
      this.stopped = true;
      clearInterval(this.sweepTimer);
      // Everything produced so far reaches JS first (bounded wait: a
      // stalled consumer must not keep the process from ending; what is
      // left is counted as lost at shutdown).
      await this.tracer.drain(2000);
      this.tracer.close();
    }
    return this.tracer.stats();
  }
}

/**
 * Resolves after `seconds`, on SIGINT/SIGTERM, or when `abort` fires,
 * whichever comes first; it always removes its signal handlers.
 */
export function waitForStop(seconds: number | undefined, abort?: AbortSignal): Promise<'timeout' | 'signal' | 'aborted'> {
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout | undefined;
    const onSignal = () => finish('signal');
    const onAbort = () => finish('aborted');
    const finish = (why: 'timeout' | 'signal' | 'aborted') => {
      if (timer) clearTimeout(timer);
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      abort?.removeEventListener('abort', onAbort);
      resolve(why);
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
    if (abort?.aborted) return finish('aborted');
    abort?.addEventListener('abort', onAbort);
    if (seconds !== undefined) timer = setTimeout(() => finish('timeout'), seconds * 1000);
  });
}
