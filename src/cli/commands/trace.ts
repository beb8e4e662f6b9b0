import { Command } from 'commander';
import { FlowTextPrinter, formatSummary } from '../../output/flow-text';
import { eventToJson } from '../../flows/to-proto';
import { waitForStop } from '../../tracer/session';
import { DiscoveredService, findByAddress } from '../../discovery/model';
import { LiveDiagnoser } from '../../explain/live';
import { SvctraceError } from '../../errors';
import { MAX_SNAPLEN } from '../../events/layout';
import { addSelectionOptions, parseDuration, SelectionOptions, servicesFrom, startTracing } from '../options';

function useColor(): boolean {
  return !!process.stdout.isTTY && !process.env.NO_COLOR;
}

export function registerTrace(program: Command): void {
  addSelectionOptions(program.command('trace').description('trace flows to ClusterIPs/NodePorts live: DNAT, SNAT, conntrack, route, veth, drops, reply'))
    .option('--duration <seconds>', 'stop after this many seconds (default: until Ctrl-C)')
    .option('-o, --output <format>', 'text (a timeline per flow) or json (one svctrace.v1.Event per line)', 'text')
    .option('--snaplen <bytes>', `capture this many bytes of each packet into json output (0-${MAX_SNAPLEN})`, '0')
    .action(async (opts: SelectionOptions & { duration?: string; output: string; snaplen: string }) => {
      const snaplen = Number(opts.snaplen);
      if (!Number.isInteger(snaplen) || snaplen < 0 || snaplen > MAX_SNAPLEN) throw new SvctraceError('BAD_INPUT', `--snaplen must be 0..${MAX_SNAPLEN}`);
      if (opts.output !== 'text' && opts.output !== 'json') throw new SvctraceError('BAD_INPUT', `--output must be text or json, not '${opts.output}'`);
      const services = await servicesFrom(opts);
      const duration = parseDuration(opts.duration);
      const write = (s: string) => process.stdout.write(s);
      let printer: FlowTextPrinter | undefined;
      let live: LiveDiagnoser | undefined;
      const { tracer, discovery, cluster } = await startTracing(opts, services, {
        snaplen,
        onIngested: (items) => {
          if (opts.output === 'json') {
            if (items.length) write(items.map((i) => eventToJson(i.event)).join('\n') + '\n');
          } else {
            printer?.print(items);
          }
          live?.observe(items);
        },
      });
      printer = new FlowTextPrinter(write, useColor(), (a) => tracer.backendName(a));
      if (opts.output === 'text') {
        // Classic failures seen live, next to the timelines (needs the rules of the services).
        const d = discovery;
        const found = services.map((sv) => (sv.address ? findByAddress(d, sv.address, sv.port, sv.proto) : undefined)).filter((x): x is DiscoveredService => !!x);
        live = new LiveDiagnoser(found, (ds) => write(ds.map((x) => `[diagnosis] [${x.severity.toUpperCase()}] ${x.code} ${x.service}: ${x.summary}\n`).join('')), 5000, d.masqueradeRule);
      }
      process.stderr.write(`svctrace: tracing ${services.map((s) => s.text).join(', ')}; Ctrl-C to stop\n`);
      await waitForStop(duration);
      live?.stop();
      const { summary, stats } = await tracer.stop();
      await cluster?.stop();
      process.stderr.write(formatSummary(summary, stats, (a) => tracer.backendName(a)) + '\n');
    });
}
