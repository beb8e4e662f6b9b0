/**
 * pcapng writing (https://www.ietf.org/archive/id/draft-ietf-opsawg-pcapng-01.html):
 * a Section Header, one Interface Description per (namespace, device or
 * netfilter hook) — link type RAW (packets start at the IP header, as
 * captured) with nanosecond timestamps — and an Enhanced Packet Block per
 * captured packet, whose comment names the transition.
 */
const BT_SHB = 0x0a0d0d0a;
const BT_IDB = 0x00000001;
const BT_EPB = 0x00000006;
const OPT_ENDOFOPT = 0;
const OPT_COMMENT = 1;
const IF_NAME = 2;
const IF_DESCRIPTION = 3;
const IF_TSRESOL = 9;
export const LINKTYPE_RAW = 101;

function pad4(n: number): number {
  return (n + 3) & ~3;
}

/** An option's length is 16 bits: longer values (a crafted summary, a namespace name) are cut to fit. */
const MAX_OPTION_BYTES = 0xffff - 3;

function option(code: number, full: Buffer): Buffer {
  const value = full.length > MAX_OPTION_BYTES ? full.subarray(0, MAX_OPTION_BYTES) : full;
  const b = Buffer.alloc(4 + pad4(value.length));
  b.writeUInt16LE(code, 0);
  b.writeUInt16LE(value.length, 2);
  value.copy(b, 4);
  return b;
}

const MAX_U64 = (1n << 64n) - 1n;

function options(opts: Array<[number, Buffer]>): Buffer {
  if (!opts.length) return Buffer.alloc(0);
  return Buffer.concat([...opts.map(([c, v]) => option(c, v)), option(OPT_ENDOFOPT, Buffer.alloc(0))]);
}

function block(type: number, body: Buffer): Buffer {
  const total = 12 + body.length;
  const b = Buffer.alloc(total);
  b.writeUInt32LE(type, 0);
  b.writeUInt32LE(total, 4);
  body.copy(b, 8);
  b.writeUInt32LE(total, total - 4);
  return b;
}

export function sectionHeader(app: string): Buffer {
  const body = Buffer.alloc(16);
  body.writeUInt32LE(0x1a2b3c4d, 0);
  body.writeUInt16LE(1, 4);
  body.writeUInt16LE(0, 6);
  body.writeBigInt64LE(-1n, 8); // section length unknown
  return block(BT_SHB, Buffer.concat([body, options([[4 /* shb_userappl */, Buffer.from(app)]])]));
}

export function interfaceDescription(name: string, description: string, snaplen: number): Buffer {
  const body = Buffer.alloc(8);
  body.writeUInt16LE(LINKTYPE_RAW, 0);
  body.writeUInt32LE(snaplen, 4);
  return block(
    BT_IDB,
    Buffer.concat([
      body,
      options([
        [IF_NAME, Buffer.from(name)],
        [IF_DESCRIPTION, Buffer.from(description)],
        [IF_TSRESOL, Buffer.from([9])], // 10^-9 s
      ]),
    ]),
  );
}

/** A packet; its timestamp is clamped to what pcapng holds (0..2^64-1 ns). */
export function enhancedPacket(ifaceId: number, rawTsNs: bigint, data: Uint8Array, origLen: number, comment: string): Buffer {
  const tsNs = rawTsNs < 0n ? 0n : rawTsNs > MAX_U64 ? MAX_U64 : rawTsNs;
  const head = Buffer.alloc(20);
  head.writeUInt32LE(ifaceId, 0);
  head.writeUInt32LE(Number(tsNs >> 32n), 4);
  head.writeUInt32LE(Number(tsNs & 0xffffffffn), 8);
  head.writeUInt32LE(data.byteLength, 12);
  head.writeUInt32LE(Math.min(0xffffffff, Math.max(origLen >>> 0, data.byteLength)), 16);
  const padded = Buffer.alloc(pad4(data.byteLength));
  Buffer.from(data.buffer, data.byteOffset, data.byteLength).copy(padded);
  return block(BT_EPB, Buffer.concat([head, padded, options(comment ? [[OPT_COMMENT, Buffer.from(comment)]] : [])]));
}
