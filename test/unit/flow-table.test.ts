import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { FlowTable, OTHER_BACKENDS, PER_BACKEND_MAX } from '../../src/flows/flow-table';
import { ctBirthOf, FlowStatsRecord, RuleTrace, Tuple } from '../../src/events/decode';
import { EventKind, NfStage, Dir, StatsReason } from '../../src/events/layout';
import { IPS_CONFIRMED, IPS_DST_NAT, IPS_ASSURED, IPS_SEEN_REPLY, IPS_SRC_NAT } from '../../src/events/conntrack';
import { parseServiceSpec } from '../../src/net/ipv4';
import { svctrace } from '../../src/gen/svctrace';
import { ctKeyOf, ev, orig, reply } from '../helpers/kernel-events';
import { eventSummary } from '../../src/output/event-summary';
import { flowToProto } from '../../src/flows/to-proto';
import { DropLocations, KernelSymbols } from '../../src/events/kallsyms';
import { observeFlows } from '../../src/explain/diagnose';
import type { DiscoveredService } from '../../src/discovery/model';
import { flowFailed, flowLine, formatSummary, stageLabel } from '../../src/output/flow-text';

import pb = svctrace.v1;

/** A stats record's reply tuple before NAT is decided: zeros. */
const NO_TUPLE: Tuple = { saddr: '0.0.0.0', daddr: '0.0.0.0', sport: 0, dport: 0, proto: 0 };

const dnated: Tuple = { saddr: '10.244.1.1', daddr: '10.244.1.12', sport: 40000, dport: 8080, proto: 6 };


function stats(over: Partial<FlowStatsRecord>): FlowStatsRecord {
  return {
    tsNs: 500n, ctId: 'ffff1', ctKey: ctKeyOf(over.ctId ?? 'ffff1'), reason: StatsReason.PERIODIC, packets: [0, 0], bytes: [0, 0], drops: 0, firstNs: 100n, lastNs: 500n,
    orig, serviceId: 1, netnsIno: 111, tcpFlags: [0, 0], delivered: true, ctBirth: ctBirthOf(over.firstNs ?? 100n), reply: NO_TUPLE, countedOnly: false, tcpState: 0xff, endSent: false, synsResent: 0, ...over,
  };
}

function table(): FlowTable {
  return new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], dropReasons: { '2': 'NO_SOCKET', '12': 'NETFILTER_DROP' }, closeGraceMs: 1000 });
}

describe('FlowTable', () => {
  it('follows one connection through match, DNAT, device, reply and destroy', () => {
    const t = table();
    const items = t.ingest([
      ev({ tsNs: 100n }),
      ev({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, pkt: dnated, ctStatus: IPS_DST_NAT }),
      ev({ tsNs: 120n, kind: EventKind.DEV_RECV, pkt: dnated, netnsIno: 222, ifname: 'eth0', linkKind: 'veth', ctOrig: { ...orig, proto: 0 } }),
      ev({ tsNs: 130n, dir: Dir.REPLY, nfHook: 1, nfStage: NfStage.AFTER_NAT, nfPriority: 101, tcpFlags: 0x12,
        pkt: { saddr: '10.96.0.100', daddr: '10.244.1.1', sport: 80, dport: 40000, proto: 6 }, ctStatus: IPS_DST_NAT | IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_ASSURED }),
    ]);
    // The kernel's final counters come just before the destroy, in its batch.
    items.push(...t.ingest([ev({ tsNs: 900n, kind: EventKind.CT_DESTROY, ctId: '', netnsIno: 111 })], [stats({ tsNs: 900n, reason: StatsReason.CLOSED, packets: [6, 4], bytes: [400, 398] })]));
    assert.equal(t.size, 1);
    const stages = items.filter((i) => i.event.kind !== pb.EventKind.EVENT_KIND_FLOW_STATS).map((i) => i.event.stage);
    assert.deepEqual(stages, [pb.Stage.STAGE_MATCH, pb.Stage.STAGE_DNAT, pb.Stage.STAGE_DEVICE, pb.Stage.STAGE_REPLY, pb.Stage.STAGE_CLOSE]);
    const f = items[0]!.flow;
    assert.equal(f.dnat, true);
    assert.equal(f.closed, true);
    assert.deepEqual(f.packets, [6, 4]);
    assert.deepEqual(f.bytes, [400, 398]);
    assert.equal(f.countersFinal, true);
    const counters = items.find((i) => i.event.kind === pb.EventKind.EVENT_KIND_FLOW_STATS)!.event.counters!;
    assert.equal(counters.final, true);
    assert.equal(counters.reason, 'closed');
    assert.deepEqual(t.summary().perBackend, { '10.244.1.12:8080': 1 });
    assert.match(eventSummary(items[3]!.event), /un-DNAT.*rewritten to 10\.96\.0\.100:80/);
  });

  it('closes a detailed flow at its end record when the events that said TIME_WAIT were lost (no REUSED follows an end)', () => {
    const t = table();
    t.ingest([ev({ tsNs: 100n }), ev({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
    const f = t.flows()[0]!;
    assert.equal(f.closed, false);
    // Its FIN events did not fit the ring; the kernel's end record did.
    t.ingest([], [stats({ tsNs: 700n, reason: StatsReason.ENDED, packets: [6, 4], bytes: [400, 398], tcpState: 7, endSent: true })]);
    assert.equal(f.closed, true, 'the end record is the last the kernel writes of it');
    assert.equal(f.closedTsNs, 700n);
    assert.equal(f.countersFinal, true);
    assert.equal(t.expire(700n + 1_000_000_000n).length, 1, 'it leaves after the grace period, not the idle timeout');
  });

  it('counts packets only from the kernel\'s counters, and keeps a flow whose events never arrived', () => {
    const t = table();
    t.ingest([ev({ tsNs: 100n }), ev({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
    const f = t.flows()[0]!;
    assert.deepEqual(f.packets, [0, 0], 'events are not packets');
    t.ingest([], [stats({ packets: [1000, 1000], bytes: [80_000, 150_000], lastNs: 5_000_000_000n })]);
    assert.deepEqual(f.packets, [1000, 1000]);
    assert.equal(f.lastTsNs, 5_000_000_000n, 'a quiet flow stays alive through its counters');
    // A flow whose events were lost (full ring) still exists through its counters.
    const lone: Tuple = { ...orig, sport: 40005 };
    const [i] = t.ingest([], [stats({ ctId: 'ffff9', orig: lone, packets: [3, 2], reason: StatsReason.CLOSED, delivered: false })]);
    assert.equal(i!.flow.orig.sport, 40005);
    assert.equal(t.summary().flows, 2);
    // Counters of a previous entry at a reused address never touch the new flow.
    t.ingest([], [stats({ orig: lone, packets: [9, 9], reason: StatsReason.REUSED })]);
    assert.deepEqual(f.packets, [1000, 1000]);
  });

  it("SYNs a client resent before any answer reach the flow, its counter events and its text, apart from its packets", () => {
    const t = table();
    const a: Tuple = { ...orig, saddr: '10.250.0.2', sport: 41200 };
    const natted: Tuple = { saddr: '10.244.1.12', daddr: '10.250.0.2', sport: 8080, dport: 41200, proto: 6 };
    const [waiting] = t.ingest([], [stats({ ctId: 'ffb1', orig: a, reply: natted, countedOnly: true, delivered: false, tcpFlags: [0x02, 0], packets: [1, 0], bytes: [60, 0], tcpState: 1, synsResent: 2 })]);
    const f = waiting!.flow;
    assert.equal(f.synsResent, 2);
    assert.deepEqual(f.packets, [1, 0], 'the resent SYNs are not packets (conntrack does not account them)');
    assert.equal(Number(waiting!.event.counters?.synsResent), 2);
    assert.match(flowLine(f), /1 pkts\/60 B out, 0 pkts\/0 B back, SYN sent 2 more times,/);
    assert.match(eventSummary(waiting!.event), /SYN sent 2 more times/);
    // Answered at last: the count stays with the flow.
    t.ingest([], [stats({ ctId: 'ffb1', orig: a, reply: natted, countedOnly: true, tcpFlags: [0x1b, 0x1b], packets: [6, 5], bytes: [360, 400], tcpState: 7, synsResent: 3, reason: StatsReason.ENDED })]);
    assert.equal(f.synsResent, 3);
    assert.equal(Number(flowToProto(f).synsResent), 3);
    assert.doesNotMatch(flowLine({ ...f, synsResent: 0 }), /SYN sent/);
    assert.match(flowLine({ ...f, synsResent: 1 }), /SYN sent 1 more time,/);
  });

  it('a counted-only flow (over the detail budget) is known by its counters: backend, masquerade, reset, and the summary says how many', () => {
    const t = table();
    const a: Tuple = { ...orig, saddr: '10.250.0.2', sport: 41100 };
    // DNAT to .12 and masqueraded: the backend sees the node's address.
    const natted: Tuple = { saddr: '10.244.1.12', daddr: '10.244.1.1', sport: 8080, dport: 61000, proto: 6 };
    const [first] = t.ingest([], [stats({ ctId: 'ffa1', orig: a, reply: natted, countedOnly: true, delivered: false, packets: [1, 0], bytes: [60, 0] })]);
    const f = first!.flow;
    assert.equal(f.countedOnly, true);
    assert.equal(f.dnat, true);
    assert.equal(f.backend, '10.244.1.12:8080');
    assert.equal(f.masqueraded, true);
    assert.equal(first!.event.backend, '10.244.1.12:8080', 'its counter events name the backend');
    assert.equal(first!.event.counters?.countedOnly, true);
    // Its end, refused by the backend: the reset is in the kernel's TCP flags.
    t.ingest([], [stats({ ctId: 'ffa1', orig: a, reply: natted, countedOnly: true, tcpFlags: [0x02, 0x14], packets: [1, 1], bytes: [60, 40], reason: StatsReason.CLOSED })]);
    assert.equal(f.reset, true);
    assert.equal(f.backendReset, true);
    assert.equal(f.backendRefused, true, 'a reset with no SYN-ACK before it: refused (what the diagnoses count)');
    assert.deepEqual(f.packets, [1, 1]);
    // An answered one: a packet came back, which is what the diagnoses read as SEEN_REPLY.
    const c: Tuple = { ...orig, saddr: '10.250.0.2', sport: 41102 };
    const [answered] = t.ingest([], [stats({ ctId: 'ffa3', orig: c, reply: natted, countedOnly: true, delivered: false, tcpFlags: [0x1b, 0x1b], packets: [6, 4] })]);
    assert.ok(answered!.flow.status & IPS_SEEN_REPLY);
    assert.equal(answered!.flow.reset, false);
    assert.equal(answered!.flow.backendRefused, undefined);
    assert.equal(answered!.flow.closed, false);
    // It reaches TIME_WAIT (its entry lives on): the connection is over, and the flow closed.
    t.ingest([], [stats({ ctId: 'ffa3', orig: c, reply: natted, countedOnly: true, tcpFlags: [0x1b, 0x1b], packets: [7, 5], tcpState: 7, tsNs: 900n })]);
    assert.equal(answered!.flow.tcpState, 7);
    assert.equal(answered!.flow.closed, true);
    assert.equal(answered!.flow.closedTsNs, 900n);
    // A counted-only connection known only by its end (the kernel writes no
    // first record for TCP, and its destroy adds none): one record makes it
    // whole, closed, with final counters.
    const endOnly: Tuple = { ...orig, saddr: '10.250.0.2', sport: 41103 };
    const indexed = t.indexSizes();
    const [ended] = t.ingest([], [stats({ ctId: 'ffa4', orig: endOnly, reply: { ...natted, dport: 41103 }, countedOnly: true, delivered: false, tcpFlags: [0x1b, 0x1b], packets: [6, 5], tcpState: 7, reason: StatsReason.ENDED, tsNs: 950n })]);
    assert.equal(ended!.flow.closed, true);
    assert.equal(ended!.flow.countersFinal, true);
    assert.equal(ended!.flow.backend, '10.244.1.12:8080');
    assert.equal(ended!.event.counters?.reason, 'ended');
    assert.equal(ended!.event.counters?.final, true);
    // Nothing more is owed of it: it goes to the sinks as ended, in no index.
    assert.equal(t.flows().includes(ended!.flow), false, 'not kept in the table');
    assert.ok(t.takeRetired().includes(ended!.flow), 'handed to the sinks as ended');
    assert.deepEqual(t.indexSizes(), indexed, 'in no index (its own backend tuple, with another client port, included)');
    // A late record of it (a packet counted after its end: the kernel writes
    // the end's counters again) makes no second flow: it corrects this one.
    const late = t.ingest([], [stats({ ctId: 'ffa4', orig: endOnly, reply: natted, countedOnly: true, delivered: true, packets: [7, 5], tcpState: 7, reason: StatsReason.ENDED, tsNs: 960n })]);
    assert.equal(late.length, 1);
    assert.equal(late[0]!.flow, ended!.flow, 'the same flow the sinks already have');
    assert.deepEqual(ended!.flow.packets, [7, 5]);
    assert.equal(t.flows().includes(ended!.flow), false, 'still not in the table');
    assert.equal(t.summary().lateCounters, 0);
    // A flow not DNATed (reply is the original reversed) has no backend.
    const b: Tuple = { ...orig, saddr: '10.250.0.2', sport: 41101 };
    const [plain] = t.ingest([], [stats({ ctId: 'ffa2', orig: b, reply: { saddr: b.daddr, daddr: b.saddr, sport: b.dport, dport: b.sport, proto: 6 }, countedOnly: true, delivered: false })]);
    assert.equal(plain!.flow.dnat, false);
    assert.equal(plain!.flow.masqueraded, false);
    const s = t.summary();
    assert.equal(s.countedOnly, 4);
    assert.equal(s.resets, 1);
    assert.deepEqual(s.perBackend, { '10.244.1.12:8080': 3 });
    assert.match(formatSummary(s, { recordsRead: 0, ctDestroyEvents: 0, packetsCounted: 0 } as never), /4 of them counted only, over the detail budget/);
    assert.doesNotMatch(formatSummary(s, { recordsRead: 0, ctDestroyEvents: 0, packetsCounted: 0 } as never), /skipped/);
    const skipped = formatSummary(s, { recordsRead: 0, ctDestroyEvents: 0, packetsCounted: 0, ringbufLost: 0, flowStateFull: 0, ctOverruns: 0, ruleTraceOverruns: 0, readerLostAtClose: 0, listenerLostAtClose: 0, hookRunsSkipped: 5, backend: 'fentry' } as never);
    assert.match(skipped, /the kernel skipped svctrace's programs 5 times .*flows that ended have conntrack's counters/);
    assert.match(skipped, /lost: 0$/m, 'program runs are not events lost');
    // The pipeline's own count, when given (an output that failed is in it), is the one shown.
    const given = formatSummary(s, { recordsRead: 9, ctDestroyEvents: 0, packetsCounted: 0 } as never, undefined, { ring_buffer: 1, internal_error: 2, flow_table: 0 });
    assert.match(given, /lost: 3 \(ring_buffer=1 internal_error=2\)$/m);
    assert.match(flowLine(f), /counted only/);
    // A detailed flow's counters never turn it into a counted-only one, and its own NAT view stays.
    const d = table();
    d.ingest([ev({ tsNs: 100n }), ev({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
    d.ingest([], [stats({ reply })]);
    assert.equal(d.flows()[0]!.countedOnly, false);
    assert.equal(d.flows()[0]!.backend, '10.244.1.12:8080');
    assert.equal(d.summary().countedOnly, 0);
  });

  it('makes a flow from the last record of an entry none of whose records arrived before, and only then', () => {
    const t = table();
    const a: Tuple = { ...orig, sport: 41001 };
    const b: Tuple = { ...orig, sport: 41002 };
    const c: Tuple = { ...orig, sport: 41003 };
    // A flow that was delivered and has left the table: its late last record is not a new flow.
    t.ingest([], [stats({ ctId: 'fff01', orig: a, reason: StatsReason.REUSED, delivered: true })]);
    t.ingest([], [stats({ ctId: 'fff02', orig: a, reason: StatsReason.EXPIRED, delivered: true })]);
    assert.equal(t.summary().flows, 0);
    // Never delivered: its last record is the only account of it, and it is ended.
    const [i] = t.ingest([], [stats({ ctId: 'fff03', orig: a, reason: StatsReason.REUSED, delivered: false, packets: [2, 1], firstNs: 100n })]);
    assert.equal(t.summary().flows, 1);
    assert.equal(i!.flow.closed, true);
    assert.deepEqual(i!.flow.packets, [2, 1]);
    // The flow at the address (a) started before the unseen entry (b): a ended first and is retired.
    t.ingest([], [stats({ ctId: 'fff03', orig: b, reason: StatsReason.REUSED, delivered: false, firstNs: 200n })]);
    assert.equal(t.summary().flows, 2);
    assert.deepEqual(t.takeRetired().map((f) => f.orig.sport), [41001]);
    assert.equal(t.flows()[0]!.orig.sport, 41002);
    // An unseen entry older than the flow at its address: counted and handed on, the newer flow stays.
    t.ingest([], [stats({ ctId: 'fff03', orig: c, reason: StatsReason.EXPIRED, delivered: false, firstNs: 150n })]);
    assert.equal(t.summary().flows, 3);
    assert.deepEqual(t.takeRetired().map((f) => [f.orig.sport, f.closed]), [[41003, true]]);
    assert.equal(t.flows().length, 1);
    assert.equal(t.flows()[0]!.orig.sport, 41002);
    assert.deepEqual(t.indexSizes(), { byKey: 1, byTuple: 1, byBackendTuple: 0 });
  });

  it('a closed flow that left the table is not made again by its late destroy, unless the ring is still behind it', () => {
    let through = 10_000n;
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1, deliveredThrough: () => through });
    const a: Tuple = { ...orig, sport: 42001 };
    t.ingest([ev({ tsNs: 100n, ctId: 'fff11', ctOrig: a, pkt: a })]);
    t.ingest([ev({ tsNs: 300n, kind: EventKind.CT_DESTROY, ctId: '', ctOrig: a, pkt: a })]);
    assert.equal(t.flows()[0]!.closed, true);
    t.expire(10_000_000n);
    assert.equal(t.size, 0);
    // Its counters come again later (a snapshot, a record that lost a race with the destroy): no new flow.
    t.ingest([], [stats({ ctId: 'fff11', orig: a, reason: StatsReason.PERIODIC, firstNs: 100n, lastNs: 200n, tsNs: 9_000n })]);
    t.ingest([], [stats({ ctId: 'fff11', orig: a, reason: StatsReason.CLOSED, firstNs: 100n, lastNs: 200n, tsNs: 9_000n })]);
    assert.equal(t.summary().flows, 1);
    // A destroy that overtook its flow's events (still in the ring): the flow is made now, its events join it.
    const b: Tuple = { ...orig, sport: 42002 };
    through = 400n;
    t.ingest([], [stats({ ctId: 'fff12', orig: b, reason: StatsReason.CLOSED, firstNs: 500n, lastNs: 600n, tsNs: 700n, packets: [5, 4] })]);
    assert.equal(t.summary().flows, 2);
    t.ingest([ev({ tsNs: 500n, ctId: 'fff12', ctOrig: b, pkt: b })]);
    assert.equal(t.summary().flows, 2);
    assert.deepEqual(t.flows().find((f) => f.orig.sport === 42002)!.packets, [5, 4]);
  });

  it('orders a batch by kernel time', () => {
    const t = table();
    const items = t.ingest([ev({ tsNs: 200n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT }), ev({ tsNs: 100n })]);
    assert.equal(items[0]!.event.stage, pb.Stage.STAGE_MATCH);
  });

  it('starts a new flow when a closed entry\'s kernel address is reused', () => {
    const t = table();
    t.ingest([ev({ tsNs: 1n }), ev({ tsNs: 2n, kind: EventKind.CT_DESTROY, ctId: '' })]);
    const items = t.ingest([ev({ tsNs: 3n, pkt: { ...orig, sport: 40001 }, ctOrig: { ...orig, sport: 40001 } })]);
    assert.equal(items[0]!.flow.id, 2);
  });

  it('keeps a connection one flow when its end (netlink) arrives before its first packets (ring buffer behind)', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1000, deliveredThrough: () => 50n });
    // Destroy and final counters first: no flow knows the entry yet.
    t.ingest([ev({ tsNs: 900n, kind: EventKind.CT_DESTROY, ctId: '' })], [stats({ tsNs: 900n, reason: StatsReason.CLOSED, packets: [6, 4], firstNs: 100n, lastNs: 890n })]);
    assert.equal(t.summary().flows, 1);
    // The ring's events of the same entry, older than its end.
    const items = t.ingest([ev({ tsNs: 100n }), ev({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, pkt: dnated, ctStatus: IPS_DST_NAT })]);
    assert.equal(items[0]!.flow.id, 1);
    assert.equal(t.summary().flows, 1, 'one connection, one flow');
    assert.equal(items[0]!.flow.closed, true);
    // A new connection reusing the address and the tuple (tcp_tw_reuse), after the end: a new flow.
    const next = t.ingest([ev({ tsNs: 1000n })]);
    assert.equal(next[0]!.flow.id, 2);
  });

  it('a reset in answer to the SYN is a refusal; one after the handshake is an abort, not "nothing listens"', () => {
    const refused = table();
    refused.ingest([ev({ tsNs: 1n, ctTcpState: 1 })]);
    const r = refused.ingest([ev({ tsNs: 2n, dir: Dir.REPLY, tcpFlags: 0x14, ctTcpState: 7 })]);
    assert.deepEqual([r[0]!.flow.backendReset, r[0]!.flow.backendRefused], [true, true]);
    const aborted = table();
    aborted.ingest([ev({ tsNs: 1n, ctTcpState: 1 }), ev({ tsNs: 2n, dir: Dir.REPLY, tcpFlags: 0x12, ctTcpState: 2, ctStatus: IPS_SEEN_REPLY })]);
    const a = aborted.ingest([ev({ tsNs: 3n, dir: Dir.REPLY, tcpFlags: 0x14, ctTcpState: 7, ctStatus: IPS_SEEN_REPLY })]);
    assert.deepEqual([a[0]!.flow.backendReset, a[0]!.flow.backendRefused], [true, undefined]);
  });

  it('names drops, ignores benign frees in the summary, and notices RST and REJECT', () => {
    const t = table();
    t.ingest([ev({ tsNs: 1n })]);
    const items = t.ingest([
      ev({ tsNs: 2n, kind: EventKind.DROP, reason: 12 }),
      ev({ tsNs: 3n, dir: Dir.REPLY, tcpFlags: 0x14, nfHook: 0 }),
      ev({ tsNs: 4n, dir: Dir.REPLY, pkt: { saddr: '10.244.1.1', daddr: '10.244.1.1', sport: 0, dport: 0, proto: 1 }, icmpType: 3, icmpCode: 3 }),
    ]);
    assert.match(eventSummary(items[0]!.event), /DROPPED \(NETFILTER_DROP\)/);
    assert.match(eventSummary(items[1]!.event), /TCP RST from the backend/);
    assert.match(eventSummary(items[2]!.event), /port unreachable/);
    const s = t.summary();
    assert.deepEqual(s.dropsByReason, { NETFILTER_DROP: 1 });
    assert.equal(s.resets, 1);
    // Labels that do not call an answer a drop.
    assert.deepEqual(items.map((i) => stageLabel(i.entry.stage, i.event)), ['DROP', 'RESET', 'ICMP']);
  });

  it('counts retried drops as packets and once per flow; a connection in TIME_WAIT counts as closed', () => {
    const t = table();
    // Three SYNs of one connection dropped by a rule (the client retries).
    t.ingest([ev({ tsNs: 1n }), ...[2n, 3n, 4n].map((tsNs) => ev({ tsNs, kind: EventKind.DROP, reason: 12 }))]);
    const s = t.summary();
    assert.deepEqual(s.dropsByReason, { NETFILTER_DROP: 3 });
    assert.deepEqual(s.dropFlowsByReason, { NETFILTER_DROP: 1 });
    assert.match(formatSummary(s, { recordsRead: 0, ctDestroyEvents: 0, packetsCounted: 0 } as never), /NETFILTER_DROP=3 in 1 flow(,|;|$|\n)/);
    // Another connection ends: TIME_WAIT, its conntrack entry still there.
    const o2 = { ...orig, sport: 40001 };
    t.ingest([ev({ tsNs: 10n, ctId: 'ffff2', ctOrig: o2, pkt: o2, ctStatus: IPS_CONFIRMED, ctTcpState: 7 })]);
    assert.equal(t.summary().closed, 1);
    // Flows start with one shared empty list for drops, ICMP errors, rule path and milestones: what one flow gets is its own.
    const [first, second] = t.flows();
    assert.deepEqual(first!.drops, ['NETFILTER_DROP'], 'each reason once: the packets are counted in the summary');
    assert.deepEqual([second!.drops, second!.icmpErrors, second!.rulePath], [[], [], []]);
    assert.notEqual(first!.seen, second!.seen);
    const t2 = table();
    const [withError] = t2.ingest([ev({ tsNs: 1n }), ev({ tsNs: 2n, dir: Dir.REPLY, pkt: { saddr: '10.244.1.1', daddr: '10.244.1.1', sport: 0, dport: 0, proto: 1 }, icmpType: 3, icmpCode: 3 })]);
    const [other] = t2.ingest([ev({ tsNs: 3n, ctId: 'ffff3', ctOrig: { ...orig, sport: 40003 }, pkt: { ...orig, sport: 40003 } })]);
    assert.deepEqual([withError!.flow.icmpErrors.length, other!.flow.icmpErrors, first!.icmpErrors], [1, [], []]);
  });

  it("counts the packets a flow's counters say were dropped, repeats reported once included, each once", () => {
    const t = table();
    // A SYN dropped by a rule and resent six times into it: one drop event, the kernel counts seven.
    t.ingest([ev({ tsNs: 1n }), ev({ tsNs: 2n, kind: EventKind.DROP, reason: 12 })]);
    t.ingest([], [stats({ tsNs: 600n, drops: 3 })]);
    t.ingest([], [stats({ tsNs: 700n, drops: 7 })]);
    t.ingest([], [stats({ tsNs: 800n, drops: 7, reason: StatsReason.CLOSED })]);
    const s = t.summary();
    assert.deepEqual(s.dropsByReason, { NETFILTER_DROP: 1 }, 'reported once');
    assert.equal(s.packetsDropped, 7, 'each packet once, however many records repeat the count');
    assert.match(formatSummary(s, { recordsRead: 0, ctDestroyEvents: 0, packetsCounted: 0 } as never), /drops by reason: NETFILTER_DROP=1 in 1 flow; 7 packets dropped in all \(the kernel's count, repeats included\)/);
    // A counted-only connection known by its end alone: its drops count too.
    const o2 = { ...orig, sport: 40002 };
    t.ingest([], [stats({ ctId: 'ffff2', orig: o2, drops: 2, countedOnly: true, delivered: false, reason: StatsReason.ENDED })]);
    assert.equal(t.summary().packetsDropped, 9);
  });

  it('a flow\'s drops stay one entry per reason however many packets (--all-packets reports each): memory bounded by the flows, the count kept', () => {
    const t = table();
    t.ingest([ev({ tsNs: 1n })]);
    for (let i = 0; i < 10_000; i++) t.ingest([ev({ tsNs: BigInt(10 + i), kind: EventKind.DROP, reason: 12 })]);
    const [f] = t.flows();
    assert.deepEqual(f!.drops, ['NETFILTER_DROP']);
    assert.deepEqual(t.summary().dropsByReason, { NETFILTER_DROP: 10_000 });
  });

  it('expires closed flows after the grace period', () => {
    const t = table();
    t.ingest([ev({ tsNs: 1n }), ev({ tsNs: 2n, kind: EventKind.CT_DESTROY, ctId: '' })]);
    assert.equal(t.expire(500_000_000n).length, 0);
    assert.equal(t.expire(2_000_000_000n).length, 1);
    assert.equal(t.size, 0);
  });

  it('keeps at most maxFlows flows', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], maxFlows: 3 });
    for (let i = 0; i < 10; i++) t.ingest([ev({ ctId: `c${i}`, tsNs: BigInt(i), pkt: { ...orig, sport: i + 1 }, ctOrig: { ...orig, sport: i + 1 } })]);
    assert.equal(t.size, 3);
    // The seven evicted flows are counted, and handed to the sinks (trace -o flows still shows them, marked).
    assert.equal(t.lost, 7);
    const evicted = t.takeRetired();
    assert.deepEqual(evicted.map((f) => f.orig.sport), [1, 2, 3, 4, 5, 6, 7]);
    assert.ok(evicted.every((f) => f.evicted && !f.closed));
    assert.match(flowLine(evicted[0]!), /, evicted \(flow table full/);
    assert.deepEqual(t.takeRetired(), []);
    // An evicted connection that goes on in the kernel: its periodic counters reach its flow, not the loss count.
    for (let s = 1; s <= 3; s++) {
      const [i] = t.ingest([], [stats({ ctId: 'c0', tsNs: BigInt(1000 + s), orig: { ...orig, sport: 1 }, firstNs: 0n, lastNs: BigInt(1000 + s), packets: [s, s], bytes: [60 * s, 60 * s] })]);
      assert.equal(i?.flow, evicted[0]);
    }
    assert.deepEqual(evicted[0]!.packets, [3, 3]);
    assert.equal(t.lost, 7);
    // An event of it (a device crossing) has no flow to go to: counted lost, not let go.
    assert.deepEqual(t.ingest([ev({ ctId: 'c0', tsNs: 2000n, kind: EventKind.DEV_RECV, pkt: { ...orig, sport: 1 }, ctOrig: { ...orig, sport: 1 }, ifname: 'eth0', linkKind: 'veth' })]), []);
    assert.equal(t.summary().orphanEvents, 1);
    assert.equal(t.lost, 8);
  });

  it('the backend on events follows the entry\'s reply tuple when a new entry takes over a flow', () => {
    const t = table();
    const first = t.ingest([ev({ tsNs: 1n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
    assert.equal(first[0]!.event.backend, '10.244.1.12:8080');
    const other: Tuple = { saddr: '10.244.2.7', daddr: '10.244.1.1', sport: 8080, dport: 40000, proto: 6 };
    const [i] = t.ingest([ev({ tsNs: 2n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT | IPS_CONFIRMED, ctReply: other })]);
    assert.equal(i!.flow, first[0]!.flow);
    assert.equal(i!.event.backend, '10.244.2.7:8080');
  });

  it('one line per flow (trace -o flows): where it went and how it ended', () => {
    const t = table();
    t.ingest([
      ev({ tsNs: 1_000_000n }),
      ev({ tsNs: 1_010_000n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, pkt: dnated, ctStatus: IPS_DST_NAT }),
      ev({ tsNs: 2_400_000n, kind: EventKind.DROP, reason: 12 }),
    ]);
    const f = t.flows()[0]!;
    assert.equal(flowFailed(f), true);
    assert.equal(
      flowLine(f, (ip) => (ip === '10.244.1.12' ? 'pod-b' : undefined)),
      'flow 1 tcp 10.244.1.1:40000 -> 10.96.0.100:80 (service 10.96.0.100:80/tcp): backend 10.244.1.12:8080 (pod-b), 1.4ms, 0 pkts/0 B out, 0 pkts/0 B back, syn_sent, dropped NETFILTER_DROP',
    );
  });

  it('tells two entries with one address and one tuple apart by their birth, also when the new one\'s first records were lost', () => {
    const t = table();
    const est = IPS_DST_NAT | IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_ASSURED;
    // A: its first packet, and its established state.
    t.ingest([ev({ tsNs: 100n, ctBirth: 101 }), ev({ tsNs: 150n, ctBirth: 101, ctStatus: est, ctTcpState: 3, tcpFlags: 0x10 })]);
    // B reuses the port and gets A's address (tcp_tw_reuse in a storm); the
    // ring had no room for B's unconfirmed first packet: its next record is
    // of a confirmed entry, like A's. Only the birth tells them apart.
    const items = t.ingest([ev({ tsNs: 300n, ctBirth: 291, ctStatus: est, ctTcpState: 3, tcpFlags: 0x10 })]);
    assert.equal(items[0]!.flow.id, 2, 'a flow of its own');
    assert.equal(t.summary().flows, 2);
    const [a] = t.takeRetired();
    assert.equal(a?.id, 1, 'A ended when B began');
    assert.equal(a.closed, true);
    // B's own counters land on B; A's late final counters (REUSED, by netlink order or a lagging ring) do not touch B.
    t.ingest([], [stats({ reason: StatsReason.PERIODIC, firstNs: 290n, lastNs: 320n, packets: [3, 2] })]);
    assert.deepEqual(t.flows()[0]!.packets, [3, 2]);
    t.ingest([], [stats({ reason: StatsReason.REUSED, firstNs: 100n, lastNs: 200n, packets: [9, 9] })]);
    assert.deepEqual(t.flows()[0]!.packets, [3, 2], 'another entry\'s counters');
    assert.equal(t.summary().flows, 2, 'A was seen: its counters make no new flow');
    assert.deepEqual(a.packets, [9, 9], 'they are A\'s own: A, retired and remembered, gets them');
    assert.equal(t.lost, 0);
    // A record with no birth (no kernel state to say) still follows the flow at the address.
    const same = t.ingest([ev({ tsNs: 330n, ctBirth: 0, ctStatus: est, ctTcpState: 3, tcpFlags: 0x11 })]);
    assert.equal(same[0]!.flow.id, 2);
    // Another tuple with B's birth (a drop of a new entry's packet before it had a state of its own): not B.
    const other = { ...orig, sport: 40999 };
    const c = t.ingest([ev({ tsNs: 340n, kind: EventKind.DROP, ctBirth: 291, ctOrig: other, pkt: other, reason: 2 })]);
    assert.equal(c[0]!.flow.id, 3);
    assert.deepEqual(c[0]!.flow.orig, other);
  });

  it('a flow its counters say was answered is answered, though its reply events did not reach it (counters ahead of a lagging ring, an older entry\'s final counters)', () => {
    const svc = { clusterIP: '10.96.0.100', port: 80 } as DiscoveredService;
    // IPVS: the SYN's records carry no conntrack status yet (unconfirmed, no NAT bit), only the backend in the reply tuple.
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1000, deliveredThrough: () => 50n });
    const a: Tuple = { ...orig, sport: 42100 };
    const aReply: Tuple = { ...reply, dport: 42100 };
    // Its final counters (netlink, ahead of the ring): the flow is made from them; its reply events are still in the ring.
    const [made] = t.ingest([], [stats({ ctId: 'ffb1', orig: a, reply: aReply, reason: StatsReason.CLOSED, firstNs: 100n, lastNs: 400n, tsNs: 2400n, packets: [6, 4] })]);
    assert.equal(made!.flow.dnat, true);
    assert.ok(made!.flow.status & IPS_SEEN_REPLY, 'four reply packets counted: answered');
    // Its SYN's record, older and without status, does not take the reply back.
    t.ingest([ev({ tsNs: 100n, ctId: 'ffb1', ctBirth: ctBirthOf(100n), ctOrig: a, pkt: a, ctStatus: 0, ctReply: aReply })]);
    assert.ok(made!.flow.status & IPS_SEEN_REPLY);
    // A newer entry with the same tuple at another address holds it now (a port reused); the old entry's final
    // counters, made a flow apart while the ring is behind, are answered too.
    const b = { ...orig, sport: 42101 };
    const bReply: Tuple = { ...reply, dport: 42101 };
    t.ingest([ev({ tsNs: 3000n, ctId: 'ffb2', ctBirth: ctBirthOf(3000n), ctOrig: b, pkt: b, ctStatus: 0, ctReply: bReply })]);
    t.ingest([], [stats({ ctId: 'ffb2', orig: b, reply: bReply, reason: StatsReason.REUSED, firstNs: 1000n, lastNs: 1200n, tsNs: 3000n, packets: [5, 3], delivered: false })]);
    const apart = t.takeRetired().find((f) => f.firstTsNs === 1000n);
    assert.ok(apart, 'the older entry, a flow of its own');
    assert.ok(apart.status & IPS_SEEN_REPLY);
    const seen = observeFlows(svc, [made!.flow, apart], 5);
    assert.deepEqual(seen.backends.map((x) => [x.backend, x.flows, x.answered]), [['10.244.1.12:8080', 2, 2]]);
    // Counters with no reply packet leave a flow unanswered.
    const [silent] = t.ingest([], [stats({ ctId: 'ffb3', orig: { ...orig, sport: 42102 }, reply: { ...reply, dport: 42102 }, reason: StatsReason.CLOSED, firstNs: 100n, lastNs: 400n, tsNs: 2400n, packets: [3, 0] })]);
    assert.equal(silent!.flow.status & IPS_SEEN_REPLY, 0);
  });

  it('an older entry\'s records that a lagging ring delivers after the newer entry\'s end make one ended flow of their own', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1000, deliveredThrough: () => 50n });
    // One address and one tuple (a port reused in a storm): only the birth tells X from Y.
    const x = orig;
    const y = orig;
    // Y's end and final counters (netlink) come first: a flow made from them.
    t.ingest([], [stats({ reason: StatsReason.CLOSED, orig: y, firstNs: 400n, lastNs: 450n, tsNs: 460n, packets: [5, 5] })]);
    assert.equal(t.summary().flows, 1);
    // Then the ring delivers X, which held the address before Y: its own flow, ended, not Y's.
    const items = t.ingest([ev({ tsNs: 100n, ctBirth: 101, ctOrig: x, pkt: x }), ev({ tsNs: 120n, ctBirth: 101, ctOrig: x, pkt: x, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
    assert.equal(items.length, 2);
    const fx = items[0]!.flow;
    assert.equal(items[1]!.flow, fx, 'one flow for X\'s records');
    assert.deepEqual(fx.orig, x);
    assert.equal(fx.closed, true);
    assert.deepEqual(t.takeRetired(), [fx], 'handed to the sinks as ended');
    // X's final counters (REUSED, written when Y took the address) land on X, not on Y.
    t.ingest([], [stats({ reason: StatsReason.REUSED, orig: x, firstNs: 100n, lastNs: 300n, tsNs: 390n, packets: [7, 6] })]);
    assert.deepEqual(fx.packets, [7, 6]);
    assert.deepEqual(t.flows().map((f) => [f.firstTsNs, f.packets]), [[400n, [5, 5]]]);
    assert.equal(t.summary().flows, 2, 'two connections, two flows');
  });

  it('counts new flows per backend address up to a cap, the rest together: the summary stays bounded across pod churn', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1000, maxFlows: 100 });
    const n = PER_BACKEND_MAX + 4;
    for (let i = 0; i < n; i++) {
      const ctId = `ffff${(0x100000 + i).toString(16)}`;
      const o = { ...orig, sport: 1024 + (i % 60000) };
      const backend = { ...reply, saddr: `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`, dport: o.sport };
      t.ingest([ev({ ctId, tsNs: BigInt(i) * 10n + 1n, ctOrig: o, pkt: o }), ev({ ctId, tsNs: BigInt(i) * 10n + 2n, ctOrig: o, ctReply: backend, pkt: o, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
    }
    const per = t.summary().perBackend;
    assert.equal(Object.keys(per).length, PER_BACKEND_MAX + 1);
    assert.equal(per[OTHER_BACKENDS], 4);
    assert.equal(Object.values(per).reduce((a, b) => a + b, 0), n, 'every flow counted once');
  });

  it('older entries remembered past their cap: the oldest goes, the recent ones keep their flows', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1000, deliveredThrough: () => 50n });
    const n = 1025; // one past the cap
    const ctIdOf = (i: number) => `ffff${(0x10000 + i).toString(16)}`;
    for (let i = 0; i < n; i++) {
      const ctId = ctIdOf(i);
      t.ingest([], [stats({ ctId, reason: StatsReason.CLOSED, firstNs: 400n, lastNs: 450n, tsNs: 460n, packets: [5, 5] })]);
      t.ingest([ev({ ctId, tsNs: 100n, ctBirth: 101 })]);
    }
    assert.equal(t.summary().flows, 2 * n);
    // A later record of a recent older entry finds its flow: no second flow of it.
    t.ingest([ev({ ctId: ctIdOf(n - 2), tsNs: 120n, ctBirth: 101, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
    assert.equal(t.summary().flows, 2 * n, 'one flow per entry');
  });

  it('a connection whose whole life is one batch gets the end the kernel wrote after its last event', () => {
    const t = table();
    const items = t.ingest(
      [
        ev({ tsNs: 100n }),
        ev({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, pkt: dnated, ctStatus: IPS_DST_NAT }),
        ev({ tsNs: 300n, ctTcpState: 7, ctStatus: IPS_DST_NAT | IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_ASSURED }),
      ],
      // Written right after the event of the packet that took it to TIME_WAIT.
      [stats({ tsNs: 301n, reason: StatsReason.ENDED, packets: [6, 5], bytes: [400, 500], tcpState: 7, reply })],
    );
    assert.equal(t.summary().flows, 1);
    const f = t.flows()[0]!;
    assert.equal(f.countersFinal, true, 'its end was not taken for a late record of an unknown flow');
    assert.deepEqual(f.packets, [6, 5]);
    assert.equal(items.at(-1)?.event.counters?.reason, 'ended', 'after its events');
  });

  it('a refused connection whose conntrack address the next one takes at once ends as a flow of its own, with its final counters', () => {
    const t = table();
    const a = { ...orig, sport: 41000 };
    const b = { ...orig, sport: 41001 };
    // A: SYN, DNAT, the backend's RST.
    t.ingest([
      ev({ tsNs: 100n, ctId: 'ffff7', ctOrig: a, pkt: a }),
      ev({ tsNs: 110n, ctId: 'ffff7', ctOrig: a, pkt: a, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT }),
      ev({ tsNs: 120n, ctId: 'ffff7', ctOrig: a, dir: Dir.REPLY, tcpFlags: 0x14, nfHook: 0, ctStatus: IPS_DST_NAT | IPS_CONFIRMED | IPS_SEEN_REPLY }),
    ]);
    // A's entry dies and B's takes its address before A's destroy arrives; the kernel writes A's final counters (REUSED) first.
    t.ingest([ev({ tsNs: 200n, ctId: 'ffff7', ctOrig: b, pkt: b })], [stats({ tsNs: 190n, ctId: 'ffff7', orig: a, reason: StatsReason.REUSED, packets: [1, 1], bytes: [60, 40] })]);
    assert.equal(t.summary().flows, 2);
    const [fa] = t.takeRetired();
    assert.ok(fa, 'A ended and is handed on');
    assert.equal(fa.orig.sport, 41000);
    assert.equal(fa.reset, true);
    assert.equal(fa.closed, true, 'the reused address ended A');
    assert.deepEqual(fa.packets, [1, 1]);
    assert.deepEqual(t.takeRetired(), [], 'taken once');
    // Only B stays in the table (A does not wait out a grace period there: storms filled the table with such flows).
    assert.deepEqual(t.flows().map((f) => f.orig.sport), [41001]);
    assert.deepEqual(t.flows()[0]!.packets, [0, 0]);
  });

  it('every index forgets a flow when it expires, also when SNAT changed what the backend receives after DNAT', () => {
    const t = table();
    const masq = { ...reply, daddr: '10.244.1.1', dport: 55555 };
    t.ingest([
      ev({ tsNs: 100n }),
      // DNAT: the backend would see the client.
      ev({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, pkt: dnated, ctStatus: IPS_DST_NAT }),
      // MASQUERADE afterwards: it sees the node's address and another port.
      ev({ tsNs: 120n, nfHook: 4, nfStage: NfStage.AFTER_NAT, nfPriority: 101, ctReply: masq, ctStatus: IPS_DST_NAT | IPS_SRC_NAT }),
      ev({ tsNs: 900n, kind: EventKind.CT_DESTROY, ctId: '', netnsIno: 111 }),
    ]);
    assert.deepEqual(t.indexSizes(), { byKey: 1, byTuple: 1, byBackendTuple: 1 });
    t.expire(10_000_000_000n);
    assert.deepEqual(t.indexSizes(), { byKey: 0, byTuple: 0, byBackendTuple: 0 }, 'a storm grew this index without bound');
  });
  describe('rule traces that come before their flow', () => {
    const trace = (traceId: number, chain: string, tsNs = 50n): RuleTrace => ({ traceId, tsNs, pkt: orig, ruleHandle: 1n, type: 3, verdict: -3, netnsIno: 111, table: 'nat', chain, target: '' });
    const pathOf = (t: FlowTable) => t.flows()[0]?.rulePath;

    it('wait for the flow, and the marking table\'s own trace is not kept', () => {
      const t = table();
      assert.deepEqual(t.ingestRuleTraces([{ ...trace(7, 'output'), table: 'svctrace_1' }, trace(7, 'OUTPUT'), trace(7, 'KUBE-SERVICES')]), []);
      t.ingestRuleTraces([trace(7, 'KUBE-SVC-X'), trace(7, 'KUBE-SEP-Y')]);
      assert.equal(t.pendingTraceGroups, 1);
      const items = t.ingest([ev({ tsNs: 100n })]);
      assert.deepEqual(pathOf(t), ['OUTPUT', 'KUBE-SERVICES', 'KUBE-SVC-X', 'KUBE-SEP-Y'], 'one packet\'s traces, split over two batches');
      assert.ok(items.some((i) => i.event.kind === pb.EventKind.EVENT_KIND_RULE_TRACE));
      // Read (50 ns) before the flow's first event (100 ns) reached us: its own time is kept.
      assert.equal(items.find((i) => i.event.kind === pb.EventKind.EVENT_KIND_RULE_TRACE)!.entry.tsNs, 50n);
      assert.equal(t.pendingTraceGroups, 0);
    });

    it('one packet\'s trace split over two batches after its flow is known: the path is completed; another packet\'s is not taken', () => {
      const t = table();
      t.ingest([ev({ tsNs: 10n })]);
      const first = t.ingestRuleTraces([trace(9, 'OUTPUT'), trace(9, 'KUBE-SERVICES')], 1000);
      assert.deepEqual(first.map((i) => i.event.rulePath), [['OUTPUT', 'KUBE-SERVICES']]);
      // Read at 50 ns, taken by the packet the flow's first event saw (10 ns): told there, in the timeline's order.
      assert.equal(first[0]!.entry.tsNs, 10n, 'the path at the flow\'s first packet, not when its message was read');
      // The same packet's filter table, with its REJECT, in the next batch.
      const reject: RuleTrace = { ...trace(9, 'KUBE-SERVICES'), table: 'filter', verdict: 0 };
      const rest = t.ingestRuleTraces([{ ...trace(9, 'OUTPUT'), table: 'filter' }, reject], 1001);
      assert.equal(rest.length, 1, 'the whole path, told again');
      assert.equal(rest[0]!.entry.tsNs, 10n, 'told again at the same time');
      assert.match(rest[0]!.event.summary ?? '', /dropped or rejected by table filter chain KUBE-SERVICES/);
      assert.deepEqual(pathOf(t)?.slice(0, 2), ['OUTPUT', 'KUBE-SERVICES']);
      // A later packet of the flow: its trace is not the flow's path.
      assert.deepEqual(t.ingestRuleTraces([trace(10, 'OUTPUT'), trace(10, 'KUBE-SVC-Z')], 1002), []);
      // Kept only a few seconds.
      t.expire(20n, 1002 + 6000);
      assert.equal(t.flows()[0]!.ruleTraces, undefined);
    });

    it('a path read long after its flow began, or one that did not cross NAT, keeps the time it was read', () => {
      // Read 2 s after the flow's first event: a SYN sent again (the first lost unconfirmed) crosses NAT too.
      const late = table();
      late.ingest([ev({ tsNs: 10n })]);
      const [l] = late.ingestRuleTraces([trace(3, 'OUTPUT', 2_000_000_010n), trace(3, 'KUBE-SERVICES', 2_000_000_010n)], 1000);
      assert.equal(l!.entry.tsNs, 2_000_000_010n);
      // Through the filter table only (a datagram sent again before any reply): not NAT's first packet.
      const filterOnly = table();
      filterOnly.ingest([ev({ tsNs: 10n })]);
      const [f] = filterOnly.ingestRuleTraces([{ ...trace(4, 'KUBE-SERVICES'), table: 'filter', verdict: 0 }], 1000);
      assert.match(f!.event.summary ?? '', /dropped or rejected by table filter/);
      assert.equal(f!.entry.tsNs, 50n);
    });

    it('a later packet of the same tuple takes the place of the one waiting (its flow was lost)', () => {
      const t = table();
      t.ingestRuleTraces([trace(1, 'OUTPUT'), trace(1, 'KUBE-SERVICES'), trace(1, 'KUBE-SVC-OLD'), trace(1, 'KUBE-SEP-OLD')]);
      t.ingestRuleTraces([trace(2, 'OUTPUT'), trace(2, 'KUBE-SERVICES'), trace(2, 'KUBE-SVC-X'), trace(2, 'KUBE-SEP-Y')]);
      assert.equal(t.pendingTraceGroups, 1);
      t.ingest([ev({ tsNs: 100n })]);
      assert.deepEqual(pathOf(t), ['OUTPUT', 'KUBE-SERVICES', 'KUBE-SVC-X', 'KUBE-SEP-Y']);
    });

    it('waiting groups leave in the order they came; one taken over by a later packet waits anew', () => {
      const t = table();
      const now = Date.now();
      const at = (sport: number, id: number): RuleTrace => ({ ...trace(id, 'KUBE-SERVICES'), pkt: { ...orig, sport } });
      t.ingestRuleTraces([at(1001, 1)], now);
      t.ingestRuleTraces([at(1002, 2)], now + 10_000);
      t.ingestRuleTraces([at(1001, 3)], now + 30_000); // the first tuple's group, replaced: younger now
      t.ingestRuleTraces([at(1003, 4)], now + 40_000);
      t.ingestRuleTraces([], now + 71_000);
      assert.equal(t.pendingTraceGroups, 2, 'the group of 1002 (61 s) left; the replaced one (41 s) and 1003 wait');
      t.ingestRuleTraces([], now + 91_000);
      assert.equal(t.pendingTraceGroups, 1);
      t.ingestRuleTraces([], now + 101_000);
      assert.equal(t.pendingTraceGroups, 0);
    });

    it('a ring seconds behind the trace messages: the traces wait for their flow, and get it', () => {
      const t = table();
      const now = Date.now();
      // The flow's first event was written at 1 s; its packet's trace came at 1.001 s.
      t.ingestRuleTraces([trace(1, 'OUTPUT', 1_001_000_000n), trace(1, 'KUBE-SERVICES', 1_001_000_000n)], now);
      // Ten seconds later the ring has delivered nothing past 0.5 s.
      t.expire(500_000_000n, now + 10_000);
      assert.equal(t.pendingTraceGroups, 1);
      t.ingest([ev({ tsNs: 1_000_000_000n })]);
      assert.deepEqual(pathOf(t), ['OUTPUT', 'KUBE-SERVICES']);
    });

    it("in a pod's namespace only a drop waits; news with no room to wait is counted lost (flow_table)", () => {
      const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], nodeNetnsIno: () => 111 });
      const inPod = (id: number, sport: number, verdict = 1): RuleTrace => ({ ...trace(id, 'INPUT'), table: 'filter', netnsIno: 222, verdict, pkt: { ...dnated, sport } });
      // A pod's packet that went through: not news, not kept, not lost.
      t.ingestRuleTraces([inPod(1, 50000)]);
      assert.equal(t.pendingTraceGroups, 0);
      // One its firewall dropped: waits for its flow, by the backend's key.
      t.ingestRuleTraces([inPod(2, 50001, 0)]);
      assert.equal(t.pendingTraceGroups, 1);
      // The node's groups wait, up to 10,000; the next one is lost, counted.
      const atNode = (id: number): RuleTrace => ({ ...trace(id, 'KUBE-SERVICES'), pkt: { ...orig, sport: 1024 + id } });
      for (let id = 10; id < 10_010; id++) t.ingestRuleTraces([atNode(id)]);
      assert.equal(t.pendingTraceGroups, 10_001);
      assert.equal(t.lost, 0);
      t.ingestRuleTraces([atNode(20_000)]);
      assert.equal(t.summary().ruleTracesNotKept, 1);
      assert.equal(t.lost, 1, 'in the flow_table stage');
      // A pod's passing packet still is not news; more of a waiting packet's trace joins its group.
      t.ingestRuleTraces([inPod(3, 50002), atNode(11)]);
      assert.equal(t.lost, 1);
      assert.equal(t.pendingTraceGroups, 10_001);
    });

    it('stop waiting once the ring has delivered a second past them, or after a minute', () => {
      const t = table();
      const now = Date.now();
      t.ingestRuleTraces([trace(1, 'KUBE-SERVICES', 2_000_000_000n)], now);
      t.expire(2_500_000_000n, now);
      assert.equal(t.pendingTraceGroups, 1, 'the ring has not yet delivered past it: its flow may still come');
      t.expire(3_000_000_001n, now);
      assert.equal(t.pendingTraceGroups, 0, 'delivered a second past it: its flow was lost in the ring');
      t.ingestRuleTraces([trace(2, 'KUBE-SERVICES', 9_000_000_000n)], now);
      t.ingestRuleTraces([], now + 59_000);
      assert.equal(t.pendingTraceGroups, 1);
      t.ingestRuleTraces([], now + 60_001);
      assert.equal(t.pendingTraceGroups, 0, 'a minute, whatever the ring does');
    });
  });
});

describe('FlowTable: where the kernel freed a dropped packet', () => {
  const symbols = KernelSymbols.parse(['ffffffff81f82610 T nf_hook_slow', 'ffffffff82055850 t ip_rcv_core', 'ffffffff82055f00 T ip_rcv'].join('\n'));
  const table = (locate = true) =>
    new FlowTable({
      services: [parseServiceSpec('10.96.0.100:80')],
      dropReasons: { '0': 'UNKNOWN', '2': 'NOT_SPECIFIED', '12': 'NETFILTER_DROP' },
      dropLocations: locate ? new DropLocations(() => symbols) : undefined,
    });

  it('a drop without a reason is named by the function that freed it, in its flow, the summary and the event', () => {
    const t = table();
    t.ingest([ev({ tsNs: 1n })]);
    const [item] = t.ingest([ev({ tsNs: 2n, kind: EventKind.DROP, reason: 0, dropLocation: 'ffffffff81f8269c' })]);
    assert.deepEqual(t.flows()[0]!.drops, ['UNKNOWN@nf_hook_slow']);
    assert.deepEqual(t.summary().dropsByReason, { 'UNKNOWN@nf_hook_slow': 1 });
    assert.equal(item!.event.dropReasonName, 'UNKNOWN', 'the kernel reason stays as the kernel gave it');
    assert.equal(item!.event.dropLocation, 'nf_hook_slow+0x8c');
    assert.match(eventSummary(item!.event), /DROPPED \(UNKNOWN, freed by nf_hook_slow\+0x8c\)/);
    // NOT_SPECIFIED (a kernel with reasons, a place without one) is named the same way.
    const [other] = t.ingest([ev({ tsNs: 3n, kind: EventKind.DROP, reason: 2, dropLocation: 'ffffffff82055860' })]);
    assert.equal(other!.event.dropLocation, 'ip_rcv_core+0x10');
    assert.deepEqual(t.flows()[0]!.drops, ['UNKNOWN@nf_hook_slow', 'NOT_SPECIFIED@ip_rcv_core']);
  });

  it('a drop with a reason keeps its name; its place still goes with the event', () => {
    const t = table();
    t.ingest([ev({ tsNs: 1n })]);
    const [item] = t.ingest([ev({ tsNs: 2n, kind: EventKind.DROP, reason: 12, dropLocation: 'ffffffff81f8269c' })]);
    assert.deepEqual(t.flows()[0]!.drops, ['NETFILTER_DROP']);
    assert.equal(item!.event.dropLocation, 'nf_hook_slow+0x8c');
  });

  it('with no symbol table (or an address it does not hold) the address shows in hex, and the name stays the reason', () => {
    for (const [t, at] of [[table(false), 'ffffffff81f8269c'], [table(), 'ffffffff80000010']] as const) {
      t.ingest([ev({ tsNs: 1n })]);
      const [item] = t.ingest([ev({ tsNs: 2n, kind: EventKind.DROP, reason: 0, dropLocation: at })]);
      assert.equal(item!.event.dropLocation, `0x${at}`);
      assert.deepEqual(t.flows()[0]!.drops, ['UNKNOWN']);
    }
  });
});

describe('FlowTable: counters that come after a flow left', () => {
  it('a packet after the end corrects a flow that expired closed; one no longer remembered is counted lost', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1000 });
    // A detailed connection ends (TIME_WAIT) and leaves the table after the grace.
    t.ingest(
      [ev({ tsNs: 100n, ctStatus: IPS_DST_NAT, ctReply: reply }), ev({ tsNs: 190n, ctStatus: IPS_DST_NAT | IPS_CONFIRMED | IPS_SEEN_REPLY, ctTcpState: 7, tcpFlags: 0x10, ctReply: reply })],
      [stats({ tsNs: 200n, reason: StatsReason.ENDED, packets: [6, 5], bytes: [400, 500], tcpState: 7, reply })],
    );
    const [f] = t.flows();
    assert.ok(f!.closed && f!.countersFinal);
    assert.deepEqual(t.expire(200n + 1_000_000_000n), [f]);
    // Its server resends its FIN, the client ACKs it again: the kernel writes the end again.
    const late = t.ingest([], [stats({ tsNs: 2_000_000_000n, lastNs: 2_000_000_000n, reason: StatsReason.ENDED, packets: [7, 6], bytes: [452, 552], tcpState: 7, reply })]);
    assert.equal(late.length, 1);
    assert.equal(late[0]!.flow, f, 'the flow the sinks had');
    assert.deepEqual([f!.packets, f!.bytes], [[7, 6], [452, 552]]);
    assert.equal(t.lost, 0);
    // After a thousand other connections ended, it is no longer remembered: counted, not applied, not a new flow.
    for (let i = 0; i < 1100; i++) {
      const o = { ...orig, sport: 20000 + i };
      t.ingest([], [stats({ ctId: (0x100000 + i).toString(16), orig: o, reason: StatsReason.ENDED, countedOnly: true, delivered: false, packets: [5, 5], tcpState: 7, reply: { ...reply, dport: o.sport } })]);
    }
    t.takeRetired();
    assert.deepEqual(t.ingest([], [stats({ tsNs: 3_000_000_000n, lastNs: 3_000_000_000n, reason: StatsReason.ENDED, packets: [8, 6], tcpState: 7, reply })]), []);
    assert.deepEqual(f!.packets, [7, 6]);
    assert.equal(t.summary().lateCounters, 1);
    assert.equal(t.lost, 1, 'in the flow_table stage\'s losses');
    // A record that repeats an end already delivered (the kernel's mark: nothing counted since), as when
    // a new entry takes the address or the state is snapshot, tells nothing new: not a loss.
    for (const reason of [StatsReason.REUSED, StatsReason.PERIODIC]) {
      assert.deepEqual(t.ingest([], [stats({ tsNs: 4_000_000_000n, lastNs: 3_000_000_000n, reason, endSent: true, packets: [8, 6], tcpState: 7, reply })]), []);
    }
    assert.equal(t.summary().lateCounters, 1);
  });
});
