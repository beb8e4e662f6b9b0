/**
 * Encoding ServerMessages and decoding ClientMessages. Events are encoded
 * once per batch and the bytes reused for every client: a client's frame is
 * the length-delimited copies of the events its filter kept.
 */
import protobuf from 'protobufjs/minimal';
import { svctrace } from '../gen/svctrace';

import pb = svctrace.v1;

export const PROTOCOL_VERSION = pb.ProtocolVersion.PROTOCOL_VERSION_1;

/** An event with its encoded bytes, shared by all clients. */
export interface EncodedEvent {
  event: pb.IEvent;
  bytes: Uint8Array;
}

export function encodeEvents(events: pb.IEvent[]): EncodedEvent[] {
  return events.map((event) => ({ event, bytes: pb.Event.encode(event).finish() }));
}

// Field numbers from the .proto, read from the generated reflection-free code's
// contract: ServerMessage.version = 1, ServerMessage.events = 3, EventBatch.events = 1.
const WIRE_LEN = 2;
const WIRE_VARINT = 0;

/** A ServerMessage{events: EventBatch{events}} frame built from pre-encoded events. */
export function eventsFrame(events: EncodedEvent[]): Uint8Array {
  const batch = protobuf.Writer.create();
  for (const e of events) batch.uint32((1 << 3) | WIRE_LEN).bytes(e.bytes);
  const batchBytes = batch.finish();
  return protobuf.Writer.create()
    .uint32((1 << 3) | WIRE_VARINT)
    .uint32(PROTOCOL_VERSION)
    .uint32((3 << 3) | WIRE_LEN)
    .bytes(batchBytes)
    .finish();
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
