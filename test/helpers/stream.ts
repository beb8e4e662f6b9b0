/** A synthetic event source for streaming tests (the kernel is not needed to test fan-out and backpressure). */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import WebSocket from 'ws';
import { svctrace } from '../../src/gen/svctrace';
import { HubSource } from '../../src/stream/hub';

import pb = svctrace.v1;

export function syntheticSource(): HubSource {
  return { services: ['10.96.0.100:80/tcp', '10.96.0.10:53/udp'], kernelLost: () => 0, activeFlows: () => 0, dropsByReason: () => ({}) };
}

export function makeEvent(i: number, over: Partial<pb.IEvent> = {}): pb.IEvent {
  return {
    tsNs: i,
    kind: pb.EventKind.EVENT_KIND_NETFILTER,
    flowId: i,
    service: i % 2 ? '10.96.0.10:53/udp' : '10.96.0.100:80/tcp',
    stage: pb.Stage.STAGE_DNAT,
    summary: `DNAT @ LOCAL_OUT -99: 10.96.0.100:80 -> backend 10.244.1.12:8080 #${i}`,
    packet: { src: '10.244.1.1', dst: '10.244.1.12', srcPort: 40000 + (i % 20000), dstPort: 8080, protocol: pb.Protocol.PROTOCOL_TCP },
    backend: i % 3 ? '10.244.1.12:8080' : '10.244.1.10:8080',
    ...over,
  };
}

/** A raw ws client that decodes ServerMessages and counts what it gets. */
export class RawClient {
  events: pb.IEvent[] = [];
  eventCount = 0;
  statuses: pb.IStatus[] = [];
  errors: pb.IError[] = [];
  closed: { code: number; reason: string } | null = null;
  keepEvents = true;
  readonly ws: WebSocket;
  readonly opened: Promise<void>;

  constructor(url: string, opts: { protocols?: string[]; headers?: Record<string, string> } = {}) {
    this.ws = new WebSocket(url, opts.protocols ?? ['svctrace.v1'], { headers: opts.headers });
    this.opened = new Promise((resolve, reject) => {
      this.ws.once('open', () => resolve());
      this.ws.once('error', reject);
      this.ws.once('unexpected-response', (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    });
    this.ws.on('message', (data) => {
      const msg = pb.ServerMessage.decode(data as Buffer);
      if (msg.body === 'events') {
        this.eventCount += msg.events!.events!.length;
        if (this.keepEvents) this.events.push(...msg.events!.events!);
      } else if (msg.body === 'status') this.statuses.push(msg.status!);
      else if (msg.body === 'error') this.errors.push(msg.error!);
    });
    this.ws.on('close', (code, reason) => (this.closed = { code, reason: reason.toString() }));
    this.ws.on('error', () => undefined);
  }

  send(m: pb.IClientMessage): void {
    this.ws.send(pb.ClientMessage.encode(m).finish());
  }
}

/** A self-signed certificate for 127.0.0.1 (openssl), in a temporary folder the caller removes. */
export function selfSignedCert(cn: string): { dir: string; cert: Buffer; key: Buffer } {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-tls-'));
  const key = path.join(dir, 'key.pem');
  const cert = path.join(dir, 'cert.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '1', '-subj', `/CN=${cn}`, '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'ignore' });
  return { dir, cert: fs.readFileSync(cert), key: fs.readFileSync(key) };
}

/** A loopback port nothing listens on now (for a server that cannot report the port it picked). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}
