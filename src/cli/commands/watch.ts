import { Command } from 'commander';
import { SvctraceError } from '../../errors';
import { connect } from '../../client/node';
import { SILENT_CLOSE } from '../../client/client';
import { eventToJson } from '../../flows/to-proto';
import { DEFAULT_LISTEN, EVENTS_PATH } from '../../stream/server';
import { stdoutRoom, waitForStop } from '../../pipeline/lifecycle';
import { eventLine } from '../../output/event-line';
import { collect, parseDuration, readToken } from '../options';
import { terminalSafeLine } from '../../output/terminal-safe';
import { compileFilter } from '../../stream/filter';

interface WatchOptions {
  token?: string;
  tokenFile?: string;
  service: string[];
  backend: string[];
  namespace: string[];
  node: string[];
  dropsOnly?: boolean;
  output: string;
  duration?: string;
}


export function registerWatch(program: Command): void {
  program
    .command('watch')
    .description('connect to a `svctrace serve` stream and print its events')
    .argument('[url]', 'ws://HOST:PORT/v1/events', `ws://${DEFAULT_LISTEN}${EVENTS_PATH}`)
    .option('--token <token>', 'bearer token')
    .option('--token-file <path>', 'read the token from this file')
    .option('-s, --service <service>', 'only this service, e.g. 10.96.0.100:80/tcp (repeatable)', collect, [])
    .option('--backend <ip[:port]>', 'only flows to this backend (repeatable)', collect, [])
    .option('--namespace <netns>', 'only events in this network namespace (repeatable)', collect, [])
    .option('--node <name>', 'only events seen on this node (a relay merges several; repeatable)', collect, [])
    .option('--drops-only', 'only drops, resets and ICMP errors')
    .option('-o, --output <format>', 'text or json', 'text')
    .option('--duration <seconds>', 'stop after this many seconds')
    .action(async (url: string, opts: WatchOptions) => {
      if (opts.output !== 'text' && opts.output !== 'json') throw new SvctraceError('BAD_INPUT', `--output must be text or json, not '${opts.output}'`);
      let parsed: URL;
      try {
        parsed = new URL(url);
      } catch {
        throw new SvctraceError('BAD_INPUT', `'${url}' is not a URL (expected ws://HOST:PORT${EVENTS_PATH})`);
      }
      if (parsed.protocol !== 'ws:' && parsed.protocol !== 'wss:') throw new SvctraceError('BAD_INPUT', `'${url}' must start with ws:// or wss://`);
      const duration = parseDuration(opts.duration);
      const filter = { services: opts.service, backends: opts.backend, namespaces: opts.namespace, nodes: opts.node, dropsOnly: !!opts.dropsOnly };
      // The server's own check, here first: a filter it would refuse is bad
      // input (exit 2), not a stream of every event with an error line.
      compileFilter(filter, Number.MAX_SAFE_INTEGER);
      const token = readToken(opts);
      let closedBy: string | undefined;
      let userClosed = false;
      // The server's close ends the watch at once (a --duration's timer is not waited out).
      const serverGone = new AbortController();
      // stdout's reader behind (`| less`): the stream is not read until stdout
      // drained; the server queues for this client, then drops (counted in
      // its Status) or closes it as too slow. Memory here stays bounded.
      let heldForStdout = false;
      let client: Awaited<ReturnType<typeof connect>> | undefined;
      const done = new Promise<void>((resolve) => {
        void (async () => {
          client = await connect(
            // A server gone without a word (its node powered off, partitioned) ends the watch too.
            { url, token, filter, connectTimeoutMs: 10_000, silenceLimitMs: 20_000 },
            {
              events: (events) => {
                const lines = events.map((e) =>
                  opts.output === 'json' ? eventToJson(e) : terminalSafeLine(eventLine(e)),
                );
                if (lines.length) process.stdout.write(lines.join('\n') + '\n');
                // (Before connect() resolves there is no client to hold yet: a few batches.)
                if (!client || heldForStdout) return;
                const room = stdoutRoom();
                if (room && client.holdReading()) {
                  heldForStdout = true;
                  void room.then(() => {
                    heldForStdout = false;
                    client?.releaseReading();
                  });
                }
              },
              error: (e) => process.stderr.write(`svctrace: server says ${terminalSafeLine(`${e.code}: ${e.message}`)}\n`),
              diagnosis: (d) => process.stdout.write(terminalSafeLine(`[diagnosis]${d.node ? ` [${d.node}]` : ''} [${(d.severity ?? '').toUpperCase()}] ${d.code}${d.layer ? ` (${d.layer})` : ''} ${d.service}${d.object ? ` ${d.object}` : ''}: ${d.summary}`) + '\n'),
              close: (code, reason) => {
                if (!userClosed) closedBy = terminalSafeLine(code === SILENT_CLOSE ? `stream ended: ${reason}` : `server closed the stream (${code}${reason ? `: ${reason}` : ''})`);
                serverGone.abort();
                resolve();
              },
            },
          ).catch((e: Error) => {
            closedBy = terminalSafeLine(e.message);
            resolve();
            return undefined;
          });
          if (!client) return;
          const nodes = client.hello?.nodes ?? [];
          process.stderr.write(
            terminalSafeLine(`svctrace: connected to ${nodes.length ? `relay ${client.hello?.node ?? '?'} (nodes: ${nodes.map((n) => `${n.node || n.url} ${n.state}`).join(', ')})` : (client.hello?.node ?? '?')} (svctrace ${client.hello?.serverVersion}${client.hello?.attachBackend ? `, backend ${client.hello.attachBackend.split(':')[0]}` : ''}), tracing ${(client.hello?.services ?? []).join(', ')}`) + '\n',
          );
          await waitForStop(duration, serverGone.signal);
          userClosed = true;
          client.close();
          resolve();
        })();
      });
      await done;
      if (closedBy) throw new SvctraceError('STREAM', closedBy);
    });
}
