import fs from 'node:fs';
import { Command } from 'commander';
import { SvctraceError } from '../../errors';
import { waitForStop } from '../../tracer/session';
import { DEFAULT_LISTEN, StreamServer } from '../../stream/server';
import { dashboardHandler } from '../../stream/static';
import { formatSummary } from '../../output/flow-text';
import { DiscoveredService, Discovery, findByAddress } from '../../discovery/model';
import { LiveDiagnoser } from '../../explain/live';
import { ServiceSpec } from '../../net/ipv4';
import { serviceLabel } from '../../flows/flow-table';
import type { svctrace } from '../../gen/svctrace';
import { addSelectionOptions, collect, parseDuration, readToken, SelectionOptions, servicesFrom, startTracing } from '../options';

interface ServeCliOptions extends SelectionOptions {
  listen: string;
  token?: string;
  tokenFile?: string;
  tlsCert?: string;
  tlsKey?: string;
  allowOrigin: string[];
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
function rulesFor(services: ServiceSpec[], d: Discovery): { rules: svctrace.v1.IServiceRules[]; found: DiscoveredService[]; masqueradeRule: boolean } {
  const out: svctrace.v1.IServiceRules[] = [];
  const found: DiscoveredService[] = [];
  for (const spec of services) {
    if (!spec.address) continue;
    const s = findByAddress(d, spec.address, spec.port, spec.proto);
    if (!s) continue;
    found.push(s);
    out.push({
      service: serviceLabel(spec),
      name: s.name,
      backends: s.endpoints.map((e) => ({ address: `${e.ip}:${e.port}`, probability: e.probability })),
      affinitySeconds: s.affinitySeconds ?? 0,
      mode: s.source,
    });
  }
  return { rules: out, found, masqueradeRule: d.masqueradeRule };
}

export function registerServe(program: Command): void {
  addSelectionOptions(program.command('serve').description('trace and stream events over WebSocket (protobuf) at /v1/events, with /healthz and /metrics'))
    .option('--listen <host:port>', 'address to listen on (beyond loopback needs a token)', DEFAULT_LISTEN)
    .option('--token <token>', 'bearer token clients must present (>= 16 characters)')
    .option('--token-file <path>', 'read the token from the first line of this file')
    .option('--tls-cert <path>', 'serve HTTPS/WSS with this certificate (PEM)')
    .option('--tls-key <path>', 'private key for --tls-cert (PEM)')
    .option('--allow-origin <origin>', 'browser Origin allowed besides the server itself (repeatable)', collect, [])
    .option('--duration <seconds>', 'stop after this many seconds (default: until Ctrl-C)')
    .action(async (opts: ServeCliOptions) => {
      const services = await servicesFrom(opts);
      const duration = parseDuration(opts.duration);
      const token = readToken(opts);
      if (!!opts.tlsCert !== !!opts.tlsKey) throw new SvctraceError('BAD_INPUT', 'give both --tls-cert and --tls-key');
      const tls = opts.tlsCert && opts.tlsKey ? { cert: readFileOpt(opts.tlsCert, 'certificate'), key: readFileOpt(opts.tlsKey, 'key') } : undefined;
      let server: StreamServer | undefined;
      let live: LiveDiagnoser | undefined;
      const { tracer, discovery, cluster } = await startTracing(opts, services, {
        onIngested: (items) => {
          server?.publish(items.map((i) => i.event));
          live?.observe(items);
        },
      });
      const source = tracer.hubSource();
      const rules = rulesFor(services, discovery);
      source.rules = rules.rules;
      try {
        server = await StreamServer.start(source, { listen: opts.listen, token, tls, allowOrigins: opts.allowOrigin, staticHandler: dashboardHandler() });
      } catch (e) {
        await tracer.stop();
        throw e;
      }
      // Classic failures, live: sent to every client as Diagnosis messages.
      live = new LiveDiagnoser(rules.found, (ds) => server?.hub.broadcastDiagnoses(ds), 5000, rules.masqueradeRule);
      process.stderr.write(`svctrace: tracing ${services.map((s) => s.text).join(', ')}; streaming at ${server.url()} (dashboard: ${server.url().replace(/^ws/, 'http').replace('/v1/events', '/')}; Ctrl-C to stop)\n`);
      await waitForStop(duration);
      live.stop();
      await server.close();
      const { summary, stats } = await tracer.stop();
      await cluster?.stop();
      process.stderr.write(formatSummary(summary, stats, (a) => tracer.backendName(a)) + '\n');
    });
}
