/**
 * The TypeScript face of the kernel tracer: loads svctrace's BPF programs,
 * selects the traced services, attaches to network namespaces and delivers
 * decoded events in batches. Native errors become SvctraceErrors.
 */
import fs from 'node:fs';
import { fromNativeError, SvctraceError } from '../errors';
import { decodeBatch, decodeRuleTraces, DecodedBatch, RuleTrace } from '../events/decode';
import { parseIPv4, ServiceSpec } from '../net/ipv4';
import { loadBinding, LoadedProgram, NativeFeatures, NativeStats, NativeTracer } from '../native/binding';
import { Channel, FLOW_STATS, NFTRACE } from '../events/layout';
import { ChannelMerge } from './channel-merge';
import { guardBatchHandler } from './losses';
import { resolveNetns } from '../netns/netns';
import { serviceIdsOf } from '../flows/service-ids';
import { monoNowNs } from '../clock';
import { BACKEND_PROBE, BACKENDS, BackendChoice, BackendRequest, chooseBackend, defaultBackend } from './backend';

/**
 * decodeErrors: batches that failed to decode; undecodedRecords: the records
 * they held (lost, stage `undecodable`). unhandledRecords: the records of
 * batches whose handler threw (lost, stage `internal_error`).
 */
export type TracerStats = NativeStats & { batchCallbacks: number; decodeErrors: number; undecodedRecords: number; unhandledRecords: number };

/** Tracers still open; closed on process exit so links never outlive us by accident. */
const openTracers = new Set<Tracer>();

/** deliver()'s channel for records the addon read from the flow-state map on request (idle sweep, snapshot): not a native one, and not the ring's order (ChannelMerge.state). */
const STATE_MAP = -1;
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once('exit', () => {
    for (const t of openTracers) t.close();
  });
}

export interface TracerOpenOptions {
  /** Attach strategy (default auto: the best the kernel offers, see backend.ts). */
  backend?: BackendRequest;
  snaplen?: number;
  allPackets?: boolean;
  ringBufferBytes?: number;
  statsIntervalMs?: number;
  /** New flows per second whose transitions are reported, the rest counted only (0 or absent: every flow). */
  detailRate?: number;
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
  private undecodedRecords = 0;
  private unhandledRecords = 0;
  private lastStats: TracerStats | null = null;
  readonly attached: AttachedNetns[] = [];
  /**
   * The backend a tracer asking for `request` gets on this kernel, and why.
   * Only auto needs the probes, in its order of preference, until one
   * passes; an explicit backend's load error speaks for itself.
   */
  static backendFor(request: BackendRequest): BackendChoice {
    const binding = loadBinding();
    const probes: Partial<NativeFeatures> = {};
    if (request === 'auto') {
      for (const b of BACKENDS) {
        const name = BACKEND_PROBE[b];
        Object.assign(probes, binding.probeFeatures([name]));
        if (probes[name]?.ok || probes[name]?.code === 'EPERM') break;
      }
    }
    try {
      return chooseBackend(request, probes);
    } catch (e) {
      // Without privileges every probe is refused: loading then says which
      // capabilities are missing, which is the error to show.
      if (probes.netfilterLink?.code !== 'EPERM') throw e;
      return { backend: 'netfilter', reason: 'netfilter (the kernel refused the probes: not permitted)' };
    }
  }

  /** The attach backend in use, and why it was chosen. */
  readonly attachBackend: BackendChoice;

  private constructor(native: NativeTracer, backend: BackendChoice) {
    this.native = native;
    this.attachBackend = backend;
    openTracers.add(this);
    installExitHook();
  }

  /**
   * Opens and loads the BPF programs (verifier runs here). snaplen: packet
   * bytes to capture per event (0 = off). allPackets: an event for every
   * packet at every hook, not only the transitions. ringBufferBytes: the
   * kernel ring buffer (the one buffer when user space is behind).
   * statsIntervalMs: how often an active flow's counters are reported.
   * detailRate: new flows per second reported in detail (default 0: all).
   */
  static open(opts: TracerOpenOptions = {}): Tracer {
    const binding = loadBinding();
    let native: NativeTracer;
    const backend = Tracer.backendFor(opts.backend ?? defaultBackend());
    try {
      native = new binding.Tracer({
        backend: backend.backend,
        snaplen: opts.snaplen ?? 0,
        allPackets: !!opts.allPackets,
        ...(opts.ringBufferBytes !== undefined ? { ringBufferBytes: opts.ringBufferBytes } : {}),
        ...(opts.statsIntervalMs !== undefined ? { statsIntervalMs: opts.statsIntervalMs } : {}),
        ...(opts.detailRate !== undefined ? { detailRate: opts.detailRate } : {}),
      });
      native.load();
    } catch (e) {
      throw backendLoadError(backend, fromNativeError(e), (name) => binding.probeFeatures([name])[name]);
    }
    return new Tracer(native, backend);
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

  /**
   * Attaches the netfilter observers inside a network namespace (name or
   * path). Other svctrace processes on the same namespace are fine: the
   * addon picks priorities they leave free. When none is left, the error
   * names them.
   */
  attachNetns(nameOrPath: string): AttachedNetns {
    const path = resolveNetns(nameOrPath);
    try {
      const r = this.n.attachNetfilter(path);
      const a = { path, ...r };
      this.attached.push(a);
      return a;
    } catch (e) {
      const err = fromNativeError(e);
      if ((e as { code?: string }).code === 'EBUSY') {
        const others = otherSvctraceProcesses();
        const named = others.length ? ` (other svctrace processes: ${others.map((o) => `${o.pid} '${o.cmd}'`).join(', ')})` : '';
        throw new SvctraceError('BPF_ATTACH', `cannot attach in ${nameOrPath}: the netfilter priorities next to NAT are all taken${named}`, {
          errno: err.errno,
          op: err.op,
          cause: e,
        });
      }
      throw err;
    }
  }

  /**
   * Starts draining the ring buffer; `onBatch` gets each native batch
   * decoded (events and flow counters), in kernel order. While it runs the
   * addon holds back: a slow handler makes records wait in the kernel's ring
   * buffer, never dropped on the way. It must not throw: a batch it throws
   * on is counted lost (`unhandledRecords`) and the first such error is
   * reported to `onError` (default: stderr). `tap`, for benchmarks, sees
   * each native batch before it is decoded (the buffer is the addon's, reused
   * after the call: a tap that keeps it copies it).
   */
  start(onBatch: (batch: DecodedBatch) => void, onError?: (e: unknown) => void, tap?: (buf: Uint8Array, channel: number) => void): void {
    const report = onError ?? ((e: unknown) => process.stderr.write(`svctrace: ${String(e)}\n`));
    this.report = report;
    this.merge = new ChannelMerge(guardBatchHandler(onBatch, report, (n) => (this.unhandledRecords += n)));
    try {
      this.n.start(
        tap
          ? (buf, count, channel) => {
              tap(buf, channel);
              this.deliver(buf, channel, count);
            }
          : (buf, count, channel) => this.deliver(buf, channel, count),
      );
    } catch (e) {
      throw fromNativeError(e);
    }
    // Netlink batches held for ordering are released once the ring is idle.
    this.mergeTimer = setInterval(() => {
      if (this.merge?.holding && this.native) this.merge.release(this.ringIdle());
    }, 10);
    this.mergeTimer.unref();
  }

  private merge?: ChannelMerge;
  private mergeTimer?: NodeJS.Timeout;
  private report: (e: unknown) => void = () => {};

  private deliver(buf: Uint8Array, channel: number = Channel.RING, count = 0): void {
    if (!this.native) {
      // A batch that was on its way when the drain ran out of time: no
      // sink takes it now. Counted as lost at shutdown, like what the ring
      // still held.
      if (this.lastStats) {
        if (channel === Channel.NETLINK) this.lastStats.listenerLostAtClose += count;
        else this.lastStats.readerLostAtClose += count;
      }
      return;
    }
    this.batchCallbacks++;
    let batch: DecodedBatch;
    try {
      batch = decodeBatch(buf);
    } catch (e) {
      this.decodeErrors++;
      this.undecodedRecords += count;
      this.report(e);
      return;
    }
    if (channel === Channel.NETLINK) this.merge?.netlink(batch);
    else if (channel === STATE_MAP) this.merge?.state(batch);
    else this.merge?.ring(batch);
  }

  /**
   * Kernel time up to which events have been delivered: now when the ring is
   * idle, else the latest ring event's. Flows end relative to it: in a storm
   * the ring can be seconds behind, and a flow closed by netlink must not be
   * forgotten before its own packets, still in the ring, arrive.
   */
  deliveredThrough(): bigint {
    if (!this.native) return this.closedRingTime ?? monoNowNs();
    if (this.ringIdle()) return monoNowNs();
    return this.merge?.ringTime ?? 0n;
  }

  /** Set at close when the ring still held records (the drain ran out of time): nothing after it arrived. */
  private closedRingTime?: bigint;

  /** Everything the ring produced so far has reached JS. */
  private ringIdle(): boolean {
    return this.n.deliveryIdle();
  }

  /**
   * Removes the kernel state of flows with no packet for idleMs (their end
   * was never reported) and delivers their final counters like any batch.
   * Returns how many.
   */
  expireIdleFlows(idleMs: number): number {
    const buf = this.n.expireFlowState(idleMs);
    if (buf.byteLength) this.deliver(buf, STATE_MAP, buf.byteLength / FLOW_STATS.size);
    return buf.byteLength / FLOW_STATS.size;
  }

  /** This kernel's drop reasons by value (read with its BTF when the tracer opened). */
  /** The loaded programs, as the kernel reports them: id, runs and time (with kernel.bpf_stats_enabled), runs skipped. */
  programs(): LoadedProgram[] {
    try {
      return this.n.programs();
    } catch (e) {
      throw fromNativeError(e);
    }
  }

  dropReasons(): Record<string, string> {
    return this.n.dropReasons();
  }

  /** Delivers every tracked flow's counters as they are now (like periodic records). */
  refreshCounters(): void {
    const buf = this.n.snapshotFlowState();
    if (buf.byteLength) this.deliver(buf, STATE_MAP, buf.byteLength / FLOW_STATS.size);
  }

  /**
   * Waits until everything the kernel produced so far has reached JS (ring
   * empty, nothing pending in the reader, no batch in flight; what the
   * netlink listeners had read or had queued in their sockets), at most
   * `timeoutMs`. True when drained.
   */
  async drain(timeoutMs = 2000): Promise<boolean> {
    const end = Date.now() + timeoutMs;
    // The listeners too: what their sockets hold, and the batch they gather
    // (a few ms of conntrack destroys), else counted lost at shutdown.
    const listenersAsked = this.n.flushListeners();
    for (;;) {
      // The listeners first: a destroy comes after its flow's packets, whose
      // records are then in the ring, and the ring idle after it has them.
      if (this.n.listenersFlushed(listenersAsked) && this.ringIdle()) {
        this.merge?.release(true);
        return true;
      }
      if (Date.now() >= end) {
        this.merge?.release(true);
        return false;
      }
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  /** Reads nftables trace messages in a namespace (see RuleMarker); `onTraces` gets them decoded. */
  traceRules(nameOrPath: string, onTraces: (traces: RuleTrace[]) => void, onError?: (e: unknown) => void): void {
    const path = resolveNetns(nameOrPath);
    const report = onError ?? ((e: unknown) => process.stderr.write(`svctrace: ${String(e)}\n`));
    try {
      this.n.traceRules(path, (buf) => {
        // Flushed by the close, after it: no flow model takes them now. Counted as lost at shutdown, like the ring's.
        if (!this.native) {
          if (this.lastStats) this.lastStats.listenerLostAtClose += Math.ceil(buf.byteLength / NFTRACE.size);
          return;
        }
        // A batch that fails is lost whole, and counted like the ring's
        // (undecodable, internal_error), never only reported.
        let traces: RuleTrace[];
        try {
          traces = decodeRuleTraces(buf);
        } catch (e) {
          this.decodeErrors++;
          this.undecodedRecords += Math.ceil(buf.byteLength / NFTRACE.size);
          report(e);
          return;
        }
        try {
          onTraces(traces);
        } catch (e) {
          this.unhandledRecords += traces.length;
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
    const s = { ...this.n.stats(), batchCallbacks: this.batchCallbacks, decodeErrors: this.decodeErrors, undecodedRecords: this.undecodedRecords, unhandledRecords: this.unhandledRecords };
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
    try {
      if (!this.ringIdle()) this.closedRingTime = this.merge?.ringTime ?? 0n;
    } catch {
      // no stats: judged as drained
    }
    if (this.mergeTimer) clearInterval(this.mergeTimer);
    this.merge?.release(true);
    const last = this.native.close();
    if (last) this.lastStats = { ...last, batchCallbacks: this.batchCallbacks, decodeErrors: this.decodeErrors, undecodedRecords: this.undecodedRecords, unhandledRecords: this.unhandledRecords };
    this.native = null;
    openTracers.delete(this);
  }

  get closed(): boolean {
    return this.native === null;
  }
}

/** Other running svctrace processes (their PID and command line), from /proc. */
export function otherSvctraceProcesses(): Array<{ pid: number; cmd: string }> {
  const out: Array<{ pid: number; cmd: string }> = [];
  let pids: string[] = [];
  try {
    pids = fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d));
  } catch {
    return out;
  }
  for (const p of pids) {
    const pid = Number(p);
    if (pid === process.pid) continue;
    try {
      const argv = fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0').filter(Boolean);
      const at = argv.findIndex((a) => /(^|\/)svctrace(\.js)?$/.test(a));
      if (at >= 0) out.push({ pid, cmd: ['svctrace', ...argv.slice(at + 1)].join(' ').slice(0, 120) });
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}

/**
 * The fentry and kprobe backends attach to functions of the nf_nat module:
 * with no NAT rule anywhere on the node the module is not loaded, and libbpf
 * only says it found no such function.
 */
function backendLoadError(backend: BackendChoice, err: SvctraceError, kernelProbe: (name: 'kprobe' | 'fentry') => { ok: boolean; code?: string; message?: string } | undefined): SvctraceError {
  // Before blaming nf_nat: the mechanism itself, on a function built into
  // every kernel (a kernel without CONFIG_KPROBES, or refusing trampolines).
  if (backend.backend !== 'netfilter' && (err.errno === 2 || err.errno === 3 || err.errno === 1 || err.errno === 95)) {
    const p = kernelProbe(backend.backend);
    // Missing capabilities are the process's, not the kernel's: the load error says so.
    if (p && !p.ok && !(p.code === 'EPERM' && /lacks CAP_/.test(p.message ?? ''))) {
      return new SvctraceError('KERNEL_UNSUPPORTED', `the ${backend.backend} backend does not work on this kernel: ${p.message ?? 'its probe failed'} (${backend.backend === 'kprobe' ? 'needs CONFIG_KPROBES=y' : 'needs BPF trampolines'}); try --backend auto`, {
        errno: err.errno,
        op: err.op,
        cause: err,
      });
    }
  }
  if (backend.backend !== 'netfilter' && (err.errno === 2 || err.errno === 3) && !fs.existsSync('/sys/module/nf_nat')) {
    return new SvctraceError('KERNEL_UNSUPPORTED', `the ${backend.backend} backend observes the nf_nat module, which is not loaded: this node has no NAT rules (no kube-proxy rules yet?)`, {
      errno: err.errno,
      op: err.op,
      cause: err,
    });
  }
  return err;
}
