/**
 * The recording's events (`record`): events appended as EVENTS chunks,
 * flushed every 500 ms or 1 MiB (each chunk one write, so a crash loses at
 * most the last half second); on close, the last chunk and the trailer with
 * the counters, and the file is closed.
 *
 * Every event handed to the sink is either in the file or counted in `lost`
 * (the trailer's lostByStage.recording): one that failed to encode, one that
 * came after --max-size was reached, or one whose chunk could not be written.
 * A write error (disk full, I/O error) stops the recording, never the
 * process: the file keeps its whole chunks, and onWriteError is told.
 */
import { svctrace } from '../../gen/svctrace';
import { longFromBigint } from '../../flows/to-proto';
import type { KeyObject } from 'node:crypto';
import { ChunkType, ChunkWriter } from '../../record/format';
import { keyId, signChainHead } from '../../record/signing';
import type { Ingested } from '../../flows/types';
import { CountedSinkFailure, type Sink } from '../sink';
import { EventWriter } from '../../stream/event-writer';
import { writeItem } from '../../stream/frames';
import { SvctraceError } from '../../errors';

import pb = svctrace.v1;

const FLUSH_BYTES = 1024 * 1024;
const FLUSH_MS = 500;

function isWriteFailure(e: unknown): e is SvctraceError {
  return e instanceof SvctraceError && e.code === 'WRITE_FAILED';
}

/** The trailer's fields the recorder knows, not the sink: counters from the trace and why it ended. */
export type TrailerCounters = Pick<pb.IRecordingTrailer, 'flows' | 'kernelLost' | 'lostByStage' | 'dropsByReason' | 'reason'>;

export class RecordingSink implements Sink {
  readonly name = 'recording';
  /** Events in the file (written chunks). */
  events = 0;
  /** Events handed to the sink that are not in the file (see above). */
  lost = 0;
  /** The trailer written at close. */
  trailer: pb.IRecordingTrailer | undefined;
  /** The next EVENTS chunk: each event length-delimited, written by the stream's encoders (no message objects for kernel records). */
  private readonly pending = new EventWriter();
  private pendingEvents = 0;
  private full = false;
  private readonly flushTimer: NodeJS.Timeout;

  constructor(
    private readonly writer: ChunkWriter,
    private readonly opts: {
      /** Stop recording events once the file reaches this size. */
      maxBytes?: number;
      /** Told once when maxBytes is reached. */
      onFull?: () => void;
      /** Told once when a write failed: the recording takes no more events. */
      onWriteError?: (e: Error) => void;
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

  /** The write error that stopped the recording. */
  get failure(): Error | undefined {
    return this.writer.failure;
  }

  write(items: Ingested[]): void {
    if (this.full || this.writer.failure) {
      this.lost += items.length;
      return;
    }
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
        this.pendingEvents++;
      } catch (e) {
        w.cutBack(mark);
        this.lost++;
        failed ??= e;
      }
    }
    // Every event this sink fails on is counted in its own stage
    // (`recording`), never again by the sink set.
    if (w.len >= FLUSH_BYTES) {
      try {
        this.flush();
      } catch (e) {
        throw new CountedSinkFailure(e);
      }
    }
    if (failed !== undefined) throw new CountedSinkFailure(failed);
  }

  /** Writes the pending events as one chunk; a write error is kept (the timer that calls this must not throw). */
  private flush(): void {
    if (!this.pending.len) return;
    const n = this.pendingEvents;
    const chunk = this.pending.finish();
    this.pending.reset();
    this.pendingEvents = 0;
    try {
      this.writer.write(ChunkType.EVENTS, chunk);
      this.events += n;
    } catch (e) {
      this.lost += n;
      if (!isWriteFailure(e)) throw e;
      this.opts.onWriteError?.(e);
      return;
    }
    if (this.opts.maxBytes && this.writer.bytes >= this.opts.maxBytes && !this.full) {
      this.full = true;
      this.opts.onFull?.();
    }
  }

  /**
   * Writes the last chunk and the trailer, and closes the file. After a
   * write error the trailer is still tried (the device may have room again);
   * if it cannot be written the file ends cut short at its last whole chunk.
   */
  close(): void {
    clearInterval(this.flushTimer);
    this.flush();
    const counters = this.opts.trailer();
    this.trailer = {
      ...counters,
      kernelLost: Number(counters.kernelLost ?? 0) + this.lost,
      lostByStage: { ...counters.lostByStage, recording: this.lost },
      events: this.events,
      endedAt: new Date().toISOString(),
      endedMonoNs: longFromBigint(process.hrtime.bigint()),
    };
    if (this.opts.signingKey) {
      this.trailer.signature = signChainHead(this.writer.chainHead, this.opts.signingKey);
      this.trailer.keyId = keyId(this.opts.signingKey);
    }
    try {
      this.writer.write(ChunkType.TRAILER, pb.RecordingTrailer.encode(this.trailer).finish());
    } catch (e) {
      this.trailer = undefined;
      if (!isWriteFailure(e)) throw e;
    } finally {
      this.writer.close();
    }
  }
}

