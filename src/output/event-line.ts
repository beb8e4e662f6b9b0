/** One line per wire Event, for `watch` and `replay` (which have no flow table). */
import { svctrace } from '../gen/svctrace';
import { eventSummary } from './event-summary';

import pb = svctrace.v1;

export function stageName(s: number | null | undefined): string {
  return (pb.Stage[s ?? 0] ?? 'STAGE_UNSPECIFIED').replace('STAGE_', '').toLowerCase();
}

export function eventLine(e: pb.IEvent): string {
  return `[flow ${String(e.flowId ?? 0)}] ${stageName(e.stage).padEnd(6)} ${eventSummary(e)}`;
}
