/**
 * Fans events out to the connected clients: each batch is encoded once,
 * offered to every client (which applies its own filter), and flushed every
 * few ms. Also sends periodic status and flow updates, and keeps the counters
 * /metrics reports.
 */
import crypto from 'node:crypto';
import WebSocket from 'ws';
import { svctrace } from '../gen/svctrace';
import { ClientConn } from './client-conn';
import { encodeEvents, encodeItems, serverFrame } from './frames';
import type { Ingested } from '../flows/types';
import { StreamLimits, DEFAULT_LIMITS, CLOSE } from './limits';
import { VERSION } from '../version';
import { nodeName } from '../node-name';

import pb = svctrace.v1;

/** What the hub needs from whatever produces events (a live tracer, a replay, a test). */
export interface HubSource {
  services: string[];
  replay?: boolean;
  /** Kernel-side losses so far. */
  kernelLost(): number;
  /** Losses per stage before the hub (kernel, addon, flow table), when known. */
  lostByStage?(): Record<string, number>;
  activeFlows(): number;
  /** Flows seen that were counted only (over the detail budget), when known. */
  flowsCountedOnly?(): number;
  dropsByReason(): Record<string, number>;
  /** Packets of traced flows the kernel dropped, repeats included, when known. */
  packetsDropped?(): number;
  /** Flows changed since the last call; `wanted` false: forget them without building messages (no client wants flows). */
  takeChangedFlows?(wanted: boolean): pb.IFlow[];
  /** What the kube-proxy rules say about the traced services (sent in Hello). */
  rules?: pb.IServiceRules[];
  /** The tracer's attach backend and why (sent in Hello). */
  attachBackend?: string;
  /** A relay: the node servers it merges (sent in Hello and Status). */
  nodes?(): pb.INodeState[];
  /** The node's name in Hello (default: nodeName()). */
  node?: string;
}

export class Hub {
  readonly limits: StreamLimits;
  private readonly clients = new Set<ClientConn>();
  private nextId = 1;
  eventsTotal = 0;
  /** Events the clients that have left missed (their `dropped` at close): client_queues never goes down. */
  private departedDropped = 0;
  private lastRateAt = Date.now();
  private lastRateEvents = 0;
  private rate = 0;
  private readonly timers: NodeJS.Timeout[] = [];
  /** Flow ids restart with every server run; clients tell runs apart by this. */
  readonly instance = crypto.randomBytes(8).toString('hex');
  /** Told the clients' filters whenever a client comes, goes or subscribes (a relay forwards them upstream). */
  onSubscriptions?: (subscriptions: Array<{ filter: pb.IFilter | null; flows: boolean }>) => void;

  constructor(
    private readonly source: HubSource,
    limits: Partial<StreamLimits> = {},
  ) {
    this.limits = { ...DEFAULT_LIMITS, ...limits };
    this.timers.push(setInterval(() => this.flushAll(), this.limits.flushMs));
    this.timers.push(setInterval(() => this.sendStatus(), this.limits.statusEveryMs));
    this.timers.push(setInterval(() => this.sendFlows(), this.limits.flowsEveryMs));
    for (const t of this.timers) t.unref();
  }

  get node(): string {
    return this.source.node ?? nodeName();
  }

  get clientCount(): number {
    return this.clients.size;
  }

  clientList(): ClientConn[] {
    return [...this.clients];
  }

  /** Adopts an accepted WebSocket; false when the server is full. */
  add(ws: WebSocket, remote: string): ClientConn | null {
    if (this.clients.size >= this.limits.maxClients) {
      // No ClientConn listens on it: a bad frame sent before the close completes
      // would be an 'error' nobody handles, which ends the process.
      ws.on('error', () => ws.terminate());
      ws.close(CLOSE.TOO_MANY_CLIENTS, `too many clients (at most ${this.limits.maxClients})`);
      return null;
    }
    const subscriptionsChanged = () => this.onSubscriptions?.([...this.clients].map((x) => ({ filter: x.subscribed, flows: x.wantsFlows })));
    const c = new ClientConn(this.nextId++, ws, remote, this.limits, {
      onClose: (x) => {
        this.departedDropped += x.dropped;
        this.clients.delete(x);
        subscriptionsChanged();
      },
      onSubscribe: subscriptionsChanged,
      statusFrame: (x) => serverFrame({ status: this.statusFor(x) }),
      localNode: this.node,
    });
    this.clients.add(c);
    subscriptionsChanged();
    c.sendControl(serverFrame({ hello: { serverVersion: VERSION, services: this.source.services, node: this.node, replay: !!this.source.replay, instance: this.instance, rules: this.source.rules ?? [], attachBackend: this.source.attachBackend ?? '', nodes: this.source.nodes?.() ?? [] } }));
    c.sendControl(serverFrame({ status: this.statusFor(c) }));
    return c;
  }

  /** Publishes a batch of events to every client. */
  publish(events: pb.IEvent[]): void {
    if (!events.length) return;
    this.eventsTotal += events.length;
    if (!this.clients.size) return;
    const encoded = encodeEvents(events);
    for (const c of this.clients) c.offer(encoded);
  }

  /** Publishes the flow table's items (their events, encoded once for every client). */
  publishItems(items: readonly Ingested[]): void {
    if (!items.length) return;
    this.eventsTotal += items.length;
    if (!this.clients.size) return;
    const encoded = encodeItems(items);
    for (const c of this.clients) c.offer(encoded);
  }

  /** Events clients missed (client_queues), all clients since the start, those gone included. */
  clientsDropped(): number {
    let n = this.departedDropped;
    for (const c of this.clients) n += c.dropped;
    return n;
  }

  flushAll(): void {
    for (const c of this.clients) c.flush();
  }

  private statusFor(c: ClientConn): pb.IStatus {
    return {
      eventsTotal: this.eventsTotal,
      flowsActive: this.source.activeFlows(),
      kernelLost: this.source.kernelLost(),
      sent: c.sent,
      dropped: c.dropped,
      flowUpdatesDropped: c.flowUpdatesDropped,
      paused: c.paused,
      clients: this.clients.size,
      dropsByReason: this.source.dropsByReason(),
      packetsDropped: this.source.packetsDropped?.() ?? 0,
      eventsPerSecond: this.rate,
      lostByStage: { ...this.source.lostByStage?.(), client_queues: this.clientsDropped() },
      nodes: this.source.nodes?.() ?? [],
      flowsCountedOnly: this.source.flowsCountedOnly?.() ?? 0,
    };
  }

  sendStatus(): void {
    const now = Date.now();
    this.rate = ((this.eventsTotal - this.lastRateEvents) * 1000) / Math.max(1, now - this.lastRateAt);
    this.lastRateAt = now;
    this.lastRateEvents = this.eventsTotal;
    for (const c of this.clients) c.sendControl(serverFrame({ status: this.statusFor(c) }));
  }

  private sendFlows(): void {
    const wanting = [...this.clients].filter((c) => c.wantsFlows && !c.paused);
    const changed = this.source.takeChangedFlows?.(wanting.length > 0) ?? [];
    if (!changed.length) return;
    const frame = serverFrame({ flows: { flows: changed } });
    for (const c of wanting) if (!c.sendControl(frame)) c.flowUpdatesDropped += changed.length;
  }

  /**
   * Sends diagnoses (classic failures seen live) to every client, a slow
   * one too: a verdict is repeated only a minute later, and only if it
   * still holds; they are few, so they cannot fill a send buffer.
   */
  broadcastDiagnoses(ds: pb.IDiagnosis[]): void {
    for (const d of ds) {
      const frame = serverFrame({ diagnosis: d });
      for (const c of this.clients) c.sendControl(frame, true);
    }
  }

  /** Closes every client and stops the timers. */
  close(): void {
    for (const t of this.timers) clearInterval(t);
    for (const c of this.clients) c.closeWith(CLOSE.SHUTDOWN, 'SHUTDOWN', 'server shutting down');
  }
}
