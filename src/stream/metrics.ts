/** /metrics in the Prometheus text exposition format (version 0.0.4). */
import v8 from 'node:v8';
import { Hub, HubSource } from './hub';

function esc(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

export function renderMetrics(hub: Hub, source: HubSource): string {
  const lines: string[] = [];
  const metric = (name: string, type: string, help: string, samples: Array<[string, number]>) => {
    lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (const [labels, v] of samples) lines.push(`${name}${labels} ${v}`);
  };
  metric('svctrace_events_total', 'counter', 'Events of traced flows seen by the server.', [['', hub.eventsTotal]]);
  metric('svctrace_flows_active', 'gauge', 'Flows currently tracked.', [['', source.activeFlows()]]);
  metric('svctrace_kernel_events_lost_total', 'counter', 'Events lost before reaching svctrace (full ring buffer, reader, netlink overrun).', [['', source.kernelLost()]]);
  metric(
    'svctrace_packet_drops_total',
    'counter',
    'Kernel drops of traced flows, by skb drop reason.',
    Object.entries(source.dropsByReason()).map(([r, n]) => [`{reason="${esc(r)}"}`, n]),
  );
  metric(
    'svctrace_events_lost_total',
    'counter',
    'Events lost, per stage (ring_buffer, flow_state, conntrack_netlink, rule_trace_netlink, shutdown, flow_table, client_queues).',
    Object.entries({ ...source.lostByStage?.(), client_queues: hub.clientsDropped() }).map(([st, n]) => [`{stage="${esc(st)}"}`, n ?? 0]),
  );
  const heap = v8.getHeapStatistics();
  metric('svctrace_heap_used_bytes', 'gauge', 'V8 heap in use by svctrace.', [['', heap.used_heap_size]]);
  metric('svctrace_heap_limit_bytes', 'gauge', 'V8 heap limit (--max-old-space-size on the #! line, plus the young generation).', [['', heap.heap_size_limit]]);
  metric('svctrace_resident_memory_bytes', 'gauge', 'Resident set size of the svctrace process.', [['', process.memoryUsage.rss()]]);
  metric('svctrace_clients', 'gauge', 'Connected WebSocket clients.', [['', hub.clientCount]]);
  const clients = hub.clientList();
  metric('svctrace_client_events_sent_total', 'counter', 'Events sent to a client.', clients.map((c) => [`{client="${c.id}",remote="${esc(c.remote)}"}`, c.sent]));
  metric('svctrace_client_events_dropped_total', 'counter', 'Events a slow client missed.', clients.map((c) => [`{client="${c.id}",remote="${esc(c.remote)}"}`, c.dropped]));
  return lines.join('\n') + '\n';
}
