import { Command } from 'commander';
import { waitForStop } from '../../pipeline/lifecycle';
import { StreamServer } from '../../stream/server';
import { dashboardHandler } from '../../stream/static';
import { formatSummary } from '../../output/flow-text';
import { MemoryWatch } from '../../process-memory';
import { DiscoveredService, Discovery } from '../../discovery/model';
import { Pipeline } from '../../pipeline/pipeline';
import { streamSink } from '../../pipeline/sinks/stream';
import { metricsSink } from '../../pipeline/sinks/metrics';
import { ServiceMetrics } from '../../metrics/service-metrics';
import { netnsLabel, pollConntrackUse } from '../../metrics/conntrack-use';
import { liveDiagnoserSink, tracedServicesInRules } from '../../pipeline/sinks/diagnoser';
import { parseServiceSpec, ServiceSpec } from '../../net/ipv4';
import { serviceLabel } from '../../flows/service-ids';
import type { svctrace } from '../../gen/svctrace';
import { addSelectionOptions, parseDuration, SelectionOptions, selectionOf, servicesFrom } from '../options';
import { addServerOptions, ServerCliOptions, serverOptionsOf } from '../server-options';
import { nodeName } from '../../node-name';

interface ServeCliOptions extends SelectionOptions, ServerCliOptions {
  duration?: string;
}

/** The rules' view of the traced services, for the dashboard's expected distribution; empty when none are found. */
function rulesFor(services: ServiceSpec[], d: Discovery): { rules: svctrace.v1.IServiceRules[]; found: DiscoveredService[] } {
  const found = tracedServicesInRules(services, d);
  const rules = found.map((s) => ({
    service: serviceLabel(parseServiceSpec(`${s.clusterIP}:${s.port}/${s.proto}`)),
    name: s.name,
    backends: s.endpoints.map((e) => ({ address: `${e.ip}:${e.port}`, probability: e.probability })),
    affinitySeconds: s.affinitySeconds ?? 0,
    mode: s.source,
  }));
  return { rules, found };
}

export function registerServe(program: Command): void {
  addServerOptions(addSelectionOptions(program.command('serve').description('trace and stream events over WebSocket (protobuf) at /v1/events, with /healthz and /metrics')))
    .option('--duration <seconds>', 'stop after this many seconds (default: until Ctrl-C)')
    .action(async (opts: ServeCliOptions) => {
      const services = await servicesFrom(opts);
      const duration = parseDuration(opts.duration);
      const serverOptions = serverOptionsOf(opts);
      let server: StreamServer | undefined;
      let metrics: ServiceMetrics | undefined;
      const memory = new MemoryWatch();
      const pipeline = await Pipeline.start({ ...selectionOf(opts, services), holdSignalsWhileStarting: true }, async (ctx) => {
        const source = ctx.hubSource();
        const rules = rulesFor(services, ctx.discovery);
        source.rules = rules.rules;
        metrics = new ServiceMetrics({
          node: nodeName(),
          expected: rules.rules.flatMap((r) => (r.backends ?? []).map((b) => ({ service: r.service ?? '', backend: b.address ?? '', ratio: b.probability ?? 0 }))),
        });
        const m = metrics;
        const s = await StreamServer.start(source, { ...serverOptions, staticHandler: dashboardHandler(), metrics: [m.registry] });
        server = s;
        // Classic failures, live: sent to every client as Diagnosis messages,
        // and those in effect as svctrace_diagnosis_active.
        return [
          liveDiagnoserSink(services, ctx.discovery, ctx.netns[0]!, (ds) => s.hub.broadcastDiagnoses(ds), { onActive: (a) => m.setDiagnoses(a), deliveredThrough: () => ctx.deliveredThrough() }),
          streamSink(s),
          metricsSink(m),
        ];
      });
      const conntrack = pollConntrackUse(
        pipeline.netns.map((p) => ({ path: p, name: netnsLabel(p) })),
        (name, entries, limit) => metrics?.setConntrack(name, entries, limit),
        (w) => process.stderr.write(`svctrace: ${w}\n`),
      );
      const url = server!.url();
      process.stderr.write(`svctrace: tracing ${services.map((s) => s.text).join(', ')} (backend ${pipeline.attachBackend.backend}); streaming at ${url} (dashboard: ${url.replace(/^ws/, 'http').replace('/v1/events', '/')}; Ctrl-C to stop)\n`);
      await waitForStop(duration, pipeline.allNetnsGone);
      conntrack.stop();
      const { summary, stats, losses } = await pipeline.stop();
      memory.stop();
      // The stream closed with the pipeline: what its clients missed, the events still queued at the end included, is final now.
      process.stderr.write(formatSummary(summary, stats, pipeline.backendName, { ...losses, client_queues: server!.hub.clientsDropped() }) + '\n' + `  ${memory.describe()}\n`);
      pipeline.throwIfNetnsGone();
    });
}
