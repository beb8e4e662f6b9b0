/** Reading a recording's chunks into messages, with every problem located. */
import fs from 'node:fs';
import protobuf from 'protobufjs/minimal';
import { svctrace } from '../gen/svctrace';
import { Chunk, CHUNK_NAMES, ChunkType, iterChunks, Problem, WalkResult } from './format';

import pb = svctrace.v1;

export interface Recording {
  header?: pb.RecordingHeader;
  snapshot?: pb.NodeSnapshot;
  trailer?: pb.RecordingTrailer;
  eventCount: number;
  eventChunks: number;
  chunks: number;
  size: number;
  /** Bytes from the start that are intact. */
  validBytes: number;
  /** The chain hash the trailer's signature covers (the hash before the trailer chunk). */
  signedHead?: Buffer;
  problems: Problem[];
}

/** Events handed on at a time: memory stays bounded whatever a chunk holds (a crafted one can hold millions). */
export const EVENTS_PER_SLICE = 4096;
/** svctrace writes no event shorter than this (its wall-clock timestamp alone takes 10 bytes). */
const MIN_EVENT_BYTES = 8;

/**
 * Decodes the length-delimited Events of an events chunk, a slice at a
 * time. An entry shorter than any event svctrace writes (e.g. a run of
 * zero bytes: empty events by the million) is a damaged payload.
 */
export function* decodeEventsPayload(payload: Uint8Array): Generator<pb.Event[], void, void> {
  const r = protobuf.Reader.create(payload);
  let out: pb.Event[] = [];
  while (r.pos < r.len) {
    const at = r.pos;
    const len = r.uint32();
    if (len < MIN_EVENT_BYTES) throw new Error(`an event of ${len} bytes at payload offset ${at} (svctrace writes none under ${MIN_EVENT_BYTES})`);
    out.push(pb.Event.decode(r, len));
    if (out.length >= EVENTS_PER_SLICE) {
      yield out;
      out = [];
    }
  }
  if (out.length) yield out;
}

/**
 * Reads a recording. `onEvents` gets each verified events chunk, in order,
 * with the recording so far (its header and snapshot come first).
 */
export function readRecording(path: string, onEvents?: (events: pb.Event[], chunk: Chunk, rec: Recording) => void): Recording {
  const it = iterRecording(path);
  try {
    for (;;) {
      const r = it.next();
      if (r.done) return r.value;
      onEvents?.(r.value.events, r.value.chunk, r.value.rec);
    }
  } finally {
    // A callback that threw (a full disk under export) leaves no file open.
    it.return({ eventCount: 0, eventChunks: 0, chunks: 0, size: 0, validBytes: 0, problems: [] });
  }
}

/**
 * Yields each events chunk's events, in slices of at most EVENTS_PER_SLICE
 * (with the recording so far), then returns
 * the whole Recording with its problems. Payloads that fail to decode despite
 * a valid hash (a writer bug, not tampering) are problems too.
 */
export function* iterRecording(path: string): Generator<{ events: pb.Event[]; chunk: Chunk; rec: Recording }, Recording, void> {
  const rec: Recording = { eventCount: 0, eventChunks: 0, chunks: 0, size: 0, validBytes: 0, problems: [] };
  const it = iterChunks(path);
  // The file is closed however the walk ends: at its end, on a problem, or
  // when the consumer stops early (return(): replay's Ctrl-C) or throws.
  try {
    let decodeProblem: Problem | undefined;
    let r = it.next();
    while (!r.done) {
      const c = r.value;
      // The order the format fixes: header, snapshot (at most one, before any
      // events; a recording may have none), events, trailer (iterChunks).
      const outOfOrder =
        c.index === 0 && c.type !== ChunkType.HEADER
          ? 'the first chunk is not the header'
          : c.type === ChunkType.HEADER && c.index !== 0
            ? 'a second header'
            : c.type === ChunkType.SNAPSHOT && (rec.snapshot || rec.eventChunks)
              ? rec.snapshot
                ? 'a second snapshot'
                : 'a snapshot after events'
              : undefined;
      if (outOfOrder) {
        decodeProblem = { kind: 'order', offset: c.offset, chunk: c.index, message: `chunk ${c.index} (${CHUNK_NAMES[c.type]}) at offset ${c.offset} is out of order: ${outOfOrder}`, corrupt: true };
        break;
      }
      try {
        switch (c.type) {
          case ChunkType.HEADER:
            rec.header = pb.RecordingHeader.decode(c.payload);
            break;
          case ChunkType.SNAPSHOT:
            rec.snapshot = pb.NodeSnapshot.decode(c.payload);
            break;
          case ChunkType.EVENTS:
            rec.eventChunks++;
            for (const events of decodeEventsPayload(c.payload)) {
              rec.eventCount += events.length;
              yield { events, chunk: c, rec };
            }
            break;
          case ChunkType.TRAILER:
            rec.trailer = pb.RecordingTrailer.decode(c.payload);
            rec.signedHead = c.prevHash;
            break;
        }
      } catch (e) {
        decodeProblem = {
          kind: 'bad-payload',
          offset: c.offset,
          chunk: c.index,
          message: `chunk ${c.index} (${CHUNK_NAMES[c.type]}) at offset ${c.offset} does not decode: ${(e as Error).message}`,
          corrupt: true,
        };
        break;
      }
      r = it.next();
    }
    if (decodeProblem) {
      rec.problems.push(decodeProblem);
      rec.validBytes = decodeProblem.offset;
      rec.size = fs.statSync(path).size;
      it.return({ problems: [], validBytes: 0, chunks: 0, size: 0 });
      return rec;
    }
    const walk = r.value as WalkResult;
    rec.problems.push(...walk.problems);
    rec.chunks = walk.chunks;
    rec.size = walk.size;
    rec.validBytes = walk.validBytes;
    return rec;
  } finally {
    it.return({ problems: [], validBytes: 0, chunks: 0, size: 0 });
  }
}
