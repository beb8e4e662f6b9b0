import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { FlowTable } from '../../src/flows/flow-table';
import type { RuleTrace } from '../../src/events/decode';
import { EventKind, NfStage } from '../../src/events/layout';
import { IPS_DST_NAT } from '../../src/events/conntrack';
import { parseServiceSpec } from '../../src/net/ipv4';
import { FlowTextPrinter, RULE_PATH_WAIT_MS, RULE_PATH_WAITING_MAX, type PrinterClock } from '../../src/output/flow-text';
import { textTimelineSink } from '../../src/pipeline/sinks/text';
import { ctKeyOf, ev, orig } from '../helpers/kernel-events';

/** A clock the test moves by hand; `later` keeps what is due and runs it when `advance` passes it. */
class ManualClock implements PrinterClock {
  t = 0;
  private timers: Array<{ at: number; fn: () => void; cancelled: boolean }> = [];
  now(): number {
    return this.t;
  }
  later(fn: () => void, ms: number): { cancel(): void } {
    const timer = { at: this.t + ms, fn, cancelled: false };
    this.timers.push(timer);
    return { cancel: () => void (timer.cancelled = true) };
  }
  advance(ms: number): void {
    this.t += ms;
    const due = this.timers.filter((x) => x.at <= this.t && !x.cancelled);
    this.timers = this.timers.filter((x) => !due.includes(x));
    for (const x of due) x.fn();
  }
  get armed(): number {
    return this.timers.filter((x) => !x.cancelled).length;
  }
}

const trace = (traceId: number, chain: string, tsNs: bigint, pkt = orig): RuleTrace => ({ traceId, tsNs, pkt, ruleHandle: 1n, type: 3, verdict: -3, netnsIno: 111, table: 'nat', chain, target: '' });

function setup(rulePathComing: boolean, write?: (s: string) => void) {
  const table = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], closeGraceMs: 1000 });
  const clock = new ManualClock();
  const out: string[] = [];
  const printer = new FlowTextPrinter(write ?? ((s) => out.push(s)), false, { rulePathComing: () => rulePathComing, clock });
  const text = () => out.join('');
  // A connection's first packet: the match before DNAT, then DNAT (its rule path's message comes after both).
  const firstEvents = (sport = 40000, ctId = 'ffff1') => {
    const o = { ...orig, sport };
    return table.ingest([ev({ tsNs: 1_000_000n, ctId, ctKey: ctKeyOf(ctId), ctOrig: o, pkt: o }), ev({ tsNs: 1_040_000n, ctId, ctKey: ctKeyOf(ctId), ctOrig: o, pkt: o, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: IPS_DST_NAT })]);
  };
  return { table, clock, printer, out, text, firstEvents };
}

/** The labels of a flow's timeline lines, in the order printed. */
const labels = (text: string) => [...text.matchAll(/^ {2}\[\d+\] +\+ *[-\d.]+ms (\S+)/gm)].map((m) => m[1]);

describe('FlowTextPrinter', () => {
  it('a new flow\'s lines wait for its rule path, which is then printed in its place: after the match, before the DNAT it explains', () => {
    const { table, printer, text, firstEvents } = setup(true);
    printer.print(firstEvents());
    assert.equal(text(), '', 'nothing yet: the path is coming');
    // Read 0.6 ms after the packet; told at the flow's first event.
    printer.print(table.ingestRuleTraces([trace(7, 'OUTPUT', 1_600_000n), trace(7, 'KUBE-SERVICES', 1_600_000n), trace(7, 'KUBE-SVC-X', 1_600_000n), trace(7, 'KUBE-SEP-Y', 1_600_000n)], 1000));
    assert.match(text(), /^\[flow 1\] tcp 10\.244\.1\.1:40000 -> 10\.96\.0\.100:80/);
    assert.deepEqual(labels(text()), ['match', 'rules', 'dnat']);
    assert.match(text(), /\+ {4}0\.000ms rules {2}kube-proxy rules taken/);
    // Later lines of the flow go out as they come.
    printer.print(table.ingest([ev({ tsNs: 2_000_000n, nfHook: 0, ctStatus: IPS_DST_NAT, ctTcpState: 3 })]));
    assert.equal(labels(text()).length, 4);
  });

  it('a path that does not come holds the flow back RULE_PATH_WAIT_MS at most; another flow is not held by it', () => {
    const { clock, printer, text, firstEvents } = setup(true);
    printer.print(firstEvents());
    clock.advance(RULE_PATH_WAIT_MS - 1);
    assert.equal(text(), '');
    clock.advance(1);
    assert.deepEqual(labels(text()), ['match', 'dnat'], 'out when the wait is over, without waiting for another batch');
    assert.equal(clock.armed, 0);
    // A second flow, later: its own wait.
    printer.print(firstEvents(40001, 'ffff2'));
    assert.equal(labels(text()).length, 2);
    clock.advance(RULE_PATH_WAIT_MS);
    assert.equal(labels(text()).length, 4);
  });

  it('prints at once where no rule path comes, and what waits when the trace ends', () => {
    const now = setup(false);
    now.printer.print(now.firstEvents());
    assert.deepEqual(labels(now.text()), ['match', 'dnat']);
    const ending = setup(true);
    ending.printer.print(ending.firstEvents());
    ending.printer.flush();
    assert.deepEqual(labels(ending.text()), ['match', 'dnat']);
    assert.equal(ending.clock.armed, 0, 'no timer left behind');
  });

  it('holds RULE_PATH_WAITING_MAX flows at most: a busy Service\'s next flow prints at once', () => {
    const { printer, text, firstEvents } = setup(true);
    for (let i = 0; i < RULE_PATH_WAITING_MAX; i++) printer.print(firstEvents(41000 + i, (0x10000 + i).toString(16)));
    assert.equal(text(), '');
    printer.print(firstEvents(50000, 'fffff'));
    assert.match(text(), /^\[flow \d+\] tcp 10\.244\.1\.1:50000 /);
    printer.flush();
    assert.equal(labels(text()).length, 2 * (RULE_PATH_WAITING_MAX + 1));
  });
  it('a flow that ends is printed at once; a wait already over is not held up by a timer armed for an earlier flow', () => {
    const { table, clock, printer, text, firstEvents } = setup(true);
    printer.print(firstEvents());
    printer.print(table.ingest([ev({ tsNs: 3_000_000n, kind: EventKind.CT_DESTROY, netnsIno: 111 })]));
    assert.equal(labels(text()).at(-1), 'close', 'its end releases it');
    assert.match(text(), /flow 1 done after/);
    // Flow 2 waits from t=50; flow 1's timer (due at 100) finds it not due and waits on to 150.
    clock.advance(50);
    printer.print(firstEvents(40001, 'ffff2'));
    const before = labels(text()).length;
    clock.advance(50);
    assert.equal(labels(text()).length, before, 'not due yet');
    clock.advance(50);
    assert.equal(labels(text()).length, before + 2);
  });

  it('a write that fails from the timer is thrown at the next call (for the sink set to report), not out of the timer', () => {
    let fail = true;
    const out: string[] = [];
    const { clock, printer, firstEvents } = setup(true, (s) => {
      if (fail) throw new Error('EIO');
      out.push(s);
    });
    printer.print(firstEvents());
    assert.doesNotThrow(() => clock.advance(RULE_PATH_WAIT_MS));
    fail = false;
    assert.throws(() => printer.print([]), /EIO/);
    assert.doesNotThrow(() => printer.print([]), 'thrown once');
  });

  it('the text sink: --drops-only holds nothing; closing prints what waits', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')] });
    const out: string[] = [];
    const sink = textTimelineSink((s) => out.push(s), { color: false, backendName: () => undefined, flows: t, rulePathsObserved: () => true });
    sink.write(t.ingest([ev({ tsNs: 1_000_000n })]));
    assert.equal(out.join(''), '');
    void sink.close?.();
    assert.deepEqual(labels(out.join('')), ['match']);
    const drops: string[] = [];
    const dropsOnly = textTimelineSink((s) => drops.push(s), { color: false, backendName: () => undefined, flows: t, dropsOnly: true, rulePathsObserved: () => true });
    const d = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], dropReasons: { '12': 'NETFILTER_DROP' } });
    dropsOnly.write(d.ingest([ev({ tsNs: 1_000_000n }), ev({ tsNs: 1_100_000n, kind: EventKind.DROP, reason: 12 })]));
    assert.match(drops.join(''), /DROP/, 'printed at once');
  });
  it('a flow that ended gets its end line once, when it leaves the table or the trace ends; one never printed or still open gets none', () => {
    const { table, printer, text, firstEvents } = setup(false);
    printer.print(firstEvents());
    const [f] = table.flows();
    printer.ended([f!]);
    assert.doesNotMatch(text(), /done after/, 'still open');
    f!.closed = true;
    printer.ended([f!]);
    assert.doesNotMatch(text(), /done after/, 'closed, its final counters not in yet (handed on early under load)');
    f!.countersFinal = true;
    printer.ended([f!]);
    printer.ended([f!]);
    assert.equal(text().match(/done after/g)?.length, 1);
    assert.match(text(), /^ {2}\[1\] flow 1 done after [\d.]+ms: backend 10\.244\.1\.12:8080, 0 pkts\/0 B out/m);
    // A flow the output never showed (counted only, or not a failure with --drops-only): none.
    const other = setup(false);
    other.firstEvents();
    const [g] = other.table.flows();
    g!.closed = true;
    g!.countersFinal = true;
    other.printer.ended([g!]);
    assert.equal(other.text(), '');
  });
});
