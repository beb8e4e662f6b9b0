/**
 * A trace session: the orchestration shared by `trace`, `demo` and tests —
 * open the tracer, select services, attach to namespaces, deliver events,
 * stop on a deadline or a signal, and summarize.
 */
import { SvctraceError } from '../errors';
import { KernelEvent } from '../events/decode';
import { ServiceSpec } from '../net/ipv4';
import { Tracer, TracerStats } from './tracer';

export interface SessionOptions {
  services: ServiceSpec[];
  /** Namespaces (names or paths) to attach the netfilter observers in. */
  netns: string[];
  onEvents: (events: KernelEvent[]) => void;
  /** Packet bytes to capture per event (0 = off, the default). */
  snaplen?: number;
  /** Every packet at every hook instead of the transitions. */
  allPackets?: boolean;
}

export class TraceSession {
  readonly tracer: Tracer;
  readonly services: ServiceSpec[];
  private stopped = false;

  private constructor(tracer: Tracer, services: ServiceSpec[]) {
    this.tracer = tracer;
    this.services = services;
  }

  /** Everything up to hooks attached; on failure nothing stays attached. */
  static start(opts: SessionOptions): TraceSession {
    if (opts.services.length === 0) throw new SvctraceError('BAD_INPUT', 'give at least one --service IP:port or --nodeport PORT');
    if (opts.netns.length === 0) throw new SvctraceError('BAD_INPUT', 'give at least one network namespace to attach in');
    const tracer = Tracer.open({ snaplen: opts.snaplen, allPackets: opts.allPackets });
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
      // The reader flushes every few ms; give in-flight batches time to land.
      await new Promise((r) => setTimeout(r, 50));
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
