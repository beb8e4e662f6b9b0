import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loadBinding } from '../../src/native/binding';
import { Channel, DEFAULT_RING_BUFFER_BYTES, DEFAULT_STATS_INTERVAL_MS, Dir, EVENT, EVENT_CAP_SIZE, EventKind, FLOW_COUNTERS, FLOW_STATS, MAX_SNAPLEN, NFTRACE, NF_PRIO_DNAT, NF_PRIO_SNAT, NfStage, StatsReason, TUPLE } from '../../src/events/layout';

// The addon reports the layout bpf/events.h compiled to; the decoder's
// literal offsets must match it field by field.
describe('event ABI parity (bpf/events.h vs src/events/layout.ts)', () => {
  const native = loadBinding().layout();

  it('svt_event: every field the addon exports has the same offset and size in TS', () => {
    assert.equal(EVENT.size, native.svt_event.size);
    assert.deepEqual(
      Object.fromEntries(Object.entries(EVENT.fields).map(([k, v]) => [k, [...v]])),
      native.svt_event.fields,
    );
  });

  it('svt_nftrace matches', () => {
    const n = native.svt_nftrace;
    assert.equal(NFTRACE.size, n.size);
    assert.deepEqual(Object.fromEntries(Object.entries(NFTRACE.fields).map(([k, v]) => [k, [...v]])), n.fields);
  });

  it('svt_flow_counters and svt_flow_stats match', () => {
    for (const [ts, n] of [
      [FLOW_COUNTERS, native.svt_flow_counters],
      [FLOW_STATS, native.svt_flow_stats],
    ] as const) {
      assert.equal(ts.size, n.size);
      assert.deepEqual(Object.fromEntries(Object.entries(ts.fields).map(([k, v]) => [k, [...v]])), n.fields);
    }
  });

  it('svt_tuple matches', () => {
    assert.equal(TUPLE.size, native.svt_tuple.size);
    assert.deepEqual(Object.fromEntries(Object.entries(TUPLE.fields).map(([k, v]) => [k, [...v]])), native.svt_tuple.fields);
  });

  it('enum values and constants match', () => {
    assert.deepEqual({ ...EventKind }, native.kinds);
    assert.equal(native.consts.NF_PRIO_DNAT, NF_PRIO_DNAT);
    assert.equal(native.consts.NF_PRIO_SNAT, NF_PRIO_SNAT);
    assert.equal(native.consts.STAGE_BEFORE_NAT, NfStage.BEFORE_NAT);
    assert.equal(native.consts.STAGE_AFTER_NAT, NfStage.AFTER_NAT);
    assert.equal(native.consts.DIR_ORIGINAL, Dir.ORIGINAL);
    assert.equal(native.consts.DIR_REPLY, Dir.REPLY);
    assert.equal(native.consts.MAX_SNAPLEN, MAX_SNAPLEN);
    assert.equal(native.consts.EVENT_CAP_SIZE, EVENT_CAP_SIZE);
    assert.equal(native.consts.RINGBUF_BYTES, DEFAULT_RING_BUFFER_BYTES);
    assert.deepEqual({ RING: native.consts.CHANNEL_RING, NETLINK: native.consts.CHANNEL_NETLINK }, { ...Channel });
    assert.equal(native.consts.STATS_INTERVAL_MS, DEFAULT_STATS_INTERVAL_MS);
    assert.deepEqual(
      { PERIODIC: native.consts.STATS_PERIODIC, CLOSED: native.consts.STATS_CLOSED, REUSED: native.consts.STATS_REUSED, EXPIRED: native.consts.STATS_EXPIRED, ENDED: native.consts.STATS_ENDED },
      { ...StatsReason },
    );
  });
});
