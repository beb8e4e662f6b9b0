/**
 * A kernel record's svctrace.v1.Event bytes, written from the decoded record
 * and its flow context (flows/ingested.ts) without making the message
 * objects first: the stream's hot path, where a busy node's every event
 * goes. Writes exactly what `encodeEvent(toProtoEvent(record, context))`
 * writes, field by field in the same order; test/unit/kernel-event-encoder.test.ts
 * checks that byte for byte on records of every kind, and
 * test/unit/event-writer.test.ts checks encodeEvent against the generated
 * encoder, so the .proto stays the one definition of the bytes.
 *
 * Most of an event's bytes are its flow's, the same on every event: they
 * are encoded once per flow and copied after that (WireSlot).
 */
import { EventKind, NfStage } from '../events/layout';
import type { KernelEvent, Tuple } from '../events/decode';
import { TCP_CT_STATES, tcpFlagNames } from '../events/conntrack';
import type { KernelIngested } from '../flows/ingested';
import type { Flow } from '../flows/types';
import { hasConntrack, protoDirection, protoKind } from '../flows/to-proto';
import { wallNsWords } from '../clock';
import { EventWriter } from './event-writer';
import { Tag } from './event-encoder';

/**
 * A flow's bytes that stay the same from event to event, encoded once and
 * copied after: its tuples (at most MAX_TUPLES: a flow has about four;
 * more are encoded each time), and three runs of fields: flow id and
 * service; the conntrack id with the original and reply tuples; backend and
 * its namespace. A run is encoded again when what it was made of changed.
 *
 * The bytes live in a fixed pool of MAX_WIRED slots, each with a slab of
 * SLAB_BYTES: a flow claims the next slot when it has none (or lost its
 * own), taking it from the flow that had it. Memory is the pool's, whatever
 * the number of flows (kept per flow, the bytes were 40 MB of a storm's RSS),
 * and a claim allocates nothing (with more flows than slots, taking turns,
 * the encoder does what it would without the pool, and a copy).
 */
const MAX_TUPLES = 6;
const MAX_WIRED = 1024;
/** A flow's runs and tuples are about 330 bytes; a slab that is full keeps what it has and takes no more. */
const SLAB_BYTES = 512;

/** A run of two fields kept in a slot's slab, with the two values it was made of. */
class Run<A, B> {
  at = -1;
  len = 0;
  a: A | undefined = undefined;
  b: B | undefined = undefined;

  /** Copies the run when it was made of `a` and `b`; false when it must be written. */
  copy(w: EventWriter, slot: WireSlot, a: A, b: B): boolean {
    if (this.at < 0 || this.a !== a || this.b !== b) return false;
    w.rawRange(slot.slab, this.at, this.len, slot.view);
    return true;
  }

  /** Keeps what `w` wrote from `start` on as the run of `a` and `b` (if the slab has room). */
  keep(w: EventWriter, slot: WireSlot, start: number, a: A, b: B): void {
    const at = slot.keep(w, start);
    if (at < 0) return;
    this.at = at;
    this.len = w.len - start;
    this.a = a;
    this.b = b;
  }
}

class WireSlot {
  /** Which claim holds the slot (Flow.wire of the flow that made it). */
  claim = 0;
  readonly slab = new Uint8Array(SLAB_BYTES);
  readonly view = new DataView(this.slab.buffer);
  used = 0;
  /** Tuples kept: the first `tuples` entries of the arrays (fixed arrays, counted: a claim writes no array length). */
  tuples = 0;
  readonly keys: Tuple[] = new Array<Tuple>(MAX_TUPLES);
  readonly tupleAt = new Int32Array(MAX_TUPLES);
  readonly tupleLen = new Int32Array(MAX_TUPLES);
  /** Flow id and service. */
  readonly head = new Run<number, string>();
  ctAt = -1;
  ctLen = 0;
  ctId = '';
  /** Which kept tuples the conntrack run was made with. */
  ctOrigIdx = 0;
  ctReplyIdx = 0;
  /** Backend and the backend's namespace. */
  readonly tail = new Run<string | undefined, string | undefined>();

  reset(claim: number): void {
    this.claim = claim;
    this.used = 0;
    this.tuples = 0;
    this.ctAt = -1;
    this.head.at = this.tail.at = -1;
  }

  /** Keeps what `w` wrote from `start` on in the slab: where, or -1 when it does not fit. */
  keep(w: EventWriter, start: number): number {
    const n = w.len - start;
    if (this.used + n > SLAB_BYTES) return -1;
    const at = this.used;
    w.copyTail(start, this.slab, at, this.view);
    this.used += n;
    return at;
  }

  findTuple(t: Tuple): number {
    const keys = this.keys;
    for (let i = 0; i < this.tuples; i++) {
      if (sameTupleAs(keys[i]!, t)) return i;
    }
    return -1;
  }
}

function sameTupleAs(k: Tuple, t: Tuple): boolean {
  return k === t || (k.sport === t.sport && k.dport === t.dport && k.saddr === t.saddr && k.daddr === t.daddr && k.proto === t.proto);
}

const slots: WireSlot[] = [];
let claims = 0;

function slotOf(f: Flow): WireSlot {
  const had = f.wire as number | undefined;
  if (had !== undefined) {
    const s = slots[had % MAX_WIRED];
    if (s && s.claim === had) return s;
  }
  const claim = ++claims;
  const i = claim % MAX_WIRED;
  const s = slots[i] ?? (slots[i] = new WireSlot());
  s.reset(claim);
  f.wire = claim;
  return s;
}

/** An event's wall-clock time, low and high words (encoding is synchronous: one will do). */
const ts = new Uint32Array(2);

/** Writes a tuple sub-message; returns where the slot keeps its fields (-1: not kept). */
function writeTuple(w: EventWriter, tag: number, t: Tuple, slot: WireSlot): number {
  const i = slot.findTuple(t);
  if (i >= 0) {
    const len = slot.tupleLen[i]!;
    w.uint32(tag).uint32(len).rawRange(slot.slab, slot.tupleAt[i]!, len, slot.view);
    return slot.tupleAt[i]!;
  }
  // The fields go straight into the event, behind a one-byte length (a
  // tuple of IPv4 text is under 128 bytes; ldelim moves a longer one), and
  // are kept from there.
  w.uint32(tag).fork();
  const start = w.len;
  if (t.saddr) w.uint32(Tag.T_SRC).string(t.saddr);
  if (t.daddr) w.uint32(Tag.T_DST).string(t.daddr);
  if (t.sport) w.uint32(Tag.T_SRC_PORT).uint32(t.sport);
  if (t.dport) w.uint32(Tag.T_DST_PORT).uint32(t.dport);
  if (t.proto) w.uint32(Tag.T_PROTOCOL).int32(t.proto);
  const len = w.len - start;
  const at = slot.tuples < MAX_TUPLES ? slot.keep(w, start) : -1;
  w.ldelim();
  if (at >= 0) {
    const i = slot.tuples++;
    slot.keys[i] = t;
    slot.tupleAt[i] = at;
    slot.tupleLen[i] = len;
  }
  return at;
}

/** Keeps what `w` holds from `start` on: where in the slab, or -1 (it did not fit). */
function keepRun(w: EventWriter, slot: WireSlot, start: number): number {
  return slot.keep(w, start);
}

/** Flow id and service (the flow's own: a flow has one of each). */
function writeHead(w: EventWriter, slot: WireSlot, flowId: number, service: string): void {
  if (slot.head.copy(w, slot, flowId, service)) return;
  const start = w.len;
  if (flowId) w.uint32(Tag.FLOW_ID).uint64(flowId);
  str(w, Tag.SERVICE, service);
  slot.head.keep(w, slot, start, flowId, service);
}

/** Conntrack's id, original and reply tuples. */
function writeCtHead(w: EventWriter, slot: WireSlot, id: string, orig: Tuple, reply: Tuple): void {
  // The run is copied when made of this id and these tuples: the tuples it
  // was made with are compared, not looked up (a slot's kept tuples never
  // move until the slot is claimed again, which resets ctAt).
  if (slot.ctAt >= 0 && slot.ctId === id && sameTupleAs(slot.keys[slot.ctOrigIdx]!, orig) && sameTupleAs(slot.keys[slot.ctReplyIdx]!, reply)) {
    w.rawRange(slot.slab, slot.ctAt, slot.ctLen, slot.view);
    return;
  }
  const start = w.len;
  str(w, Tag.C_ID, id);
  const origAt = writeTuple(w, Tag.C_ORIGINAL, orig, slot);
  const replyAt = writeTuple(w, Tag.C_REPLY, reply, slot);
  const at = origAt < 0 || replyAt < 0 ? -1 : slot.keep(w, start);
  if (at < 0) return;
  slot.ctAt = at;
  slot.ctLen = w.len - start;
  slot.ctId = id;
  slot.ctOrigIdx = slot.findTuple(orig);
  slot.ctReplyIdx = slot.findTuple(reply);
}

/** Backend and the backend's namespace (set once DNAT and the pod are known). */
function writeTail(w: EventWriter, slot: WireSlot, backend: string | undefined, netns: string | undefined): void {
  if (slot.tail.copy(w, slot, backend, netns)) return;
  const start = w.len;
  str(w, Tag.BACKEND, backend);
  str(w, Tag.BACKEND_NETNS, netns);
  slot.tail.keep(w, slot, start, backend, netns);
}

/**
 * A device's sub-message (ifindex, name, kind, namespace inode and name,
 * pod side) is the same on every event of every flow that crosses it: kept
 * per device in a direct-mapped table (a slot per hash of ifindex and
 * namespace inode, checked against every value it was made of), so most
 * events copy it. A node has a few hundred devices at most; two that share
 * a slot take turns, encoding as they would without it.
 */
const DEVICE_SLOTS = 256;
const DEVICE_BYTES = 128;

class DeviceBytes {
  ifindex = -1;
  netnsIno = -1;
  ifname = '';
  linkKind = '';
  netnsName: string | undefined = undefined;
  podSide = false;
  len = 0;
  readonly bytes = new Uint8Array(DEVICE_BYTES);
  readonly view = new DataView(this.bytes.buffer);
}

const devices: DeviceBytes[] = Array.from({ length: DEVICE_SLOTS }, () => new DeviceBytes());

function writeDevice(w: EventWriter, e: KernelEvent, netnsName: string | undefined, podSide: boolean): void {
  const d = devices[(Math.imul(e.ifindex, 0x9e3779b1) ^ e.netnsIno) >>> 24]!;
  if (d.len && d.ifindex === e.ifindex && d.netnsIno === e.netnsIno && d.ifname === e.ifname && d.linkKind === e.linkKind && d.netnsName === netnsName && d.podSide === podSide) {
    w.rawRange(d.bytes, 0, d.len, d.view);
    return;
  }
  const start = w.len;
  w.uint32(Tag.DEVICE).fork();
  u32(w, Tag.D_IFINDEX, e.ifindex);
  str(w, Tag.D_NAME, e.ifname);
  str(w, Tag.D_KIND, e.linkKind);
  if (e.netnsIno) w.uint32(Tag.D_NETNS_INODE).uint64(e.netnsIno);
  str(w, Tag.D_NETNS, netnsName);
  if (podSide) w.uint32(Tag.D_POD_SIDE).bool(true);
  w.ldelim();
  const n = w.len - start;
  if (n > DEVICE_BYTES) {
    d.len = 0;
    return;
  }
  w.copyTail(start, d.bytes, 0, d.view);
  d.len = n;
  d.ifindex = e.ifindex;
  d.netnsIno = e.netnsIno;
  d.ifname = e.ifname;
  d.linkKind = e.linkKind;
  d.netnsName = netnsName;
  d.podSide = podSide;
}

/**
 * Fields whose text is one of a few values known by number (TCP flags,
 * conntrack's TCP state): tag, length and text encoded once per value,
 * found by the number, copied after.
 */
class FieldTable {
  private readonly bytes: Array<Uint8Array | undefined> = new Array<Uint8Array | undefined>(256);
  constructor(
    private readonly tag: number,
    private readonly text: (value: number) => string,
  ) {}

  write(w: EventWriter, value: number): void {
    let b = this.bytes[value];
    if (b === undefined) {
      const f = new EventWriter(64);
      str(f, this.tag, this.text(value));
      b = this.bytes[value] = f.finish();
    }
    if (b.length) w.rawRange(b, 0, b.length);
  }
}

const tcpFlagsField = new FieldTable(Tag.TCP_FLAGS, tcpFlagNames);
/** As protoTcpState gives it for a TCP entry. */
const tcpStateField = new FieldTable(Tag.C_TCP_STATE, (state) => TCP_CT_STATES[state] ?? String(state));

function str(w: EventWriter, tag: number, v: string | null | undefined): void {
  if (v) w.uint32(tag).string(v);
}

function u32(w: EventWriter, tag: number, v: number): void {
  if (v) w.uint32(tag).uint32(v);
}

/** Writes one kernel record's Event (its fields, no length prefix), as encodeEvent(item.event, w) would. */
export function encodeKernelEvent(item: KernelIngested, w: EventWriter): void {
  const e: KernelEvent = item.record;
  const ctx = item.context;
  const slot = slotOf(item.flow);
  wallNsWords(e.tsNs, ts);
  if (ts[0]! | ts[1]!) w.uint32(Tag.TS_NS).uint64Words(ts[0]!, ts[1]!);
  const kind = protoKind(e);
  if (kind) w.uint32(Tag.KIND).int32(kind);
  writeHead(w, slot, ctx.flowId, ctx.service);
  if (ctx.stage) w.uint32(Tag.STAGE).int32(ctx.stage);
  w.uint32(Tag.DIRECTION).int32(protoDirection(e));
  if (e.kind !== EventKind.CT_DESTROY) {
    writeTuple(w, Tag.PACKET, e.pkt, slot);
    u32(w, Tag.LENGTH, e.pktLen);
    if (e.pkt.proto === 6 && e.kind !== EventKind.FIB) tcpFlagsField.write(w, e.tcpFlags & 0xff);
  }
  if (hasConntrack(e)) {
    w.uint32(Tag.CONNTRACK).fork();
    writeCtHead(w, slot, ctx.ctId, e.ctOrig, e.ctReply);
    u32(w, Tag.C_STATUS, e.ctStatus);
    if (e.ctOrig.proto === 6) tcpStateField.write(w, e.ctTcpState & 0xff); // protoTcpState(e); '' (not written) for other protocols
    u32(w, Tag.C_MARK, e.ctMark);
    u32(w, Tag.C_ZONE, e.ctZone);
    u32(w, Tag.C_TIMEOUT_MS, e.ctTimeoutMs);
    str(w, Tag.C_TCP_STATE_BEFORE, ctx.tcpStateBefore);
    w.ldelim();
  } else if (ctx.ctId) {
    w.uint32(Tag.CONNTRACK).fork();
    str(w, Tag.C_ID, ctx.ctId);
    w.ldelim();
  }
  if (e.ifindex || e.netnsIno) writeDevice(w, e, ctx.netnsName, !!ctx.podSide);
  if (e.kind === EventKind.NF) {
    w.uint32(Tag.HOOK).int32(e.nfHook + 1);
    if (e.nfPriority) w.uint32(Tag.PRIORITY).sint32(e.nfPriority);
    if (e.nfStage === NfStage.AFTER_NAT) w.uint32(Tag.AFTER_NAT).bool(true);
  }
  if (e.kind === EventKind.DROP) {
    u32(w, Tag.DROP_REASON, e.reason);
    str(w, Tag.DROP_REASON_NAME, ctx.dropReasonName ?? String(e.reason));
  }
  if (e.kind === EventKind.FIB) {
    str(w, Tag.GATEWAY, e.gateway);
    u32(w, Tag.ROUTE_TABLE, e.reason);
  }
  if (e.pkt.proto === 1) {
    u32(w, Tag.ICMP_TYPE, e.icmpType);
    u32(w, Tag.ICMP_CODE, e.icmpCode);
  }
  u32(w, Tag.CPU, e.cpu);
  writeTail(w, slot, ctx.backend, ctx.backendNetns);
  if (e.capture?.length) w.uint32(Tag.PACKET_DATA).bytes(e.capture);
  if (ctx.benignDrop) w.uint32(Tag.BENIGN_DROP).bool(true);
  str(w, Tag.SERVICE_NAME, ctx.serviceName);
  str(w, Tag.BACKEND_POD, ctx.backendPod);
  str(w, Tag.DROP_LOCATION, ctx.dropLocation);
}
