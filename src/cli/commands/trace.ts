import { Command } from 'commander';
import { KernelEvent } from '../../events/decode';
import { parseNodePortSpec, parseServiceSpec, ServiceSpec } from '../../net/ipv4';
import { formatEventText } from '../../output/event-text';
import { TraceSession, waitForStop } from '../../tracer/session';
import { CURRENT_NETNS } from '../../tracer/netns';
import { SvctraceError } from '../../errors';

function collect(value: string, previous: string[]): string[] {
  return previous.concat([value]);
}

function parseDuration(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0 || n > 7 * 24 * 3600) throw new SvctraceError('BAD_INPUT', `--duration '${v}' must be a number of seconds > 0`);
  return n;
}

export function jsonEvent(e: KernelEvent): string {
  return JSON.stringify(e, (_k, v) => (typeof v === 'bigint' ? v.toString() : v));
}

export function registerTrace(program: Command): void {
  program
    .command('trace')
    .description('trace flows to ClusterIPs/NodePorts live')
    .option('-s, --service <ip:port[/proto]>', 'ClusterIP service to trace (repeatable)', collect, [])
    .option('--nodeport <port[/proto]>', 'NodePort to trace (repeatable)', collect, [])
    .option('--netns <name|path>', 'network namespace of the node (repeatable; default: svctrace\'s own)', collect, [])
    .option('--duration <seconds>', 'stop after this many seconds (default: until Ctrl-C)')
    .option('-o, --output <format>', 'text or json', 'text')
    .action(async (opts: { service: string[]; nodeport: string[]; netns: string[]; duration?: string; output: string }) => {
      if (opts.output !== 'text' && opts.output !== 'json') throw new SvctraceError('BAD_INPUT', `--output must be text or json, not '${opts.output}'`);
      const services: ServiceSpec[] = [...opts.service.map(parseServiceSpec), ...opts.nodeport.map(parseNodePortSpec)];
      const duration = parseDuration(opts.duration);
      let t0: bigint | null = null;
      const session = TraceSession.start({
        services,
        netns: opts.netns.length ? opts.netns : [CURRENT_NETNS],
        onEvents: (events) => {
          const lines: string[] = [];
          for (const e of events) {
            if (t0 === null) t0 = e.tsNs;
            lines.push(opts.output === 'json' ? jsonEvent(e) : formatEventText(e, t0));
          }
          process.stdout.write(lines.join('\n') + '\n');
        },
      });
      process.stderr.write(`svctrace: tracing ${services.map((s) => s.text).join(', ')} (Ctrl-C to stop)\n`);
      await waitForStop(duration);
      const stats = await session.stop();
      process.stderr.write(`svctrace: ${stats.recordsRead} events, ${stats.ringbufLost} lost to a full ring buffer\n`);
    });
}
