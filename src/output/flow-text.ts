/**
 * Human output of `svctrace trace`: a live timeline per flow, one line per
 * milestone (the first time a flow reaches each stage), and the summary
 * printed on exit. Colour only when writing to a terminal.
 */
import { svctrace } from '../gen/svctrace';
import { flowTableLost, type Flow, type FlowSummary, type Ingested } from '../flows/types';
import { PROTO_NAMES, TCP_CT_STATES as TCP_STATE_NAMES } from '../events/conntrack';
import type { TracerStats } from '../tracer/tracer';
import { formatLosses, kernelLosses, totalLost, type StageLosses } from '../tracer/losses';
import { eventSummary, isFailureEvent, stageLabel } from './event-summary';
import type { LiveDiagnosis } from '../explain/live';

export { isFailureEvent, stageLabel };

import pb = svctrace.v1;

/** A failure event (drop, reset, ICMP error) among ingested items: only drops' wire events are looked at (made). */
export function isFailureItem(item: Ingested): boolean {
  return item.entry.stage === pb.Stage.STAGE_DROP && isFailureEvent(item.event);
}


const COLOR: Record<number, string> = {
  [pb.Stage.STAGE_MATCH]: '36', // cyan
  [pb.Stage.STAGE_DNAT]: '33', // yellow
  [pb.Stage.STAGE_SNAT]: '35', // magenta
  [pb.Stage.STAGE_ROUTE]: '34', // blue
  [pb.Stage.STAGE_DEVICE]: '32', // green
  [pb.Stage.STAGE_REPLY]: '36',
  [pb.Stage.STAGE_DROP]: '1;31', // bold red
  [pb.Stage.STAGE_CLOSE]: '2', // dim
};

/** A flow that failed somewhere: dropped, reset or answered by an ICMP error. */
export function flowFailed(f: Flow): boolean {
  return f.drops.length > 0 || f.reset || f.icmpErrors.length > 0;
}

/** ", SYN sent 3 more times": a client that waited on an answer (the resent SYNs are not in the packet counts). */
function synsResentText(f: Flow): string {
  return f.synsResent ? `, SYN sent ${f.synsResent} more time${f.synsResent === 1 ? '' : 's'}` : '';
}

/**
 * One line for a whole flow (`trace -o flows`), for busy Services: where
 * it went and how it ended.
 *   flow 12 tcp 10.250.0.2:41130 -> 10.96.0.100:80 (service ...): backend 10.244.1.11:8080, 2.4ms, 6 pkts/395 B out, 4 pkts/398 B back, closed
 */
export function flowLine(f: Flow, backendName: (addr: string) => string | undefined = () => undefined): string {
  const dur = (Number(f.lastTsNs - f.firstTsNs) / 1e6).toFixed(1);
  const backend = f.dnat ? `${f.reply.saddr}:${f.reply.sport}` : 'none (not DNATed)';
  const name = f.dnat ? backendName(f.reply.saddr) : undefined;
  const open = f.proto === 6 ? (TCP_STATE_NAMES[f.tcpState] ?? 'open').toLowerCase() : 'open';
  const state = f.closed ? 'closed' : f.evicted ? `${open}, evicted (flow table full: what came after is another flow)` : open;
  const failures = [
    ...(f.reset ? ['reset'] : []),
    ...[...new Set(f.drops)].map((d) => `dropped ${d}`),
    ...[...new Set(f.icmpErrors)].map((e) => `ICMP ${e}`),
    ...(f.backendDropRule ? [`by ${f.backendDropRule}`] : []),
  ];
  return (
    `flow ${f.id} ${PROTO_NAMES[f.proto] ?? f.proto} ${f.orig.saddr}:${f.orig.sport} -> ${f.orig.daddr}:${f.orig.dport} (service ${f.service}): ` +
    `backend ${backend}${name ? ` (${name})` : ''}, ${dur}ms, ${f.packets[0]} pkts/${f.bytes[0]} B out, ${f.packets[1]} pkts/${f.bytes[1]} B back` +
    `${synsResentText(f)}${f.masqueraded ? ', masqueraded' : ''}, ${state}${failures.length ? `, ${failures.join(', ')}` : ''}${f.countedOnly ? ' (counted only: over the detail budget)' : ''}`
  );
}

/**
 * How long a new flow's first lines wait for its rule path (`rules`), where
 * rule paths are observed: the kernel's nftables trace message about the
 * flow's first packet is read 0.5-5 ms after the packet (its own socket, its
 * own thread), by which time the flow's route, DNAT and reply were printed,
 * and its `+0.000ms rules` line came out below them. A wait a person cannot
 * see; a path later than this is printed when it comes, as before.
 */
export const RULE_PATH_WAIT_MS = 100;
/** New flows waiting at most at once; past this a new flow prints at once (memory bounded on a busy Service). */
export const RULE_PATH_WAITING_MAX = 256;

/** What the printer needs of time: replaced in tests. */
export interface PrinterClock {
  now(): number;
  /** Calls `fn` after `ms`; the timer must not keep the process alive. */
  later(fn: () => void, ms: number): { cancel(): void };
}

const realClock: PrinterClock = {
  now: () => performance.now(),
  later: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref();
    return { cancel: () => clearTimeout(t) };
  },
};

/** A new flow's lines, kept until its rule path came or the wait is over. */
interface WaitingFlow {
  until: number;
  header: string;
  lines: Array<{ tsNs: bigint; text: string }>;
}

export interface FlowTextOptions {
  backendName?: (addr: string) => string | undefined;
  /** Whether a new flow's rule path is coming (observed through nftables tracing): its first lines then wait for it, at most RULE_PATH_WAIT_MS. */
  rulePathComing?: () => boolean;
  clock?: PrinterClock;
}

export class FlowTextPrinter {
  /** Flows whose header line went out: weak, so that a flow gone from the table is gone from here too (a Set of ids grew by one per detailed flow for as long as a trace ran). */
  private readonly headerPrinted = new WeakSet<Flow>();
  /** Flows whose end line ("flow N done after ...") went out. */
  private readonly endPrinted = new WeakSet<Flow>();
  /** New flows waiting for their rule path, oldest first (one wait for all: the oldest is due first). */
  private readonly waiting = new Map<Flow, WaitingFlow>();
  private timer: { cancel(): void } | undefined;
  /** What writing from the timer threw, for the next call to throw. */
  private timerFailure: Error | undefined;
  private readonly backendName: (addr: string) => string | undefined;
  private readonly rulePathComing: () => boolean;
  private readonly clock: PrinterClock;

  constructor(
    private readonly write: (s: string) => void,
    private readonly color: boolean,
    opts: FlowTextOptions = {},
  ) {
    this.backendName = opts.backendName ?? (() => undefined);
    this.rulePathComing = opts.rulePathComing ?? (() => false);
    this.clock = opts.clock ?? realClock;
  }

  private paint(code: string | undefined, s: string): string {
    return this.color && code ? `\x1b[${code}m${s}\x1b[0m` : s;
  }

  /** Prints the milestones among `items` (a new flow's may wait a moment for its rule path: see RULE_PATH_WAIT_MS). */
  print(items: Ingested[]): void {
    this.throwTimerFailure();
    // Flows whose wait is over go out first, on their own: a throw below
    // (this batch's) does not take them with it.
    const due: string[] = [];
    this.releaseDue(due);
    if (due.length) this.write(due.join('\n') + '\n');
    const lines: string[] = [];
    for (const item of items) {
      const { flow, entry } = item;
      if (!entry.milestone) continue;
      const event = item.event; // made only for what is printed
      let w = this.waiting.get(flow);
      let header: string | undefined;
      if (!w && !this.headerPrinted.has(flow)) {
        this.headerPrinted.add(flow);
        header = this.paint('1', `[flow ${flow.id}] ${PROTO_NAMES[flow.proto] ?? flow.proto} ${flow.orig.saddr}:${flow.orig.sport} -> ${flow.orig.daddr}:${flow.orig.dport} (service ${flow.service})`);
        // Its path, if it comes, is told at the first packet's time: wait
        // for it, unless it already came (same batch) or no path comes.
        if (entry.label !== 'rules' && this.waiting.size < RULE_PATH_WAITING_MAX && this.rulePathComing()) {
          w = { until: this.clock.now() + RULE_PATH_WAIT_MS, header, lines: [] };
          this.waiting.set(flow, w);
          this.timer ??= this.clock.later(() => this.onTimer(), RULE_PATH_WAIT_MS);
        }
      }
      const rel = (Number(entry.tsNs - flow.firstTsNs) / 1e6).toFixed(3);
      const label = (entry.label ?? (entry.stateChange && entry.stage !== pb.Stage.STAGE_DROP ? 'state' : stageLabel(entry.stage, event))).padEnd(6);
      let text = `  [${flow.id}] +${rel.padStart(9)}ms ${this.paint(COLOR[entry.stage], label)} ${eventSummary(event)}`;
      if (entry.stage === pb.Stage.STAGE_CLOSE) {
        text += `\n  [${flow.id}] ${this.describeEnd(flow)}`;
        this.endPrinted.add(flow);
      }
      if (w) {
        w.lines.push({ tsNs: entry.tsNs, text });
        // Its path came, or it is over: out now, in time order.
        if (entry.label === 'rules' || entry.stage === pb.Stage.STAGE_CLOSE) this.release(flow, w, lines);
      } else {
        if (header) lines.push(header);
        lines.push(text);
      }
    }
    if (lines.length) this.write(lines.join('\n') + '\n');
  }

  /**
   * The end line of each flow among `flows` that closed and whose timeline
   * was printed, unless its close line said it: a TCP connection's end is
   * its TIME_WAIT or CLOSE, counted in the kernel, and conntrack's destroy
   * (its close line) comes minutes later if at all. Called when flows leave
   * the table (2 s after their end, their last counters in) and when the
   * trace ends.
   */
  ended(flows: readonly Flow[]): void {
    const lines: string[] = [];
    for (const f of flows) {
      // Closed with the kernel's final counters (a flow handed on early, its
      // address reused under load, may have none yet: no line then).
      if (!f.closed || !f.countersFinal || this.endPrinted.has(f) || !this.headerPrinted.has(f)) continue;
      const w = this.waiting.get(f);
      if (w) this.release(f, w, lines);
      this.endPrinted.add(f);
      lines.push(`  [${f.id}] ${this.describeEnd(f)}`);
    }
    if (lines.length) this.write(lines.join('\n') + '\n');
  }

  /** Prints every waiting flow's lines (the trace ended). */
  flush(): void {
    this.timer?.cancel();
    this.timer = undefined;
    const lines: string[] = [];
    for (const [flow, w] of this.waiting) this.release(flow, w, lines);
    try {
      if (lines.length) this.write(lines.join('\n') + '\n');
    } finally {
      this.throwTimerFailure();
    }
  }

  private onTimer(): void {
    this.timer = undefined;
    const lines: string[] = [];
    this.releaseDue(lines);
    try {
      if (lines.length) this.write(lines.join('\n') + '\n');
    } catch (e) {
      // Out of the sink's calls, a throw would end the process: it is
      // thrown at the next call instead, which the sink set reports.
      this.timerFailure ??= e instanceof Error ? e : new Error(String(e));
    }
  }

  private throwTimerFailure(): void {
    const e = this.timerFailure;
    this.timerFailure = undefined;
    if (e) throw e;
  }

  /** Releases the flows whose wait is over; arms the timer for the next one. */
  private releaseDue(lines: string[]): void {
    if (!this.waiting.size) return;
    const now = this.clock.now();
    for (const [flow, w] of this.waiting) {
      if (w.until > now) {
        this.timer ??= this.clock.later(() => this.onTimer(), Math.max(1, Math.ceil(w.until - now)));
        return;
      }
      this.release(flow, w, lines);
    }
  }

  private release(flow: Flow, w: WaitingFlow, lines: string[]): void {
    this.waiting.delete(flow);
    lines.push(w.header);
    // Stable: lines of one time stay in the order they came (the path after the match it explains).
    w.lines.sort((a, b) => (a.tsNs < b.tsNs ? -1 : a.tsNs > b.tsNs ? 1 : 0));
    for (const l of w.lines) lines.push(l.text);
  }

  describeEnd(f: Flow): string {
    const dur = (Number(f.lastTsNs - f.firstTsNs) / 1e6).toFixed(1);
    const backend = f.dnat ? `${f.reply.saddr}:${f.reply.sport}` : 'none (not DNATed)';
    const name = f.dnat ? this.backendName(f.reply.saddr) : undefined;
    const drops = f.drops.length ? `, drops: ${[...new Set(f.drops)].join(',')}` : '';
    return (
      `flow ${f.id} done after ${dur}ms: backend ${backend}${name ? ` (${name})` : ''}, ` +
      `${f.packets[0]} pkts/${f.bytes[0]} B out, ${f.packets[1]} pkts/${f.bytes[1]} B back${synsResentText(f)}` +
      `${f.masqueraded ? ', masqueraded' : ''}${f.reset ? ', reset' : ''}${drops}`
    );
  }
}

/** A diagnosis found while tracing, as the text output prints it (`trace`, the demo). */
export function diagnosisLine(d: LiveDiagnosis): string {
  return `[diagnosis] [${d.severity.toUpperCase()}] ${d.code}${d.layer ? ` (${d.layer})` : ''} ${d.service}${d.object ? ` ${d.object}` : ''}: ${d.summary}`;
}

/** The summary printed when a trace ends (Ctrl-C or --duration). */
/**
 * The summary a trace ends with. `losses`: the pipeline's count per stage
 * (PipelineResult.losses: the outputs' failures included); without it, the
 * kernel's, the tracer's and the flow table's.
 */
export function formatSummary(s: FlowSummary, stats: TracerStats, backendName: (addr: string) => string | undefined = () => undefined, lossesByStage?: Partial<StageLosses>): string {
  const unseen = stats.flowsUnseen ?? 0;
  const lines = [`summary: ${s.flows} flows (${s.closed} closed), ${s.resets} reset${unseen ? `; ${unseen} more flows lost whole (${stats.flowsUnseenReset ?? 0} of them reset; the ring buffer was full for every record of theirs)` : ''}`];
  if (s.countedOnly) lines.push(`  ${s.countedOnly} of them counted only, over the detail budget (packets, bytes, backend, drops; no hook or device events): --detail-rate all shows every flow's path`);
  const backends = Object.entries(s.perBackend).sort((a, b) => b[1] - a[1]);
  if (backends.length) {
    lines.push('  new flows per backend:');
    for (const [b, n] of backends) {
      const name = backendName(b.split(':')[0]!);
      lines.push(`    ${b.padEnd(22)} ${String(n).padStart(6)}${name ? `  ${name}` : ''}`);
    }
  }
  // Drops reported and the flows they belong to (a flow's timeline shows
  // its first drop of a reason once); then the kernel's count of the
  // packets, which also holds the repeats it reported once (a SYN resent
  // into the same DROP rule), unless --all-packets.
  const drops = Object.entries(s.dropsByReason);
  const flowsOf = (r: string) => s.dropFlowsByReason?.[r] ?? 0;
  const packets = s.packetsDropped ?? 0;
  const packetsText = packets ? `; ${packets} packet${packets === 1 ? '' : 's'} dropped in all (the kernel's count, repeats included)` : '';
  lines.push(drops.length ? `  drops by reason: ${drops.map(([r, n]) => `${r}=${n} in ${flowsOf(r)} flow${flowsOf(r) === 1 ? '' : 's'}`).join(', ')}${packetsText}` : packets ? `  drops:${packetsText.slice(1)}` : '  drops: none');
  const losses = lossesByStage ?? { ...kernelLosses(stats), flow_table: flowTableLost(s) };
  const lost = totalLost(losses);
  lines.push(
    `  events: ${stats.recordsRead} kernel + ${stats.ctDestroyEvents} conntrack destroy (${stats.packetsCounted} packets counted in the kernel), lost: ${lost}` +
      (lost ? ` (${formatLosses(losses)})` : ''),
  );
  const missed = stats.packetsMissedByHooks ?? 0;
  if (missed) lines.push(`  ${missed} packets conntrack counted that the hooks never saw (the kernel skipped a ${stats.backend} program, or a rule dropped them between conntrack and NAT), found at their connection's end: those flows' final counters are conntrack's`);
  const skipped = stats.hookRunsSkipped ?? 0;
  if (skipped)
    lines.push(
      `  the kernel skipped svctrace's programs ${skipped} times (the program, or for a kprobe any BPF program, already running on that CPU): ` +
        (stats.backend === 'netfilter'
          ? 'a device crossing, route or drop may be missing from a timeline (packet counts are not affected)'
          : "a packet's count or a transition may be missing; where conntrack accounting is on, flows that ended have conntrack's counters"),
    );
  return lines.join('\n');
}
