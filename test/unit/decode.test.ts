import { ctKeyOf } from '../helpers/kernel-events';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { decodeBatch, DecodeError } from '../../src/events/decode';
import { EVENT, EVENT_CAP_SIZE, EventKind, FLOW_COUNTERS, FLOW_STATS, StatsReason } from '../../src/events/layout';

const F = EVENT.fields;

/** Writes one record the way the kernel would (network-order addresses/ports). */
function record(over: { kind?: number; size?: number; daddr?: number[]; dport?: number; prio?: number; ifname?: string } = {}): Buffer {
  const b = Buffer.alloc(EVENT.size);
  b.writeUInt16LE(over.kind ?? EventKind.NF, F.kind[0]);
  b.writeUInt16LE(over.size ?? EVENT.size, F.size[0]);
  b.writeUInt32LE(1, F.cpu[0]);
  b.writeBigUInt64LE(123456789n, F.ts_ns[0]);
  b.writeBigUInt64LE(0xffff888812345678n, F.ct_id[0]);
  Buffer.from([10, 244, 1, 1]).copy(b, F.pkt[0] + 0);
  Buffer.from(over.daddr ?? [10, 96, 0, 100]).copy(b, F.pkt[0] + 4);
  b.writeUInt16BE(45278, F.pkt[0] + 8);
  b.writeUInt16BE(over.dport ?? 80, F.pkt[0] + 10);
  b.writeUInt8(6, F.pkt[0] + 12);
  b.writeUInt32LE(0x28, F.ct_status[0]);
  b.writeInt32LE(over.prio ?? -101, F.nf_priority[0]);
  b.writeUInt8(3, F.nf_hook[0]);
  b.writeUInt8(0x02, F.tcp_flags[0]);
  b.write(over.ifname ?? 'cni0', F.ifname[0], 'latin1');
  return b;
}

describe('decodeBatch', () => {
  it('a drop carries the address that freed it, in hex; other kinds carry none', () => {
    const drop = record({ kind: EventKind.DROP });
    drop.writeBigUInt64LE(0xffffffff81f8269cn, F.drop_location[0]);
    const nf = record();
    nf.writeBigUInt64LE(0xffffffff81f8269cn, F.drop_location[0]);
    const [d, n] = decodeBatch(Buffer.concat([drop, nf])).events;
    assert.equal(d!.dropLocation, 'ffffffff81f8269c');
    assert.equal(n!.dropLocation, '');
  });

  it('nf_conn addresses: distinct addresses get distinct keys and their own hex; no address, key 0', () => {
    const at = (addr: bigint) => {
      const b = record();
      b.writeBigUInt64LE(addr, F.ct_id[0]);
      return decodeBatch(b).events[0]!;
    };
    const a = at(0xffff888812345678n);
    const b = at(0xffff888912345678n); // same low word, other high word
    const c = at(0xffff888812345678n);
    assert.notEqual(a.ctKey, b.ctKey);
    assert.equal(a.ctKey, c.ctKey);
    assert.equal(b.ctId, 'ffff888912345678');
    assert.equal(c.ctId, 'ffff888812345678', 'the cached text is the address\'s own');
    const none = at(0n);
    assert.equal(none.ctKey, 0);
    assert.equal(none.ctId, '');
  });

  it('addresses, tuples and nf_conn ids decode to their own values past the caches\' size (slots shared by many values)', () => {
    // 12,000 addresses and ids, twice around: more than the caches have
    // slots, so values share slots and replace each other; each one must
    // still decode to its own text, the second time round too.
    const n = 12_000;
    const records: Buffer[] = [];
    const want: Array<{ pkt: object; ctId: string }> = [];
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < n; i++) {
        // A quarter each differ from one another in the client port, the
        // source address, the destination address, or all of it.
        const g = i % 4;
        const varied = [10 + (i % 7), (i >> 8) & 255, i & 255, (i * 13) & 255];
        const saddr = g === 1 || g === 3 ? varied : [10, 244, 1, 1];
        const daddr = g === 2 || g === 3 ? varied : [10, 96, 0, 100];
        const sport = g === 0 || g === 3 ? 1024 + i : 45278;
        const proto = i % 3 ? 6 : 17;
        // Ids 256 bytes apart (slab objects), and pairs that differ only in
        // bits 53-63 (one key for both: the text is checked against the whole address).
        const id = (i % 2 ? 0x7fff888800000000n : 0xffff888800000000n) + BigInt(i >> 1) * 256n;
        const b = record({ daddr, dport: 80 });
        Buffer.from(saddr).copy(b, F.pkt[0]);
        b.writeUInt16BE(sport, F.pkt[0] + 8);
        b.writeUInt8(proto, F.pkt[0] + 12);
        b.writeBigUInt64LE(id, F.ct_id[0]);
        records.push(b);
        want.push({ pkt: { saddr: saddr.join('.'), daddr: daddr.join('.'), sport, dport: 80, proto }, ctId: id.toString(16) });
      }
    }
    const evs = decodeBatch(Buffer.concat(records)).events;
    assert.equal(evs.length, want.length);
    for (let i = 0; i < evs.length; i++) {
      assert.deepEqual(evs[i]!.pkt, want[i]!.pkt, `record ${i}`);
      assert.equal(evs[i]!.ctId, want[i]!.ctId, `record ${i}`);
    }
  });

  it('a tuple seen again is the same object; one differing only in protocol or a port is its own', () => {
    const udp = record();
    udp.writeUInt8(17, F.pkt[0] + 12);
    const otherPort = record({ dport: 81 });
    const [a, b, c, d] = decodeBatch(Buffer.concat([record(), record(), udp, otherPort])).events;
    assert.equal(a!.pkt, b!.pkt, 'one object for one tuple');
    assert.notEqual(a!.pkt, c!.pkt);
    assert.equal(c!.pkt.proto, 17);
    assert.equal(a!.pkt.proto, 6);
    assert.equal(d!.pkt.dport, 81);
    assert.equal(decodeBatch(record()).events[0]!.pkt, a!.pkt, 'and in the next batch');
  });

  it('decodes addresses, ports (network order) and host-order fields', () => {
    const [e] = decodeBatch(record()).events;
    assert.ok(e);
    assert.equal(e.kind, EventKind.NF);
    assert.equal(e.tsNs, 123456789n);
    assert.equal(e.ctId, 'ffff888812345678');
    assert.equal(e.ctKey, ctKeyOf('ffff888812345678'), 'the map key is the address\'s bits 0-52');
    assert.deepEqual(e.pkt, { saddr: '10.244.1.1', daddr: '10.96.0.100', sport: 45278, dport: 80, proto: 6 });
    assert.equal(e.nfPriority, -101);
    assert.equal(e.nfHook, 3);
    assert.equal(e.tcpFlags, 2);
    assert.equal(e.ctStatus, 0x28);
    assert.equal(e.ifname, 'cni0');
  });

  it('decodes several records in order', () => {
    const evs = decodeBatch(Buffer.concat([record({ dport: 80 }), record({ daddr: [10, 244, 1, 12], dport: 8080, prio: -99 })])).events;
    assert.equal(evs.length, 2);
    assert.equal(evs[1]?.pkt.daddr, '10.244.1.12');
    assert.equal(evs[1]?.pkt.dport, 8080);
    assert.equal(evs[1]?.nfPriority, -99);
  });

  it('reads a full-length interface name without a terminator', () => {
    const [e] = decodeBatch(record({ ifname: 'abcdefghijklmnop' })).events;
    assert.equal(e?.ifname, 'abcdefghijklmnop');
  });

  it('names devices by their bytes: a name seen before, another one, and one that differs only in its end', () => {
    const names = ['veth1', 'veth2', 'cni0', 'veth1', 'veth12', 'veth1', 'abcdefghijklmnop', 'abcdefghijklmnoq', 'veth2'];
    const evs = decodeBatch(Buffer.concat(names.map((ifname) => record({ ifname })))).events;
    assert.deepEqual(evs.map((e) => e.ifname), names);
    // Reused batch memory: what a name was cached from may be overwritten, the names stay right.
    const buf = record({ ifname: 'eth0' });
    assert.equal(decodeBatch(buf).events[0]?.ifname, 'eth0');
    buf.write('eth1', EVENT.fields.ifname[0], 'latin1');
    assert.equal(decodeBatch(buf).events[0]?.ifname, 'eth1');
  });

  it('rejects a batch that is not whole records', () => {
    assert.throws(() => decodeBatch(Buffer.concat([record(), Buffer.alloc(3)])), DecodeError);
  });

  it('decodes a record carrying a packet capture, and strides over it', () => {
    const cap = Buffer.concat([record({ size: EVENT_CAP_SIZE }), Buffer.alloc(EVENT_CAP_SIZE - EVENT.size)]);
    cap.writeUInt16LE(4, EVENT.fields.cap_len[0]);
    Buffer.from([0x45, 0, 0, 60]).copy(cap, EVENT.size);
    const evs = decodeBatch(Buffer.concat([cap, record()])).events;
    assert.equal(evs.length, 2);
    assert.deepEqual([...evs[0]!.capture!], [0x45, 0, 0, 60]);
    assert.equal(evs[1]!.capture, undefined);
  });

  it('rejects a record whose size field disagrees with the ABI', () => {
    assert.throws(() => decodeBatch(record({ size: 100 })), /size 100/);
  });

  it('decodes from a buffer view with a non-zero byteOffset', () => {
    const backing = Buffer.concat([Buffer.alloc(8), record()]);
    const [e] = decodeBatch(backing.subarray(8)).events;
    assert.equal(e?.pkt.daddr, '10.96.0.100');
  });

  it('decodes a flow counters record between events, keeping both in order', () => {
    const st = Buffer.alloc(FLOW_STATS.size);
    const S = FLOW_STATS.fields;
    const C = FLOW_COUNTERS.fields;
    const c = S.c[0];
    st.writeUInt16LE(EventKind.FLOW_STATS, S.kind[0]);
    st.writeUInt16LE(FLOW_STATS.size, S.size[0]);
    st.writeBigUInt64LE(5n, S.ts_ns[0]);
    st.writeBigUInt64LE(0xffff888812345678n, S.ct_id[0]);
    st.writeUInt32LE(StatsReason.CLOSED, S.reason[0]);
    st.writeBigUInt64LE(1003n, c + C.packets[0]);
    st.writeBigUInt64LE(1001n, c + C.packets[0] + 8);
    st.writeBigUInt64LE(2n ** 40n + 0xffffffffn, c + C.bytes[0]);
    st.writeBigUInt64LE(77n, c + C.bytes[0] + 8);
    Buffer.from([10, 96, 0, 100]).copy(st, c + C.orig[0] + 4);
    st.writeUInt16BE(80, c + C.orig[0] + 10);
    st.writeUInt8(0x1b, c + C.tcp_flags[0] + 1);
    const { events, stats } = decodeBatch(Buffer.concat([record(), st, record({ dport: 81 })]));
    assert.equal(events.length, 2);
    assert.equal(events[1]!.pkt.dport, 81);
    assert.equal(stats.length, 1);
    const r = stats[0]!;
    assert.equal(r.ctId, 'ffff888812345678');
    assert.equal(r.reason, StatsReason.CLOSED);
    assert.deepEqual(r.packets, [1003, 1001]);
    assert.deepEqual(r.bytes, [2 ** 40 + 0xffffffff, 77]);
    assert.equal(r.orig.daddr, '10.96.0.100');
    assert.equal(r.orig.dport, 80);
    assert.deepEqual(r.tcpFlags, [0, 0x1b]);
  });

  it('rejects a truncated flow counters record', () => {
    const st = Buffer.alloc(FLOW_STATS.size);
    st.writeUInt16LE(EventKind.FLOW_STATS, 0);
    st.writeUInt16LE(FLOW_STATS.size, 2);
    assert.throws(() => decodeBatch(st.subarray(0, 100)), DecodeError);
  });
});
