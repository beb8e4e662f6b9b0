/**
 * The stream's encoder of kernel records (stream/kernel-event-encoder.ts)
 * against the one it stands in for: encodeEvent of the item's wire event
 * (itself checked against the generated encoder in event-writer.test.ts).
 * Byte for byte, on records of every kind through a real flow table, on a
 * flow's later events (which copy what its first ones encoded), and when
 * what a flow's cached bytes were made of changes.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { FlowTable } from '../../src/flows/flow-table';
import { KernelIngested, nameItem } from '../../src/flows/ingested';
import type { Ingested } from '../../src/flows/types';
import type { KernelEvent } from '../../src/events/decode';
import { EventKind, NfStage, Dir } from '../../src/events/layout';
import { IPS_ASSURED, IPS_CONFIRMED, IPS_DST_NAT, IPS_SEEN_REPLY, IPS_SRC_NAT } from '../../src/events/conntrack';
import { parseServiceSpec } from '../../src/net/ipv4';
import { encodeEvents, encodeItems, eventBytes, eventsFrame } from '../../src/stream/frames';
import { EventWriter } from '../../src/stream/event-writer';
import { encodeEvent } from '../../src/stream/event-encoder';
import { encodeKernelEvent } from '../../src/stream/kernel-event-encoder';
import { hasConntrack } from '../../src/flows/to-proto';
import { ev, orig, reply } from '../helpers/kernel-events';
import { svctrace } from '../../src/gen/svctrace';
import { wallNs, wallNsWords } from '../../src/clock';

import pb = svctrace.v1;

const dnated = { saddr: '10.244.1.1', daddr: '10.244.1.12', sport: 40000, dport: 8080, proto: 6 };
const ct = IPS_DST_NAT | IPS_CONFIRMED;

function table(): FlowTable {
  return new FlowTable({
    services: [parseServiceSpec('10.96.0.100:80'), parseServiceSpec('10.96.0.53:53/udp')],
    dropReasons: { '2': 'NO_SOCKET', '12': 'NETFILTER_DROP', '27': 'QUEUE_PURGE' },
    netnsName: (ino) => (ino === 222 ? 'pod-a' : undefined),
  });
}

/** A connection's records of every kind, in order. */
function connection(over: Partial<KernelEvent> = {}): KernelEvent[] {
  const o = (x: Partial<KernelEvent>) => ev({ ...over, ...x });
  return [
    o({ tsNs: 100n, cpu: 1 }),
    o({ tsNs: 110n, nfStage: NfStage.AFTER_NAT, nfPriority: -99, pkt: dnated, ctStatus: IPS_DST_NAT, ctMark: 0x4000, ctZone: 3, ctTimeoutMs: 120000 }),
    o({ tsNs: 115n, kind: EventKind.FIB, pkt: dnated, gateway: '10.244.1.254', reason: 254, ifindex: 5, ifname: 'cni0', linkKind: 'bridge', ctStatus: ct }),
    o({ tsNs: 120n, kind: EventKind.DEV_RECV, pkt: dnated, netnsIno: 222, ifname: 'eth0', linkKind: 'veth', ctOrig: { ...orig, proto: 0 } }),
    o({ tsNs: 125n, kind: EventKind.DEV_XMIT, pkt: dnated, netnsIno: 111, ifindex: 0, ifname: '', linkKind: '' }),
    o({ tsNs: 130n, dir: Dir.REPLY, nfHook: 1, nfStage: NfStage.AFTER_NAT, nfPriority: 101, tcpFlags: 0x12, ctTcpState: 3,
      pkt: { saddr: '10.96.0.100', daddr: '10.244.1.1', sport: 80, dport: 40000, proto: 6 }, ctStatus: ct | IPS_SEEN_REPLY | IPS_ASSURED }),
    o({ tsNs: 131n, dir: Dir.REPLY, nfHook: 1, nfStage: NfStage.BEFORE_NAT, nfPriority: -101, tcpFlags: 0x10, ctTcpState: 3, pkt: reply, ctStatus: ct | IPS_SEEN_REPLY | IPS_ASSURED | IPS_SRC_NAT }),
    o({ tsNs: 140n, kind: EventKind.DROP, reason: 12, pkt: dnated, ctStatus: ct, capture: Uint8Array.from([0x45, 0, 0, 60]) }),
    o({ tsNs: 141n, kind: EventKind.DROP, reason: 27, pkt: dnated, ctStatus: ct }),
    o({ tsNs: 142n, kind: EventKind.DROP, reason: 99, pkt: dnated, ctOrig: { ...orig, proto: 0 }, ctStatus: 0, dropLocation: 'ffffffff81f8269c' }),
    o({ tsNs: 150n, tcpFlags: 0x11, ctTcpState: 7, ctStatus: ct | IPS_SEEN_REPLY | IPS_ASSURED }),
    o({ tsNs: 160n, tcpFlags: 0x04, ctTcpState: 8, ctStatus: ct | IPS_SEEN_REPLY | IPS_ASSURED }),
    o({ tsNs: 170n, kind: EventKind.CT_DESTROY, ctStatus: ct | IPS_SEEN_REPLY | IPS_ASSURED }),
  ];
}

/** An ICMP error and a UDP exchange, of another service. */
function others(): KernelEvent[] {
  const u = { saddr: '10.244.1.1', daddr: '10.96.0.53', sport: 5353, dport: 53, proto: 17 };
  return [
    ev({ tsNs: 200n, ctId: 'ffff2', pkt: u, ctOrig: u, serviceId: 2, ctTcpState: 0, tcpFlags: 0, cpu: 0 }),
    ev({ tsNs: 210n, ctId: 'ffff3', kind: EventKind.DROP, reason: 2, icmpType: 3, icmpCode: 3, pkt: { ...u, proto: 1 }, ctOrig: u, serviceId: 2 }),
    ev({ tsNs: 220n, ctId: '', ctOrig: { ...orig, proto: 0 }, ctReply: { ...orig, proto: 0 }, kind: EventKind.DROP, reason: 2, pkt: { ...orig, sport: 41000 } }),
  ];
}

function ours(item: KernelIngested): Buffer {
  const w = new EventWriter(64);
  encodeKernelEvent(item, w);
  return Buffer.from(w.finish());
}

function reference(item: Ingested): Buffer {
  const w = new EventWriter(64);
  encodeEvent(item.event, w);
  return Buffer.from(w.finish());
}

function kernelItems(items: Ingested[]): KernelIngested[] {
  const k = items.filter((i): i is KernelIngested => i instanceof KernelIngested);
  assert.ok(k.length > 0);
  return k;
}

describe('kernel event encoder', () => {
  it('writes the wall-clock time as wallNs gives it, below and above 2^53 ns of uptime', () => {
    const out = new Uint32Array(2);
    for (const mono of [0n, 1n, 2n ** 32n - 1n, 2n ** 32n, 10n ** 15n, 2n ** 53n - 1n, 2n ** 53n, 2n ** 60n + 12345n]) {
      wallNsWords(mono, out);
      assert.equal(BigInt(out[1]!) * 2n ** 32n + BigInt(out[0]!), wallNs(mono) & (2n ** 64n - 1n), `mono ${mono}`);
    }
  });

  it('writes what encodeEvent writes of the wire event, on records of every kind', () => {
    const t = table();
    const items = kernelItems(t.ingest([...connection(), ...others()]));
    // Encoded from the record first (the flow's cached bytes made), then compared.
    const fromRecords = items.map(ours);
    assert.ok(items.every((i) => !i.materialized), 'the encoder made no wire event');
    const kinds = new Set<number>();
    items.forEach((item, i) => {
      kinds.add(item.record.kind);
      assert.deepEqual(fromRecords[i], reference(item), `record ${i} (kind ${item.record.kind}, ${pb.Stage[item.context.stage]})`);
    });
    for (const k of [EventKind.NF, EventKind.FIB, EventKind.DEV_RECV, EventKind.DEV_XMIT, EventKind.DROP, EventKind.CT_DESTROY]) assert.ok(kinds.has(k), `kind ${k} covered`);
    assert.ok(items.some((i) => i.context.benignDrop) && items.some((i) => i.context.tcpStateBefore) && items.some((i) => i.context.podSide), 'benign drop, state change and pod side covered');
  });

  it('copies a flow\'s bytes on later events and makes them again when they change', () => {
    const t = table();
    const first = kernelItems(t.ingest(connection().slice(0, 3)));
    first.forEach((item) => assert.deepEqual(ours(item), reference(item)));
    // Records of one flow whose original tuple differs (made by hand: the
    // table would make them flows of their own): the conntrack run is made
    // again, and again on the way back.
    const base = first[1]!;
    const odd = new KernelIngested(base.flow, base.entry, { ...base.record, ctOrig: { ...base.record.ctOrig, sport: 40001 } }, base.context);
    assert.deepEqual(ours(odd), reference(odd), 'another original tuple');
    assert.deepEqual(ours(base), reference(base), 'and back');
    // Another service, flow id or conntrack id under the same flow (not
    // made so by the table today): the runs made of them are made again.
    // Each case on a flow of its own, its bytes cached first (a full slab
    // caches no more, and would hide a missing check).
    for (const change of [{ service: '10.96.0.200:80/tcp' }, { flowId: 1000 }, { ctId: 'ffff0000abcd' }]) {
      const what = JSON.stringify(change);
      const items = kernelItems(table().ingest(connection().slice(0, 3)));
      assert.ok(items.some((i) => hasConntrack(i.record)), 'a record with conntrack among them');
      for (const item of items) {
        assert.deepEqual(ours(item), reference(item), `${what}: before (kind ${item.record.kind})`);
        const changed = new KernelIngested(item.flow, item.entry, item.record, { ...item.context, ...change });
        assert.deepEqual(ours(changed), reference(changed), `${what} (kind ${item.record.kind})`);
      }
    }
    // The same flow, more events (cached tuples and runs), then its backend
    // changes under the same entry (a new reply tuple: new runs).
    const later = kernelItems(t.ingest([
      ev({ tsNs: 300n, nfStage: NfStage.AFTER_NAT, pkt: dnated, ctStatus: ct }),
      ev({ tsNs: 310n, nfStage: NfStage.AFTER_NAT, ctStatus: ct, pkt: { ...dnated, daddr: '10.244.1.13' }, ctReply: { ...reply, saddr: '10.244.1.13' } }),
      ev({ tsNs: 320n, nfStage: NfStage.AFTER_NAT, ctStatus: ct, pkt: { ...dnated, daddr: '10.244.1.13' }, ctReply: { ...reply, saddr: '10.244.1.13' } }),
    ]));
    assert.equal(later[0]!.flow, first[0]!.flow);
    later.forEach((item, i) => assert.deepEqual(ours(item), reference(item), `later event ${i}`));
    assert.notEqual(later[1]!.context.backend, later[0]!.context.backend, 'the backend changed');
    // A flow with more packet tuples than the encoder keeps: each still right.
    const many = kernelItems(t.ingest(Array.from({ length: 10 }, (_, i) => ev({ tsNs: 400n + BigInt(i), pkt: { ...orig, sport: 50000 + i } }))));
    many.forEach((item, i) => assert.deepEqual(ours(item), reference(item), `tuple ${i}`));
  });

  it('a device\'s cached sub-message is made again when any of its values changes', () => {
    const items = kernelItems(table().ingest([...connection(), ...others()]));
    const dev = items.find((i) => i.record.ifindex && i.record.netnsIno)!;
    assert.ok(dev, 'an event with a device');
    assert.deepEqual(ours(dev), reference(dev), 'the device, cached');
    const variants: Array<[string, KernelIngested]> = [
      ['another namespace name', new KernelIngested(dev.flow, dev.entry, dev.record, { ...dev.context, netnsName: 'pod default/web-2' })],
      ['no namespace name', new KernelIngested(dev.flow, dev.entry, dev.record, { ...dev.context, netnsName: undefined })],
      ['pod side', new KernelIngested(dev.flow, dev.entry, dev.record, { ...dev.context, podSide: !dev.context.podSide })],
      ['renamed', new KernelIngested(dev.flow, dev.entry, { ...dev.record, ifname: 'eth9' }, dev.context)],
      ['another kind', new KernelIngested(dev.flow, dev.entry, { ...dev.record, linkKind: 'vxlan' }, dev.context)],
    ];
    // Other devices, enough of them to share the table's slots with it.
    for (let k = 1; k <= 600; k++) {
      variants.push([`ifindex ${k}`, new KernelIngested(dev.flow, dev.entry, { ...dev.record, ifindex: k }, dev.context)]);
      variants.push([`namespace +${k}`, new KernelIngested(dev.flow, dev.entry, { ...dev.record, netnsIno: dev.record.netnsIno + k }, dev.context)]);
    }
    for (const [what, item] of variants) {
      assert.deepEqual(ours(dev), reference(dev), `${what}: the original, cached`);
      assert.deepEqual(ours(item), reference(item), what);
    }
  });

  it('takes API names given before the event is made, and a made event as its holder changed it', () => {
    const t = table();
    const [a, b] = kernelItems(t.ingest(connection().slice(0, 2)));
    nameItem(a!, { service: 'default/web:http', pod: 'default/web-1' });
    assert.ok(!a!.materialized);
    // From the record, with the names, before anything makes the event.
    const named = ours(a!);
    assert.ok(!a!.materialized, 'the names were written from the record');
    assert.deepEqual(named, reference(a!), 'API names written from the record');
    assert.equal(a!.event.serviceName, 'default/web:http');
    assert.equal(a!.event.backendPod, 'default/web-1');
    b!.event.node = 'changed-by-a-sink';
    const batch = encodeItems([a!, b!]);
    assert.deepEqual(Buffer.from(eventBytes(batch, 0)), Buffer.concat([Buffer.from([0x0a]), lengthOf(reference(a!)), reference(a!)]));
    assert.equal(pb.Event.decode(eventBytes(batch, 1).subarray(3)).node, 'changed-by-a-sink');
  });

  it('a batch encoded from items is the batch encoded from their events, as a frame', () => {
    const t = table();
    const items = t.ingest([...connection(), ...others()]);
    const fromItems = encodeItems(items);
    const fromEvents = encodeEvents(items.map((i) => i.event));
    assert.deepEqual(Buffer.from(fromItems.bytes), Buffer.from(fromEvents.bytes));
    assert.deepEqual([...fromItems.ends], [...fromEvents.ends]);
    assert.equal(fromItems.count, items.length);
    assert.equal(pb.ServerMessage.decode(eventsFrame([fromItems.bytes])).events?.events?.length, items.length);
  });
});

function lengthOf(b: Buffer): Buffer {
  const out: number[] = [];
  let v = b.length;
  while (v > 127) {
    out.push((v & 127) | 128);
    v >>>= 7;
  }
  out.push(v);
  return Buffer.from(out);
}
