/**
 * What the flow table makes of one kernel record: its flow, its timeline
 * entry, and its wire event, made on first use. Sinks that render, record
 * or filter read `event`; the stream's encoder writes the record's bytes
 * without it (stream/kernel-event-encoder.ts), so a batch that is only
 * streamed, or only modelled (the datapath benchmark's pipeline with no
 * sinks), makes no message objects: making them and collecting them after
 * was about a tenth of the stream's main thread (toProtoEvent, a Long per
 * timestamp, and their garbage, in a profile of the pipeline benchmark).
 */
import { svctrace } from '../gen/svctrace';
import type { KernelEvent } from '../events/decode';
import type { Flow, Ingested, TimelineEntry } from './types';
import { EventContext, protoDirection, protoTcpState, toProtoEvent } from './to-proto';

import pb = svctrace.v1;

export class KernelIngested implements Ingested {
  private made?: pb.IEvent;

  constructor(
    readonly flow: Flow,
    readonly entry: TimelineEntry,
    /** The record as decoded; read-only, like everything the decoder makes. */
    readonly record: KernelEvent,
    /** What the flow knew when the record came (the flow moves on; the event keeps this). */
    readonly context: EventContext,
  ) {}

  /** The wire event (no summary: rendered at the edge). Made once; later reads get the same object. */
  get event(): pb.IEvent {
    return (this.made ??= toProtoEvent(this.record, this.context));
  }

  /** The wire event was made: whoever holds it may have changed it, so only it says what goes out. */
  get materialized(): boolean {
    return this.made !== undefined;
  }
}

/** Names from the Kubernetes API on an item's event: kept for the event if it is not made yet. */
export function nameItem(item: Ingested, names: { service?: string; pod?: string }): void {
  if (!names.service && !names.pod) return;
  const target: { serviceName?: string | null; backendPod?: string | null } = unmade(item) ? item.context : item.event;
  if (names.service) target.serviceName = names.service;
  if (names.pod) target.backendPod = names.pod;
}

// Fields of an item's event read per event by sinks that watch every event
// (the metrics), without making the event when it is not made yet: each is
// what `item.event` would hold.
function unmade(item: Ingested): item is KernelIngested {
  return item instanceof KernelIngested && !item.materialized;
}

export function itemBackend(item: Ingested): string | undefined {
  return (unmade(item) ? item.context.backend : item.event.backend) || undefined;
}

export function itemApiNames(item: Ingested): { serviceName: string; backendPod: string } {
  const from = unmade(item) ? item.context : item.event;
  return { serviceName: from.serviceName ?? '', backendPod: from.backendPod ?? '' };
}

export function itemDirection(item: Ingested): pb.Direction {
  return unmade(item) ? protoDirection(item.record) : item.event.direction ?? pb.Direction.DIRECTION_UNSPECIFIED;
}

export function itemTcpState(item: Ingested): string | undefined {
  return (unmade(item) ? protoTcpState(item.record) : item.event.conntrack?.tcpState) ?? undefined;
}
