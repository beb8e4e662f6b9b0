/** IPv4 address and Service spec parsing; every bad input is a BAD_INPUT error. */
import { SvctraceError } from '../errors';

const PROTOS = { tcp: 6, udp: 17, sctp: 132 } as const;
export type ProtoName = keyof typeof PROTOS;

/** Parses a dotted quad into a host-order uint32, or throws BAD_INPUT. */
export function parseIPv4(s: string): number {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(s);
  if (!m) throw new SvctraceError('BAD_INPUT', `'${s}' is not an IPv4 address`);
  let v = 0;
  for (let i = 1; i <= 4; i++) {
    const octet = Number(m[i]);
    if (octet > 255 || (m[i]!.length > 1 && m[i]!.startsWith('0'))) {
      throw new SvctraceError('BAD_INPUT', `'${s}' is not an IPv4 address`);
    }
    v = v * 256 + octet;
  }
  return v >>> 0;
}

/** Formats a host-order uint32 as a dotted quad. */
export function formatIPv4(v: number): string {
  return [v >>> 24, (v >>> 16) & 255, (v >>> 8) & 255, v & 255].join('.');
}

export function parsePort(s: string, what = 'port'): number {
  if (!/^\d{1,5}$/.test(s)) throw new SvctraceError('BAD_INPUT', `${what} '${s}' is not a number 1-65535`);
  const p = Number(s);
  if (p < 1 || p > 65535) throw new SvctraceError('BAD_INPUT', `${what} '${s}' is not a number 1-65535`);
  return p;
}

/** A traced ClusterIP (or, with address null, a NodePort on any node address). */
export interface ServiceSpec {
  /** Dotted quad, or null for a NodePort (matches any destination address). */
  address: string | null;
  port: number;
  proto: ProtoName;
  protoNumber: number;
  /** How the user wrote it, for messages. */
  text: string;
}

/** Parses `IP:port[/proto]` (proto tcp by default). */
export function parseServiceSpec(text: string): ServiceSpec {
  const m = /^([^:/]+):([^/]+)(?:\/(.+))?$/.exec(text.trim());
  if (!m) throw new SvctraceError('BAD_INPUT', `service '${text}' must look like IP:port[/tcp|udp], e.g. 10.96.0.100:80`);
  const address = m[1]!;
  parseIPv4(address);
  const port = parsePort(m[2]!, `service '${text}': port`);
  const proto = parseProto(m[3] ?? 'tcp', text);
  return { address, port, proto, protoNumber: PROTOS[proto], text };
}

/** Parses `port[/proto]` for a NodePort. */
export function parseNodePortSpec(text: string): ServiceSpec {
  const m = /^([^/]+)(?:\/(.+))?$/.exec(text.trim());
  if (!m) throw new SvctraceError('BAD_INPUT', `nodeport '${text}' must look like 30080[/tcp|udp]`);
  const port = parsePort(m[1]!, `nodeport '${text}'`);
  const proto = parseProto(m[2] ?? 'tcp', text);
  return { address: null, port, proto, protoNumber: PROTOS[proto], text };
}

function parseProto(p: string, text: string): ProtoName {
  const lower = p.toLowerCase();
  if (!Object.hasOwn(PROTOS, lower)) throw new SvctraceError('BAD_INPUT', `service '${text}': protocol must be tcp, udp or sctp`);
  return lower as ProtoName;
}
