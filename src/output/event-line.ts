/** One line per wire Event, for `watch` and `replay` (which have no flow table). */
import { svctrace } from '../gen/svctrace';
import { eventSummary } from './event-summary';

import pb = svctrace.v1;

export function stageName(s: number | null | undefined): string {
  return (pb.Stage[s ?? 0] ?? 'STAGE_UNSPECIFIED').replace('STAGE_', '').toLowerCase();
}

/** Events from a relay name their node (flow ids are per node): `[node-a flow 7]`. */
export function eventLine(e: pb.IEvent): string {
  return `[${e.node ? `${e.node} ` : ''}flow ${String(e.flowId ?? 0)}] ${stageName(e.stage).padEnd(6)} ${eventSummary(e)}`;
}
