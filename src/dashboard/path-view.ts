/**
 * The path of one flow as hops: client -> (NodePort) -> ClusterIP match ->
 * DNAT -> SNAT -> route -> bridge/veth -> pod namespace -> reply un-DNAT ->
 * close, each with its time from the first event and the tuple; drops in red.
 */
import { svctrace } from '../gen/svctrace';
import { FlowView } from './store';
import { eventSummary, stageLabel } from '../output/event-summary';

import pb = svctrace.v1;

export interface Hop {
  stage: string;
  title: string;
  detail: string;
  deltaMs: number;
  drop: boolean;
}

function tuple(t: pb.ITuple | null | undefined): string {
  return t ? `${t.src}:${t.srcPort} → ${t.dst}:${t.dstPort}` : '';
}

/** Milestones of a flow: the first event of each stage/device, in kernel order. */
export function hops(f: FlowView): Hop[] {
  const seen = new Set<string>();
  const out: Hop[] = [];
  const t0 = f.events.length ? BigInt(String(f.events[0]!.tsNs ?? 0)) : 0n;
  const sorted = [...f.events].sort((a, b) => (BigInt(String(a.tsNs ?? 0)) < BigInt(String(b.tsNs ?? 0)) ? -1 : 1));
  for (const e of sorted) {
    const stage = (pb.Stage[e.stage ?? 0] ?? '').replace('STAGE_', '').toLowerCase();
    const summary = eventSummary(e);
    const dev = e.device?.name ? `${e.device.name}${e.device.netns ? `@${e.device.netns}` : ''}` : '';
    let key = `${stage}:${e.direction}`;
    if (stage === 'device') key += `:${e.kind}:${dev}`;
    if (stage === 'drop') key += `:${summary}`;
    if (stage === 'arrive' || (stage === 'dnat' && !e.afterNat) || (stage === 'snat' && !e.afterNat) || (stage === 'reply' && !/un-DNAT/.test(summary))) continue;
    if (seen.has(key)) continue;
    seen.add(key);
    const deltaMs = Number(BigInt(String(e.tsNs ?? 0)) - t0) / 1e6;
    let title = stage;
    let detail = summary;
    if (stage === 'dnat' && e.conntrack?.original && e.conntrack.reply) {
      title = 'DNAT';
      detail = `${e.conntrack.original.dst}:${e.conntrack.original.dstPort} → ${e.conntrack.reply.src}:${e.conntrack.reply.srcPort}`;
    } else if (stage === 'device') {
      title = `${e.kind === pb.EventKind.EVENT_KIND_DEV_XMIT ? 'xmit' : 'recv'} ${e.device?.name ?? ''} (${e.device?.kind || 'dev'})`;
      detail = `${e.device?.netns ?? ''} ${tuple(e.packet)}`;
    } else if (stage === 'match') {
      title = 'ClusterIP match';
      detail = tuple(e.packet);
    } else if (stage === 'reply') {
      title = 'reply un-DNAT';
      detail = tuple(e.packet);
    }
    if (stage === 'drop') title = stageLabel(e.stage ?? 0, e); // DROP, RESET or ICMP: an answer is not a drop
    if (e.benignDrop) title = 'freed';
    out.push({ stage, title, detail, deltaMs, drop: stage === 'drop' && !e.benignDrop });
  }
  return out;
}
