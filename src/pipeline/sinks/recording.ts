/**
 * The recording's events (`record`): events appended as EVENTS chunks,
 * flushed every 500 ms or 1 MiB (each chunk one write, so a crash loses at
 * most the last half second); on close, the last chunk and the trailer with
 * the counters, and the file is closed.
 */
import { svctrace } from '../../gen/svctrace';
import { longFromBigint } from '../../flows/to-proto';
import type { KeyObject } from 'node:crypto';
import { ChunkType, ChunkWriter } from '../../record/format';
import { keyId, signChainHead } from '../../record/signing';
import type { Ingested } from '../../flows/types';
import type { Sink } from '../sink';
import { EventWriter } from '../../stream/event-writer';
import { writeItem } from '../../stream/frames';

import pb = svctrace.v1;

const FLUSH_BYTES = 1024 * 1024;
const FLUSH_MS = 500;

/** The trailer's fields the recorder knows, not the sink: counters from the trace and why it ended. */
export type TrailerCounters = Pick<pb.IRecordingTrailer, 'flows' | 'kernelLost' | 'lostByStage' | 'dropsByReason' | 'reason'>;

export class RecordingSink implements Sink {
  readonly name = 'recording';
  events = 0;
  /** The trailer written at close. */
  trailer: pb.IRecordingTrailer | undefined;
  /** The next EVENTS chunk: each event length-delimited, written by the stream's encoders (no message objects for kernel records). */
  private readonly pending = new EventWriter();
  private full = false;
  private readonly flushTimer: NodeJS.Timeout;

  constructor(
    private readonly writer: ChunkWriter,
    private readonly opts: {
      /** Stop recording events once the file reaches this size. */
      maxBytes?: number;
      /** Told once when maxBytes is reached. */
      onFull?: () => void;
      /** The trailer's counters, asked for at close (after the last event). */
      trailer: () => TrailerCounters;
      /** Ed25519 key: the trailer carries a signature of the chain head (record --sign-key). */
      signingKey?: KeyObject;
    },
  ) {
    this.flushTimer = setInterval(() => this.flush(), FLUSH_MS);
    this.flushTimer.unref();
  }

  /** Bytes written so far, including what is waiting to be flushed. */
  get bytes(): number {
    return this.writer.bytes + this.pending.len;
  }

  write(items: Ingested[]): void {
    if (this.full) return;
    const w = this.pending;
    let failed: unknown;
    for (const item of items) {
      // Each event whole or not at all: an encode that threw must not leave
      // half an event in the chunk, which would make the file unreadable.
      // The batch's other events are still written; the failure is told
      // after them (the sink set reports it).
      const mark = w.mark();
      try {
        writeItem(item, w.fork(2)); // length-delimited, as protobufjs's Writer.bytes() writes it
        w.ldelim();
        this.events++;
      } catch (e) {
        w.cutBack(mark);
        failed ??= e;
      }
    }
    if (w.len >= FLUSH_BYTES) this.flush();
    if (failed !== undefined) throw failed;
  }

  private flush(): void {
    if (!this.pending.len) return;
    this.writer.write(ChunkType.EVENTS, this.pending.finish());
    this.pending.reset();
    if (this.opts.maxBytes && this.writer.bytes >= this.opts.maxBytes && !this.full) {
      this.full = true;
      this.opts.onFull?.();
    }
  }

  close(): void {
    clearInterval(this.flushTimer);
    this.flush();
    this.trailer = {
      ...this.opts.trailer(),
      events: this.events,
      endedAt: new Date().toISOString(),
      endedMonoNs: longFromBigint(process.hrtime.bigint()),
    };
    if (this.opts.signingKey) {
      this.trailer.signature = signChainHead(this.writer.chainHead, this.opts.signingKey);
      this.trailer.keyId = keyId(this.opts.signingKey);
    }
    this.writer.write(ChunkType.TRAILER, pb.RecordingTrailer.encode(this.trailer).finish());
    this.writer.close();
  }
}

