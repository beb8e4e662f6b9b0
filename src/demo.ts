/**
 * The demo: svctrace's main job on the built-in lab. Stands up a simulated
 * node in network namespaces, traces its Services, sends traffic the way a
 * user would (curl to the ClusterIP from the node, curl to the NodePort from
 * a client, a DNS-like UDP query, a Service without endpoints), prints each
 * flow's timeline and a summary, and tears everything down.
 */
import { SvctraceError } from './errors';
import { Lab } from './lab/lab';
import { runIn } from './lab/exec';
import { parseNodePortSpec, parseServiceSpec } from './net/ipv4';
import { diagnosisLine, formatSummary } from './output/flow-text';
import { Pipeline } from './pipeline/pipeline';
import { waitForStop } from './pipeline/lifecycle';
import { textTimelineSink } from './pipeline/sinks/text';
import { liveDiagnoserSink } from './pipeline/sinks/diagnoser';

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export async function runDemo(opts: { requests: number; out?: NodeJS.WritableStream; color?: boolean }): Promise<void> {
  const out = opts.out ?? process.stdout;
  const say = (s: string): void => void out.write(s + '\n');
  if (!Number.isInteger(opts.requests) || opts.requests < 1 || opts.requests > 1000) {
    throw new SvctraceError('BAD_INPUT', '--requests must be 1..1000');
  }
  // Ctrl-C (kill, a closed terminal) ends the demo at its next step and
  // tears the lab down: the signal's default action left every namespace
  // of it behind. Signals while the lab is built are held by this too.
  const demoDone = new AbortController();
  let interrupted = false;
  void waitForStop(undefined, demoDone.signal).then((why) => {
    if (why !== 'signal') return;
    interrupted = true;
    say('interrupted: stopping after this step, then tearing the lab down');
  });
  say('svctrace demo: building the lab (network namespaces only)...');
  let lab: Lab;
  try {
    lab = await Lab.up({ remoteNode: true });
  } catch (e) {
    demoDone.abort();
    // A terminal's Ctrl-C reaches the lab's own processes too (its pod servers): the build failing then is the interrupt's doing.
    if (interrupted) return say('lab torn down (its build was interrupted)');
    throw e;
  }
  let pipeline: Pipeline | undefined;
  try {
    if (interrupted) return;
    const web = lab.service('web');
    const dns = lab.service('kube-dns');
    const empty = lab.service('empty');
    const remote = lab.service('remote');
    say(`  node ${lab.nodeNetns}; pods ${lab.pods.map((p) => `${p.name}=${p.ip}`).join(' ')}`);
    say(`  default/web ${web.clusterIP}:${web.port} (NodePort ${web.nodePort}), kube-system/kube-dns ${dns.clusterIP}:53/udp, default/empty ${empty.clusterIP}:80 (no endpoints), default/remote ${remote.clusterIP}:80 (pod on a second node)\n`);
    const color = opts.color ?? (!!(out as NodeJS.WriteStream).isTTY && !process.env.NO_COLOR);
    pipeline = await Pipeline.start(
      {
        services: [
          parseServiceSpec(`${web.clusterIP}:${web.port}`),
          parseNodePortSpec(String(web.nodePort)),
          parseServiceSpec(`${dns.clusterIP}:${dns.port}/udp`),
          parseServiceSpec(`${empty.clusterIP}:${empty.port}`),
          parseServiceSpec(`${remote.clusterIP}:${remote.port}`),
        ],
        netns: [lab.nodeNetns],
        kubeconfig: false, // the lab has no API server
      },
      (ctx) => [
        textTimelineSink((s) => out.write(s), { color, backendName: ctx.backendName, flows: ctx.flows, rulePathsObserved: ctx.rulePathsObserved }),
        // The classic failures, as `trace` finds them: here the Service without endpoints.
        liveDiagnoserSink(ctx.services, ctx.discovery, ctx.netns[0]!, (ds) => out.write(ds.map((d) => `${diagnosisLine(d)}\n`).join('')), { deliveredThrough: () => ctx.deliveredThrough() }),
      ],
    );

    for (let i = 0; i < opts.requests; i++) {
      if (interrupted) return;
      const r = await lab.curl(`http://${web.clusterIP}:${web.port}/`);
      say(`$ curl ${web.clusterIP}:${web.port}  (from the node) -> ${r.ok ? r.body.trim() : `failed: ${r.stderr.trim()}`}`);
      await sleep(50);
    }
    if (interrupted) return;
    const np = await lab.curl(`http://${lab.nodeIPForClient()}:${web.nodePort}/`, 'client');
    say(`$ curl ${lab.nodeIPForClient()}:${web.nodePort}  (NodePort, from the client) -> ${np.ok ? np.body.trim() : `failed: ${np.stderr.trim()}`}`);
    await sleep(50);
    if (interrupted) return;
    const rr = await lab.curl(`http://${remote.clusterIP}:${remote.port}/`);
    say(`$ curl ${remote.clusterIP}  (backend on the second node, over VXLAN) -> ${rr.ok ? rr.body.trim() : `failed: ${rr.stderr.trim()}`}`);
    await sleep(50);
    if (interrupted) return;
    const udp = await runIn(lab.nodeNetns, [process.execPath, '-e', UDP_QUERY, dns.clusterIP, String(dns.port)], { allowFail: true });
    say(`$ udp query ${dns.clusterIP}:53 -> ${udp.stdout.trim() || udp.stderr.trim()}`);
    await sleep(50);
    if (interrupted) return;
    const e = await lab.curl(`http://${empty.clusterIP}:${empty.port}/`);
    say(`$ curl ${empty.clusterIP}  (no endpoints) -> ${e.ok ? e.body.trim() : `failed: ${e.stderr.trim()}`}`);
    // Conntrack reaps expired entries lazily; the lab asks it to now so the
    // flows' ends (DESTROY) show up before the demo exits.
    await sleep(2500);
    await lab.reapConntrack();
    await sleep(300);
    if (interrupted) return;
    const { summary, stats, losses } = await pipeline.stop();
    say('');
    say(formatSummary(summary, stats, pipeline.backendName, losses));
    say(`  pods' own logs: ${lab.pods.map((p) => `${p.name}=${lab.served.filter((s) => s.pod === p.name).length}`).join(' ')}`);
  } finally {
    try {
      try {
        await pipeline?.stop();
      } finally {
        await lab.down();
        say(`lab torn down (${lab.leftovers().length} namespaces left)`);
      }
    } finally {
      demoDone.abort();
    }
  }
}

/** A one-shot UDP request/response, run inside a lab namespace. */
export const UDP_QUERY = `
const s = require('node:dgram').createSocket('udp4');
const [addr, port] = process.argv.slice(1);
const t = setTimeout(() => { console.log('timeout'); process.exit(1); }, 2000);
s.on('message', (m) => { console.log(String(m).trim()); clearTimeout(t); s.close(); });
s.send('query', Number(port), addr);
`;
