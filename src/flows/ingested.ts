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
import type { FlowStatsRecord, KernelEvent } from '../events/decode';
import { StatsReason } from '../events/layout';
import { wallNs } from '../clock';
import type { Flow, Ingested, TimelineEntry } from './types';
import { EventContext, longFromBigint, protoDirection, protoTcpState, protoTuple, toProtoEvent } from './to-proto';

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

/** A flow's counter record (FLOW_STATS), its wire event made on first use like KernelIngested's. */
export class StatsIngested implements Ingested {
  private made?: pb.IEvent;

  constructor(
    readonly flow: Flow,
    readonly entry: TimelineEntry,
    /** The record as decoded; read-only. */
    readonly record: FlowStatsRecord,
    /** The flow's backend when the record came. */
    private readonly backend: string | undefined,
    private readonly reasonName: string,
  ) {}

  get event(): pb.IEvent {
    if (this.made) return this.made;
    const { flow: f, record: r } = this;
    const event: pb.IEvent = {
      tsNs: longFromBigint(wallNs(r.tsNs)),
      kind: pb.EventKind.EVENT_KIND_FLOW_STATS,
      flowId: f.id,
      service: f.service,
      direction: pb.Direction.DIRECTION_ORIGINAL,
      packet: protoTuple(f.orig),
      conntrack: { id: f.ctId },
      counters: {
        packetsOriginal: r.packets[0],
        bytesOriginal: r.bytes[0],
        packetsReply: r.packets[1],
        bytesReply: r.bytes[1],
        drops: r.drops,
        final: r.reason !== StatsReason.PERIODIC,
        reason: this.reasonName,
        // A flow is counted only from its start: the record's own word.
        countedOnly: r.countedOnly || f.countedOnly,
        synsResent: r.synsResent,
      },
    };
    if (this.backend) event.backend = this.backend;
    return (this.made = event);
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

/** The flow's kernel drop counter, on a counter record's item (every drop, repeats included); undefined on others. */
export function itemKernelDrops(item: Ingested): number | undefined {
  return item instanceof StatsIngested ? item.record.drops : undefined;
}
