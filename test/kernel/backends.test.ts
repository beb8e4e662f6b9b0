/**
 * The attach backends are ways into one tracer: on a kernel that offers
 * several (Debian's 6.12 in the VM matrix offers all three), pipelines with
 * each backend traced side by side over the same traffic report the same
 * flows — tuples (the reply tuple shows SNAT), backends, and counters, to
 * the packet and byte.
 *
 * Where the kernel offers only one backend (this project's 6.18 host has no
 * trampolines nor kprobes) it skips saying so, unless SVT_REQUIRE_BACKENDS
 * names the backends the kernel row must compare (the matrix sets
 * "netfilter fentry kprobe" on 6.12, "fentry kprobe" on 6.1), where a
 * missing one is a failure.
 *
 * On a kernel that counts the kprobe runs it skips (>= 6.7), the kprobe
 * backend is made to lose some, and svctrace must say how many, as the
 * kernel does.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import { kernelPrograms, kernelTest, IS_ROOT, sleep } from '../helpers/kernel';
import { FlowLog, TIME_SCALE } from '../helpers/flows';
import { reapUntil } from '../helpers/lab-traffic';
import { Lab, POD_HTTP_PORT } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { Pipeline } from '../../src/pipeline/pipeline';
import { parseServiceSpec } from '../../src/net/ipv4';
import { loadBinding } from '../../src/native/binding';
import { BACKEND_PROBE, BACKENDS, type Backend } from '../../src/tracer/backend';
import type { Flow } from '../../src/flows/types';
import { ended } from '../helpers/child';

/** test/helpers/hold-bpf-guard.c, built beside the addon. */
const HOLD_BPF_GUARD = path.resolve(__dirname, '..', '..', '..', 'build', 'svctrace-hold-bpf-guard');

describe('attach backends agree (kernel)', () => {
  let lab: Lab;

  before(async () => {
    if (!IS_ROOT) return;
    lab = await Lab.up({ pods: 3 });
    await runIn(lab.nodeNetns, ['sysctl', '-qw', 'net.netfilter.nf_conntrack_acct=1']);
  });

  after(async () => {
    await lab?.down();
  });

  async function trace(backend: Backend): Promise<{ p: Pipeline; log: FlowLog }> {
    const log = new FlowLog();
    const web = lab.service('web');
    const p = await Pipeline.start(
      {
        services: [parseServiceSpec(`${web.clusterIP}:80`)],
        netns: [lab.nodeNetns],
        kubeconfig: false,
        ruleTrace: false,
        closeGraceMs: 3_600_000,
        attachBackend: backend,
      },
      () => [{ name: 'test', write: log.add }],
    );
    assert.equal(p.attachBackend.backend, backend);
    return { p, log };
  }

  /** What both backends must agree on, per flow. */
  const view = (f: Flow) =>
    JSON.stringify({
      orig: f.orig,
      reply: f.reply,
      backend: f.backend,
      packets: f.packets,
      bytes: f.bytes,
      final: f.countersFinal,
    });

  kernelTest('every backend the kernel offers reports the same flows: tuples, backends and exact counters', async (t) => {
    const f = loadBinding().probeFeatures();
    const offered = BACKENDS.filter((b) => f[BACKEND_PROBE[b]].ok);
    const offers = BACKENDS.map((b) => `${b}: ${f[BACKEND_PROBE[b]].ok ? 'ok' : f[BACKEND_PROBE[b]].message}`).join('; ');
    const required = (process.env.SVT_REQUIRE_BACKENDS ?? '').split(/\s+/).filter(Boolean);
    for (const b of required) assert.ok(offered.includes(b as Backend), `SVT_REQUIRE_BACKENDS has ${b}, which this kernel does not offer (${offers})`);
    if (offered.length < 2) {
      t.skip(`this kernel offers ${offered.length ? `only ${offered[0]}` : 'no backend'} (${offers})`);
      return;
    }
    const web = lab.service('web');
    const runs: Array<{ backend: Backend; p: Pipeline; log: FlowLog }> = [];
    try {
      for (const b of offered) runs.push({ backend: b, ...(await trace(b)) });
      // Short connections from the node itself (LOCAL_OUT), and a keep-alive
      // one. Limits scaled: this runs where a kernel offers two backends or
      // more (the emulated guests), two or three pipelines in one process.
      for (let i = 0; i < 6; i++) assert.ok((await lab.curl(`http://${web.clusterIP}/c${i}`, 'node', [], 5 * TIME_SCALE)).ok);
      for (let i = 0; i < 3; i++) await runIn(lab.nodeNetns, ['curl', '-s', '-o', '/dev/null', '--max-time', String(5 * TIME_SCALE), `http://${web.clusterIP}/n${i}`], { timeoutMs: 15_000 * TIME_SCALE });
      await runIn(lab.nodeNetns, ['curl', '-s', '-o', '/dev/null', '--max-time', String(20 * TIME_SCALE), `http://${web.clusterIP}/k[1-40]`], { timeoutMs: 30_000 * TIME_SCALE });
      await sleep(2500); // TIME_WAIT is 2 s in the lab
      const tcpFlows = (log: FlowLog) => [...log.flows.values()].filter((x) => x.orig.proto === 6);
      const ended = (log: FlowLog) => tcpFlows(log).length >= 10 && tcpFlows(log).every((x) => x.countersFinal);
      const state = (log: FlowLog) => tcpFlows(log).map((x) => `${x.orig.sport}${x.countersFinal ? '' : ' (open)'} ${x.packets}`).join(', ');
      assert.ok(
        await reapUntil(lab, () => runs.every((r) => ended(r.log)), 15_000),
        `every connection ended, seen by every backend: ${runs.map((r) => `${r.backend} [${state(r.log)}]`).join('; ')}`,
      );
      const key = (x: Flow) => `${x.orig.saddr}:${x.orig.sport}`;
      const byKey = (log: FlowLog) => new Map(tcpFlows(log).map((x) => [key(x), view(x)]));
      const [first, ...others] = runs.map((r) => ({ backend: r.backend, flows: byKey(r.log) }));
      assert.equal(first!.flows.size, 10);
      for (const o of others) {
        assert.deepEqual([...o.flows.keys()].sort(), [...first!.flows.keys()].sort(), `the same connections: ${first!.backend} vs ${o.backend}`);
        for (const [k, v] of first!.flows) assert.equal(o.flows.get(k), v, `connection ${k}: ${first!.backend} vs ${o.backend}`);
      }
      for (const r of runs) assert.equal(r.p.attachBackend.backend, r.backend);
    } finally {
      for (const r of runs) await r.p.stop();
    }
  });

  kernelTest("kprobe runs the kernel skipped while the CPU held BPF's guard are counted, as bpftool shows (Linux >= 6.7)", async (t) => {
    const f = loadBinding().probeFeatures();
    const required = (process.env.SVT_REQUIRE_BACKENDS ?? '').split(/\s+/).includes('kprobe');
    if (!f[BACKEND_PROBE.kprobe].ok) {
      assert.ok(!required, `SVT_REQUIRE_BACKENDS has kprobe, which this kernel does not offer: ${f[BACKEND_PROBE.kprobe].message}`);
      t.skip(`this kernel offers no kprobe backend: ${f[BACKEND_PROBE.kprobe].message}`);
      return;
    }
    const [major, minor] = os.release().split('.').map(Number) as [number, number];
    if (major < 6 || (major === 6 && minor < 7)) {
      t.skip(`Linux ${os.release()} does not count the kprobe runs it skips (6.7 does): the destroy's correction (hooks_missed_packets) is all there is`);
      return;
    }
    const web = lab.service('web');
    const { p } = await trace('kprobe');
    // One helper per CPU spends the run inside a BPF syscall that holds the
    // CPU's BPF guard: a NAT hook function reached from an interrupt's end
    // there has its kprobe program skipped. A TCP timer's segment is one: the
    // pods drop every other SYN, and the client resends it from its
    // retransmission timer, whose softirq runs at the end of the timer
    // interrupt, inside the helper's syscall on that CPU.
    const dropEveryOtherSyn = ['INPUT', '-p', 'tcp', '--syn', '--dport', String(POD_HTTP_PORT), '-m', 'statistic', '--mode', 'nth', '--every', '2', '--packet', '0', '-j', 'DROP'];
    for (const pod of lab.pods) await runIn(pod.netns, ['iptables', '-I', ...dropEveryOtherSyn]);
    const seconds = 8;
    const holders = os.cpus().map((_, cpu) => spawn(HOLD_BPF_GUARD, [String(seconds + 2), String(cpu)], { stdio: ['ignore', 'pipe', 'pipe'] }));
    const held = holders.map(
      (h) =>
        new Promise<string>((resolve) => {
          let out = '';
          h.stdout!.on('data', (d) => (out += d));
          h.stderr!.on('data', (d) => (out += d));
          h.on('error', (e) => resolve(String(e)));
          void ended(h).then((code) => resolve(`${out.trim()} (exit ${code})`));
        }),
    );
    try {
      const before = p.stats().hookRunsSkipped;
      const w = await runIn(lab.clientNetns, ['wrk', '-t1', '-c8', `-d${seconds}s`, '-H', 'Connection: close', `http://${web.clusterIP}/`], { timeoutMs: (seconds + 60) * 1000 * TIME_SCALE });
      const results = await Promise.all(held);
      for (const r of results) assert.match(r, /^\d+ \(exit 0\)$/, `the guard holder ran: ${r}`);
      const mine = p.programs();
      const skipped = p.stats().hookRunsSkipped;
      const kernel = new Map([...kernelPrograms()].map(([id, x]) => [id, x.recursion_misses ?? 0]));
      const why = `${skipped - before} runs skipped over ${/(\d+) requests in/.exec(w.stdout)?.[1] ?? '?'} requests, guard held by ${results.join(', ')} batch lookups; ${mine.map((x) => `${x.name}=${x.runsSkipped} (bpftool ${kernel.get(x.id)})`).join(' ')}`;
      t.diagnostic(why);
      assert.ok(skipped > before, `the kernel skipped svctrace's kprobe programs and svctrace says so: ${why}`);
      assert.ok(mine.some((x) => x.name.startsWith('svt_kprobe_') && x.runsSkipped > 0), why);
      assert.equal(skipped, mine.reduce((n, x) => n + x.runsSkipped, 0), why);
      // Read after ours: svctrace's own syscalls may have made the kernel skip one more since.
      for (const x of mine) assert.ok((kernel.get(x.id) ?? -1) >= x.runsSkipped, `bpftool's count is svctrace's: ${why}`);
      assert.equal(p.losses().hook_runs_skipped, skipped, 'a loss stage of its own');
    } finally {
      for (const h of holders) if (h.exitCode === null) h.kill('SIGKILL');
      for (const pod of lab.pods) await runIn(pod.netns, ['iptables', '-D', ...dropEveryOtherSyn], { allowFail: true });
      await p.stop();
    }
  });
});
