/**
 * Typed access to the native addon (native/*.cc, built by cmake-js into
 * build/Release/svctrace.node). The shapes here mirror what the addon
 * returns; test/native/binding.test.ts checks them against the real thing.
 */
import path from 'node:path';
import fs from 'node:fs';
import { SvctraceError } from '../errors';

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
}

/** A traced service as the addon takes it: host-order address (0 = any) and port. */
export interface NativeService {
  addr: number;
  port: number;
  proto: number;
  id: number;
}

export interface NativeStats {
  kernelEvents: number;
  ringbufLost: number;
  flowsStarted: number;
  recordsRead: number;
  batchesDelivered: number;
  readerDropped: number;
  malformed: number;
  links: number;
  /** Tracked flows the kernel believes alive (a hint: may over-count). */
  activeFlows: number;
  ctDestroyEvents: number;
  ruleTraceEvents: number;
  ctOverruns: number;
}

export interface NativeTracer {
  load(): void;
  setServices(services: NativeService[]): number;
  attachNetfilter(netnsPath: string): { netnsIno: number; links: number };
  start(onBatch: (batch: Buffer, count: number) => void): void;
  stats(): NativeStats;
  close(): void;
  /** Reads nftables trace messages in a namespace: batches of struct svt_nftrace. */
  traceRules(netnsPath: string, onBatch: (batch: Buffer, count: number) => void): void;
  /** Benchmarks only: emit `count` synthetic events of `flows` flows (needs benchSource). */
  benchEmit(count: number, flows: number): void;
}

export interface NativeBinding {
  Tracer: new (opts?: { snaplen?: number; benchSource?: boolean; allPackets?: boolean }) => NativeTracer;
  probeFeatures(): NativeFeatures;
  layout(): NativeLayout;
  dropReasons(): Record<string, string>;
}

/** Where the addon is built: build/Release under the package root. */
export const ADDON_PATH = path.resolve(__dirname, '..', '..', '..', 'build', 'Release', 'svctrace.node');

let cached: NativeBinding | undefined;

/** Loads the addon once; a missing build is a clear error, not a stack trace. */
export function loadBinding(): NativeBinding {
  if (cached) return cached;
  if (!fs.existsSync(ADDON_PATH)) {
    throw new SvctraceError('NATIVE_MISSING', `native addon not built (${ADDON_PATH}): run 'npm run build'`);
  }
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  cached = require(ADDON_PATH) as NativeBinding;
  return cached;
}
