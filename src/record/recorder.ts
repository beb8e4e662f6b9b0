/**
 * `svctrace record`: a trace whose output is a recording — header, node
 * snapshot, then the live events in chunks (pipeline/sinks/recording), and a
 * trailer with the counters when the recording ends (duration, size limit or
 * signal).
 */
import fs from 'node:fs';
import os from 'node:os';
import Long from 'long';
import { longFromBigint } from '../flows/to-proto';
import { svctrace } from '../gen/svctrace';
import { SvctraceError } from '../errors';
import { ServiceSpec } from '../net/ipv4';
import { Pipeline } from '../pipeline/pipeline';
import { totalLost } from '../tracer/losses';
import { waitForStop } from '../pipeline/lifecycle';
import { RecordingSink } from '../pipeline/sinks/recording';
import { serviceLabel } from '../flows/service-ids';
import { runDoctor } from '../doctor/doctor';
import { VERSION } from '../version';
import { ChunkType, ChunkWriter } from './format';
import { takeSnapshot } from './snapshot';
import { nodeName } from '../node-name';

import pb = svctrace.v1;

export interface RecordOptions {
  path: string;
  services: ServiceSpec[];
  /** Namespaces (names or paths); default: svctrace's own. */
  netns?: string[];
  /** Kubeconfig to name services and pods with (see PipelineOptions.kubeconfig). */
  kubeconfig?: string | false;
  snaplen: number;
  allPackets?: boolean;
  attachBackend?: import('../tracer/backend').BackendRequest;
  ringBufferBytes?: number;
  statsIntervalMs?: number;
  /** See PipelineOptions.detailRate. */
  detailRate?: number;
  durationS?: number;
  maxBytes?: number;
  overwrite?: boolean;
  command?: string;
  onWarning?: (message: string) => void;
  /** Called about once a second with progress. */
  onProgress?: (p: { events: number; bytes: number; elapsedS: number }) => void;
  /** Ed25519 private key: the trailer is signed (see record/signing). */
  signingKey?: import('node:crypto').KeyObject;
  /** Tracing runs and the recording is being written (the hooks are attached). */
  onStarted?: () => void;
}

function mono(): Long {
  return longFromBigint(process.hrtime.bigint());
}

function createWriter(path: string, overwrite?: boolean): ChunkWriter {
  try {
    return new ChunkWriter(path, overwrite);
  } catch (e) {
    if (e instanceof SvctraceError) throw e; // WRITE_FAILED: created, but its first bytes could not be written
    const code = (e as NodeJS.ErrnoException).code;
    throw new SvctraceError('BAD_INPUT', code === 'EEXIST' ? `${path} exists (use --force to overwrite)` : `cannot create ${path}: ${code ?? (e as Error).message}`);
  }
}

export async function record(opts: RecordOptions): Promise<pb.IRecordingTrailer> {
  let stopReason: string | undefined;
  // The recording ends early: --max-size reached, or a write failed.
  const endEarly = new AbortController();
  let events: RecordingSink | undefined;
  let created = false;
  // A recording that never started tracing (refused attach, bad namespace)
  // is no evidence of anything: it is removed, not left half-written.
  const pipeline = await Pipeline.start(
    {
      services: opts.services,
      netns: opts.netns,
      kubeconfig: opts.kubeconfig,
      snaplen: opts.snaplen,
      allPackets: opts.allPackets,
      attachBackend: opts.attachBackend,
      ringBufferBytes: opts.ringBufferBytes,
      statsIntervalMs: opts.statsIntervalMs,
      detailRate: opts.detailRate,
      onWarning: opts.onWarning,
      holdSignalsWhileStarting: true, // it waits for the stop signals itself, below
    },
    async (ctx) => {
      const writer = createWriter(opts.path, opts.overwrite);
      created = true;
      const doctor = runDoctor();
      writer.write(
        ChunkType.HEADER,
        pb.RecordingHeader.encode({
          toolVersion: VERSION,
          protocolVersion: pb.ProtocolVersion.PROTOCOL_VERSION_1,
          node: nodeName(),
          kernel: os.release(),
          startedAt: new Date().toISOString(),
          startedMonoNs: mono(),
          services: ctx.services.map(serviceLabel),
          netns: [...ctx.netns],
          capabilities: Object.fromEntries(doctor.checks.map((c) => [c.id, c.ok])),
          snaplen: opts.snaplen,
          command: opts.command ?? '',
          attachBackend: ctx.attachBackend.reason,
        }).finish(),
      );
      writer.write(ChunkType.SNAPSHOT, pb.NodeSnapshot.encode(await takeSnapshot([...ctx.netns], [...ctx.services])).finish());
      events = new RecordingSink(writer, {
        maxBytes: opts.maxBytes,
        signingKey: opts.signingKey,
        onFull: () => {
          stopReason ??= 'max-size';
          endEarly.abort();
        },
        onWriteError: () => {
          // Told once, at the end, with what the file holds (below).
          stopReason ??= 'write-error';
          endEarly.abort();
        },
        trailer: () => {
          const summary = ctx.flows.summary();
          const losses = ctx.losses();
          // A trace that failed to start still ends its recording.
          return { flows: summary.flows, kernelLost: totalLost(losses), lostByStage: losses as Record<string, number>, dropsByReason: summary.dropsByReason, reason: stopReason ?? 'error' };
        },
      });
      return [events];
    },
  ).catch((e: unknown) => {
    // (Only a regular file: -o /dev/null --force must not remove the device.)
    if (created && fs.statSync(opts.path, { throwIfNoEntry: false })?.isFile()) fs.rmSync(opts.path, { force: true });
    throw e;
  });
  const sink = events!;
  opts.onStarted?.();
  const started = Date.now();
  const progressTimer = setInterval(() => opts.onProgress?.({ events: sink.events, bytes: sink.bytes, elapsedS: (Date.now() - started) / 1000 }), 1000);
  try {
    // (A Ctrl-C while the pipeline started returns at once: the recording still gets its trailer.)
    const why = await waitForStop(opts.durationS, AbortSignal.any([endEarly.signal, pipeline.allNetnsGone]));
    if (pipeline.allNetnsGone.aborted) stopReason ??= 'netns-deleted';
    stopReason ??= why === 'timeout' ? 'duration' : 'signal';
  } finally {
    clearInterval(progressTimer);
    await pipeline.stop();
  }
  const failure = sink.failure;
  if (failure) {
    // What is in the file is good evidence up to the failure: say what it holds and what it misses.
    const holds = sink.trailer ? 'its trailer says so' : 'it is cut short there (verify reads it)';
    throw new SvctraceError('WRITE_FAILED', `${failure.message}; the recording holds the first ${sink.events} events, ${sink.lost} were not recorded; ${holds}`, { cause: failure });
  }
  if (!sink.trailer) throw new SvctraceError('INTERNAL', `${opts.path}: the recording could not be completed`);
  // The recording is complete (its trailer says why it ended); the command still fails.
  pipeline.throwIfNetnsGone();
  return sink.trailer;
}
