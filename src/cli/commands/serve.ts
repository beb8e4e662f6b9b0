import fs from 'node:fs';
import os from 'node:os';
import { Command } from 'commander';
import { SvctraceError } from '../../errors';
import { waitForStop } from '../../pipeline/lifecycle';
import { DEFAULT_LISTEN, StreamServer } from '../../stream/server';
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
import { addSelectionOptions, collect, parseDuration, readToken, SelectionOptions, selectionOf, servicesFrom } from '../options';

interface ServeCliOptions extends SelectionOptions {
  listen: string;
  token?: string;
  tokenFile?: string;
  tlsCert?: string;
  tlsKey?: string;
  allowOrigin: string[];
  allowHost: string[];
  duration?: string;
}

function readFileOpt(path: string, what: string): Buffer {
  try {
    return fs.readFileSync(path);
  } catch (e) {
    throw new SvctraceError('BAD_INPUT', `cannot read ${what} ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
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
  addSelectionOptions(program.command('serve').description('trace and stream events over WebSocket (protobuf) at /v1/events, with /healthz and /metrics'))
    .option('--listen <host:port>', 'address to listen on (beyond loopback needs a token)', DEFAULT_LISTEN)
    .option('--token <token>', 'bearer token clients must present (>= 16 characters)')
    .option('--token-file <path>', 'read the token from the first line of this file')
    .option('--tls-cert <path>', 'serve HTTPS/WSS with this certificate (PEM)')
    .option('--tls-key <path>', 'private key for --tls-cert (PEM)')
    .option('--allow-origin <origin>', 'browser Origin allowed besides the server itself (repeatable)', collect, [])
    .option('--allow-host <name>', 'Host name accepted besides addresses and localhost, e.g. the name clients use (repeatable; guards against DNS rebinding)', collect, [])
    .option('--duration <seconds>', 'stop after this many seconds (default: until Ctrl-C)')
    .action(async (opts: ServeCliOptions) => {
      const services = await servicesFrom(opts);
      const duration = parseDuration(opts.duration);
      const token = readToken(opts);
      if (!!opts.tlsCert !== !!opts.tlsKey) throw new SvctraceError('BAD_INPUT', 'give both --tls-cert and --tls-key');
      const tls = opts.tlsCert && opts.tlsKey ? { cert: readFileOpt(opts.tlsCert, 'certificate'), key: readFileOpt(opts.tlsKey, 'key') } : undefined;
      let server: StreamServer | undefined;
      let metrics: ServiceMetrics | undefined;
      const memory = new MemoryWatch();
      const pipeline = await Pipeline.start(selectionOf(opts, services), async (ctx) => {
        const source = ctx.hubSource();
        const rules = rulesFor(services, ctx.discovery);
        source.rules = rules.rules;
        metrics = new ServiceMetrics({
          node: os.hostname(),
          expected: rules.rules.flatMap((r) => (r.backends ?? []).map((b) => ({ service: r.service ?? '', backend: b.address ?? '', ratio: b.probability ?? 0 }))),
        });
        const m = metrics;
        const s = await StreamServer.start(source, { listen: opts.listen, token, tls, allowOrigins: opts.allowOrigin, allowHosts: opts.allowHost, staticHandler: dashboardHandler(), metrics: [m.registry] });
        server = s;
        // Classic failures, live: sent to every client as Diagnosis messages,
        // and those in effect as svctrace_diagnosis_active.
        return [
          liveDiagnoserSink(services, ctx.discovery, ctx.netns[0]!, (ds) => s.hub.broadcastDiagnoses(ds), { onActive: (a) => m.setDiagnoses(a) }),
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
      const { summary, stats } = await pipeline.stop();
      memory.stop();
      process.stderr.write(formatSummary(summary, stats, pipeline.backendName) + '\n' + `  ${memory.describe()}\n`);
      pipeline.throwIfNetnsGone();
    });
}
