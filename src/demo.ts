/**
 * The demo: svctrace's main job on the built-in lab. Stands up a simulated
 * node in network namespaces, traces its web Service, curls it from the node
 * and through the NodePort from a client namespace, prints what the kernel
 * did, and tears everything down.
 */
import { SvctraceError } from './errors';
import { KernelEvent } from './events/decode';
import { Lab } from './lab/lab';
import { parseNodePortSpec, parseServiceSpec } from './net/ipv4';
import { formatEventText } from './output/event-text';
import { TraceSession } from './tracer/session';

export async function runDemo(opts: { requests: number; out?: NodeJS.WritableStream }): Promise<void> {
  const out = opts.out ?? process.stdout;
  if (!Number.isInteger(opts.requests) || opts.requests < 1 || opts.requests > 1000) {
    throw new SvctraceError('BAD_INPUT', '--requests must be 1..1000');
  }
  out.write('svctrace demo: building the lab (network namespaces only)...\n');
  const lab = await Lab.up();
  let session: TraceSession | undefined;
  try {
    const web = lab.service('web');
    out.write(`  node netns ${lab.nodeNetns}, ${lab.pods.length} pods: ${lab.pods.map((p) => `${p.name}=${p.ip}`).join(' ')}\n`);
    out.write(`  service default/web ClusterIP ${web.clusterIP}:${web.port}, NodePort ${web.nodePort}\n`);
    const events: KernelEvent[] = [];
    session = TraceSession.start({
      services: [parseServiceSpec(`${web.clusterIP}:${web.port}`), parseNodePortSpec(String(web.nodePort))],
      netns: [lab.nodeNetns],
      onEvents: (b) => events.push(...b),
    });
    for (let i = 0; i < opts.requests; i++) {
      const r = await lab.curl(`http://${web.clusterIP}:${web.port}/`);
      out.write(`  curl ${web.clusterIP}:${web.port} from the node -> ${r.ok ? r.body.trim() : `failed: ${r.stderr.trim()}`}\n`);
    }
    const np = await lab.curl(`http://${lab.nodeIPForClient()}:${web.nodePort}/`, 'client');
    out.write(`  curl NodePort from the client -> ${np.ok ? np.body.trim() : `failed: ${np.stderr.trim()}`}\n`);
    const stats = await session.stop();
    const t0 = events[0]?.tsNs ?? 0n;
    out.write(`\nwhat the kernel did (${events.length} events):\n`);
    for (const e of events) out.write(formatEventText(e, t0) + '\n');
    out.write(`\n${stats.recordsRead} events in ${stats.batchCallbacks} batches, ${stats.ringbufLost} lost\n`);
  } finally {
    session?.tracer.close();
    await lab.down();
    out.write(`lab torn down (${lab.leftovers().length} namespaces left)\n`);
  }
}
