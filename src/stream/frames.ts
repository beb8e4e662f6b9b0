/**
 * Encoding ServerMessages and decoding ClientMessages. Events are encoded
 * once per batch and the bytes reused for every client: a client's frame is
 * the length-delimited copies of the events its filter kept.
 */
import protobuf from 'protobufjs/minimal';
import { svctrace } from '../gen/svctrace';
import { EventWriter } from './event-writer';
import { encodeEvent } from './event-encoder';

import pb = svctrace.v1;

export const PROTOCOL_VERSION = pb.ProtocolVersion.PROTOCOL_VERSION_1;

/**
 * A batch of events encoded once, shared by all clients: `bytes` holds each
 * event as one EventBatch.events field (tag, length, message), one after the
 * other; event i is bytes[ends[i-1] .. ends[i]). Frames are concatenations
 * of such ranges: a client that takes the whole batch takes one range.
 */
export interface EncodedBatch {
  events: pb.IEvent[];
  bytes: Uint8Array;
  ends: Uint32Array;
}

// Field numbers from the .proto: ServerMessage.version = 1,
// ServerMessage.events = 3, EventBatch.events = 1.
const WIRE_LEN = 2;
const WIRE_VARINT = 0;
const BATCH_EVENT_TAG = (1 << 3) | WIRE_LEN;

/** Bytes kept for an event's length: events are mostly 128 bytes to 16 KiB (the writer moves those that are not). */
const EVENT_LENGTH_BYTES = 2;

/** One writer for every batch (encoding is synchronous): its buffer is reused. */
const writer = new EventWriter();

/** Encodes a batch once, into one buffer (no buffer or view per event). */
export function encodeEvents(events: pb.IEvent[]): EncodedBatch {
  const w = writer;
  w.reset();
  const ends = new Uint32Array(events.length);
  for (let i = 0; i < events.length; i++) {
    encodeEvent(events[i]!, w.uint32(BATCH_EVENT_TAG).fork(EVENT_LENGTH_BYTES));
    w.ldelim();
    ends[i] = w.len;
  }
  return { events, bytes: w.finish(), ends };
}

/** Event i of a batch, as its EventBatch.events field. */
export function eventBytes(batch: EncodedBatch, i: number): Uint8Array {
  return batch.bytes.subarray(i ? batch.ends[i - 1] : 0, batch.ends[i]);
}

/** A ServerMessage{events: EventBatch{events}} frame built from ranges of encoded batches. */
export function eventsFrame(ranges: readonly Uint8Array[]): Uint8Array {
  let total = 0;
  for (const r of ranges) total += r.byteLength;
  const header = protobuf.Writer.create()
    .uint32((1 << 3) | WIRE_VARINT)
    .uint32(PROTOCOL_VERSION)
    .uint32((3 << 3) | WIRE_LEN)
    .uint32(total)
    .finish();
  const frame = new Uint8Array(header.byteLength + total);
  frame.set(header, 0);
  let o = header.byteLength;
  for (const r of ranges) {
    frame.set(r, o);
    o += r.byteLength;
  }
  return frame;
}

export function serverFrame(body: Omit<pb.IServerMessage, 'version'>): Uint8Array {
  return pb.ServerMessage.encode({ version: PROTOCOL_VERSION, ...body }).finish();
}

export function errorFrame(code: string, message: string, fatal = false): Uint8Array {
  return serverFrame({ error: { code, message, fatal } });
}

/** Decodes a client frame; returns an error sentence instead of throwing. */
export function decodeClientMessage(data: Uint8Array): { msg?: pb.ClientMessage; error?: string } {
  let msg: pb.ClientMessage;
  try {
    msg = pb.ClientMessage.decode(data);
  } catch (e) {
    return { error: `not a svctrace.v1.ClientMessage: ${(e as Error).message}` };
  }
  if (!msg.body) return { error: 'ClientMessage has no body (subscribe, pause, resume or ping)' };
  return { msg };
}
