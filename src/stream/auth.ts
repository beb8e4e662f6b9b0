/**
 * Who may connect: a bearer token (required when listening beyond loopback)
 * given as `Authorization: Bearer <token>` or, for browsers that cannot set
 * headers on a WebSocket, as the subprotocol `bearer.<token>` next to
 * `svctrace.v1`; and, for browsers, an Origin that is the server's own or
 * one the operator allowed.
 */
import crypto from 'node:crypto';
import net from 'node:net';
import type { IncomingMessage } from 'node:http';

export { SUBPROTOCOL } from '../client/client';
export const TOKEN_PROTOCOL_PREFIX = 'bearer.';

function equalSecret(a: string, b: string): boolean {
  const ha = crypto.createHash('sha256').update(a).digest();
  const hb = crypto.createHash('sha256').update(b).digest();
  return crypto.timingSafeEqual(ha, hb);
}

/** The token a request presents, if any. */
export function presentedToken(req: IncomingMessage): string | undefined {
  const auth = req.headers.authorization;
  if (auth) {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(auth);
    if (m) return m[1];
  }
  const protos = req.headers['sec-websocket-protocol'];
  if (protos) {
    for (const p of protos.split(',').map((s) => s.trim())) {
      if (p.startsWith(TOKEN_PROTOCOL_PREFIX)) return p.slice(TOKEN_PROTOCOL_PREFIX.length);
    }
  }
  return undefined;
}

export function tokenOk(req: IncomingMessage, token: string | undefined): boolean {
  if (!token) return true;
  const given = presentedToken(req);
  return given !== undefined && equalSecret(given, token);
}

/** Browsers send Origin; it must be this server (same host:port) or allowed. Non-browsers send none. */
export function originOk(req: IncomingMessage, allowed: string[]): boolean {
  const origin = req.headers.origin;
  if (!origin) return true;
  if (allowed.includes('*') || allowed.includes(origin)) return true;
  try {
    return new URL(origin).host === req.headers.host;
  } catch {
    return false;
  }
}

export function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\./.test(host);
}

/**
 * DNS rebinding: a page from evil.example, whose name the attacker then
 * points at 127.0.0.1, reaches a loopback server from the victim's browser
 * as same-origin: its requests carry `Host: evil.example:PORT`. So the Host
 * must be an address (a literal cannot be rebound: a page served from it is
 * this server's own), `localhost`, or a name the operator allowed
 * (`--allow-host`). Requests without a Host (HTTP/1.0 tools) pass.
 */
export function hostOk(req: IncomingMessage, allowedNames: readonly string[]): boolean {
  const host = req.headers.host;
  if (host === undefined) return true;
  const m = /^(?:\[([^\]]+)\]|([^:]+))(?::\d+)?$/.exec(host.trim());
  if (!m) return false;
  const name = (m[1] ?? m[2]!).toLowerCase();
  if (net.isIP(name)) return true;
  if (name === 'localhost' || name.endsWith('.localhost')) return true;
  return allowedNames.some((a) => a.toLowerCase() === name);
}
