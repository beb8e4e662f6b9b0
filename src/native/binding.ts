/**
 * Typed access to the native addon (native/*.cc). It is found by
 * node-gyp-build: a local build (build/Release/svctrace.node, `npm run
 * build`) when there is one, else the package's prebuilt one
 * (prebuilds/linux-<arch>/, scripts/prebuild.sh). The shapes here mirror what
 * the addon returns: test/native/layout.test.ts checks the record layout
 * against the addon's own, and the kernel tests call the rest on a real
 * kernel.
 */
import path from 'node:path';
import { SvctraceError } from '../errors';
import type { Backend } from '../tracer/backend';

/** [offset, size] of a struct field, as compiled (native/layout.cc). */
export type FieldLayout = [number, number];
export interface StructLayout {
  size: number;
  fields: Record<string, FieldLayout>;
}
export interface NativeLayout {
  svt_tuple: StructLayout;
  svt_event: StructLayout;
  svt_nftrace: StructLayout;
  svt_flow_counters: StructLayout;
  svt_flow_stats: StructLayout;
  kinds: Record<string, number>;
  consts: Record<string, number>;
}

export interface ProbeResult {
  ok: boolean;
  code?: string;
  errno?: number;
  message?: string;
}
export interface NativeFeatures {
  ringbuf: ProbeResult;
  netfilterLink: ProbeResult;
  tpBtf: ProbeResult;
  kprobe: ProbeResult;
  fentry: ProbeResult;
  /** fentry on nf_nat's PRE_ROUTING hook function: the fentry backend's need. */
  natFentry: ProbeResult;
  /** kprobe on the same function: the kprobe backend's need. */
  natKprobe: ProbeResult;
  /** tp_btf/kfree_skb reading its drop reason (Linux >= 5.17). */
  dropReason: ProbeResult;
}

/** A traced service as the addon takes it: host-order address (0 = any) and port. */
export interface NativeService {
  addr: number;
  port: number;
  proto: number;
  id: number;
}

export interface NativeStats {
  /** Records written into the ring buffer (events and flow counters). */
  kernelEvents: number;
  /** Records the kernel could not write: the ring buffer was full (JS behind). */
  ringbufLost: number;
  flowsStarted: number;
  /** Flows the kernel could not keep counters for (svt_flow_state full), and the rare new entry's first counters the conntrack listener could not put back (a race with its next packet). */
  flowStateFull: number;
  /** Flows none of whose records fit the ring buffer, their final counters included: seen by no output. */
  flowsUnseen: number;
  /** Of those, the ones a TCP reset ended (connection attempts, mostly). */
  flowsUnseenReset: number;
  /** kprobe backend: NAT hook returns whose entry was lost, so their after-NAT view is lost. */
  natExitUnmatched: number;
  /** Tracked flows started over the detail budget (detailRate): counted in the kernel, their transitions not reported. Not a loss. */
  flowsCountedOnly: number;
  /** Packets of tracked flows counted in the kernel (never reported one by one). */
  packetsCounted: number;
  ringBufferBytes: number;
  recordsRead: number;
  batchesDelivered: number;
  /** Records read from the ring but not handed to JS when the reader stopped. */
  readerLostAtClose: number;
  /** Times the reader held back because JS held its maximum of batches. */
  readerHeldBack: number;
  malformed: number;
  /** Not yet delivered: bytes in the ring, records pending in the reader, batches JS holds. */
  ringBacklogBytes: number;
  readerPending: number;
  batchesInFlight: number;
  links: number;
  /** The attach backend this tracer was loaded with. */
  backend: Backend;
  /** Tracked flows the kernel believes alive (a hint: may over-count). */
  activeFlows: number;
  /**
   * Conntrack destroys still to come for entries a new entry with the same
   * tuple replaced (a client reusing its port): each is taken off when it
   * comes, and its destroy is not told again. A hint: may over-count.
   */
  staleDestroysOwed: number;
  ctDestroyEvents: number;
  /**
   * Conntrack destroy messages the listeners read, traced or not. A socket
   * filter in the kernel keeps only traced services' (up to 512 services):
   * destroys of other connections on the node cost svctrace no read.
   */
  ctDestroysRead: number;
  /**
   * A destroy's map lookups and deletes run as two BPF programs
   * (BPF_PROG_TYPE_SYSCALL, Linux 5.14+), one syscall each, instead of five
   * map syscalls on the conntrack listener's thread.
   */
  ctDestroyPrograms: boolean;
  /**
   * Packets of destroyed entries that conntrack's accounting counted and the
   * counting hook did not (a kprobe program skipped while the CPU ran
   * another BPF program or syscall; a packet dropped between conntrack and
   * NAT): their flows' final counters were raised to conntrack's. Zero
   * where conntrack accounting is off (nothing to compare).
   */
  packetsMissedByHooks: number;
  /**
   * Runs of svctrace's programs the kernel skipped, as the kernel counts
   * them (bpf_prog_info.recursion_misses, summed): a trampoline's program
   * (fentry, tp_btf) already running on that CPU, or for a kprobe any BPF
   * program or syscall (counted since Linux 6.7). 0 where the kernel does
   * not count them.
   */
  hookRunsSkipped: number;
  ruleTraceEvents: number;
  /** Conntrack DESTROY messages the kernel dropped for want of room in our socket (every one, where the kernel counts them; untraced entries' included: an upper bound on events lost). */
  ctOverruns: number;
  /** The same for nftables trace messages. */
  ruleTraceOverruns: number;
  /** Netlink records read but not handed to JS when a listener stopped. */
  listenerLostAtClose: number;
}

/** One loaded program, from the kernel's bpf_prog_info. */
export interface LoadedProgram {
  name: string;
  /** The kernel's program id (bpftool prog show id N). */
  id: number;
  /** Runs and time in them: counted only while kernel.bpf_stats_enabled is on. */
  runs: number;
  runTimeNs: number;
  /** Runs the kernel skipped (recursion_misses). */
  runsSkipped: number;
}

export interface NativeTracer {
  load(): void;
  setServices(services: NativeService[]): number;
  attachNetfilter(netnsPath: string): { netnsIno: number; links: number };
  /** channel: 0 the BPF ring buffer, 1 a conntrack netlink listener (native/batch_sink.h). */
  /** `batch` is the addon's buffer, valid during the call only (reused for the next batch): copy what you keep. */
  start(onBatch: (batch: Uint8Array, count: number, channel: number) => void): void;
  stats(): NativeStats;
  /** Everything the ring produced so far has reached JS (stats()'s ringBacklogBytes, readerPending and batchesInFlight all 0), without stats()'s syscalls. */
  deliveryIdle(): boolean;
  /** Asks the netlink listeners (conntrack destroys, rule traces) to hand over what their sockets hold now, at once: a generation for listenersFlushed. */
  flushListeners(): number;
  /** Every listener has handed over what it held at flushListeners() returning `gen`, and JS has handled those batches. */
  listenersFlushed(gen: number): boolean;
  /** The last stats, once the programs are detached and the reader and listeners stopped (readerLostAtClose: what never reached JS); undefined when already closed. */
  close(): NativeStats | undefined;
  /** Reads nftables trace messages in a namespace: batches of struct svt_nftrace. */
  /** As for `start`: `batch` is valid during the call only. */
  traceRules(netnsPath: string, onBatch: (batch: Uint8Array, count: number) => void): void;
  /** Removes the kernel state of flows idle for idleMs; returns their final counters (svt_flow_stats records). */
  expireFlowState(idleMs: number): Buffer;
  /** Every tracked flow's counters now (svt_flow_stats records, periodic). */
  snapshotFlowState(): Buffer;
  /** { [value]: name } of this kernel's drop reasons (enum skb_drop_reason; UNKNOWN where kfree_skb has none). */
  dropReasons(): Record<string, string>;
  /** The loaded programs, as the kernel reports them (bpftool prog show). */
  programs(): LoadedProgram[];
  /** Benchmarks only: emit `count` synthetic events of `flows` flows (needs benchSource). */
  benchEmit(count: number, flows: number): void;
}

export interface NativeBinding {
  Tracer: new (opts?: { backend?: Backend; snaplen?: number; benchSource?: boolean; allPackets?: boolean; ringBufferBytes?: number; statsIntervalMs?: number; detailRate?: number }) => NativeTracer;
  /** Every kernel probe, or only the named ones (the rest are then absent). */
  probeFeatures(names?: Array<keyof NativeFeatures>): NativeFeatures;
  layout(): NativeLayout;
  /** malloc_trim(0): gives glibc's free pages back to the system; true if any were. */
  releaseFreeMemory(): boolean;
  /** The same on libuv's thread pool, off the JS thread; `done` gets whether any were. */
  releaseFreeMemory(done: (released: boolean) => void): void;
}

/** The package root: where build/ and prebuilds/ are. */
const PACKAGE_ROOT = path.resolve(__dirname, '..', '..', '..');

/** The addon this process loads, or a clear error saying what was looked for and how to get one. */
export function addonPath(): string {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const nodeGypBuild = require('node-gyp-build') as { resolve(dir: string): string };
    return nodeGypBuild.resolve(PACKAGE_ROOT);
  } catch (e) {
    const wanted = (e as Error).message.split('\n')[0]!.replace(/^No native build was found for /, '');
    throw new SvctraceError(
      'NATIVE_MISSING',
      `no native addon for this machine (${wanted}) in ${PACKAGE_ROOT}: neither a local build (build/Release) nor a prebuilt one (prebuilds/); build it with 'npm run build' (needs clang, cmake, bpftool and libbpf-dev: scripts/setup-system.sh)`,
    );
  }
}

let cached: NativeBinding | undefined;

/** Loads the addon once; a missing or unloadable build is a clear error, not a stack trace. */
export function loadBinding(): NativeBinding {
  if (cached) return cached;
  const file = addonPath();
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    cached = require(file) as NativeBinding;
  } catch (e) {
    throw new SvctraceError('NATIVE_MISSING', `the native addon ${file} does not load here: ${(e as Error).message.split('\n')[0]}`);
  }
  return cached;
}
