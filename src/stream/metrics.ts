/**
 * /metrics in the Prometheus text format (prom-client): the server's own
 * series (events, losses, memory, clients), plus any registry handed in
 * (the per-Service series of metrics/service-metrics when tracing).
 */
import v8 from 'node:v8';
import { Counter, Gauge, Registry } from 'prom-client';
import type { Hub, HubSource } from './hub';

/** The server's own series, each read from its owner when scraped. */
export function serverRegistry(hub: Hub, source: HubSource): Registry {
  const registry = new Registry();
  const registers = [registry];
  const value = (name: string, help: string, read: () => number, kind: 'gauge' | 'counter' = 'gauge') => {
    if (kind === 'gauge') {
      new Gauge({ name, help, registers, collect() { this.set(read()); } });
    } else {
      new Counter({ name, help, registers, collect() { this.reset(); this.inc(read()); } });
    }
  };
  value('svctrace_events_total', 'Events of traced flows seen by the server.', () => hub.eventsTotal, 'counter');
  value('svctrace_flows_active', 'Flows currently tracked.', () => source.activeFlows());
  value('svctrace_kernel_events_lost_total', 'Events lost before reaching svctrace (full ring buffer, reader, netlink overrun).', () => source.kernelLost(), 'counter');
  new Counter({
    name: 'svctrace_packet_drops_total',
    help: 'Kernel drops of traced flows reported, by skb drop reason (a flow\'s repeats at one place once, unless --all-packets; svctrace_dropped_packets_total counts the packets).',
    labelNames: ['reason'],
    registers,
    collect() {
      this.reset();
      for (const [reason, n] of Object.entries(source.dropsByReason())) this.inc({ reason }, n);
    },
  });
  new Counter({
    name: 'svctrace_events_lost_total',
    help: 'Events lost, per stage (ring_buffer, flow_state, nat_exit_unmatched, conntrack_netlink, hooks_missed_packets (packets, not events), hook_runs_skipped (program runs the kernel skipped, not events), rule_trace_netlink, undecodable, internal_error (events a bug in svctrace lost), shutdown, flow_table, flow_updates (flow changes no flow update carried, not events), client_queues (events clients missed, those gone included); a relay: relay_upstream, relay_flows).',
    labelNames: ['stage'],
    registers,
    collect() {
      this.reset();
      for (const [stage, n] of Object.entries({ ...source.lostByStage?.(), client_queues: hub.clientsDropped() })) this.inc({ stage }, n ?? 0);
    },
  });
  const countedOnly = source.flowsCountedOnly?.bind(source);
  if (countedOnly) {
    value('svctrace_flows_counted_only_total', 'Traced flows started over the detail budget (--detail-rate): counted in the kernel (packets, bytes, backend, drops), their transitions not reported. Not a loss.', countedOnly, 'counter');
  }
  value('svctrace_heap_used_bytes', 'V8 heap in use by svctrace.', () => v8.getHeapStatistics().used_heap_size);
  value('svctrace_heap_limit_bytes', 'V8 heap limit (--max-old-space-size on the #! line, plus the young generation).', () => v8.getHeapStatistics().heap_size_limit);
  value('svctrace_resident_memory_bytes', 'Resident set size of the svctrace process.', () => process.memoryUsage.rss());
  value('svctrace_clients', 'Connected WebSocket clients.', () => hub.clientCount);
  const perClient = (name: string, help: string, read: (c: ReturnType<Hub['clientList']>[number]) => number) =>
    new Counter({
      name,
      help,
      labelNames: ['client', 'remote'],
      registers,
      collect() {
        this.reset();
        for (const c of hub.clientList()) this.inc({ client: String(c.id), remote: c.remote }, read(c));
      },
    });
  if (source.nodes) {
    // A relay: each node server, as it stands (1 connected, 0.5 lagging, 0 down or connecting).
    const nodes = source.nodes.bind(source);
    new Gauge({
      name: 'svctrace_relay_node_up',
      help: 'A node server the relay merges: 1 connected, 0.5 lagging, 0 down or connecting.',
      labelNames: ['node', 'url'],
      registers,
      collect() {
        this.reset();
        for (const n of nodes()) this.set({ node: n.node ?? '', url: n.url ?? '' }, n.state === 'connected' ? 1 : n.state === 'lagging' ? 0.5 : 0);
      },
    });
    new Counter({
      name: 'svctrace_relay_node_events_lost_total',
      help: "Events a node server lost before they reached the relay (its kernel side, and what it dropped for the relay).",
      labelNames: ['node', 'url'],
      registers,
      collect() {
        this.reset();
        for (const n of nodes()) this.inc({ node: n.node ?? '', url: n.url ?? '' }, Number(n.lost ?? 0));
      },
    });
  }
  perClient('svctrace_client_events_sent_total', 'Events sent to a client.', (c) => c.sent);
  perClient('svctrace_client_events_dropped_total', 'Events a slow client missed.', (c) => c.dropped);
  return registry;
}

/** The exposition text of the server's registry and the extra ones. */
export function renderMetrics(registries: Registry[]): Promise<string> {
  return Registry.merge(registries).metrics();
}
