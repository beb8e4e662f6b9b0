/**
 * The per-Service Prometheus series from the flow model: each connection
 * counted once, by backend; errors, drops and masquerade; latencies from
 * kernel timestamps; the cardinality cap. No kernel: the flow table is fed
 * decoded records (test/helpers/kernel-events).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Hub } from '../../src/stream/hub';
import { serverRegistry } from '../../src/stream/metrics';
import { syntheticSource } from '../helpers/stream';
import { FlowTable } from '../../src/flows/flow-table';
import type { Tuple } from '../../src/events/decode';
import { Dir, EventKind, NfStage, StatsReason } from '../../src/events/layout';
import { IPS_ASSURED, IPS_CONFIRMED, IPS_DST_NAT, IPS_SEEN_REPLY, IPS_SRC_NAT } from '../../src/events/conntrack';
import { parseServiceSpec } from '../../src/net/ipv4';
import { ServiceMetrics } from '../../src/metrics/service-metrics';
import { parseConntrackUse, netnsLabel } from '../../src/metrics/conntrack-use';
import { ctKeyOf, ev, orig, reply } from '../helpers/kernel-events';

const SVC = '10.96.0.100:80/tcp';

function table(): FlowTable {
  return new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')], dropReasons: { '12': 'NETFILTER_DROP', '3': 'QUEUE_PURGE' }, closeGraceMs: 0 });
}

/** One client connection (its own source port and nf_conn) DNATed to backend .1X:8080, answered after `replyNs`. */
function connection(n: number, backendHost: number, opts: { replyNs?: bigint; masquerade?: boolean; reset?: boolean } = {}) {
  const ctId = `ffff${(0x100 + n).toString(16)}`;
  const o: Tuple = { ...orig, sport: 40000 + n };
  const r: Tuple = { ...reply, saddr: `10.244.1.${backendHost}`, dport: opts.masquerade ? 50000 + n : o.sport, daddr: opts.masquerade ? '10.244.1.1' : o.saddr };
  const t0 = BigInt(n) * 1_000_000_000n;
  const nat = IPS_DST_NAT | (opts.masquerade ? IPS_SRC_NAT : 0);
  const evs = [
    // Before DNAT the entry's reply tuple is the original reversed.
    ev({ ctId, tsNs: t0, ctOrig: o, ctReply: { saddr: o.daddr, daddr: o.saddr, sport: o.dport, dport: o.sport, proto: 6 }, pkt: o }),
    ev({ ctId, tsNs: t0 + 10_000n, ctOrig: o, ctReply: r, nfStage: NfStage.AFTER_NAT, nfPriority: -99, ctStatus: nat }),
  ];
  if (opts.replyNs !== undefined) {
    evs.push(
      ev({ ctId, tsNs: t0 + 10_000n + opts.replyNs, ctOrig: o, ctReply: r, dir: Dir.REPLY, tcpFlags: opts.reset ? 0x04 : 0x12, ctStatus: nat | IPS_CONFIRMED | IPS_SEEN_REPLY, ctTcpState: 2 }),
    );
    if (!opts.reset) evs.push(ev({ ctId, tsNs: t0 + 20_000n + opts.replyNs, ctOrig: o, ctReply: r, tcpFlags: 0x10, ctStatus: nat | IPS_CONFIRMED | IPS_SEEN_REPLY | IPS_ASSURED, ctTcpState: 3 }));
  }
  return evs;
}

async function series(m: ServiceMetrics): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  for (const line of (await m.registry.metrics()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

describe('ServiceMetrics', () => {
  it('counts each connection once, by backend, next to the share the rules give it', async () => {
    const t = table();
    const m = new ServiceMetrics({ node: 'n1', expected: [{ service: SVC, backend: '10.244.1.12:8080', ratio: 0.5 }, { service: SVC, backend: '10.244.1.13:8080', ratio: 0.5 }] });
    // Three to .12, one to .13, fed in two batches: the second repeats events of known flows.
    const evs = [...connection(1, 12, { replyNs: 200_000n }), ...connection(2, 12, { replyNs: 300_000n }), ...connection(3, 12, { replyNs: 400_000n }), ...connection(4, 13, { replyNs: 2_000_000n })];
    m.observe(t.ingest(evs.slice(0, 5)));
    m.observe(t.ingest(evs.slice(5)));
    const s = await series(m);
    assert.equal(s.get(`svctrace_connections_total{service="${SVC}",service_name="",backend="10.244.1.12:8080",backend_pod="",node="n1"}`), 3);
    assert.equal(s.get(`svctrace_connections_total{service="${SVC}",service_name="",backend="10.244.1.13:8080",backend_pod="",node="n1"}`), 1);
    assert.equal(s.get(`svctrace_connection_attempts_total{service="${SVC}"}`), 4);
    assert.equal(s.get(`svctrace_backend_observed_ratio{service="${SVC}",backend="10.244.1.12:8080"}`), 0.75);
    assert.equal(s.get(`svctrace_backend_expected_ratio{service="${SVC}",backend="10.244.1.13:8080"}`), 0.5);
    // DNAT to first reply: 0.2, 0.3, 0.4 ms for .12; 2 ms for .13.
    assert.equal(s.get(`svctrace_first_reply_seconds_count{service="${SVC}",backend="10.244.1.12:8080"}`), 3);
    assert.equal(s.get(`svctrace_first_reply_seconds_bucket{le="0.00025",service="${SVC}",backend="10.244.1.12:8080"}`), 1);
    assert.equal(s.get(`svctrace_first_reply_seconds_bucket{le="0.0005",service="${SVC}",backend="10.244.1.12:8080"}`), 3);
    assert.ok(Math.abs(s.get(`svctrace_first_reply_seconds_sum{service="${SVC}",backend="10.244.1.13:8080"}`)! - 0.002) < 1e-9, String(s.get(`svctrace_first_reply_seconds_sum{service="${SVC}",backend="10.244.1.13:8080"}`)) + [...s.keys()].filter(k=>k.includes("first_reply_seconds_sum")).join(" "));
    // First packet to ESTABLISHED: 10 µs + reply + 10 µs.
    assert.equal(s.get(`svctrace_connection_setup_seconds_count{service="${SVC}",backend="10.244.1.13:8080"}`), 1);
    assert.ok(Math.abs(s.get(`svctrace_connection_setup_seconds_sum{service="${SVC}",backend="10.244.1.13:8080"}`)! - 0.00202) < 1e-9);
  });

  it('counts resets, ICMP errors, real drops, masquerade and unanswered connections', async () => {
    const t = table();
    const m = new ServiceMetrics({ node: 'n1' });
    const ctId = 'ffff9';
    m.observe(
      t.ingest([
        ...connection(1, 12, { replyNs: 100_000n, reset: true }),
        ...connection(2, 12, { replyNs: 100_000n, masquerade: true }),
        ev({ ctId, tsNs: 10n }),
        ev({ ctId, tsNs: 20n, kind: EventKind.DROP, reason: 12 }),
        ev({ ctId, tsNs: 30n, kind: EventKind.DROP, reason: 12 }),
        ev({ ctId, tsNs: 40n, kind: EventKind.DROP, reason: 3 }),
        ev({ ctId, tsNs: 50n, dir: Dir.REPLY, pkt: { saddr: '10.244.1.1', daddr: '10.244.1.1', sport: 0, dport: 0, proto: 1 }, icmpType: 3, icmpCode: 3, ctinfo: 4 }),
      ]),
    );
    const silent = t.ingest(connection(3, 14));
    m.observe(silent);
    m.expired([silent[0]!.flow]);
    const s = await series(m);
    assert.equal(s.get(`svctrace_connection_errors_total{service="${SVC}",kind="reset"}`), 1);
    assert.equal(s.get(`svctrace_connection_errors_total{service="${SVC}",kind="icmp"}`), 1);
    assert.equal(s.get(`svctrace_drops_total{service="${SVC}",reason="NETFILTER_DROP"}`), 2);
    assert.equal(s.get(`svctrace_drops_total{service="${SVC}",reason="QUEUE_PURGE"}`), undefined, 'a normal end of a packet is not a drop');
    assert.equal(s.get(`svctrace_masqueraded_connections_total{service="${SVC}"}`), 1);
    assert.equal(s.get(`svctrace_unanswered_connections_total{service="${SVC}",backend="10.244.1.14:8080"}`), 1);
  });

  it("counts dropped packets from the flows' kernel counters, each once, repeats reported once included", async () => {
    const t = table();
    const m = new ServiceMetrics({ node: 'n1' });
    const ctId = 'ffff9';
    // One drop event; the kernel counted six drops (the client resent its SYN into the rule).
    m.observe(t.ingest([ev({ ctId, tsNs: 10n }), ev({ ctId, tsNs: 20n, kind: EventKind.DROP, reason: 12 })]));
    const record = (drops: number, tsNs: bigint) => ({
      tsNs, ctId, ctKey: ctKeyOf(ctId), reason: StatsReason.PERIODIC, packets: [6, 0] as [number, number], bytes: [360, 0] as [number, number], drops, firstNs: 10n, lastNs: tsNs,
      orig, serviceId: 1, netnsIno: 111, tcpFlags: [2, 0] as [number, number], delivered: true, ctBirth: 0, reply: { saddr: '0.0.0.0', daddr: '0.0.0.0', sport: 0, dport: 0, proto: 0 }, countedOnly: false, tcpState: 1, endSent: false, synsResent: 0,
    });
    m.observe(t.ingest([], [record(4, 100n)]));
    m.observe(t.ingest([], [record(6, 200n), record(6, 300n)]));
    const s = await series(m);
    assert.equal(s.get(`svctrace_drops_total{service="${SVC}",reason="NETFILTER_DROP"}`), 1, 'reported once');
    assert.equal(s.get(`svctrace_dropped_packets_total{service="${SVC}"}`), 6);
  });

  it('refuses series past the cap and counts what it refused', async () => {
    const t = table();
    const m = new ServiceMetrics({ node: 'n1', maxSeriesPerFamily: 3 });
    // Five backends, two connections each: only three backends get series.
    const evs = [1, 2, 3, 4, 5].flatMap((b) => [...connection(b, 20 + b, { replyNs: 1000n }), ...connection(10 + b, 20 + b, { replyNs: 1000n })]);
    m.observe(t.ingest(evs));
    const s = await series(m);
    const backends = [...s.keys()].filter((k) => k.startsWith('svctrace_connections_total{'));
    assert.equal(backends.length, 3);
    assert.equal(s.get('svctrace_series_refused_total{metric="svctrace_connections_total"}'), 4);
    assert.equal([...s.keys()].filter((k) => k.startsWith('svctrace_first_reply_seconds_count{')).length, 3);
  });

  it('shows the diagnoses in effect and conntrack use', async () => {
    const m = new ServiceMetrics({ node: 'n1' });
    m.setDiagnoses([{ code: 'NO_ENDPOINTS', service: SVC, severity: 'error' }]);
    m.setConntrack('node', 120, 262144);
    let s = await series(m);
    assert.equal(s.get(`svctrace_diagnosis_active{code="NO_ENDPOINTS",service="${SVC}",severity="error"}`), 1);
    assert.equal(s.get('svctrace_conntrack_entries{netns="node"}'), 120);
    assert.equal(s.get('svctrace_conntrack_entries_limit{netns="node"}'), 262144);
    m.setDiagnoses([]);
    s = await series(m);
    assert.equal(s.get(`svctrace_diagnosis_active{code="NO_ENDPOINTS",service="${SVC}",severity="error"}`), undefined);
  });

  it('passes promtool check metrics, when promtool is installed', async (t) => {
    const m = new ServiceMetrics({ node: 'n1', expected: [{ service: SVC, backend: '10.244.1.12:8080', ratio: 1 }] });
    m.observe(table().ingest(connection(1, 12, { replyNs: 1000n })));
    let promtool: string | undefined;
    try {
      promtool = execFileSync('sh', ['-c', 'command -v promtool || ls .cache/prometheus/usr/bin/promtool'], { encoding: 'utf8' }).trim();
    } catch {
      return t.skip('promtool not installed (scripts/setup.sh installs it); the kernel Prometheus test runs it under CI');
    }
    execFileSync(promtool, ['check', 'metrics'], { input: await m.registry.metrics(), encoding: 'utf8' });
  });
});

describe('conntrack use', () => {
  it('parses the two sysctl values and names namespaces', () => {
    assert.deepEqual(parseConntrackUse('12\n262144\n'), { entries: 12, limit: 262144 });
    assert.equal(parseConntrackUse('cat: no such file\n'), undefined);
    assert.equal(netnsLabel('/run/netns/svt-1-node'), 'svt-1-node');
    assert.equal(netnsLabel('/proc/self/ns/net'), 'node');
  });
});

describe('deploy/', () => {
  it('the Grafana dashboard and the alerting rules use only series svctrace exports', () => {
    const root = path.join(__dirname, '..', '..', '..');
    const hub = new Hub(syntheticSource());
    const names = new Set<string>();
    for (const r of [new ServiceMetrics({ node: 'n1' }).registry, serverRegistry(hub, syntheticSource())]) {
      for (const metric of r.getMetricsAsArray()) {
        const name = (metric as unknown as { name: string }).name;
        names.add(name);
        for (const suffix of ['_bucket', '_sum', '_count']) names.add(name + suffix);
      }
    }
    hub.close();
    for (const file of ['deploy/grafana/svctrace-dashboard.json', 'deploy/prometheus/svctrace-alerts.yml', 'deploy/prometheus/svctrace-alerts.test.yml']) {
      const text = fs.readFileSync(path.join(root, file), 'utf8');
      const used = new Set(text.match(/\bsvctrace_[a-z_]+/g) ?? []);
      assert.ok(used.size > 0, `${file} uses no svctrace series`);
      for (const u of used) assert.ok(names.has(u), `${file} uses ${u}, which svctrace does not export`);
    }
    JSON.parse(fs.readFileSync(path.join(root, 'deploy/grafana/svctrace-dashboard.json'), 'utf8'));
  });
});
