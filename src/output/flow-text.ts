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

export class FlowTextPrinter {
  /** Flows whose header line went out: weak, so that a flow gone from the table is gone from here too (a Set of ids grew by one per detailed flow for as long as a trace ran). */
  private readonly headerPrinted = new WeakSet<Flow>();

  constructor(
    private readonly write: (s: string) => void,
    private readonly color: boolean,
    private readonly backendName: (addr: string) => string | undefined = () => undefined,
  ) {}

  private paint(code: string | undefined, s: string): string {
    return this.color && code ? `\x1b[${code}m${s}\x1b[0m` : s;
  }

  /** Prints the milestones among `items`. */
  print(items: Ingested[]): void {
    const lines: string[] = [];
    for (const item of items) {
      const { flow, entry } = item;
      if (!entry.milestone) continue;
      const event = item.event; // made only for what is printed
      if (!this.headerPrinted.has(flow)) {
        this.headerPrinted.add(flow);
        lines.push(this.paint('1', `[flow ${flow.id}] ${PROTO_NAMES[flow.proto] ?? flow.proto} ${flow.orig.saddr}:${flow.orig.sport} -> ${flow.orig.daddr}:${flow.orig.dport} (service ${flow.service})`));
      }
      const rel = (Number(entry.tsNs - flow.firstTsNs) / 1e6).toFixed(3);
      const label = (entry.label ?? (entry.stateChange && entry.stage !== pb.Stage.STAGE_DROP ? 'state' : stageLabel(entry.stage, event))).padEnd(6);
      lines.push(`  [${flow.id}] +${rel.padStart(9)}ms ${this.paint(COLOR[entry.stage], label)} ${eventSummary(event)}`);
      if (entry.stage === pb.Stage.STAGE_CLOSE) lines.push(`  [${flow.id}] ${this.describeEnd(flow)}`);
    }
    if (lines.length) this.write(lines.join('\n') + '\n');
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
