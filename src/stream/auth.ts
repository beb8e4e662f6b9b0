/**
 * Who may connect: a bearer token (required when listening beyond loopback)
 * given as `Authorization: Bearer <token>` or, for browsers that cannot set
 * headers on a WebSocket, as the subprotocol `bearer.<token>` next to
 * `svctrace.v1`; and, for browsers, an Origin that is the server's own or
 * one the operator allowed.
 */
import crypto from 'node:crypto';
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
