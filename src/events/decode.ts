/**
 * Decodes a batch buffer from the addon (consecutive struct svt_event
 * records) into plain objects. Addresses and ports are network byte order in
 * the record; everything else is little-endian host order.
 */
import os from 'node:os';
import { EVENT, EVENT_CAP_SIZE, EventKind, FLOW_COUNTERS, FLOW_STATS, NFTRACE, TUPLE } from './layout';
import { intern } from '../intern';

if (os.endianness() !== 'LE') {
  // The ABI is host order; the decoder reads little-endian. Say so loudly.
  throw new Error('svctrace: the event decoder supports little-endian hosts only');
}

/**
 * A packet or conntrack 5-tuple with dotted-quad addresses. Read-only: the
 * decoder hands out one object per distinct tuple it saw recently (see
 * readTuple), shared by every event and flow that carries it.
 */
export interface Tuple {
  readonly saddr: string;
  readonly daddr: string;
  readonly sport: number;
  readonly dport: number;
  readonly proto: number;
}

/** One decoded kernel observation (struct svt_event). */
export interface KernelEvent {
  kind: number;
  cpu: number;
  tsNs: bigint;
  /** Kernel address of the nf_conn, hex; '' when the packet had no conntrack entry. */
  ctId: string;
  /** The same address as a number, for keying maps without making a string per event (0: none; see ctKeyAt). */
  ctKey: number;
  pkt: Tuple;
  ctOrig: Tuple;
  ctReply: Tuple;
  ctStatus: number;
  ctMark: number;
  ctTimeoutMs: number;
  netnsIno: number;
  ifindex: number;
  nfPriority: number;
  reason: number;
  pktLen: number;
  ctZone: number;
  nfHook: number;
  ctinfo: number;
  tcpFlags: number;
  ctTcpState: number;
  nfStage: number;
  /** 0 original (client -> service), 1 reply. */
  dir: number;
  serviceId: number;
  /** Next-hop gateway of a routing decision; '' when directly connected. */
  gateway: string;
  ifname: string;
  /** rtnl link kind of the device: 'veth', 'bridge', 'vxlan', '' (physical, loopback). */
  linkKind: string;
  icmpType: number;
  icmpCode: number;
  /** Which entry at the ct address this is (ctBirth of its state's first packet); 0 when the kernel had no state to say. */
  ctBirth: number;
  /** Drop: the kernel code address that freed the packet (kfree_skb's caller), hex; '' for other kinds. See kallsyms.ts. */
  dropLocation: string;
  /** The packet's first bytes from its IP header, when capture is on. */
  capture?: Uint8Array;
}

/** A flow's counters, kept in the kernel and reported periodically and at its end (struct svt_flow_stats). */
export interface FlowStatsRecord {
  tsNs: bigint;
  /** The flow's nf_conn address, hex, as KernelEvent.ctId. */
  ctId: string;
  /** The same address as a number, as KernelEvent.ctKey. */
  ctKey: number;
  /** enum svt_stats_reason (StatsReason): periodic, closed, reused, expired, ended. */
  reason: number;
  /** Per direction: [original, reply]. */
  packets: [number, number];
  bytes: [number, number];
  drops: number;
  firstNs: bigint;
  lastNs: bigint;
  /** The entry's original tuple. */
  orig: Tuple;
  serviceId: number;
  netnsIno: number;
  /** OR of the TCP flags seen, per direction. */
  tcpFlags: [number, number];
  /** Some record of this flow reached the ring buffer before this one (false: this is the first user space hears of it). */
  delivered: boolean;
  /** KernelEvent.ctBirth of this entry, from firstNs. */
  ctBirth: number;
  /** The entry's reply tuple once its NAT was decided (proto 0 before): the backend, and what it sees as the client. */
  reply: Tuple;
  /** The flow started over the detail budget (--detail-rate): counted in the kernel, its transitions not reported. */
  countedOnly: boolean;
  /** Conntrack's TCP state when the kernel last saw one of its packets (enum tcp_conntrack; 0xff: none yet). */
  tcpState: number;
  /** The flow's end (ENDED) was written and nothing was counted since: a record other than ENDED repeats those counters. */
  endSent: boolean;
  /** SYNs resent while the entry waited for any reply: not in packets or bytes (conntrack does not account them either). */
  synsResent: number;
}

/** A decoded batch: the events, and the flows' counter records, each in kernel order. */
export interface DecodedBatch {
  events: KernelEvent[];
  stats: FlowStatsRecord[];
}

export class DecodeError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'DecodeError';
  }
}

const F = EVENT.fields;
const T = TUPLE.fields;

// Dotted quads are built once per address: a node sees few distinct ones
// and every event carries six. A direct-mapped table (one slot per hash of
// the address, the address kept to check it): bounded by construction, and
// a lookup is two array reads, where a Map keyed by addresses above 2^31
// (heap numbers) cost a hash each, a tenth of the decode.
const IP_SLOTS = 4096;
const ipKeys = new Float64Array(IP_SLOTS).fill(-1);
const ipTexts: string[] = new Array<string>(IP_SLOTS).fill('');

function ipv4(b: Uint8Array, o: number): string {
  const key = ((b[o]! << 24) | (b[o + 1]! << 16) | (b[o + 2]! << 8) | b[o + 3]!) >>> 0;
  const i = (key ^ (key >>> 12) ^ (key >>> 24)) & (IP_SLOTS - 1);
  if (ipKeys[i] === key) return ipTexts[i]!;
  const s = `${b[o]}.${b[o + 1]}.${b[o + 2]}.${b[o + 3]}`;
  ipKeys[i] = key;
  ipTexts[i] = s;
  return s;
}

// Tuples repeat even more than addresses: a detailed flow's twenty-odd
// events carry three each, drawn from four or five distinct ones (before
// and after DNAT, each direction, conntrack's two). One object per distinct
// tuple, direct-mapped like the addresses and checked against the record's
// own bytes, so a repeated tuple costs a hash and four compares instead of
// an object (a third of what decoding an event allocated, twenty-eighth
// pass). Bounded by construction; a slot taken by another tuple just makes
// a new object.
const TUPLE_SLOTS = 4096;
/** Per slot: saddr, daddr, both ports, proto + 1 (0: empty), as the record's raw words. */
const tupleWords = new Uint32Array(TUPLE_SLOTS * 4);
const tupleObjects: Tuple[] = new Array<Tuple>(TUPLE_SLOTS);

function readTuple(dv: DataView, b: Uint8Array, o: number): Tuple {
  const s = dv.getUint32(o + T.saddr[0], true);
  const d = dv.getUint32(o + T.daddr[0], true);
  const ports = dv.getUint32(o + T.sport[0], true); // sport and dport, adjacent
  const proto = b[o + T.proto[0]]! + 1;
  let h = s ^ Math.imul(d, 0x9e3779b1) ^ Math.imul(ports ^ proto, 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 15), 0x2c1b3c6d);
  const i = (h >>> 20) & (TUPLE_SLOTS - 1);
  const k = i * 4;
  if (tupleWords[k] === s && tupleWords[k + 1] === d && tupleWords[k + 2] === ports && tupleWords[k + 3] === proto) return tupleObjects[i]!;
  const t: Tuple = {
    saddr: ipv4(b, o + T.saddr[0]),
    daddr: ipv4(b, o + T.daddr[0]),
    sport: dv.getUint16(o + T.sport[0], false),
    dport: dv.getUint16(o + T.dport[0], false),
    proto: proto - 1,
  };
  tupleWords[k] = s;
  tupleWords[k + 1] = d;
  tupleWords[k + 2] = ports;
  tupleWords[k + 3] = proto;
  tupleObjects[i] = t;
  return t;
}

/**
 * An nf_conn address as a map key. Kernel pointers do not fit a double's 53
 * bits; the key keeps bits 0-52. Two addresses that differ only in bits
 * 53-63 would share a key: slab objects of one machine do not (the x86-64
 * and arm64 direct maps span far less than 2^53 bytes). The hex text cached
 * per key is checked against the whole address, so the id shown is always
 * the address's own.
 */
function ctKeyAt(dv: DataView, o: number): number {
  return (dv.getUint32(o + 4, true) & 0x1fffff) * 0x100000000 + dv.getUint32(o, true);
}

/**
 * Hex text per nf_conn address, direct-mapped like the addresses: events of
 * one flow come close together, so a few thousand recent flows give the
 * hits. Checked against the whole address (key and high word).
 */
const HEX_SLOTS = 8192;
const hexKeys = new Float64Array(HEX_SLOTS).fill(-1);
const hexHis = new Uint32Array(HEX_SLOTS);
const hexTexts: string[] = new Array<string>(HEX_SLOTS).fill('');

function ctHex(dv: DataView, o: number, key: number): string {
  const lo = dv.getUint32(o, true);
  const hi = dv.getUint32(o + 4, true);
  if (key === 0 && hi === 0) return '';
  // Slab objects are aligned: the low bits say little, so bits 6 and up.
  const i = ((lo >>> 6) ^ (lo >>> 19)) & (HEX_SLOTS - 1);
  if (hexKeys[i] === key && hexHis[i] === hi) return hexTexts[i]!;
  const text = dv.getBigUint64(o, true).toString(16);
  hexKeys[i] = key;
  hexHis[i] = hi;
  hexTexts[i] = text;
  return text;
}

// Device names and kinds (and rule tables and chains) repeat across events:
// one string per distinct name, found by a hash of its bytes and checked
// against them. Bounded like the other caches.
const nameCache = new Map<number, { bytes: Uint8Array; text: string }>();
const NAME_CACHE_MAX = 1024;

function cString(b: Uint8Array, o: number, len: number): string {
  if (b[o] === 0) return ''; // most events carry no device
  let end = o;
  let h = 0x811c9dc5; // FNV-1a
  while (end < o + len && b[end] !== 0) {
    h = Math.imul(h ^ b[end]!, 0x01000193);
    end++;
  }
  const n = end - o;
  h = (h ^ n) >>> 0;
  const hit = nameCache.get(h);
  if (hit && hit.bytes.length === n) {
    let i = 0;
    while (i < n && hit.bytes[i] === b[o + i]) i++;
    if (i === n) return hit.text;
  }
  const text = Buffer.from(b.buffer, b.byteOffset + o, n).toString('latin1');
  if (nameCache.size >= NAME_CACHE_MAX) nameCache.clear();
  nameCache.set(h, { bytes: Uint8Array.prototype.slice.call(b, o, end), text });
  return text;
}

/** Decodes one record at byte offset `o` of `buf`. */
export function decodeEvent(buf: Uint8Array, o: number): KernelEvent {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  return decodeAt(dv, buf, o);
}

function decodeAt(dv: DataView, b: Uint8Array, o: number): KernelEvent {
  const size = dv.getUint16(o + F.size[0], true);
  if (size !== EVENT.size && size !== EVENT_CAP_SIZE) {
    throw new DecodeError(`record at offset ${o} has size ${size}, expected ${EVENT.size} or ${EVENT_CAP_SIZE}`);
  }
  if (o + size > b.byteLength) throw new DecodeError(`record at offset ${o} (${size} bytes) runs past the batch end`);
  const capLen = dv.getUint16(o + F.cap_len[0], true);
  const ctKey = ctKeyAt(dv, o + F.ct_id[0]);
  const e: KernelEvent = {
    kind: dv.getUint16(o + F.kind[0], true),
    cpu: dv.getUint32(o + F.cpu[0], true),
    tsNs: dv.getBigUint64(o + F.ts_ns[0], true),
    ctId: ctHex(dv, o + F.ct_id[0], ctKey),
    ctKey,
    pkt: readTuple(dv, b, o + F.pkt[0]),
    ctOrig: readTuple(dv, b, o + F.ct_orig[0]),
    ctReply: readTuple(dv, b, o + F.ct_reply[0]),
    ctStatus: dv.getUint32(o + F.ct_status[0], true),
    ctMark: dv.getUint32(o + F.ct_mark[0], true),
    ctTimeoutMs: dv.getUint32(o + F.ct_timeout_ms[0], true),
    netnsIno: dv.getUint32(o + F.netns_ino[0], true),
    ifindex: dv.getUint32(o + F.ifindex[0], true),
    nfPriority: dv.getInt32(o + F.nf_priority[0], true),
    reason: dv.getUint32(o + F.reason[0], true),
    pktLen: dv.getUint32(o + F.pkt_len[0], true),
    ctZone: dv.getUint16(o + F.ct_zone[0], true),
    nfHook: dv.getUint8(o + F.nf_hook[0]),
    ctinfo: dv.getUint8(o + F.ctinfo[0]),
    tcpFlags: dv.getUint8(o + F.tcp_flags[0]),
    ctTcpState: dv.getUint8(o + F.ct_tcp_state[0]),
    nfStage: dv.getUint8(o + F.nf_stage[0]),
    dir: dv.getUint8(o + F.dir[0]),
    serviceId: dv.getUint32(o + F.service_id[0], true),
    gateway: dv.getUint32(o + F.gateway[0], true) === 0 ? '' : ipv4(b, o + F.gateway[0]),
    ifname: cString(b, o + F.ifname[0], F.ifname[1]),
    linkKind: cString(b, o + F.link_kind[0], F.link_kind[1]),
    icmpType: dv.getUint8(o + F.icmp_type[0]),
    icmpCode: dv.getUint8(o + F.icmp_code[0]),
    ctBirth: dv.getUint32(o + F.ct_birth[0], true),
    dropLocation: '',
  };
  // Read for drops only: a string per event is what the hot path avoids.
  if (e.kind === EventKind.DROP) e.dropLocation = dv.getBigUint64(o + F.drop_location[0], true).toString(16);
  if (size === EVENT_CAP_SIZE && capLen > 0) {
    if (capLen > EVENT_CAP_SIZE - EVENT.size) throw new DecodeError(`record at offset ${o} claims ${capLen} captured bytes`);
    // A copy: the batch is the addon's buffer, reused for the next batch.
    e.capture = Uint8Array.prototype.slice.call(b, o + EVENT.size, o + EVENT.size + capLen);
  }
  return e;
}

const S = FLOW_STATS.fields;
const C = FLOW_COUNTERS.fields;

/** A 64-bit counter as a number, from its two 32-bit halves: exact up to
 * 2^53, and no BigInt made (and collected) for each of a record's five. */
function u64(dv: DataView, o: number): number {
  return dv.getUint32(o + 4, true) * 0x100000000 + dv.getUint32(o, true);
}

function decodeStatsAt(dv: DataView, b: Uint8Array, o: number): FlowStatsRecord {
  const c = o + S.c[0];
  const ctKey = ctKeyAt(dv, o + S.ct_id[0]);
  const firstNs = dv.getBigUint64(c + C.first_ns[0], true);
  return {
    tsNs: dv.getBigUint64(o + S.ts_ns[0], true),
    ctId: ctHex(dv, o + S.ct_id[0], ctKey),
    ctKey,
    reason: dv.getUint32(o + S.reason[0], true),
    packets: [u64(dv, c + C.packets[0]), u64(dv, c + C.packets[0] + 8)],
    bytes: [u64(dv, c + C.bytes[0]), u64(dv, c + C.bytes[0] + 8)],
    drops: u64(dv, c + C.drops[0]),
    firstNs,
    lastNs: dv.getBigUint64(c + C.last_ns[0], true),
    orig: readTuple(dv, b, c + C.orig[0]),
    serviceId: dv.getUint32(c + C.service_id[0], true),
    netnsIno: dv.getUint32(c + C.netns_ino[0], true),
    tcpFlags: [dv.getUint8(c + C.tcp_flags[0]), dv.getUint8(c + C.tcp_flags[0] + 1)],
    delivered: dv.getUint8(c + C.delivered[0]) !== 0,
    ctBirth: ctBirthOf(firstNs),
    reply: readTuple(dv, b, c + C.reply[0]),
    countedOnly: dv.getUint8(c + C.counted_only[0]) !== 0,
    tcpState: dv.getUint8(c + C.last_tcp_state[0]),
    endSent: dv.getUint8(c + C.end_sent[0]) !== 0,
    synsResent: dv.getUint16(c + C.syns_resent[0], true),
  };
}

/** SVT_CT_BIRTH (bpf/events.h): the birth stamp events carry, from a state's first_ns. */
export function ctBirthOf(firstNs: bigint): number {
  return (Number(firstNs & 0xffffffffn) | 1) >>> 0;
}

/**
 * Decodes a whole batch: consecutive records, each `size` bytes long (an
 * event, one carrying a packet capture, or a flow's counters). A batch that
 * does not end on a record boundary is rejected.
 */
export function decodeBatch(buf: Uint8Array): DecodedBatch {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const out: DecodedBatch = { events: [], stats: [] };
  let o = 0;
  while (o < buf.byteLength) {
    if (buf.byteLength - o < 4) throw new DecodeError(`batch of ${buf.byteLength} bytes ends inside a record at offset ${o}`);
    if (dv.getUint16(o + F.kind[0], true) === EventKind.FLOW_STATS) {
      if (dv.getUint16(o + S.size[0], true) !== FLOW_STATS.size || o + FLOW_STATS.size > buf.byteLength) {
        throw new DecodeError(`flow counters record at offset ${o} is not ${FLOW_STATS.size} bytes`);
      }
      out.stats.push(decodeStatsAt(dv, buf, o));
      o += FLOW_STATS.size;
      continue;
    }
    if (buf.byteLength - o < EVENT.size) throw new DecodeError(`batch of ${buf.byteLength} bytes ends inside a record at offset ${o}`);
    out.events.push(decodeAt(dv, buf, o));
    o += dv.getUint16(o + F.size[0], true);
  }
  return out;
}

/** One nftables trace message (struct svt_nftrace). */
export interface RuleTrace {
  traceId: number;
  tsNs: bigint;
  pkt: Tuple;
  ruleHandle: bigint;
  /** 1 policy, 2 return, 3 rule (enum nft_trace_types). */
  type: number;
  /** NF_ACCEPT 1, NF_DROP 0, NFT_JUMP -3, NFT_GOTO -4, NFT_RETURN -5, NFT_CONTINUE -1. */
  verdict: number;
  netnsIno: number;
  table: string;
  chain: string;
  target: string;
}

const N = NFTRACE.fields;


/** Decodes a batch of svt_nftrace records. */
export function decodeRuleTraces(buf: Uint8Array): RuleTrace[] {
  if (buf.byteLength % NFTRACE.size !== 0) throw new DecodeError(`rule trace batch of ${buf.byteLength} bytes is not a multiple of ${NFTRACE.size}`);
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const out: RuleTrace[] = [];
  for (let o = 0; o < buf.byteLength; o += NFTRACE.size) {
    out.push({
      traceId: dv.getUint32(o + N.trace_id[0], true),
      tsNs: dv.getBigUint64(o + N.ts_ns[0], true),
      pkt: readTuple(dv, buf, o + N.pkt[0]),
      ruleHandle: dv.getBigUint64(o + N.rule_handle[0], true),
      type: dv.getUint32(o + N.type[0], true),
      verdict: dv.getInt32(o + N.verdict[0], true),
      netnsIno: dv.getUint32(o + N.netns_ino[0], true),
      table: intern(cString(buf, o + N.table[0], N.table[1])),
      chain: intern(cString(buf, o + N.chain[0], N.chain[1])),
      target: intern(cString(buf, o + N.target[0], N.target[1])),
    });
  }
  return out;
}
