/**
 * `svctrace record`: header, node snapshot, then the live events in chunks
 * (flushed every 500 ms or 1 MiB, each chunk one write, so a crash loses at
 * most the last half second), and a trailer with the counters when the
 * recording ends (duration, size limit or signal).
 */
import os from 'node:os';
import protobuf from 'protobufjs/minimal';
import Long from 'long';
import { longFromBigint } from '../flows/to-proto';
import { svctrace } from '../gen/svctrace';
import { SvctraceError } from '../errors';
import { ServiceSpec } from '../net/ipv4';
import { FlowTracer } from '../tracer/flow-tracer';
import { totalLost } from '../tracer/losses';
import { resolveNetns } from '../tracer/netns';
import { waitForStop } from '../tracer/session';
import { serviceLabel } from '../flows/flow-table';
import { runDoctor } from '../doctor/doctor';
import { VERSION } from '../version';
import { ChunkType, ChunkWriter } from './format';
import { takeSnapshot } from './snapshot';

import pb = svctrace.v1;

const FLUSH_BYTES = 1024 * 1024;
const FLUSH_MS = 500;

export interface RecordOptions {
  path: string;
  services: ServiceSpec[];
  netns: string[];
  snaplen: number;
  allPackets?: boolean;
  durationS?: number;
  maxBytes?: number;
  overwrite?: boolean;
  command?: string;
  /** Called about once a second with progress. */
  onProgress?: (p: { events: number; bytes: number; elapsedS: number }) => void;
}

function mono(): Long {
  return longFromBigint(process.hrtime.bigint());
}

export async function record(opts: RecordOptions): Promise<pb.IRecordingTrailer> {
  const netnsPaths = opts.netns.map(resolveNetns);
  let writer: ChunkWriter;
  try {
    writer = new ChunkWriter(opts.path, opts.overwrite);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new SvctraceError('BAD_INPUT', code === 'EEXIST' ? `${opts.path} exists (use --force to overwrite)` : `cannot create ${opts.path}: ${code ?? (e as Error).message}`);
  }
  const doctor = runDoctor();
  writer.write(
    ChunkType.HEADER,
    pb.RecordingHeader.encode({
      toolVersion: VERSION,
      protocolVersion: pb.ProtocolVersion.PROTOCOL_VERSION_1,
      node: os.hostname(),
      kernel: os.release(),
      startedAt: new Date().toISOString(),
      startedMonoNs: mono(),
      services: opts.services.map(serviceLabel),
      netns: netnsPaths,
      capabilities: Object.fromEntries(doctor.checks.map((c) => [c.id, c.ok])),
      snaplen: opts.snaplen,
      command: opts.command ?? '',
    }).finish(),
  );
  writer.write(ChunkType.SNAPSHOT, pb.NodeSnapshot.encode(await takeSnapshot(netnsPaths, opts.services)).finish());

  let pending = protobuf.Writer.create();
  let pendingBytes = 0;
  let events = 0;
  let stopReason: string | null = null;
  const sizeReached = new AbortController();

  const flush = () => {
    if (!pendingBytes) return;
    writer.write(ChunkType.EVENTS, pending.finish());
    pending = protobuf.Writer.create();
    pendingBytes = 0;
    if (opts.maxBytes && writer.bytes >= opts.maxBytes && !stopReason) {
      stopReason = 'max-size';
      sizeReached.abort();
    }
  };

  const tracer = FlowTracer.start({
    services: opts.services,
    netns: netnsPaths,
    snaplen: opts.snaplen,
    allPackets: opts.allPackets,
    onWarning: (w) => process.stderr.write(`svctrace: warning: ${w}\n`),
    onIngested: (items) => {
      if (stopReason === 'max-size') return;
      for (const { event } of items) {
        const bytes = pb.Event.encode(event).finish();
        pending.bytes(bytes); // length-delimited
        pendingBytes += bytes.length + 5;
        events++;
      }
      if (pendingBytes >= FLUSH_BYTES) flush();
    },
  });
  const started = Date.now();
  const flushTimer = setInterval(flush, FLUSH_MS);
  const progressTimer = setInterval(() => opts.onProgress?.({ events, bytes: writer.bytes + pendingBytes, elapsedS: (Date.now() - started) / 1000 }), 1000);
  try {
    const why = await waitForStop(opts.durationS, sizeReached.signal);
    stopReason ??= why === 'timeout' ? 'duration' : 'signal';
  } finally {
    clearInterval(flushTimer);
    clearInterval(progressTimer);
  }
  const { summary, stats } = await tracer.stop();
  flush();
  const trailer: pb.IRecordingTrailer = {
    events,
    flows: summary.flows,
    kernelLost: totalLost(tracer.losses()),
    lostByStage: tracer.losses() as Record<string, number>,
    endedAt: new Date().toISOString(),
    endedMonoNs: mono(),
    dropsByReason: summary.dropsByReason,
    reason: stopReason ?? 'signal',
  };
  writer.write(ChunkType.TRAILER, pb.RecordingTrailer.encode(trailer).finish());
  writer.close();
  return trailer;
}
