/**
 * The two attach backends are two ways into one tracer: on a kernel that
 * offers both (Linux >= 6.4 with module BTF, such as Debian's 6.12 in the VM
 * matrix), a netfilter-backend pipeline and a fentry-backend pipeline traced
 * side by side over the same traffic report the same flows — tuples (the
 * reply tuple shows SNAT), backends, and counters, to the packet and byte.
 *
 * Where the kernel offers only one backend (this project's 6.18 host has no
 * trampolines; 6.1 has no netfilter links) it skips saying so, unless
 * SVT_REQUIRE_BACKENDS=both (set by the matrix rows of kernels that offer
 * both), where that is a failure.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { kernelTest, IS_ROOT, sleep } from '../helpers/kernel';
import { FlowLog, waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { Pipeline } from '../../src/pipeline/pipeline';
import { parseServiceSpec } from '../../src/net/ipv4';
import { loadBinding } from '../../src/native/binding';
import type { Backend } from '../../src/tracer/backend';
import type { Flow } from '../../src/flows/types';

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

  kernelTest('netfilter and fentry report the same flows: tuples, backends and exact counters', async (t) => {
    const f = loadBinding().probeFeatures();
    if (!f.netfilterLink.ok || !f.natFentry.ok) {
      const why = `this kernel offers ${f.netfilterLink.ok ? 'netfilter links only' : f.natFentry.ok ? 'fentry only' : 'neither backend'} (netfilter: ${f.netfilterLink.message ?? 'ok'}; fentry: ${f.natFentry.message ?? 'ok'})`;
      if (process.env.SVT_REQUIRE_BACKENDS === 'both') assert.fail(`SVT_REQUIRE_BACKENDS=both, but ${why}`);
      t.skip(why);
      return;
    }
    const web = lab.service('web');
    const a = await trace('netfilter');
    const b = await trace('fentry');
    try {
      // Short connections from the client namespace (forwarded: PRE_ROUTING)
      // and from the node itself (LOCAL_OUT), and a keep-alive one.
      for (let i = 0; i < 6; i++) assert.ok((await lab.curl(`http://${web.clusterIP}/c${i}`)).ok);
      for (let i = 0; i < 3; i++) await runIn(lab.nodeNetns, ['curl', '-s', '-o', '/dev/null', '--max-time', '5', `http://${web.clusterIP}/n${i}`]);
      await runIn(lab.nodeNetns, ['curl', '-s', '-o', '/dev/null', '--max-time', '20', `http://${web.clusterIP}/k[1-40]`], { timeoutMs: 30_000 });
      await sleep(2500); // TIME_WAIT is 2 s in the lab
      await lab.reapConntrack();
      const tcpFlows = (log: FlowLog) => [...log.flows.values()].filter((x) => x.orig.proto === 6);
      const ended = (log: FlowLog) => tcpFlows(log).length >= 10 && tcpFlows(log).every((x) => x.countersFinal);
      const state = (log: FlowLog) => tcpFlows(log).map((x) => `${x.orig.sport}${x.countersFinal ? '' : ' (open)'} ${x.packets}`).join(', ');
      assert.ok(await waitFor(() => ended(a.log) && ended(b.log), 15_000), `every connection ended, seen by both: netfilter [${state(a.log)}]; fentry [${state(b.log)}]`);
      const key = (x: Flow) => `${x.orig.saddr}:${x.orig.sport}`;
      const byKey = (log: FlowLog) => new Map(tcpFlows(log).map((x) => [key(x), view(x)]));
      const na = byKey(a.log);
      const nb = byKey(b.log);
      assert.deepEqual([...nb.keys()].sort(), [...na.keys()].sort(), 'the same connections');
      for (const [k, v] of na) assert.equal(nb.get(k), v, `connection ${k}: netfilter vs fentry`);
      assert.equal(na.size, 10);
    } finally {
      await a.p.stop();
      await b.p.stop();
    }
  });
});
