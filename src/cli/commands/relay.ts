import { Command } from 'commander';
import { SvctraceError } from '../../errors';
import { waitForStop } from '../../pipeline/lifecycle';
import { Relay } from '../../relay/relay';
import { EVENTS_PATH } from '../../stream/server';
import { dashboardHandler } from '../../stream/static';
import { collect, parseDuration, readToken, warn } from '../options';
import { Cluster } from '../../k8s/cluster';
import { addServerOptions, readFileOpt, ServerCliOptions, serverOptionsOf } from '../server-options';
import { terminalSafeLine } from '../../output/terminal-safe';

interface RelayCliOptions extends ServerCliOptions {
  agent: string[];
  agentsService?: string;
  kubeconfig?: string;
  agentToken?: string;
  agentTokenFile?: string;
  agentCa?: string;
  duration?: string;
}

export const RELAY_LISTEN = '127.0.0.1:7644';

/** A node server's stream URL: ws(s)://HOST:PORT, its path /v1/events when not given. */
export function agentUrl(text: string): string {
  let u: URL;
  try {
    u = new URL(text);
  } catch {
    throw new SvctraceError('BAD_INPUT', `--agent '${text}' is not a URL (expected ws://HOST:PORT${EVENTS_PATH})`);
  }
  if (u.protocol !== 'ws:' && u.protocol !== 'wss:') throw new SvctraceError('BAD_INPUT', `--agent '${text}' must start with ws:// or wss://`);
  if (u.pathname === '/' || u.pathname === '') u.pathname = EVENTS_PATH;
  else if (u.pathname !== EVENTS_PATH) throw new SvctraceError('BAD_INPUT', `--agent '${text}': a node server's stream is at ${EVENTS_PATH}, not ${u.pathname}`);
  return u.toString();
}

/** --agents-service NS/NAME[:PORT_NAME]: the node servers' headless Service. */
export function parseAgentsService(text: string): { namespace: string; name: string; portName: string } {
  const m = /^([a-z0-9][-a-z0-9]*)\/([a-z0-9][-a-z0-9.]*)(?::([a-z0-9][-a-z0-9]*))?$/.exec(text);
  if (!m) throw new SvctraceError('BAD_INPUT', `--agents-service '${text}' must look like NAMESPACE/NAME[:PORT_NAME], e.g. svctrace/svctrace-agents:stream`);
  return { namespace: m[1]!, name: m[2]!, portName: m[3] ?? '' };
}

/** How often the agents' EndpointSlices (watched by the informer: a local cache) are looked at. */
const AGENTS_RESYNC_MS = 1000;

export function registerRelay(program: Command): void {
  addServerOptions(
    program
      .command('relay')
      .description("merge every node's `svctrace serve` stream into one endpoint (same protocol and dashboard); events name their node")
      .option('--agent <url>', "a node server's stream, ws(s)://HOST:PORT[/v1/events] (repeatable)", collect, [])
      .option('--agents-service <ns/name[:port]>', "find the node servers from the EndpointSlices of their headless Service, as nodes come and go (Kubernetes API)")
      .option('--kubeconfig <path>', 'for --agents-service (default: $KUBECONFIG, ~/.kube/config or in-cluster)')
      .option('--agent-token <token>', "the relay's token towards the node servers")
      .option('--agent-token-file <path>', 'read that token from this file')
      .option('--agent-ca <path>', 'CA certificate (PEM) the node servers\' wss:// certificates are checked against'),
    RELAY_LISTEN,
  )
    .option('--duration <seconds>', 'stop after this many seconds (default: until Ctrl-C)')
    .action(async (opts: RelayCliOptions) => {
      if (!opts.agent.length && !opts.agentsService) throw new SvctraceError('BAD_INPUT', 'give --agent ws://NODE:PORT (a node\'s `svctrace serve`; repeatable) or --agents-service NAMESPACE/NAME');
      const urls = [...new Set(opts.agent.map(agentUrl))];
      const agentsService = opts.agentsService ? parseAgentsService(opts.agentsService) : undefined;
      const duration = parseDuration(opts.duration);
      if (opts.agentToken && opts.agentTokenFile) throw new SvctraceError('BAD_INPUT', 'give --agent-token or --agent-token-file, not both');
      const agentToken = readToken({ token: opts.agentToken, tokenFile: opts.agentTokenFile });
      const agentCa = opts.agentCa ? readFileOpt(opts.agentCa, 'CA certificate') : undefined;
      const cluster = agentsService ? await Cluster.start({ kubeconfig: opts.kubeconfig, onWarning: warn }) : null;
      if (agentsService && !cluster) throw new SvctraceError('BAD_INPUT', '--agents-service needs the Kubernetes API: give --kubeconfig, set $KUBECONFIG, or run in a pod with a service account');
      // The agents' ready endpoints (each node's serve), next to the --agent ones.
      const agents = () => [
        ...urls,
        ...(cluster && agentsService
          ? cluster.endpoints(agentsService.namespace, agentsService.name, agentsService.portName).filter((e) => e.ready && !e.terminating).map((e) => `${agentCa ? 'wss' : 'ws'}://${e.ip}:${e.port}${EVENTS_PATH}`)
          : []),
      ].map((url) => ({ url }));
      const relay = await Relay.start({
        agents: agents(),
        agentToken,
        agentCa,
        serve: { ...serverOptionsOf(opts), staticHandler: dashboardHandler() },
        onNodeChange: (n) => process.stderr.write(`svctrace: node ${n.node || '?'} (${n.url}): ${n.state}${n.error ? `: ${n.error}` : ''}\n`),
      });
      const resync = cluster ? setInterval(() => relay.setAgents(agents()), AGENTS_RESYNC_MS) : undefined;
      const url = relay.url();
      process.stderr.write(`svctrace: relaying ${relay.links.length} node server(s)${agentsService ? ` (and those of ${opts.agentsService} as they come)` : ''} at ${url} (dashboard: ${url.replace(/^ws/, 'http').replace(EVENTS_PATH, '/')}; Ctrl-C to stop)\n`);
      await waitForStop(duration);
      clearInterval(resync);
      await relay.stop();
      await cluster?.stop();
      // Node names come from the agents: shown as text, never as terminal controls.
      for (const n of relay.nodes()) process.stderr.write(terminalSafeLine(`  node ${n.node || '?'} (${n.url}): ${n.events} events, ${n.lost} lost, ${n.reconnects} reconnects, ${n.state}`) + '\n');
    });
}
