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

function option(code: number, value: Buffer): Buffer {
  const b = Buffer.alloc(4 + pad4(value.length));
  b.writeUInt16LE(code, 0);
  b.writeUInt16LE(value.length, 2);
  value.copy(b, 4);
  return b;
}

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

export function enhancedPacket(ifaceId: number, tsNs: bigint, data: Uint8Array, origLen: number, comment: string): Buffer {
  const head = Buffer.alloc(20);
  head.writeUInt32LE(ifaceId, 0);
  head.writeUInt32LE(Number(tsNs >> 32n), 4);
  head.writeUInt32LE(Number(tsNs & 0xffffffffn), 8);
  head.writeUInt32LE(data.byteLength, 12);
  head.writeUInt32LE(Math.max(origLen, data.byteLength), 16);
  const padded = Buffer.alloc(pad4(data.byteLength));
  Buffer.from(data.buffer, data.byteOffset, data.byteLength).copy(padded);
  return block(BT_EPB, Buffer.concat([head, padded, options(comment ? [[OPT_COMMENT, Buffer.from(comment)]] : [])]));
}
