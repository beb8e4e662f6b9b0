/**
 * A relay's link to one node server (`svctrace serve` on a node): connects
 * to its /v1/events with the relay's own token, names every event, flow and
 * diagnosis after the node it came from, keeps the node server's counters,
 * and reconnects with exponential backoff when the connection fails or
 * closes. Its state is what the relay's Hello and Status say of the node.
 */
import WebSocket from 'ws';
import { ClientHandlers, SvctraceClient, WebSocketCtor } from '../client/client';
import { svctrace } from '../gen/svctrace';
import type { UpstreamRequest } from './upstream';

import pb = svctrace.v1;

export type NodeStateName = 'connecting' | 'connected' | 'lagging' | 'down';

export interface AgentLinkOptions {
  url: string;
  token?: string;
  /** PEM CA bundle for wss:// node servers with their own certificates. */
  ca?: Buffer;
  /** Reconnect delays: from minBackoffMs, doubling up to maxBackoffMs. */
  minBackoffMs?: number;
  maxBackoffMs?: number;
  /** No Hello this long after connecting: down, and retried (default 10 s). */
  connectTimeoutMs?: number;
  /**
   * No message this long (Status comes every second): the connection is
   * taken as dead, closed, and retried (default 20 s, beyond the 15 s after
   * which a node server closes a relay that reads too slowly). A node that
   * vanished without closing (powered off, partitioned) was otherwise
   * "lagging" for ever.
   */
  silenceLimitMs?: number;
}

export interface AgentLinkSinks {
  events(events: pb.Event[]): void;
  flows(flows: pb.IFlow[]): void;
  diagnosis(d: pb.Diagnosis): void;
  /** The node's state changed (connected, down, ...). */
  changed(link: AgentLink): void;
}

/** No message (Status comes every second) for this long: the node is lagging. */
const QUIET_MS = 3000;
/** It dropped events for the relay this recently: lagging. */
const DROPPED_RECENTLY_MS = 5000;

export class AgentLink {
  node = '';
  /** From the node server's Hello: what it traces, and what its rules say of it. */
  servicesSeen: string[] = [];
  rules: pb.IServiceRules[] = [];
  private connState: 'connecting' | 'connected' | 'down' = 'connecting';
  error = '';
  events = 0;
  reconnects = 0;
  /** The node server's last Status on the current connection. */
  status?: pb.Status;
  /**
   * Losses of earlier connections. `dropped` is per connection; the others
   * are the node server's run's, which restart with it: a connection's last
   * Status still counts while the link is down, and is added to these only
   * when the next connection is to another run (Hello.instance differs).
   * The same run carries its counts on, and its next Status replaces it.
   */
  private lostBefore = 0;
  /** Frames from the node server that did not decode (each at least one event lost: relay_upstream). */
  private badFrames = 0;
  private kernelLostBefore = 0;
  private stagesBefore: Record<string, number> = {};
  private endedStatus?: pb.IStatus;
  private endedInstance = '';
  private instance = '';
  private lastMessageAt = 0;
  private lastDropAt = 0;
  private client?: SvctraceClient;
  private retry?: NodeJS.Timeout;
  private backoffMs: number;
  private stopped = false;
  private request: UpstreamRequest = { paused: true, filter: null, flows: false };
  private readonly WebSocketImpl: WebSocketCtor;

  constructor(
    private readonly opts: AgentLinkOptions,
    private readonly sinks: AgentLinkSinks,
  ) {
    this.backoffMs = opts.minBackoffMs ?? 500;
    const ca = opts.ca;
    // The client library takes a WebSocket constructor: bind the CA to `ws`'s.
    this.WebSocketImpl = (ca
      ? class extends WebSocket {
          constructor(url: string, protocols?: string[]) {
            super(url, protocols, { ca });
          }
        }
      : WebSocket) as unknown as WebSocketCtor;
  }

  get url(): string {
    return this.opts.url;
  }

  start(): void {
    void this.connect();
  }

  /** What the relay's clients want now; applied at once, and on every reconnect. */
  apply(request: UpstreamRequest): void {
    this.request = request;
    const c = this.client;
    if (!c || this.connState !== 'connected') return;
    if (request.paused) c.pause();
    else {
      c.subscribe(request.filter ?? {}, request.flows);
      c.resume();
    }
  }

  private async connect(): Promise<void> {
    if (this.stopped) return;
    this.connState = 'connecting';
    const handlers: ClientHandlers = {
      hello: (h) => {
        this.instance = h.instance ?? '';
        if (this.endedStatus && this.instance !== this.endedInstance) this.foldEnded();
      },
      events: (events) => {
        this.seen();
        this.events += events.length;
        for (const e of events) if (!e.node) e.node = this.node;
        this.sinks.events(events);
      },
      flows: (flows) => {
        this.seen();
        for (const f of flows) if (!f.node) f.node = this.node;
        this.sinks.flows(flows);
      },
      diagnosis: (d) => {
        this.seen();
        if (!d.node) d.node = this.node;
        this.sinks.diagnosis(d);
      },
      status: (s) => {
        this.seen();
        if (this.status && Number(s.dropped) > Number(this.status.dropped)) this.lastDropAt = Date.now();
        this.status = s;
        this.endedStatus = undefined; // the same run's counts, carried on (another run's were folded at its Hello)
      },
      close: (code, reason) => this.lost(`closed (${code}${reason ? `: ${reason}` : ''})`),
      // A frame that did not decode: its events are lost to the relay (how many, it cannot tell).
      error: (e) => {
        if (e.code === 'BAD_FRAME') this.badFrames++;
      },
    };
    // stop() cancels a connect under way (a node that takes no answer holds it for connectTimeoutMs).
    const connecting = new AbortController();
    this.connecting = connecting;
    try {
      const client = await SvctraceClient.connect(
        {
          signal: connecting.signal,
          url: this.opts.url,
          token: this.opts.token,
          WebSocket: this.WebSocketImpl,
          connectTimeoutMs: this.opts.connectTimeoutMs ?? 10_000,
          silenceLimitMs: this.opts.silenceLimitMs ?? 20_000,
        },
        handlers,
      );
      if (this.stopped) return client.close();
      this.client = client;
      this.node = client.hello?.node || this.node;
      this.servicesSeen = client.hello?.services ?? [];
      this.rules = client.hello?.rules ?? [];
      this.connState = 'connected';
      this.error = '';
      this.backoffMs = this.opts.minBackoffMs ?? 500;
      this.seen();
      this.apply(this.request);
      this.sinks.changed(this);
    } catch (e) {
      this.lost(e instanceof Error ? e.message : String(e));
    } finally {
      if (this.connecting === connecting) this.connecting = undefined;
    }
  }

  private connecting?: AbortController;

  private seen(): void {
    this.lastMessageAt = Date.now();
  }

  /** The connection failed or ended: down, its counters kept, and a retry scheduled. */
  private lost(why: string): void {
    if (this.stopped) return; // let go on purpose: nothing to say or retry
    if (this.status) {
      this.lostBefore += Number(this.status.dropped);
      this.endedStatus = this.status;
      this.endedInstance = this.instance;
      this.status = undefined;
    }
    this.client = undefined;
    const wasDown = this.connState === 'down';
    this.connState = 'down';
    this.error = why;
    if (!wasDown) this.sinks.changed(this);
    if (this.retry) return;
    const delay = this.backoffMs;
    this.backoffMs = Math.min(this.backoffMs * 2, this.opts.maxBackoffMs ?? 10_000);
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.reconnects++;
      void this.connect();
    }, delay);
    this.retry.unref();
  }

  stateName(now = Date.now()): NodeStateName {
    if (this.connState !== 'connected') return this.connState;
    if (now - this.lastMessageAt > QUIET_MS || now - this.lastDropAt < DROPPED_RECENTLY_MS) return 'lagging';
    return 'connected';
  }

  /**
   * This link is to a node server listed again after it was let go (`gone`,
   * stopped): gone's counts are this link's before its first connection,
   * as if that were a reconnect (the same run carries them on, another run
   * adds its own).
   */
  carryOn(gone: AgentLink): void {
    this.lostBefore = gone.droppedForRelay();
    this.kernelLostBefore = gone.kernelLostBefore;
    this.stagesBefore = { ...gone.stagesBefore };
    this.endedStatus = gone.runStatus;
    this.endedInstance = gone.status ? gone.instance : gone.endedInstance;
    this.reconnects = gone.reconnects;
  }

  private foldEnded(): void {
    const s = this.endedStatus!;
    this.kernelLostBefore += Number(s.kernelLost ?? 0);
    for (const [stage, n] of Object.entries(s.lostByStage ?? {})) this.stagesBefore[stage] = (this.stagesBefore[stage] ?? 0) + Number(n);
    this.endedStatus = undefined;
  }

  /** The node server's counts now: its current connection's Status, or while down the last one's. */
  private get runStatus(): pb.IStatus | undefined {
    return this.status ?? this.endedStatus;
  }

  /** Events the node server lost before they reached the relay: in its kernel and pipeline. */
  kernelLost(): number {
    return this.kernelLostBefore + Number(this.runStatus?.kernelLost ?? 0);
  }

  /** The node server's losses per stage, all its runs (its own clients' stage, client_queues, included). */
  lostByStage(): Record<string, number> {
    const out = { ...this.stagesBefore };
    for (const [stage, n] of Object.entries(this.runStatus?.lostByStage ?? {})) out[stage] = (out[stage] ?? 0) + Number(n);
    return out;
  }

  /** Events the node server dropped for the relay (the relay read too slowly). */
  droppedForRelay(): number {
    return this.lostBefore + Number(this.status?.dropped ?? 0) + this.badFrames;
  }

  nodeState(): pb.INodeState {
    return {
      node: this.node,
      url: this.opts.url,
      state: this.stateName(),
      error: this.error,
      events: this.events,
      lost: this.kernelLost() + this.droppedForRelay(),
      reconnects: this.reconnects,
    };
  }

  stop(): void {
    this.stopped = true;
    if (this.retry) clearTimeout(this.retry);
    this.connecting?.abort();
    this.client?.close();
  }
}
