/**
 * The benchmark's WebSocket client, in its own process: counts the events it
 * receives and reports progress to the parent.
 *
 * It counts by walking each frame's protobuf fields (ServerMessage.events ->
 * EventBatch.events), as a relay or a recorder forwarding the bytes would,
 * and decodes every 256th event in full (with the generated decoder) to check
 * the bytes are Events; a frame that does not parse is counted as invalid,
 * and the stage fails on any. A client decoding every event into objects
 * runs out of CPU before the server does (at about 300k events/s it took a
 * whole core on these 2-core machines, beside the server's), so it would
 * measure itself, not the pipeline. `--decode` decodes every event anyway.
 */
import WebSocket from 'ws';
import { svctrace } from '../src/gen/svctrace';
import { SUBPROTOCOL } from '../src/client/client';

import pb = svctrace.v1;

const url = process.argv[2]!;
const decodeAll = process.argv.includes('--decode');
const CHECK_EVERY = decodeAll ? 1 : 256;

let received = 0;
let invalid = 0;

function varint(b: Uint8Array, at: { o: number }): number {
  let v = 0;
  let shift = 0;
  for (;;) {
    if (at.o >= b.length || shift > 28) throw new Error('truncated varint');
    const c = b[at.o++]!;
    v += (c & 127) * 2 ** shift;
    if (c < 128) return v;
    shift += 7;
  }
}

function skip(b: Uint8Array, at: { o: number }, wire: number): void {
  if (wire === 0) varint(b, at);
  else if (wire === 2) {
    const len = varint(b, at); // read before at.o is: the varint moves it
    at.o += len;
  }
  else if (wire === 1) at.o += 8;
  else if (wire === 5) at.o += 4;
  else throw new Error(`wire type ${wire}`);
  if (at.o > b.length) throw new Error('field runs past the frame');
}

/** Events in one ServerMessage frame (0 for hello, status, ...). */
function countEvents(b: Uint8Array): number {
  const at = { o: 0 };
  let n = 0;
  while (at.o < b.length) {
    const tag = varint(b, at);
    if (tag !== ((3 << 3) | 2)) {
      skip(b, at, tag & 7);
      continue;
    }
    const end = varint(b, at) + at.o;
    if (end > b.length) throw new Error('EventBatch runs past the frame');
    while (at.o < end) {
      const t = varint(b, at);
      if (t !== ((1 << 3) | 2)) {
        skip(b, at, t & 7);
        continue;
      }
      const len = varint(b, at);
      if (at.o + len > end) throw new Error('Event runs past its batch');
      if ((received + n) % CHECK_EVERY === 0) pb.Event.decode(b.subarray(at.o, at.o + len));
      at.o += len;
      n++;
    }
  }
  return n;
}

const ws = new WebSocket(url, [SUBPROTOCOL]);
ws.binaryType = 'nodebuffer';
let ready = false;
ws.on('message', (data: Buffer) => {
  if (!ready) {
    // The server's hello: the hub has this client.
    ready = true;
    if (process.send) {
      process.send({ ready: true });
      setInterval(() => process.send!({ received, invalid }), 5);
    } else {
      // Run by hand: a line a second.
      let last = 0;
      setInterval(() => {
        console.log(`${received - last} events/s (${received} in all, ${invalid} invalid frames)`);
        last = received;
      }, 1000);
    }
  }
  try {
    received += countEvents(data);
  } catch {
    invalid++;
  }
});
ws.on('error', (e) => {
  console.error(`ws-counter: ${e.message}`);
  process.exit(1);
});
