/**
 * The TypeScript face of the kernel tracer: loads svctrace's BPF programs,
 * selects the traced services, attaches to network namespaces and delivers
 * decoded events in batches. Native errors become SvctraceErrors.
 */
import { fromNativeError, SvctraceError } from '../errors';
import { decodeBatch, decodeRuleTraces, KernelEvent, RuleTrace } from '../events/decode';
import { parseIPv4, ServiceSpec } from '../net/ipv4';
import { loadBinding, NativeStats, NativeTracer } from '../native/binding';
import { resolveNetns } from '../netns/netns';
import { serviceIdsOf } from '../flows/service-ids';

export type TracerStats = NativeStats & { batchCallbacks: number; decodeErrors: number };

/** Tracers still open; closed on process exit so links never outlive us by accident. */
const openTracers = new Set<Tracer>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once('exit', () => {
    for (const t of openTracers) t.close();
  });
}

export interface AttachedNetns {
  path: string;
  netnsIno: number;
  links: number;
}

export class Tracer {
  private native: NativeTracer | null;
  private batchCallbacks = 0;
  private decodeErrors = 0;
  private lastStats: TracerStats | null = null;
  readonly attached: AttachedNetns[] = [];

  private constructor(native: NativeTracer) {
    this.native = native;
    openTracers.add(this);
    installExitHook();
  }

  /**
   * Opens and loads the BPF programs (verifier runs here). snaplen: packet
   * bytes to capture per event (0 = off). allPackets: an event for every
   * packet at every hook, not only the transitions.
   */
  static open(opts: { snaplen?: number; allPackets?: boolean } = {}): Tracer {
    const binding = loadBinding();
    let native: NativeTracer;
    try {
      native = new binding.Tracer({ snaplen: opts.snaplen ?? 0, allPackets: !!opts.allPackets });
      native.load();
    } catch (e) {
      throw fromNativeError(e);
    }
    return new Tracer(native);
  }

  private get n(): NativeTracer {
    if (!this.native) throw new SvctraceError('INTERNAL', 'tracer is closed');
    return this.native;
  }

  /** Replaces the set of traced services; each is reported under its id from serviceIdsOf. */
  setServices(services: ServiceSpec[]): void {
    const list = serviceIdsOf(services).map(({ service: s, id }) => ({
      addr: s.address === null ? 0 : parseIPv4(s.address),
      port: s.port,
      proto: s.protoNumber,
      id,
    }));
    try {
      this.n.setServices(list);
    } catch (e) {
      throw fromNativeError(e);
    }
  }

  /** Attaches the netfilter observers inside a network namespace (name or path). */
  attachNetns(nameOrPath: string): AttachedNetns {
    const path = resolveNetns(nameOrPath);
    try {
      const r = this.n.attachNetfilter(path);
      const a = { path, ...r };
      this.attached.push(a);
      return a;
    } catch (e) {
      throw fromNativeError(e);
    }
  }

  /**
   * Starts draining the ring buffer; `onEvents` gets each native batch
   * decoded, in kernel order. It must not throw (errors are reported to
   * `onError`, default: stderr).
   */
  start(onEvents: (events: KernelEvent[]) => void, onError?: (e: unknown) => void): void {
    const report = onError ?? ((e: unknown) => process.stderr.write(`svctrace: ${String(e)}\n`));
    try {
      this.n.start((buf) => {
        this.batchCallbacks++;
        let events: KernelEvent[];
        try {
          events = decodeBatch(buf);
        } catch (e) {
          this.decodeErrors++;
          report(e);
          return;
        }
        try {
          onEvents(events);
        } catch (e) {
          report(e);
        }
      });
    } catch (e) {
      throw fromNativeError(e);
    }
  }

  /** Reads nftables trace messages in a namespace (see RuleMarker); `onTraces` gets them decoded. */
  traceRules(nameOrPath: string, onTraces: (traces: RuleTrace[]) => void, onError?: (e: unknown) => void): void {
    const path = resolveNetns(nameOrPath);
    const report = onError ?? ((e: unknown) => process.stderr.write(`svctrace: ${String(e)}\n`));
    try {
      this.n.traceRules(path, (buf) => {
        try {
          onTraces(decodeRuleTraces(buf));
        } catch (e) {
          report(e);
        }
      });
    } catch (e) {
      throw fromNativeError(e);
    }
  }

  stats(): TracerStats {
    if (!this.native) {
      if (this.lastStats) return this.lastStats;
      throw new SvctraceError('INTERNAL', 'tracer is closed');
    }
    const s = { ...this.n.stats(), batchCallbacks: this.batchCallbacks, decodeErrors: this.decodeErrors };
    this.lastStats = s;
    return s;
  }

  /** Detaches everything and frees the BPF objects. Idempotent. */
  close(): void {
    if (!this.native) return;
    try {
      this.stats();
    } catch {
      // keep the previous snapshot
    }
    this.native.close();
    this.native = null;
    openTracers.delete(this);
  }

  get closed(): boolean {
    return this.native === null;
  }
}
