/**
 * The confusion matrix: every fault of the catalogue (src/lab/faults.ts),
 * injected into the lab in each kube-proxy mode, run through the three ways
 * a user asks svctrace what is wrong — `explain --probe`, `explain --watch`
 * with traffic, and `trace` with the same traffic — each of which must name
 * the fault's diagnosis with the right backend or rule, and no other
 * error-level diagnosis. The healthy lab must give none at all. The matrix
 * is printed at the end (the README shows it).
 *
 * SVT_FAULTS=id,id runs only those faults (the healthy row always runs);
 * SVT_FAULT_MODES=ipvs,... only those modes. IPVS mode runs where the
 * kernel has IPVS (the VM matrix); elsewhere it is skipped saying so,
 * unless SVT_REQUIRE_IPVS=1 makes that a failure.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { kernelTest, IS_ROOT, netfilterLinks, sleep } from '../helpers/kernel';
import { TIME_SCALE, waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { readKernelConfig } from '../../src/doctor/kernel-config';
import { Expected, Fault, FAULTS, FaultTool, HEALTHY, NOT_COVERED, targetOf } from '../../src/lab/faults';
import { explain } from '../../src/explain/explain';
import { ended } from '../helpers/child';

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');
const TOOLS: FaultTool[] = ['probe', 'watch', 'trace'];
/**
 * After the traffic, what it left is awaited this long (times TIME_SCALE)
 * before both tracers stop: an unanswered neighbour is given up 3 s after
 * the first packet, and every curl gives up after 2 s.
 */
const SETTLE_MS = 3000;
const ONLY = process.env.SVT_FAULTS?.split(',').filter(Boolean);
const MODES = (['iptables', 'nftables', 'ipvs'] as const).filter((m) => !process.env.SVT_FAULT_MODES || process.env.SVT_FAULT_MODES.split(',').includes(m));

interface Said {
  code: string;
  severity: string;
  object?: string;
}

interface Cell {
  ok: boolean;
  text: string;
}

/** What a tool said against what it should have: every expected diagnosis, and no other error. */
function judge(said: Said[], expected: Expected[]): Cell {
  const matches = (d: Said, e: Expected) => d.code === e.code && (!e.object || (d.object ?? '').includes(e.object));
  const missing = expected.filter((e) => !said.some((d) => matches(d, e)));
  const wrong = said.filter((d) => d.severity === 'error' && !expected.some((e) => matches(d, e)));
  const ok = !missing.length && !wrong.length;
  const right = expected.filter((e) => !missing.includes(e)).map((e) => e.code);
  const text = ok
    ? right.length ? right.join(', ') : 'no error'
    : [...missing.map((e) => `MISSING ${e.code}${e.object ? ` (${e.object})` : ''}`), ...wrong.map((d) => `WRONG ${d.code}${d.object ? ` (${d.object})` : ''}`)].join('; ');
  return { ok, text };
}

/**
 * The events of up to three traced flows that never showed a DNAT: what a
 * RULES_MISSING the trace should not have said was judged on.
 */
function undnatedFlows(out: string): string {
  const byFlow = new Map<string, Array<{ summary?: string; tsNs?: string }>>();
  const dnated = new Set<string>();
  for (const l of out.split('\n')) {
    if (!l.startsWith('{') || l.startsWith('{"diagnosis"')) continue;
    const e = JSON.parse(l) as { flowId?: string; summary?: string; tsNs?: string; backend?: string };
    if (!e.flowId) continue;
    if (e.backend) dnated.add(e.flowId);
    (byFlow.get(e.flowId) ?? byFlow.set(e.flowId, []).get(e.flowId)!).push(e);
  }
  const bad = [...byFlow].filter(([id]) => !dnated.has(id));
  return `${bad.length} of ${byFlow.size} traced flows never showed a backend` + bad.slice(0, 3).map(([id, evs]) => `\n  flow ${id}:${evs.map((e) => `\n    ${e.tsNs} ${e.summary}`).join('')}`).join('');
}

/**
 * The events of up to three traced flows to `backend` that never showed a
 * reply (no SEEN_REPLY, no reply packet counted): what a REPLY_PATH_BROKEN
 * or other per-backend diagnosis the trace should not have said was judged on.
 */
function unansweredFlows(out: string, backend: string): string {
  type Line = { flowId?: string; summary?: string; tsNs?: string; backend?: string; kind?: string; conntrack?: { statusNames?: string[] }; counters?: { packetsReply?: string } };
  const byFlow = new Map<string, Line[]>();
  const answered = new Set<string>();
  const mine = new Set<string>();
  for (const l of out.split('\n')) {
    if (!l.startsWith('{') || l.startsWith('{"diagnosis"')) continue;
    const e = JSON.parse(l) as Line;
    if (!e.flowId) continue;
    if (e.backend === backend) mine.add(e.flowId);
    if (JSON.stringify(e.conntrack?.statusNames ?? []).includes('SEEN_REPLY') || Number(e.counters?.packetsReply ?? 0) > 0) answered.add(e.flowId);
    (byFlow.get(e.flowId) ?? byFlow.set(e.flowId, []).get(e.flowId)!).push(e);
  }
  const bad = [...mine].filter((id) => !answered.has(id));
  return `${bad.length} of ${mine.size} traced flows to ${backend} never showed a reply` + bad.slice(0, 3).map((id) => `\n  flow ${id}:${byFlow.get(id)!.map((e) => `\n    ${e.tsNs} ${e.kind} ${e.summary} ${JSON.stringify({ backend: e.backend, conntrack: e.conntrack, counters: e.counters })}`).join('')}`).join('');
}

/**
 * `svctrace trace -o json` until `stop` (Ctrl-C, as a user ends it): the
 * diagnoses it printed ({"diagnosis": ...} lines), and its output. Not a
 * fixed --duration: under an emulated CPU, explain --watch took long enough
 * to attach that a trace started with a duration ended before the traffic
 * did (it saw 5 of 18 connections, too few to judge a distribution).
 */
function traceCli(netns: string, target: string): { started: Promise<boolean>; stop: () => Promise<Said[]>; kill: () => void; out: () => string; err: () => string } {
  const t = spawn(process.execPath, [CLI, 'trace', '--netns', netns, '--service', target, '-o', 'json'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  t.stdout!.on('data', (d) => (out += d));
  t.stderr!.on('data', (d) => (err += d));
  const started = waitFor(() => err.includes('Ctrl-C to stop') || t.exitCode !== null, 15_000);
  const done = new Promise<Said[]>((resolve, reject) => {
    void ended(t).then((code) => {
      if (code !== 0) reject(new Error(`trace exited ${code}: ${err}`));
      const lines = out.split('\n').filter((l) => l.startsWith('{"diagnosis"'));
      resolve(lines.map((l) => (JSON.parse(l) as { diagnosis: Said }).diagnosis));
    });
  });
  const stop = () => {
    if (t.exitCode === null && t.signalCode === null) t.kill('SIGINT');
    return done;
  };
  // After a failure: a trace still running is ended, and its end is no second failure.
  const kill = () => {
    done.catch(() => undefined);
    if (t.exitCode === null && t.signalCode === null) t.kill('SIGKILL');
  };
  return { started, stop, kill, out: () => out, err: () => err };
}

const matrix: Array<{ mode: string; fault: Fault; cells: Record<FaultTool, Cell> }> = [];

after(() => {
  if (!matrix.length) return;
  const w = Math.max(...matrix.map((r) => r.fault.id.length)) + 2;
  const cellW = 40;
  const lines = [
    'Diagnoses per fault (✓ right, ✗ missing or wrong), explain --probe | explain --watch | trace:',
    `${'mode'.padEnd(10)}${'fault'.padEnd(w)}${TOOLS.map((t) => t.padEnd(cellW)).join('')}`,
    ...matrix.map((r) => `${r.mode.padEnd(10)}${r.fault.id.padEnd(w)}${TOOLS.map((t) => `${r.cells[t].ok ? '✓' : '✗'} ${r.cells[t].text}`.slice(0, cellW - 1).padEnd(cellW)).join('')}`),
    'Not injected:',
    ...NOT_COVERED.map((n) => `  ${n.fault}: ${n.why}`),
  ];
  console.log(lines.join('\n'));
});

for (const mode of MODES) {
  describe(`fault catalogue, kube-proxy ${mode} mode: explain --probe, explain --watch and trace name each fault (kernel)`, () => {
    let lab: Lab;
    let unavailable = '';
    before(async () => {
      if (!IS_ROOT) return;
      try {
        lab = await Lab.up({ proxyMode: mode, remoteNode: true });
      } catch (e) {
        // IPVS mode is skipped only where the kernel's config says IPVS is not built.
        const ipvs = readKernelConfig()?.get('CONFIG_IP_VS');
        if (mode !== 'ipvs' || ipvs === 'y' || ipvs === 'm' || process.env.SVT_REQUIRE_IPVS === '1') throw e;
        unavailable = (e as Error).message;
      }
    });
    after(async () => {
      await lab?.down();
    });

    // SVT_FAULT_REPEAT=n runs each chosen fault n times (a flaky one, in one lab).
    const chosen = FAULTS.filter((f) => f.modes.includes(mode) && (!ONLY || ONLY.includes(f.id)));
    const faults = [HEALTHY, ...Array.from({ length: Math.max(1, Number(process.env.SVT_FAULT_REPEAT) || 1) }, () => chosen).flat()];
    for (const fault of faults) {
      kernelTest(`${fault.id}: ${fault.symptom}`, async (t) => {
        if (unavailable) {
          t.skip(unavailable);
          return;
        }
        const target = targetOf(fault, mode);
        const vars = await fault.inject(lab);
        const expected = fault.expect(vars, mode);
        const said: Partial<Record<FaultTool, Said[]>> = {};
        let observed = '';
        let probedBackends = '';
        let trace: ReturnType<typeof traceCli> | undefined;
        try {
          const probed = await explain({ target, netns: lab.nodeNetns, probe: true });
          said.probe = probed.flatMap((e) => e.diagnoses);
          // What the probe found per backend goes with any failure (its outcome, the neighbour, who holds the address).
          probedBackends = JSON.stringify(probed.map((e) => ({ target: e.target, backends: e.backends.map((b) => ({ at: `${b.ip}:${b.port}`, probe: b.probe, neighbour: b.neighbour.state, holder: b.holder, route: b.route.ok ? 'ok' : b.route.error })) })));
          // The node's neighbours in every state (ip's default view hides NOARP
          // and NONE entries) and the pods' link flags, as the probe left them.
          probedBackends += `\nnode neighbours after the probe: ${(await runIn(lab.nodeNetns, ['ip', '-s', 'neigh', 'show', 'nud', 'all'], { allowFail: true })).stdout.trim().replace(/\n/g, ' | ')}`;
          for (const pod of lab.pods) probedBackends += `\n${pod.name}: ${(await runIn(pod.netns, ['ip', '-o', 'link', 'show', 'eth0'], { allowFail: true })).stdout.trim()}`;
          const linksBefore = netfilterLinks().length;
          trace = traceCli(lab.nodeNetns, target);
          assert.ok(await trace.started, 'trace started');
          // The watch ends once the traffic is over and what it left has settled (a
          // neighbour given up, a reply's retransmissions: about 3 s), or at its window.
          const trafficOver = new AbortController();
          const watch = explain({ target, netns: lab.nodeNetns, watchSeconds: 8 * TIME_SCALE, watchUntil: trafficOver.signal });
          // Both tracers attached (eight netfilter links each; explain watches nothing when the rules lack the Service).
          const watching = fault.id !== 'rules-missing';
          assert.ok(await waitFor(() => netfilterLinks().length >= linksBefore + (watching ? 16 : 8), 15_000), 'the tracers attached before the traffic');
          await fault.traffic(lab);
          await sleep(SETTLE_MS * TIME_SCALE);
          trafficOver.abort();
          const watched = await watch;
          if (watching) assert.ok((watched[0]?.observed?.flows ?? 0) > 0, 'explain --watch saw the traffic');
          said.watch = watched.flatMap((e) => e.diagnoses);
          observed = JSON.stringify(watched[0]?.observed?.backends.map((b) => ({ ...b, clients: b.clients.size, droppedBy: [...(b.droppedBy ?? [])], icmpBy: [...(b.icmpBy ?? [])] })));
          // The watch's window (after the traffic) has passed: the trace has seen what it will.
          said.trace = await trace.stop();
          if (said.trace.some((d) => d.code === 'RULES_MISSING') && !expected.trace.some((e) => e.code === 'RULES_MISSING')) observed += `\ntrace: ${undnatedFlows(trace.out())}`;
          for (const d of said.trace) {
            const backend = /^backend (\S+)$/.exec(d.object ?? '')?.[1];
            if (backend && d.severity === 'error' && !expected.trace.some((e) => e.code === d.code && (!e.object || (d.object ?? '').includes(e.object)))) observed += `\ntrace, ${d.code}: ${unansweredFlows(trace.out(), backend)}`;
          }
          // Its warnings and summary (losses per stage, the ring's lag) go with any failure.
          observed += `\ntrace's stderr (end): ${trace.err().slice(-1500)}`;
        } finally {
          trace?.kill();
          await fault.remove(lab);
          await lab.flushNodeState();
        }
        const cells = Object.fromEntries(TOOLS.map((t) => [t, judge(said[t] ?? [], expected[t])])) as Record<FaultTool, Cell>;
        matrix.push({ mode, fault, cells });
        const bad = TOOLS.filter((t) => !cells[t].ok);
        assert.deepEqual(
          bad.map((t) => `${t}: ${cells[t].text}`),
          [],
          `${fault.id} (${mode}): what each tool said: ${JSON.stringify(said, (k, v) => (k === 'evidence' ? undefined : v))}; explain --probe found: ${probedBackends}; explain --watch observed: ${observed}`,
        );
      }, { timeout: 180_000 });
    }
  });
}
