/**
 * A small typed client for svctrace's event stream, for Node and browsers:
 * connects to ws(s)://HOST:PORT/v1/events, presents the token as a
 * subprotocol, subscribes with a filter and hands over decoded messages.
 * It imports no Node module: in Node pass the `ws` package's WebSocket
 * (src/client/node.ts does), in a browser the global one is used.
 */
import { svctrace } from '../gen/svctrace';

import pb = svctrace.v1;

export const SUBPROTOCOL = 'svctrace.v1';

/** The part of the WebSocket API both `ws` and browsers provide. */
export interface WebSocketLike {
  binaryType: string;
  readyState: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  /** Node's `ws`: stops reading the socket (TCP backpressure) and starts again; a browser's WebSocket has no such thing. */
  pause?(): void;
  resume?(): void;
  /** Node's `ws`: drops the connection at once, with no closing handshake (a dead peer never answers one). */
  terminate?(): void;
}
export type WebSocketCtor = new (url: string, protocols?: string[]) => WebSocketLike;

export interface ClientOptions {
  url: string;
  token?: string;
  filter?: pb.IFilter;
  /** Also receive flow updates. */
  flows?: boolean;
  WebSocket?: WebSocketCtor;
  /**
   * No Hello this long after connecting: the attempt fails (TIMEOUT). A
   * server that is down but whose address still takes packets (or drops
   * them) is otherwise waited on for as long as TCP retries.
   */
  connectTimeoutMs?: number;
  /**
   * No message this long once connected (a server sends Status every
   * second): the connection is taken as dead and closed, and `close` says
   * why (code SILENT_CLOSE). A peer that vanished without a FIN or RST
   * (powered off, partitioned) otherwise leaves the socket open for ever.
   * Not counted while reading is held (holdReading).
   */
  silenceLimitMs?: number;
  /** Aborted before the connect settles: it fails (ABORTED) and the socket is let go at once. */
  signal?: AbortSignal;
}

/** The close code `close` reports when the client gave up on a silent server (silenceLimitMs); not a code the server sends. */
export const SILENT_CLOSE = 4900;

export interface ClientHandlers {
  /** The server's Hello, before any other message (also before connect resolves). */
  hello?: (hello: pb.IHello) => void;
  events?: (events: pb.Event[]) => void;
  flows?: (flows: pb.IFlow[]) => void;
  status?: (status: pb.Status) => void;
  error?: (error: pb.Error) => void;
  diagnosis?: (d: pb.Diagnosis) => void;
  close?: (code: number, reason: string) => void;
}

export class ClientError extends Error {
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
    this.name = 'ClientError';
  }
}

function toBytes(data: unknown): Uint8Array | null {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (Array.isArray(data)) {
    // ws may deliver fragmented messages as Buffer[]
    const parts = data as Uint8Array[];
    const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
    let o = 0;
    for (const p of parts) {
      out.set(p, o);
      o += p.byteLength;
    }
    return out;
  }
  return null;
}

export class SvctraceClient {
  hello?: pb.IHello;
  lastStatus?: pb.Status;
  private handlers: ClientHandlers = {};
  /** Pings waiting for their pong (sync): answered, or failed when the connection ends. */
  private readonly pongs = new Map<string, { answered: () => void; failed: (e: ClientError) => void }>();
  private nextNonce = 1;
  private lastMessageAt = monoMs();
  /** Reading held (holdReading): silence is this side's doing, not the server's. */
  private holding = false;
  private silenceTimer?: ReturnType<typeof setInterval>;
  private endReported = false;

  private constructor(private readonly ws: WebSocketLike) {}

  /** Connects and resolves once the server said hello (and the filter is sent). */
  static connect(opts: ClientOptions, handlers: ClientHandlers = {}): Promise<SvctraceClient> {
    const Ctor = opts.WebSocket ?? (globalThis as unknown as { WebSocket?: WebSocketCtor }).WebSocket;
    if (!Ctor) return Promise.reject(new ClientError('no WebSocket implementation: pass one (e.g. the ws package)', 'NO_WEBSOCKET'));
    if (opts.signal?.aborted) return Promise.reject(new ClientError(`connecting to ${opts.url}: cancelled`, 'ABORTED'));
    const protocols = [SUBPROTOCOL, ...(opts.token ? [`bearer.${opts.token}`] : [])];
    const ws = new Ctor(opts.url, protocols);
    ws.binaryType = 'arraybuffer';
    const client = new SvctraceClient(ws);
    client.handlers = handlers;
    return new Promise((resolve, reject) => {
      // One outcome: resolved (the connection is the caller's from then on,
      // its end told by handlers.close) or rejected (the socket let go, its
      // end told by the rejection alone).
      let done = false;
      let helloSeen = false;
      const fail = (e: ClientError, drop: boolean): void => {
        if (done) return;
        done = true;
        clearTimeout(connectTimer);
        opts.signal?.removeEventListener('abort', onAbort);
        client.endReported = true; // nothing more is handed over
        client.failPings();
        reject(e);
        if (drop) client.drop();
      };
      const onAbort = (): void => fail(new ClientError(`connecting to ${opts.url}: cancelled`, 'ABORTED'), true);
      const succeed = (): void => {
        if (done) return;
        done = true;
        clearTimeout(connectTimer);
        opts.signal?.removeEventListener('abort', onAbort);
        if (opts.silenceLimitMs) client.watchSilence(opts.silenceLimitMs);
        resolve(client);
      };
      const connectTimer = opts.connectTimeoutMs
        ? unrefTimer(setTimeout(() => fail(new ClientError(`no answer from ${opts.url} within ${seconds(opts.connectTimeoutMs!)}`, 'TIMEOUT'), true), opts.connectTimeoutMs))
        : undefined;
      ws.onerror = (ev) => {
        // ws's error event names the cause (ECONNREFUSED, a TLS failure); a browser's says nothing.
        const why = (ev as { message?: unknown } | null)?.message;
        fail(new ClientError(`cannot connect to ${opts.url}${typeof why === 'string' && why ? `: ${why}` : ''}`, 'CONNECT'), false);
      };
      ws.onclose = (ev) => {
        if (!done) fail(new ClientError(`connection to ${opts.url} closed (${ev.code}${ev.reason ? `: ${ev.reason}` : ''})`, 'CLOSED'), false);
        else client.ended(ev.code, ev.reason);
      };
      ws.onmessage = (ev) => {
        // Frames the socket still had after the end (silence, a failed connect) are not handed over.
        if (client.endReported) return;
        client.lastMessageAt = monoMs();
        const bytes = toBytes(ev.data);
        if (!bytes) return;
        let msg: pb.ServerMessage;
        try {
          msg = pb.ServerMessage.decode(bytes);
        } catch {
          client.handlers.error?.(pb.Error.create({ code: 'BAD_FRAME', message: 'undecodable frame from server' }));
          return;
        }
        if (msg.body === 'hello' && !helloSeen) {
          helloSeen = true;
          client.hello = msg.hello!;
          client.handlers.hello?.(client.hello);
          if (done) return; // the handler ended it (an abort)
          if (opts.filter || opts.flows) {
            // Resolve once the server applied the filter; a server that does not answer is let go.
            client.subscribe(opts.filter ?? {}, !!opts.flows);
            client.sync().then(succeed, (e: ClientError) => fail(e, true));
          } else {
            succeed();
          }
          return;
        }
        client.dispatch(msg);
      };
      opts.signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Closes when no message came for limitMs (reading held aside). */
  private watchSilence(limitMs: number): void {
    this.silenceTimer = unrefTimer(
      setInterval(
        () => {
          const silent = () => !this.holding && !this.endReported && monoMs() - this.lastMessageAt > limitMs;
          if (!silent()) return;
          // After a stall of this thread, frames may be waiting in the socket:
          // they are read before a timer of the next turn, which decides.
          setTimeout(() => {
            if (!silent()) return;
            this.ended(SILENT_CLOSE, `no message from the server for ${seconds(limitMs)}: connection presumed dead`);
            this.drop();
          }, 0);
        },
        Math.min(1000, Math.max(10, limitMs / 4)),
      ),
    );
  }

  /** The connection ended (the socket's close, or silence): stops the watch and tells the handler once. */
  private ended(code: number, reason: string): void {
    if (this.endReported) return;
    this.endReported = true;
    clearInterval(this.silenceTimer);
    this.failPings();
    this.handlers.close?.(code, reason);
  }

  /** Pings that will get no pong now: their sync() fails at once (its timer does not hold Node open). */
  private failPings(): void {
    const waiting = [...this.pongs.values()];
    this.pongs.clear();
    for (const p of waiting) p.failed(new ClientError('the connection ended', 'CLOSED'));
  }

  /** Lets go of the socket without a closing handshake where it can (a dead peer never answers one). */
  private drop(): void {
    if (this.ws.terminate) this.ws.terminate();
    else this.ws.close();
  }

  /** Replaces the handlers (e.g. after connect resolved). */
  on(handlers: ClientHandlers): this {
    this.handlers = { ...this.handlers, ...handlers };
    return this;
  }

  private dispatch(msg: pb.ServerMessage): void {
    switch (msg.body) {
      case 'events':
        this.handlers.events?.(msg.events!.events as pb.Event[]);
        break;
      case 'flows':
        this.handlers.flows?.(msg.flows!.flows ?? []);
        break;
      case 'status':
        this.lastStatus = msg.status as pb.Status;
        this.handlers.status?.(msg.status as pb.Status);
        break;
      case 'error':
        this.handlers.error?.(msg.error as pb.Error);
        break;
      case 'diagnosis':
        this.handlers.diagnosis?.(msg.diagnosis as pb.Diagnosis);
        break;
      case 'pong': {
        const key = String(msg.pong?.nonce ?? 0);
        this.pongs.get(key)?.answered();
        this.pongs.delete(key);
        break;
      }
      default:
        break;
    }
  }

  private send(m: pb.IClientMessage): void {
    this.ws.send(pb.ClientMessage.encode(m).finish());
  }

  subscribe(filter: pb.IFilter, flows = false): void {
    this.send({ subscribe: { filter, flows } });
  }

  pause(): void {
    this.send({ pause: {} });
  }

  resume(): void {
    this.send({ resume: {} });
  }

  /**
   * Stops reading from the server while this side's output is behind (Node
   * only; false where it cannot): the server's queue for this client fills
   * and it drops what does not fit, counted in its Status, or closes a
   * client stuck too long (TOO_SLOW). Unlike pause(), nothing is skipped
   * uncounted.
   */
  holdReading(): boolean {
    if (!this.ws.pause) return false;
    this.ws.pause();
    this.holding = true;
    return true;
  }

  releaseReading(): void {
    this.holding = false;
    this.lastMessageAt = monoMs();
    this.ws.resume?.();
  }

  ping(nonce = Date.now()): void {
    this.send({ ping: { nonce } });
  }

  /**
   * Resolves when the server has processed everything sent before (a ping
   * answered in order): e.g. after subscribe(), before relying on the filter.
   */
  sync(timeoutMs = 5000): Promise<void> {
    const nonce = this.nextNonce++;
    return new Promise((resolve, reject) => {
      const t = unrefTimer(
        setTimeout(() => {
          this.pongs.delete(String(nonce));
          reject(new ClientError('no answer from the server', 'TIMEOUT'));
        }, timeoutMs),
      );
      this.pongs.set(String(nonce), {
        answered: () => {
          clearTimeout(t);
          resolve();
        },
        failed: (e) => {
          clearTimeout(t);
          reject(e);
        },
      });
      if (this.endReported) return this.failPings();
      this.ping(nonce);
    });
  }

  close(): void {
    clearInterval(this.silenceTimer);
    this.ws.close(1000, 'bye');
    // A peer that never answers the closing handshake (gone) would hold the socket, and Node's process, for ws's 30 s.
    if (this.ws.terminate) unrefTimer(setTimeout(() => this.ws.terminate!(), CLOSE_WAIT_MS));
  }
}

/** How long close() waits for the server's half of the closing handshake before it lets go of the socket. */
const CLOSE_WAIT_MS = 2000;

/** Milliseconds on a clock no wall-clock step moves (Node and browsers). */
function monoMs(): number {
  return performance.now();
}

/** Node's timers hold the process open; a browser's are numbers. */
function unrefTimer<T>(t: T): T {
  (t as { unref?: () => void }).unref?.();
  return t;
}

function seconds(ms: number): string {
  return `${ms % 1000 ? (ms / 1000).toFixed(1) : ms / 1000} s`;
}
