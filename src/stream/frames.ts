/**
 * Encoding ServerMessages and decoding ClientMessages. Events are encoded
 * once per batch and the bytes reused for every client: a client's frame is
 * the length-delimited copies of the events its filter kept.
 */
import protobuf from 'protobufjs/minimal';
import { svctrace } from '../gen/svctrace';
import { EventWriter } from './event-writer';

import pb = svctrace.v1;

export const PROTOCOL_VERSION = pb.ProtocolVersion.PROTOCOL_VERSION_1;

/** An event with its encoded bytes, shared by all clients. */
export interface EncodedEvent {
  event: pb.IEvent;
  /** The event as one EventBatch.events field (tag, length, message): frames are concatenations of these. */
  bytes: Uint8Array;
}

// Field numbers from the .proto: ServerMessage.version = 1,
// ServerMessage.events = 3, EventBatch.events = 1.
const WIRE_LEN = 2;
const WIRE_VARINT = 0;
const BATCH_EVENT_TAG = (1 << 3) | WIRE_LEN;

/** One writer for every batch (encoding is synchronous): its buffer is reused. */
const writer = new EventWriter();

/**
 * Encodes a batch once, into one buffer: each event's bytes are a view of
 * it (no buffer per event, no second copy to frame them).
 */
export function encodeEvents(events: pb.IEvent[]): EncodedEvent[] {
  const w = writer;
  w.reset();
  const ends: number[] = new Array(events.length);
  for (let i = 0; i < events.length; i++) {
    pb.Event.encode(events[i]!, w.uint32(BATCH_EVENT_TAG).fork().asWriter());
    w.ldelim();
    ends[i] = w.len;
  }
  const buf = w.finish();
  const out: EncodedEvent[] = new Array(events.length);
  let start = 0;
  for (let i = 0; i < events.length; i++) {
    out[i] = { event: events[i]!, bytes: buf.subarray(start, ends[i]) };
    start = ends[i]!;
  }
  return out;
}

/** A ServerMessage{events: EventBatch{events}} frame built from pre-encoded events. */
export function eventsFrame(events: EncodedEvent[]): Uint8Array {
  let total = 0;
  for (const e of events) total += e.bytes.byteLength;
  const header = protobuf.Writer.create()
    .uint32((1 << 3) | WIRE_VARINT)
    .uint32(PROTOCOL_VERSION)
    .uint32((3 << 3) | WIRE_LEN)
    .uint32(total)
    .finish();
  const frame = new Uint8Array(header.byteLength + total);
  frame.set(header, 0);
  let o = header.byteLength;
  for (const e of events) {
    frame.set(e.bytes, o);
    o += e.bytes.byteLength;
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
