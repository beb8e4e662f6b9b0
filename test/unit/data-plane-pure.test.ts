/** Pure parts of the data plane: ordering the two kernel channels, loss accounting, the sizing flags. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ChannelMerge } from '../../src/tracer/channel-merge';
import { formatLosses, guardBatchHandler, kernelLosses, totalLost } from '../../src/tracer/losses';
import { parseDetailRate, parseDuration, parseRingBuffer, parseStatsInterval } from '../../src/cli/options';
import { parseSpeed } from '../../src/record/replay';
import { SvctraceError } from '../../src/errors';
import type { DecodedBatch } from '../../src/events/decode';
import { ev } from '../helpers/kernel-events';

const batch = (name: string, ...ts: bigint[]): DecodedBatch & { name: string } => ({ name, events: ts.map((t) => ev({ tsNs: t })), stats: [] });

describe('ChannelMerge: a flow\'s end never overtakes its start', () => {
  it('holds a netlink batch until the ring has delivered past its time', () => {
    const out: string[] = [];
    const m = new ChannelMerge((b) => out.push((b as { name: string } & DecodedBatch).name), 500);
    m.netlink(batch('destroy', 200n), 0);
    assert.deepEqual(out, [], 'held: the ring has not reached t=200 yet');
    m.ring(batch('ring-early', 100n), 10);
    assert.deepEqual(out, ['ring-early']);
    m.ring(batch('ring-late', 250n), 20);
    assert.deepEqual(out, ['ring-early', 'ring-late', 'destroy']);
  });

  it('releases when the ring is idle, after maxHoldMs, and past maxHeld', () => {
    const out: string[] = [];
    const m = new ChannelMerge((b) => out.push((b as { name: string } & DecodedBatch).name), 500, 2);
    m.netlink(batch('a', 900n), 0);
    m.release(true, 1);
    assert.deepEqual(out, ['a'], 'ring idle');
    m.netlink(batch('b', 900n), 0);
    m.release(false, 499);
    assert.deepEqual(out, ['a']);
    m.release(false, 500);
    assert.deepEqual(out, ['a', 'b'], 'held at most maxHoldMs');
    for (const n of ['c', 'd', 'e']) m.netlink(batch(n, 900n), 600);
    assert.deepEqual(out, ['a', 'b', 'c'], 'at most maxHeld wait');
    assert.equal(m.holding, 2);
  });

  it("records read from the state map now (sweep, snapshot) go at once and do not move the ring's time", () => {
    const out: string[] = [];
    const m = new ChannelMerge((b) => out.push((b as { name: string } & DecodedBatch).name), 500);
    m.ring(batch('ring', 100n), 0);
    m.netlink(batch('destroy', 200n), 1);
    m.state(batch('sweep', 5_000n), 2);
    assert.deepEqual(out, ['ring', 'sweep'], 'the sweep went; the destroy still waits for the ring');
    assert.equal(m.ringTime, 100n, "the ring's time is still its own");
    m.ring(batch('ring-late', 300n), 3);
    assert.deepEqual(out, ['ring', 'sweep', 'ring-late', 'destroy']);
  });
});

describe('losses per stage', () => {
  it('totals and names only the stages that lost something', () => {
    const l = { ring_buffer: 3, flow_state: 0, flow_table: 2, client_queues: 0 };
    assert.equal(totalLost(l), 5);
    assert.equal(formatLosses(l), 'ring_buffer=3 flow_table=2');
  });
  it('counts of packets and flows are shown, not added to the events lost', () => {
    const l = { ring_buffer: 1, flows_unseen: 4, hooks_missed_packets: 2, hook_runs_skipped: 7 };
    assert.equal(totalLost(l), 1);
    assert.equal(formatLosses(l), 'ring_buffer=1 flows_unseen=4 hooks_missed_packets=2 hook_runs_skipped=7');
  });
  it("the kernel's count of skipped program runs is a stage of its own in every output", () => {
    const l = kernelLosses({ ringbufLost: 0, flowStateFull: 0, ctOverruns: 0, ruleTraceOverruns: 0, readerLostAtClose: 0, listenerLostAtClose: 0, hookRunsSkipped: 3 } as never);
    assert.equal(l.hook_runs_skipped, 3);
    assert.equal(totalLost(l), 0, 'program runs, not events');
  });
  it('records user space could not read (the reader\'s malformed ones, a batch that failed to decode) are events lost, in a stage of their own', () => {
    const l = kernelLosses({ ringbufLost: 0, flowStateFull: 0, ctOverruns: 0, ruleTraceOverruns: 0, readerLostAtClose: 0, listenerLostAtClose: 0, malformed: 2, undecodedRecords: 40 } as never);
    assert.equal(l.undecodable, 42);
    assert.equal(totalLost(l), 42);
  });
  it('a batch the pipeline throws on is counted lost, all its records, and reported once however often it happens; the next batches still go through', () => {
    const reports: unknown[] = [];
    let lost = 0;
    const handled: string[] = [];
    const handler = guardBatchHandler(
      (b) => {
        const name = (b as { name: string } & DecodedBatch).name;
        if (name.startsWith('bad')) throw new Error(`bug on ${name}`);
        handled.push(name);
      },
      (e) => reports.push(e),
      (n) => (lost += n),
    );
    const withStats = { ...batch('bad1', 1n, 2n, 3n), stats: [{} as DecodedBatch['stats'][number], {} as DecodedBatch['stats'][number]] };
    assert.doesNotThrow(() => handler(batch('ok1', 1n)));
    assert.doesNotThrow(() => handler(withStats));
    assert.doesNotThrow(() => handler(batch('bad2', 4n)));
    handler(batch('ok2', 5n));
    assert.deepEqual(handled, ['ok1', 'ok2']);
    assert.equal(lost, 3 + 2 + 1, 'every record of the batches it threw on: events and counter records');
    assert.equal(reports.length, 1);
    assert.match(String(reports[0]), /bug on bad1/);
    const l = kernelLosses({ ringbufLost: 0, flowStateFull: 0, ctOverruns: 0, ruleTraceOverruns: 0, readerLostAtClose: 0, listenerLostAtClose: 0, unhandledRecords: lost } as never);
    assert.equal(l.internal_error, 6);
    assert.equal(totalLost(l), 6);
    assert.equal(formatLosses(l), 'internal_error=6');
  });
});

describe('sizing flags', () => {
  it('--ring-buffer takes a power of two MiB, 1..1024', () => {
    assert.equal(parseRingBuffer('64'), 64 * 2 ** 20);
    assert.equal(parseRingBuffer(undefined), undefined);
    for (const bad of ['3', '0', '2048', 'x', '1.5', '-4']) assert.throws(() => parseRingBuffer(bad), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT', bad);
  });

  it('--detail-rate takes whole flows per second, or all (0)', () => {
    assert.equal(parseDetailRate('250'), 250);
    assert.equal(parseDetailRate('0'), 0);
    assert.equal(parseDetailRate('all'), 0);
    assert.equal(parseDetailRate(undefined), undefined);
    for (const bad of ['', ' ', '-1', '1.5', 'many', '1000001', '1e9']) assert.throws(() => parseDetailRate(bad), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT', bad);
  });

  it('--stats-interval takes 10 ms .. 1 h', () => {
    assert.equal(parseStatsInterval('250'), 250);
    for (const bad of ['5', 'soon', '3600001']) assert.throws(() => parseStatsInterval(bad), SvctraceError, bad);
  });

  it('numbers are written in decimal: hex, binary, exponents, signs and spaces are refused, not read as numbers', () => {
    assert.equal(parseDuration('2.5'), 2.5);
    assert.equal(parseSpeed('10'), 10);
    assert.equal(parseSpeed('0.5'), 0.5);
    const bad = (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT';
    for (const v of ['0x10', '0b11', '0o7', '1e3', ' 5', '5 ', '+5', '-0', '', '.5', '5.', 'Infinity']) {
      assert.throws(() => parseDuration(v), bad, `--duration ${JSON.stringify(v)}`);
      assert.throws(() => parseDetailRate(v), bad, `--detail-rate ${JSON.stringify(v)}`);
      assert.throws(() => parseRingBuffer(v), bad, `--ring-buffer ${JSON.stringify(v)}`);
      assert.throws(() => parseStatsInterval(v), bad, `--stats-interval ${JSON.stringify(v)}`);
      assert.throws(() => parseSpeed(v), bad, `--speed ${JSON.stringify(v)}`);
    }
    assert.throws(() => parseSpeed('0.0000001'), bad, 'a speed at which nothing would ever play');
  });
});
