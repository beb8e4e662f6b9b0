/**
 * `svctrace serve`'s HTTP(S) + WebSocket server: /v1/events (the protobuf
 * event stream), /healthz, /metrics, and / (the dashboard, when built).
 * Authentication and origin checks happen before the WebSocket upgrade.
 */
import { isIPv6 } from 'node:net';
import type { Ingested } from '../flows/types';
import http from 'node:http';
import https from 'node:https';
import type { Duplex } from 'node:stream';
import { WebSocketServer } from 'ws';
import { SvctraceError } from '../errors';
import { hostOk, isLoopback, originOk, SUBPROTOCOL, tokenOk } from './auth';
import { Hub, HubSource } from './hub';
import { StreamLimits } from './limits';
import type { Registry } from 'prom-client';
import { renderMetrics, serverRegistry } from './metrics';
import { svctrace } from '../gen/svctrace';

import pb = svctrace.v1;

export const DEFAULT_LISTEN = '127.0.0.1:7643';
export const EVENTS_PATH = '/v1/events';

export interface ServeOptions {
  listen?: string;
  token?: string;
  tls?: { cert: Buffer; key: Buffer };
  allowOrigins?: string[];
  /** Host names accepted in requests besides addresses and localhost (DNS rebinding; see auth.hostOk). */
  allowHosts?: string[];
  limits?: Partial<StreamLimits>;
  /** More series for /metrics (the per-Service ones when tracing). */
  metrics?: Registry[];
  /** Serves GET / and static assets (the dashboard). */
  staticHandler?: (req: http.IncomingMessage, res: http.ServerResponse) => boolean;
}

/** Parses host:port ([v6]:port allowed); BAD_INPUT on junk. */
export function parseListen(listen: string): { host: string; port: number } {
  // HOST: an IPv4 address or a host name, or an IPv6 address in brackets.
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)):(\d{1,5})$/.exec(listen.trim());
  if (!m || (m[1] !== undefined && !isIPv6(m[1]))) throw new SvctraceError('BAD_INPUT', `--listen '${listen}' must look like HOST:PORT, e.g. 127.0.0.1:7643`);
  const port = Number(m[3]);
  if (port > 65535) throw new SvctraceError('BAD_INPUT', `--listen '${listen}': port must be 0-65535`);
  return { host: (m[1] ?? m[2])!, port };
}

function rejectUpgrade(socket: Duplex, status: number, text: string, extra = ''): void {
  socket.end(`HTTP/1.1 ${status} ${text}\r\nConnection: close\r\nContent-Type: text/plain\r\n${extra}Content-Length: ${text.length + 1}\r\n\r\n${text}\n`);
}

export class StreamServer {
  readonly hub: Hub;
  private readonly server: http.Server | https.Server;
  private readonly wss: WebSocketServer;
  private readonly registries: Registry[];

  private constructor(
    source: HubSource,
    private readonly opts: ServeOptions,
  ) {
    this.hub = new Hub(source, opts.limits);
    this.registries = [serverRegistry(this.hub, source), ...(opts.metrics ?? [])];
    this.wss = new WebSocketServer({
      noServer: true,
      // A frame up to 4x the limit is read, so that its sender is told why
      // it is closed (an Error message, then 1009); past that ws cuts it.
      maxPayload: this.hub.limits.maxClientMessageBytes * 4,
      perMessageDeflate: false, // protobuf batches compress poorly per frame; CPU matters more
      handleProtocols: (protocols) => (protocols.has(SUBPROTOCOL) ? SUBPROTOCOL : false),
    });
    const handler = (req: http.IncomingMessage, res: http.ServerResponse) => this.onRequest(req, res);
    this.server = opts.tls ? https.createServer({ cert: opts.tls.cert, key: opts.tls.key }, handler) : http.createServer(handler);
    this.server.on('upgrade', (req, socket, head) => this.onUpgrade(req, socket, head));
    // Malformed HTTP gets a status line, not a silently closed socket:
    // 431 for oversized headers or URL, 400 for the rest (TE+CL, garbage).
    this.server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
      if (!socket.writable) return socket.destroy();
      const status = err.code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large' : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? '408 Request Timeout' : '400 Bad Request';
      socket.end(`HTTP/1.1 ${status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
    });
  }

  static async start(source: HubSource, opts: ServeOptions = {}): Promise<StreamServer> {
    const { host, port } = parseListen(opts.listen ?? DEFAULT_LISTEN);
    if (!isLoopback(host) && !opts.token) {
      throw new SvctraceError('BAD_INPUT', `listening on ${host} (beyond loopback) needs --token or --token-file`);
    }
    if (opts.token !== undefined && opts.token.length < 16) {
      throw new SvctraceError('BAD_INPUT', 'the token must be at least 16 characters');
    }
    const s = new StreamServer(source, opts);
    await new Promise<void>((resolve, reject) => {
      s.server.once('error', (e: NodeJS.ErrnoException) =>
        reject(new SvctraceError('BAD_INPUT', `cannot listen on ${host}:${port}: ${e.code === 'EADDRINUSE' ? 'address in use' : e.message}`)),
      );
      s.server.listen(port, host, () => resolve());
    });
    return s;
  }

  address(): { host: string; port: number } {
    const a = this.server.address();
    if (!a || typeof a === 'string') throw new SvctraceError('INTERNAL', 'server not listening');
    return { host: a.address, port: a.port };
  }

  url(): string {
    const { host, port } = this.address();
    const h = host.includes(':') ? `[${host}]` : host;
    return `${this.opts.tls ? 'wss' : 'ws'}://${h}:${port}${EVENTS_PATH}`;
  }

  publish(events: pb.IEvent[]): void {
    this.hub.publish(events);
  }

  /** The flow table's items: see StreamHub.publishItems. */
  publishItems(items: readonly Ingested[]): void {
    this.hub.publishItems(items);
  }

  private onRequest(req: http.IncomingMessage, res: http.ServerResponse): void {
    const path = (req.url ?? '/').split('?')[0];
    if (!hostOk(req, this.opts.allowHosts ?? [])) {
      res.writeHead(403, { 'content-type': 'text/plain' }).end(`Host '${String(req.headers.host).slice(0, 100)}' not allowed: use an address or localhost, or start serve with --allow-host NAME\n`);
      return;
    }
    if (path === '/healthz') {
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
      return;
    }
    // The dashboard's page and assets hold no data: served without the
    // token, so a browser reaches its token form (the stream and /metrics
    // still need it).
    if (path !== '/metrics' && path !== EVENTS_PATH && this.opts.staticHandler?.(req, res)) return;
    if (!tokenOk(req, this.opts.token)) {
      res.writeHead(401, { 'content-type': 'text/plain', 'www-authenticate': 'Bearer' }).end('unauthorized\n');
      return;
    }
    if (path === '/metrics') {
      renderMetrics(this.registries).then(
        (text) => res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' }).end(text),
        (e: unknown) => res.writeHead(500, { 'content-type': 'text/plain' }).end(`metrics failed: ${e instanceof Error ? e.message : String(e)}\n`),
      );
      return;
    }
    if (path === EVENTS_PATH) {
      res.writeHead(426, { 'content-type': 'text/plain', upgrade: 'websocket' }).end('use a WebSocket client\n');
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
  }

  private onUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on('error', () => socket.destroy());
    const path = (req.url ?? '/').split('?')[0];
    if (path !== EVENTS_PATH) return rejectUpgrade(socket, 404, 'Not Found');
    if (!hostOk(req, this.opts.allowHosts ?? [])) return rejectUpgrade(socket, 403, 'Forbidden');
    if (!tokenOk(req, this.opts.token)) return rejectUpgrade(socket, 401, 'Unauthorized', 'WWW-Authenticate: Bearer\r\n');
    if (!originOk(req, this.opts.allowOrigins ?? [])) return rejectUpgrade(socket, 403, 'Forbidden');
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      this.hub.add(ws, `${req.socket.remoteAddress}:${req.socket.remotePort}`);
    });
  }

  async close(): Promise<void> {
    this.hub.close();
    await new Promise<void>((resolve) => {
      this.wss.close();
      this.server.close(() => resolve());
      this.server.closeAllConnections?.();
    });
  }
}
