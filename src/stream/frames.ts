/**
 * Encoding ServerMessages and decoding ClientMessages. Events are encoded
 * once per batch and the bytes reused for every client: a client's frame is
 * the length-delimited copies of the events its filter kept.
 */
import protobuf from 'protobufjs/minimal';
import { svctrace } from '../gen/svctrace';
import { EventWriter } from './event-writer';
import { encodeEvent } from './event-encoder';
import { encodeKernelEvent } from './kernel-event-encoder';
import { KernelIngested } from '../flows/ingested';
import type { Ingested } from '../flows/types';

import pb = svctrace.v1;

export const PROTOCOL_VERSION = pb.ProtocolVersion.PROTOCOL_VERSION_1;

/**
 * A batch of events encoded once, shared by all clients: `bytes` holds each
 * event as one EventBatch.events field (tag, length, message), one after the
 * other; event i is bytes[ends[i-1] .. ends[i]). Frames are concatenations
 * of such ranges: a client that takes the whole batch takes one range.
 */
export interface EncodedBatch {
  /** How many events. */
  count: number;
  /** Event i as a message, for clients that filter (an item's is made then, not before). */
  event(i: number): pb.IEvent;
  bytes: Uint8Array;
  ends: Uint32Array;
  /**
   * The whole batch as one ServerMessage frame: `bytes` behind the frame's
   * header, in the same buffer (bytes is a view of it). A client that takes
   * the whole batch and nothing else sends it as it is, with no copy.
   */
  frame: Uint8Array;
}

// Field numbers from the .proto: ServerMessage.version = 1,
// ServerMessage.events = 3, EventBatch.events = 1.
const WIRE_LEN = 2;
const WIRE_VARINT = 0;
const BATCH_EVENT_TAG = (1 << 3) | WIRE_LEN;

/** Bytes kept for an event's length: events are mostly 128 bytes to 16 KiB (the writer moves those that are not). */
const EVENT_LENGTH_BYTES = 2;

/** One writer for every batch (encoding is synchronous). */
const writer = new EventWriter();

/**
 * Bytes per event of the batches so far (a moving average): a batch is
 * written into a buffer of its own, sized from it with a quarter more, and
 * that buffer is the frame, with no copy (a copy of every batch was a tenth
 * of the stream's time at a million events a second). A batch that needs
 * more grows the buffer, as any write does.
 */
let bytesPerEvent = 256;

/** Room kept before a batch's events for its frame's header: tag and version, tag and a length of up to 5 bytes. */
const HEADER_ROOM = 8;

/** The header of ServerMessage{version, events: EventBatch} whose EventBatch is `total` bytes. */
function frameHeader(total: number): Uint8Array {
  return protobuf.Writer.create()
    .uint32((1 << 3) | WIRE_VARINT)
    .uint32(PROTOCOL_VERSION)
    .uint32((3 << 3) | WIRE_LEN)
    .uint32(total)
    .finish();
}

/**
 * Encodes n events once, into one buffer (no buffer or view per event):
 * `write` writes event i's fields. The buffer starts with the frame header
 * of the whole batch, written into room kept before the events once their
 * length is known.
 */
function encodeBatch(n: number, write: (i: number, w: EventWriter) => void, event: (i: number) => pb.IEvent): EncodedBatch {
  const w = writer;
  w.resetOwned(HEADER_ROOM + Math.ceil(n * bytesPerEvent * 1.25));
  w.skip(HEADER_ROOM);
  const ends = new Uint32Array(n);
  for (let i = 0; i < n; i++) {
    write(i, w.uint32(BATCH_EVENT_TAG).fork(EVENT_LENGTH_BYTES));
    w.ldelim();
    ends[i] = w.len - HEADER_ROOM;
  }
  const header = frameHeader(w.len - HEADER_ROOM);
  const at = HEADER_ROOM - header.byteLength;
  w.put(header, at);
  if (n) bytesPerEvent = (bytesPerEvent * 3 + (w.len - HEADER_ROOM) / n) / 4;
  const frame = w.takeFrom(at);
  return { count: n, event, bytes: frame.subarray(header.byteLength), ends, frame };
}

/** Encodes a batch of events once. */
export function encodeEvents(events: pb.IEvent[]): EncodedBatch {
  return encodeBatch(events.length, (i, w) => encodeEvent(events[i]!, w), (i) => events[i]!);
}

/**
 * One item's Event (its fields, no length): from the kernel record when
 * nobody made its wire event; from the event when somebody did (a sink, the
 * API names), as its holder may have changed it.
 */
export function writeItem(item: Ingested, w: EventWriter): void {
  if (item instanceof KernelIngested && !item.materialized) encodeKernelEvent(item, w);
  else encodeEvent(item.event, w);
}

/**
 * Encodes the flow table's items once. A kernel record whose event nobody
 * made is written from the record (kernel-event-encoder); an event that
 * was made, by a sink or the API names, is written from the event, which
 * is what its holder may have changed.
 */
export function encodeItems(items: readonly Ingested[]): EncodedBatch {
  return encodeBatch(items.length, (i, w) => writeItem(items[i]!, w), (i) => items[i]!.event);
}

/** Event i of a batch, as its EventBatch.events field. */
export function eventBytes(batch: EncodedBatch, i: number): Uint8Array {
  return batch.bytes.subarray(i ? batch.ends[i - 1] : 0, batch.ends[i]);
}

/** A ServerMessage{events: EventBatch{events}} frame built from ranges of encoded batches. */
export function eventsFrame(ranges: readonly Uint8Array[]): Uint8Array {
  let total = 0;
  for (const r of ranges) total += r.byteLength;
  const header = frameHeader(total);
  // Not zero-filled (new Uint8Array is): every byte is copied over below.
  // A buffer of its own, as a batch's frame has: a queued frame's memory is
  // its buffer's (frameMemory).
  const frame = Buffer.allocUnsafeSlow(header.byteLength + total);
  frame.set(header, 0);
  let o = header.byteLength;
  for (const r of ranges) {
    frame.set(r, o);
    o += r.byteLength;
  }
  return frame;
}

/**
 * The memory an events frame keeps alive while queued: its whole buffer
 * (a batch's frame is written into a buffer sized beforehand, a quarter
 * larger than it needs; a frame made from ranges is exactly its bytes).
 */
export function frameMemory(frame: Uint8Array): number {
  return Math.max(frame.byteLength, frame.buffer.byteLength);
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
