/**
 * svctrace.v1.Event to protobuf bytes, for the stream's hot path: every
 * event a node sees is encoded once here. The generated encoder
 * (pb.Event.encode) checks each of the message's fields with
 * hasOwnProperty and calls a sub-encoder per nested message; this one reads
 * each field once and writes the same bytes in the same order.
 *
 * The .proto stays the one definition of the wire format:
 * test/unit/event-writer.test.ts checks that every field of Event and of the
 * messages it nests (as the generated code declares them) is encoded here,
 * byte for byte as the generated encoder does (all fields set, each alone,
 * defaults, and events of every kind). A message it does not know (unknown fields kept by a relay
 * from a newer agent) goes to the generated encoder.
 */
import { svctrace } from '../gen/svctrace';
import { EventWriter } from './event-writer';

import pb = svctrace.v1;

// Tags: field number << 3 | wire type (0 varint, 2 length-delimited).
export const enum Tag {
  // Event
  TS_NS = 8,
  KIND = 16,
  FLOW_ID = 24,
  SERVICE = 34,
  STAGE = 40,
  SUMMARY = 50,
  DIRECTION = 56,
  PACKET = 66,
  LENGTH = 72,
  TCP_FLAGS = 82,
  CONNTRACK = 90,
  DEVICE = 98,
  HOOK = 104,
  PRIORITY = 112,
  AFTER_NAT = 120,
  DROP_REASON = 128,
  DROP_REASON_NAME = 138,
  GATEWAY = 146,
  ROUTE_TABLE = 152,
  ICMP_TYPE = 160,
  ICMP_CODE = 168,
  CPU = 176,
  BACKEND = 186,
  BACKEND_NETNS = 194,
  PACKET_DATA = 202,
  BENIGN_DROP = 208,
  RULE_PATH = 218,
  SERVICE_NAME = 226,
  BACKEND_POD = 234,
  COUNTERS = 242,
  NODE = 250,
  DROP_LOCATION = 258,
  // Tuple
  T_SRC = 10,
  T_DST = 18,
  T_SRC_PORT = 24,
  T_DST_PORT = 32,
  T_PROTOCOL = 40,
  // Conntrack
  C_ID = 10,
  C_ORIGINAL = 18,
  C_REPLY = 26,
  C_STATUS = 32,
  C_STATUS_NAMES = 42,
  C_TCP_STATE = 50,
  C_MARK = 56,
  C_ZONE = 64,
  C_TIMEOUT_MS = 72,
  C_TCP_STATE_BEFORE = 82,
  // Device
  D_IFINDEX = 8,
  D_NAME = 18,
  D_KIND = 26,
  D_NETNS_INODE = 32,
  D_NETNS = 42,
  D_POD_SIDE = 48,
  // FlowCounters
  F_PACKETS_ORIGINAL = 8,
  F_BYTES_ORIGINAL = 16,
  F_PACKETS_REPLY = 24,
  F_BYTES_REPLY = 32,
  F_DROPS = 40,
  F_FINAL = 48,
  F_REASON = 58,
  F_COUNTED_ONLY = 64,
  F_SYNS_RESENT = 72,
}

type U64 = number | Long | null | undefined;
interface Long {
  low: number;
  high: number;
}

function nonZero64(v: U64): v is number | Long {
  return v != null && (typeof v === 'object' ? (v.low | v.high) !== 0 : v !== 0);
}

function str(w: EventWriter, tag: number, v: string | null | undefined): void {
  if (v) w.uint32(tag).string(v);
}

function u32(w: EventWriter, tag: number, v: number | null | undefined): void {
  if (v) w.uint32(tag).uint32(v);
}

function i32(w: EventWriter, tag: number, v: number | null | undefined): void {
  if (v) w.uint32(tag).int32(v);
}

function u64(w: EventWriter, tag: number, v: U64): void {
  if (nonZero64(v)) w.uint32(tag).uint64(v);
}

function flag(w: EventWriter, tag: number, v: boolean | null | undefined): void {
  if (v) w.uint32(tag).bool(true);
}

/** Has fields protobufjs kept from a newer schema: only the generated encoder writes those back. */
function hasUnknowns(m: object | null | undefined): boolean {
  return m != null && (m as { $unknowns?: unknown[] }).$unknowns != null;
}

function tuple(w: EventWriter, tag: number, t: pb.ITuple): void {
  w.uint32(tag).fork();
  str(w, Tag.T_SRC, t.src);
  str(w, Tag.T_DST, t.dst);
  u32(w, Tag.T_SRC_PORT, t.srcPort);
  u32(w, Tag.T_DST_PORT, t.dstPort);
  i32(w, Tag.T_PROTOCOL, t.protocol);
  w.ldelim();
}

function conntrack(w: EventWriter, c: pb.IConntrack): void {
  w.uint32(Tag.CONNTRACK).fork();
  str(w, Tag.C_ID, c.id);
  if (c.original) tuple(w, Tag.C_ORIGINAL, c.original);
  if (c.reply) tuple(w, Tag.C_REPLY, c.reply);
  u32(w, Tag.C_STATUS, c.status);
  if (c.statusNames) for (const n of c.statusNames) w.uint32(Tag.C_STATUS_NAMES).string(n);
  str(w, Tag.C_TCP_STATE, c.tcpState);
  u32(w, Tag.C_MARK, c.mark);
  u32(w, Tag.C_ZONE, c.zone);
  u32(w, Tag.C_TIMEOUT_MS, c.timeoutMs);
  str(w, Tag.C_TCP_STATE_BEFORE, c.tcpStateBefore);
  w.ldelim();
}

function device(w: EventWriter, d: pb.IDevice): void {
  w.uint32(Tag.DEVICE).fork();
  u32(w, Tag.D_IFINDEX, d.ifindex);
  str(w, Tag.D_NAME, d.name);
  str(w, Tag.D_KIND, d.kind);
  u64(w, Tag.D_NETNS_INODE, d.netnsInode);
  str(w, Tag.D_NETNS, d.netns);
  flag(w, Tag.D_POD_SIDE, d.podSide);
  w.ldelim();
}

function counters(w: EventWriter, c: pb.IFlowCounters): void {
  w.uint32(Tag.COUNTERS).fork();
  u64(w, Tag.F_PACKETS_ORIGINAL, c.packetsOriginal);
  u64(w, Tag.F_BYTES_ORIGINAL, c.bytesOriginal);
  u64(w, Tag.F_PACKETS_REPLY, c.packetsReply);
  u64(w, Tag.F_BYTES_REPLY, c.bytesReply);
  u64(w, Tag.F_DROPS, c.drops);
  flag(w, Tag.F_FINAL, c.final);
  str(w, Tag.F_REASON, c.reason);
  flag(w, Tag.F_COUNTED_ONLY, c.countedOnly);
  u64(w, Tag.F_SYNS_RESENT, c.synsResent);
  w.ldelim();
}

/** Writes one Event (its fields, no length prefix), as pb.Event.encode(e, w) would. */
export function encodeEvent(e: pb.IEvent, w: EventWriter): void {
  if (hasUnknowns(e) || hasUnknowns(e.packet) || hasUnknowns(e.conntrack) || hasUnknowns(e.conntrack?.original) || hasUnknowns(e.conntrack?.reply) || hasUnknowns(e.device) || hasUnknowns(e.counters)) {
    pb.Event.encode(e, w.asWriter());
    return;
  }
  u64(w, Tag.TS_NS, e.tsNs);
  i32(w, Tag.KIND, e.kind);
  u64(w, Tag.FLOW_ID, e.flowId);
  str(w, Tag.SERVICE, e.service);
  i32(w, Tag.STAGE, e.stage);
  str(w, Tag.SUMMARY, e.summary);
  i32(w, Tag.DIRECTION, e.direction);
  if (e.packet) tuple(w, Tag.PACKET, e.packet);
  u32(w, Tag.LENGTH, e.length);
  str(w, Tag.TCP_FLAGS, e.tcpFlags);
  if (e.conntrack) conntrack(w, e.conntrack);
  if (e.device) device(w, e.device);
  i32(w, Tag.HOOK, e.hook);
  if (e.priority) w.uint32(Tag.PRIORITY).sint32(e.priority);
  flag(w, Tag.AFTER_NAT, e.afterNat);
  u32(w, Tag.DROP_REASON, e.dropReason);
  str(w, Tag.DROP_REASON_NAME, e.dropReasonName);
  str(w, Tag.GATEWAY, e.gateway);
  u32(w, Tag.ROUTE_TABLE, e.routeTable);
  u32(w, Tag.ICMP_TYPE, e.icmpType);
  u32(w, Tag.ICMP_CODE, e.icmpCode);
  u32(w, Tag.CPU, e.cpu);
  str(w, Tag.BACKEND, e.backend);
  str(w, Tag.BACKEND_NETNS, e.backendNetns);
  if (e.packetData?.length) w.uint32(Tag.PACKET_DATA).bytes(e.packetData);
  flag(w, Tag.BENIGN_DROP, e.benignDrop);
  if (e.rulePath) for (const r of e.rulePath) w.uint32(Tag.RULE_PATH).string(r);
  str(w, Tag.SERVICE_NAME, e.serviceName);
  str(w, Tag.BACKEND_POD, e.backendPod);
  if (e.counters) counters(w, e.counters);
  str(w, Tag.NODE, e.node);
  str(w, Tag.DROP_LOCATION, e.dropLocation);
}
