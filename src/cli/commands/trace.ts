import { Command } from 'commander';
import { diagnosisLine, formatSummary } from '../../output/flow-text';
import { waitForStop } from '../../pipeline/lifecycle';
import { Pipeline } from '../../pipeline/pipeline';
import { flowLinesSink, textTimelineSink } from '../../pipeline/sinks/text';
import { jsonLinesSink } from '../../pipeline/sinks/json';
import { liveDiagnoserSink } from '../../pipeline/sinks/diagnoser';
import { SvctraceError } from '../../errors';
import { MAX_SNAPLEN } from '../../events/layout';
import { addSelectionOptions, parseDuration, parseSnaplen, SelectionOptions, selectionOf, servicesFrom } from '../options';

function useColor(): boolean {
  return !!process.stdout.isTTY && !process.env.NO_COLOR;
}

export function registerTrace(program: Command): void {
  addSelectionOptions(program.command('trace').description('trace flows to ClusterIPs/NodePorts live: DNAT, SNAT, conntrack, route, veth, drops, reply'))
    .option('--duration <seconds>', 'stop after this many seconds (default: until Ctrl-C)')
    .option('-o, --output <format>', 'text (a timeline per flow), flows (one line per flow as it ends: for busy Services) or json (one svctrace.v1.Event per line)', 'text')
    .option('--drops-only', 'show only failures: drops, resets, ICMP errors (text, json), or the flows that had one (flows)')
    .option('--snaplen <bytes>', `capture this many bytes of each packet into json output (0-${MAX_SNAPLEN})`, '0')
    .action(async (opts: SelectionOptions & { duration?: string; output: string; snaplen: string; dropsOnly?: boolean }) => {
      const snaplen = parseSnaplen(opts.snaplen);
      if (!['text', 'json', 'flows'].includes(opts.output)) throw new SvctraceError('BAD_INPUT', `--output must be text, flows or json, not '${opts.output}'`);
      const dropsOnly = !!opts.dropsOnly;
      const services = await servicesFrom(opts);
      const duration = parseDuration(opts.duration);
      const write = (s: string) => process.stdout.write(s);
      const pipeline = await Pipeline.start({ ...selectionOf(opts, services), snaplen, holdSignalsWhileStarting: true }, (ctx) => {
        // Classic failures seen live, next to the timelines or flows; in JSON as {"diagnosis": ...} lines.
        const diagnoser = liveDiagnoserSink(services, ctx.discovery, ctx.netns[0]!, (ds) =>
          write(
            ds
              .map((x) =>
                opts.output === 'json'
                  ? `${JSON.stringify({ diagnosis: x })}\n`
                  : `${diagnosisLine(x)}\n`,
              )
              .join(''),
          ),
          { deliveredThrough: () => ctx.deliveredThrough() },
        );
        return opts.output === 'json'
          ? [jsonLinesSink(write, dropsOnly), diagnoser]
          : opts.output === 'flows'
            ? [flowLinesSink(write, ctx.flows, ctx.backendName, dropsOnly), diagnoser]
            : [textTimelineSink(write, { color: useColor(), backendName: ctx.backendName, flows: ctx.flows, dropsOnly, rulePathsObserved: ctx.rulePathsObserved }), diagnoser];
      });
      process.stderr.write(`svctrace: tracing ${services.map((s) => s.text).join(', ')} (backend ${pipeline.attachBackend.reason}); Ctrl-C to stop\n`);
      await waitForStop(duration, pipeline.allNetnsGone);
      const { summary, stats, losses } = await pipeline.stop();
      process.stderr.write(formatSummary(summary, stats, pipeline.backendName, losses) + '\n');
      pipeline.throwIfNetnsGone();
    });
}
