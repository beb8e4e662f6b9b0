/**
 * One WebSocket client of the event stream: its filter, pause state, and the
 * bounded queue that keeps a slow reader from slowing anyone else. Frames go
 * straight to the socket while its send buffer (ws `bufferedAmount`) is
 * below the high-water mark; above it they wait in a queue of at most
 * maxQueueBytes, from which the oldest frames are dropped (and their events
 * counted as `dropped`). A client that stays above the mark for stuckAfterMs
 * is disconnected with a reason.
 */
import WebSocket from 'ws';
import { svctrace } from '../gen/svctrace';
import { SvctraceError } from '../errors';
import { ACCEPT_ALL, compileFilter, EventPredicate } from './filter';
import { decodeClientMessage, EncodedBatch, errorFrame, eventsFrame, frameMemory, serverFrame } from './frames';
import { CLOSE, StreamLimits } from './limits';

import pb = svctrace.v1;

interface QueuedFrame {
  bytes: Uint8Array;
  events: number;
  /** What it keeps alive (frameMemory): what maxQueueBytes caps. */
  memory: number;
}

export class ClientConn {
  readonly id: number;
  readonly remote: string;
  private filter: EventPredicate = ACCEPT_ALL;
  /** The filter as the client sent it (null: everything); a relay forwards it to the node servers. */
  subscribed: pb.IFilter | null = null;
  wantsFlows = false;
  paused = false;
  sent = 0;
  dropped = 0;
  /** Flow updates this client missed because it read too slowly (skipped above the high-water mark; a flow's next update carries its whole state again). */
  flowUpdatesDropped = 0;
  /** Ranges of encoded batches this client took, not yet framed, and how many events they hold. */
  private pending: Uint8Array[] = [];
  private pendingEvents = 0;
  private queue: QueuedFrame[] = [];
  private queueBytes = 0;
  private aboveSince: number | null = null;
  /** Bytes handed to the socket so far, WebSocket framing included (what ws's bufferedAmount counts). */
  private wireBytes = 0;
  /** Event frames handed to the socket that may still be in its send buffer: where each ends in wireBytes, and its events. */
  private inFlight: Array<{ end: number; events: number }> = [];
  private msgWindowStart = Date.now();
  private msgCount = 0;
  closed = false;

  constructor(
    id: number,
    private readonly ws: WebSocket,
    remote: string,
    private readonly limits: StreamLimits,
    private readonly hooks: {
      onClose: (c: ClientConn) => void;
      onSubscribe?: (c: ClientConn) => void;
      /** The client's Status frame now: sent last before the server closes it, with its final counts. */
      statusFrame?: (c: ClientConn) => Uint8Array;
      /** The server's node: a filter on nodes matches its events (which leave Event.node unset) by it. */
      localNode: string;
    },
  ) {
    this.id = id;
    this.remote = remote;
    ws.on('message', (data, isBinary) => this.onMessage(data as Buffer, isBinary));
    // ws answers a WebSocket ping with a pong of the same payload, into the send buffer.
    ws.on('ping', (data: Buffer) => (this.wireBytes += wireLength(data.length)));
    ws.on('close', () => this.finish());
    ws.on('error', () => this.finish());
  }

  private finish(): void {
    if (this.closed) return;
    this.closed = true;
    // What it took and never sent is missed too: counted before it is let go.
    // So are the events of frames still in the socket's send buffer (a
    // client cut off for reading too slowly has up to the high-water mark
    // there): handed to the socket, never written to the client.
    const unwritten = this.unwrittenEvents();
    this.sent -= unwritten;
    this.dropped += unwritten;
    this.inFlight = [];
    this.dropped += this.pendingEvents;
    for (const f of this.queue) this.dropped += f.events;
    this.pending = [];
    this.pendingEvents = 0;
    this.queue = [];
    this.queueBytes = 0;
    this.hooks.onClose(this);
  }

  /**
   * Sends a control frame now (ahead of queued events): hello, status, flow
   * updates, diagnoses, errors. Skipped for a client above the high-water
   * mark, so a stuck client cannot grow the send buffer, unless `always`
   * (errors and diagnoses: few, and news no later frame repeats). True when
   * sent; the caller counts what a skip cost (a status costs nothing: the
   * next one says it all again).
   */
  sendControl(bytes: Uint8Array, always = false): boolean {
    if (this.closed || this.ws.readyState !== WebSocket.OPEN) return false;
    if (!always && this.ws.bufferedAmount >= this.limits.highWaterBytes) return false;
    this.ws.send(bytes, { binary: true });
    this.wireBytes += wireLength(bytes.byteLength);
    return true;
  }

  /**
   * Events of the frames the socket has not written yet: those that end
   * past what it wrote (all it was handed, less what it still buffers).
   * Frames it wrote leave the list as they go, so the list holds at most
   * the send buffer's frames (the high-water mark's worth, and one more).
   */
  private unwrittenEvents(): number {
    const written = this.wireBytes - this.ws.bufferedAmount;
    while (this.inFlight.length && this.inFlight[0]!.end <= written) this.inFlight.shift();
    let n = 0;
    for (const f of this.inFlight) n += f.events;
    return n;
  }

  private onMessage(data: Buffer, isBinary: boolean): void {
    const now = Date.now();
    if (now - this.msgWindowStart >= 1000) {
      this.msgWindowStart = now;
      this.msgCount = 0;
    }
    if (++this.msgCount > this.limits.maxClientMessagesPerSecond) {
      this.closeWith(CLOSE.POLICY, 'LIMIT', `more than ${this.limits.maxClientMessagesPerSecond} messages per second`);
      return;
    }
    if (data.length > this.limits.maxClientMessageBytes) {
      this.closeWith(CLOSE.TOO_BIG, 'TOO_BIG', `client messages are at most ${this.limits.maxClientMessageBytes} bytes (got ${data.length})`);
      return;
    }
    if (!isBinary) {
      this.sendControl(errorFrame('BAD_MESSAGE', 'send binary svctrace.v1.ClientMessage frames, not text'), true);
      return;
    }
    const { msg, error } = decodeClientMessage(data);
    if (!msg) {
      this.sendControl(errorFrame('BAD_MESSAGE', error ?? 'bad message'), true);
      return;
    }
    try {
      this.apply(msg);
    } catch (e) {
      const m = e instanceof SvctraceError ? e.message : String(e);
      this.sendControl(errorFrame(e instanceof SvctraceError && e.code === 'BAD_INPUT' ? 'BAD_FILTER' : 'INTERNAL', m), true);
    }
  }

  private apply(msg: pb.ClientMessage): void {
    switch (msg.body) {
      case 'subscribe':
        this.filter = compileFilter(msg.subscribe?.filter, this.limits.maxFilterEntries, this.hooks.localNode);
        this.subscribed = msg.subscribe?.filter ?? null;
        this.wantsFlows = !!msg.subscribe?.flows;
        this.hooks.onSubscribe?.(this);
        break;
      case 'pause':
        // What it took before pausing is still its own: sent (or queued), not dropped.
        this.flush();
        this.paused = true;
        break;
      case 'resume':
        this.paused = false;
        break;
      case 'ping':
        // Even above the high-water mark: a client waits on it (sync), and its pings are rate-limited.
        this.sendControl(serverFrame({ pong: { nonce: msg.ping?.nonce ?? 0 } }), true);
        break;
    }
  }

  /**
   * Takes the events of a batch this client wants: the whole batch as one
   * range without a filter, else each run of wanted events as one range.
   */
  offer(batch: EncodedBatch): void {
    if (this.closed || this.paused) return;
    const { count, bytes, ends } = batch;
    if (this.filter === ACCEPT_ALL && this.pendingEvents === 0 && count * 4 >= this.limits.flushEvents) {
      // A big batch (a busy node's) is a frame already: queued as it is, no
      // copy (a copy of every batch into a bigger frame was a tenth of the
      // stream's time at a million events a second). Small ones are still
      // gathered into fewer frames below.
      this.enqueue({ bytes: batch.frame, events: count, memory: frameMemory(batch.frame) });
      this.pump();
      return;
    }
    if (this.filter === ACCEPT_ALL) {
      this.pending.push(bytes);
      this.pendingEvents += count;
    } else {
      let runStart = -1;
      for (let i = 0; i <= count; i++) {
        const wanted = i < count && this.filter(batch.event(i));
        if (wanted && runStart < 0) runStart = i;
        if (!wanted && runStart >= 0) {
          this.pending.push(bytes.subarray(runStart ? ends[runStart - 1] : 0, ends[i - 1]));
          this.pendingEvents += i - runStart;
          runStart = -1;
        }
      }
    }
    if (this.pendingEvents >= this.limits.flushEvents) this.flush();
  }

  /** Turns pending events into one frame and sends or queues it; then pumps. */
  flush(): void {
    if (this.closed) return;
    if (this.pendingEvents) {
      const bytes = eventsFrame(this.pending);
      const frame = { bytes, events: this.pendingEvents, memory: frameMemory(bytes) };
      this.pending = [];
      this.pendingEvents = 0;
      this.enqueue(frame);
    }
    this.pump();
  }

  private enqueue(f: QueuedFrame): void {
    this.queue.push(f);
    this.queueBytes += f.memory;
    while (this.queueBytes > this.limits.maxQueueBytes && this.queue.length > 1) {
      const old = this.queue.shift()!;
      this.queueBytes -= old.memory;
      this.dropped += old.events;
    }
  }

  /** Moves queued frames to the socket while it is below the high-water mark. */
  pump(): void {
    if (this.closed || this.ws.readyState !== WebSocket.OPEN) return;
    while (this.queue.length && this.ws.bufferedAmount < this.limits.highWaterBytes) {
      const f = this.queue.shift()!;
      this.queueBytes -= f.memory;
      this.sent += f.events;
      this.ws.send(f.bytes, { binary: true });
      this.wireBytes += wireLength(f.bytes.byteLength);
      this.inFlight.push({ end: this.wireBytes, events: f.events });
    }
    if (this.inFlight.length) this.unwrittenEvents(); // lets go of the frames written
    const now = Date.now();
    if (this.ws.bufferedAmount >= this.limits.highWaterBytes) {
      this.aboveSince ??= now;
      if (now - this.aboveSince >= this.limits.stuckAfterMs) {
        this.closeWith(CLOSE.TOO_SLOW, 'TOO_SLOW', `client read too slowly for ${this.limits.stuckAfterMs} ms (${this.dropped} events dropped)`);
      }
    } else {
      this.aboveSince = null;
    }
  }

  /** Sends a fatal error then closes; for a stuck socket the close frame may never arrive, so terminate. */
  closeWith(code: number, errCode: string, reason: string): void {
    if (this.closed) return;
    // What it took and will never be handed to the socket is missed: counted
    // now, and told in a last Status (a relay adds it to what the node lost
    // for it; the Status skipped above the high-water mark left it stale).
    // What the send buffer holds comes before that Status: a client that
    // reads it has read them. (finish() counts them as missed too, for this
    // server's totals: a client cut off reads none of them.)
    for (const f of this.queue) this.dropped += f.events;
    this.dropped += this.pendingEvents;
    this.queue = [];
    this.queueBytes = 0;
    this.pending = [];
    this.pendingEvents = 0;
    let status: Uint8Array | undefined;
    try {
      status = this.hooks.statusFrame?.(this);
    } catch {
      // counters not readable (a source already closed): the close goes on without them
    }
    if (status) this.sendControl(status, true);
    this.sendControl(errorFrame(errCode, reason, true), true);
    // The close frame goes into the send buffer too (status code and reason).
    if (this.ws.readyState === WebSocket.OPEN) this.wireBytes += wireLength(2 + Buffer.byteLength(reason.slice(0, 120)));
    this.ws.close(code, reason.slice(0, 120));
    const t = setTimeout(() => this.ws.terminate(), this.limits.closeGraceMs);
    t.unref();
    this.finish();
  }

  get queuedBytes(): number {
    return this.queueBytes;
  }

  get bufferedAmount(): number {
    return this.ws.bufferedAmount;
  }
}

/** A server frame's length on the wire: its payload and its header (unmasked; no extensions: the server turns compression off). */
function wireLength(payload: number): number {
  return payload + (payload < 126 ? 2 : payload < 65536 ? 4 : 10);
}
