/**
 * kube-proxy's IPVS mode, traced: the lab renders it as kube-proxy does
 * (kube-ipvs0, IPVS virtual servers with real servers in masquerade mode,
 * ipsets, mark-only nat rules, net.ipv4.vs.conntrack=1), and every
 * connection to the VIP — from a client namespace, from the node itself,
 * and to the NodePort — must show, in one flow, the real server IPVS chose
 * (DNAT by IPVS), the masquerade, and the reply rewritten back to the VIP;
 * with packet and byte counters equal to conntrack's own accounting, and
 * the real servers' shares equal to what IPVS itself counted (rr). explain
 * reads the same virtual service: each real server's share as the
 * scheduler and weights give it (weight 0: kube-proxy's graceful
 * termination), persistence as session affinity, and --watch agreeing.
 *
 * IPVS is not built into this project's host kernels: there (the kernel's
 * config says CONFIG_IP_VS is not set) the test skips saying so, unless
 * SVT_REQUIRE_IPVS=1 (the VM matrix, whose Debian kernels have it), where
 * that is a failure.
 */
import { after, before, describe, TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { kernelTest, IS_ROOT, netfilterLinks, sleep } from '../helpers/kernel';
import { FlowLog, TIME_SCALE, waitFor } from '../helpers/flows';
import { reapUntil } from '../helpers/lab-traffic';
import { conntrackDestroys } from '../helpers/conntrack-events';
import type { Flow } from '../../src/flows/types';
import { explain } from '../../src/explain/explain';
import { Lab } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { Pipeline } from '../../src/pipeline/pipeline';
import { parseNodePortSpec, parseServiceSpec } from '../../src/net/ipv4';
import { svctrace } from '../../src/gen/svctrace';
import { readKernelConfig } from '../../src/doctor/kernel-config';

import S = svctrace.v1.Stage;

describe('kube-proxy IPVS mode (kernel)', () => {
  let lab: Lab | undefined;
  let unavailable = '';

  before(async () => {
    if (!IS_ROOT) return;
    try {
      lab = await Lab.up({ pods: 2, proxyMode: 'ipvs' });
    } catch (e) {
      unavailable = (e as Error).message;
      // A skip only where the kernel's own config says IPVS is not built:
      // anything else failing the lab is a failure.
      const ipvs = readKernelConfig()?.get('CONFIG_IP_VS');
      if (!/IPVS/.test(unavailable) || ipvs === 'y' || ipvs === 'm') throw e;
    }
    if (lab) await runIn(lab.nodeNetns, ['sysctl', '-qw', 'net.netfilter.nf_conntrack_acct=1']);
  });

  after(async () => {
    await lab?.down();
  });

  /** The IPVS lab, or undefined after skipping (no IPVS here) or failing (SVT_REQUIRE_IPVS=1). */
  function ipvsLab(t: TestContext): Lab | undefined {
    if (lab) return lab;
    if (process.env.SVT_REQUIRE_IPVS === '1') assert.fail(`SVT_REQUIRE_IPVS=1, but ${unavailable}`);
    t.skip(unavailable);
    return undefined;
  }

  kernelTest('every connection to the VIP: the real server, the masquerade and the reply in one flow; exact counters; rr shares as IPVS counts them', async (t) => {
    const up = ipvsLab(t);
    if (!up) return;
    const L: Lab = up;
    const web = L.service('web');
    // The kernel's own account of each entry, read apart from svctrace.
    const ct = await conntrackDestroys(L.nodeNetns);
    const log = new FlowLog();
    const p = await Pipeline.start(
      {
        services: [parseServiceSpec(`${web.clusterIP}:80`), parseNodePortSpec(String(web.nodePort))],
        netns: [L.nodeNetns],
        kubeconfig: false,
        ruleTrace: false,
        closeGraceMs: 3_600_000,
      },
      () => [{ name: 'test', write: log.add }],
    );
    try {
      const N = 8;
      for (let i = 0; i < N; i++) assert.ok((await L.curl(`http://${web.clusterIP}/c${i}`, 'client')).ok, 'client -> VIP');
      for (let i = 0; i < 4; i++) assert.ok((await L.curl(`http://${web.clusterIP}/n${i}`, 'node')).ok, 'node -> VIP');
      for (let i = 0; i < 2; i++) assert.ok((await L.curl(`http://10.250.0.1:${web.nodePort}/p${i}`, 'client')).ok, 'client -> NodePort');
      await sleep(2500); // TIME_WAIT is 2 s in the lab
      const total = N + 4 + 2;
      const flows = () => [...log.flows.values()].filter((f) => f.orig.proto === 6);
      // A connection's end (TIME_WAIT) gives svctrace its final counters;
      // conntrack's DESTROY, which this test compares them with, comes once
      // the entry is reaped after the lab's 2 s TIME_WAIT: wait for both.
      const destroyLine = (f: Flow) => ct.text().split('\n').find((l) => l.includes(`sport=${f.orig.sport} `) && l.includes(`dst=${f.orig.daddr} `));
      const ended = () => flows().length >= total && flows().every((f) => f.countersFinal && destroyLine(f) !== undefined);
      assert.ok(
        await reapUntil(L, ended, 15_000),
        `every connection ended and conntrack destroyed it: ${flows().length} flows, ${flows().filter((f) => !f.countersFinal).length} without final counters, ${flows().filter((f) => !destroyLine(f)).length} without a DESTROY`,
      );
      assert.equal(flows().length, total, 'one flow per connection');
      assert.equal(L.served.length, total);

      for (const served of L.served) {
        // The pod saw the masqueraded address: the entry's reply destination.
        const f = flows().find((x) => `${x.reply.daddr}:${x.reply.dport}` === served.client);
        const what = `request ${served.path} (pod saw ${served.client})`;
        assert.ok(f, `${what}: no flow`);
        const pod = L.pods.find((x) => x.name === served.pod)!;
        assert.equal(f.backend, `${pod.ip}:8080`, `${what}: the real server IPVS chose`);
        assert.ok(f.dnat && f.masqueraded, `${what}: DNAT (IPVS) and masquerade`);
        const evs = log.eventsOf(f);
        assert.ok(evs.some((e) => e.stage === S.STAGE_DNAT && e.conntrack?.reply?.src === pod.ip), `${what}: a DNAT stage naming the real server`);
        const vip = f.orig.daddr;
        assert.ok(evs.some((e) => e.stage === S.STAGE_REPLY && e.packet?.src === vip), `${what}: the reply rewritten back to ${vip}`);
        assert.ok(evs.some((e) => e.stage === S.STAGE_DEVICE && e.device?.netns === pod.netns), `${what}: the crossing into ${pod.netns}`);
        // Counted once per packet, not again when IPVS sends it out.
        const k = destroyLine(f);
        assert.ok(k, `${what}: conntrack's own DESTROY with counters`);
        const pk = [...k.matchAll(/packets=(\d+)/g)].map((m) => Number(m[1]));
        const by = [...k.matchAll(/bytes=(\d+)/g)].map((m) => Number(m[1]));
        assert.deepEqual(f.packets, pk, `${what}: packets [orig, reply] vs conntrack`);
        assert.deepEqual(f.bytes, by, `${what}: bytes [orig, reply] vs conntrack`);
      }

      // rr over two real servers: svctrace's flows per backend are IPVS's own connection counts.
      const stats = (await runIn(L.nodeNetns, ['ipvsadm', '-Ln', '--stats', '-t', `${web.clusterIP}:80`])).stdout;
      for (const pod of L.pods) {
        const row = stats.split('\n').find((l) => l.includes(`${pod.ip}:8080`));
        const conns = Number(row?.trim().split(/\s+/)[2]);
        const traced = flows().filter((f) => f.orig.daddr === web.clusterIP && f.backend === `${pod.ip}:8080`).length;
        assert.equal(traced, conns, `real server ${pod.ip}: svctrace ${traced}, ipvsadm ${conns}\n${stats}`);
      }
    } finally {
      ct.stop();
      await p.stop();
    }
  });

  kernelTest('explain: the virtual service, shares as rr and weights give them, persistence as affinity, --watch agreeing with IPVS', async (t) => {
    const up = ipvsLab(t);
    if (!up) return;
    const L: Lab = up;
    const web = L.service('web');
    const vip = `${web.clusterIP}:80`;
    const [pod0, pod1] = L.pods as [(typeof L.pods)[0], (typeof L.pods)[0]];
    // A terminating endpoint, as kube-proxy keeps it: weight 0, no new connections.
    await runIn(L.nodeNetns, ['ipvsadm', '-e', '-t', vip, '-r', `${pod0.ip}:8080`, '-m', '-w', '0']);
    // The watch ends 2 s (scaled) after the curls, what they left come in:
    // a fixed 4 s window held ten curls of about 1.2 s each in an emulated
    // guest, at half the margin of every other wait.
    const curlsOver = new AbortController();
    let watch: ReturnType<typeof explain> | undefined;
    try {
      const served = L.served.length;
      const linksBefore = netfilterLinks().length;
      watch = explain({ target: vip, netns: L.nodeNetns, watchSeconds: 60 * TIME_SCALE, watchUntil: curlsOver.signal });
      assert.ok(await waitFor(() => netfilterLinks().length >= linksBefore + 8, 15_000), 'explain --watch attached');
      for (let i = 0; i < 10; i++) assert.ok((await L.curl(`http://${vip}/w${i}`, 'client', [], 5 * TIME_SCALE)).ok);
      await sleep(2000 * TIME_SCALE);
      curlsOver.abort();
      const e = (await watch)[0]!;
      assert.equal(e.mode, 'ipvs');
      assert.equal(e.service?.source, 'ipvs');
      assert.equal(e.service?.chain, 'ipvs rr');
      const share = (ip: string) => e.service!.endpoints.find((x) => x.ip === ip)?.probability;
      assert.equal(share(pod0.ip), 0, 'weight 0: no share');
      assert.equal(share(pod1.ip), 1);
      // What the kernel did agrees: every new connection went to pod1, as
      // the pods' own logs and svctrace's flows say.
      assert.deepEqual(new Set(L.served.slice(served).map((x) => x.pod)), new Set([pod1.name]));
      const seen = (ip: string) => e.observed?.backends.find((b) => b.backend === `${ip}:8080`)?.flows ?? 0;
      assert.equal(seen(pod1.ip), 10, JSON.stringify(e.observed?.backends));
      assert.equal(seen(pod0.ip), 0);
      const codes = e.diagnoses.map((d) => d.code);
      assert.ok(!codes.includes('SKEWED_DISTRIBUTION'), `no skew: the rules say pod1 takes all (${codes})`);
      assert.deepEqual(e.diagnoses.filter((d) => d.severity === 'error'), [], 'no error');
    } finally {
      // A failed curl leaves the watch running: it ends here, not at its window.
      curlsOver.abort();
      await watch?.catch(() => undefined);
      await runIn(L.nodeNetns, ['ipvsadm', '-e', '-t', vip, '-r', `${pod0.ip}:8080`, '-m', '-w', '1']);
    }

    // sessionAffinity: ClientIP is a persistent virtual service in IPVS.
    await L.setAffinity('web', 600);
    try {
      const a = (await explain({ target: vip, netns: L.nodeNetns }))[0]!;
      assert.equal(a.service?.affinitySeconds, 600);
      const d = a.diagnoses.find((x) => x.code === 'SESSION_AFFINITY');
      assert.deepEqual(d?.evidence, [`IPVS virtual service ${vip} is persistent (ipvsadm: persistent 600)`]);
      assert.deepEqual(a.service!.endpoints.map((x) => x.probability), [0.5, 0.5]);
    } finally {
      await L.setAffinity('web', undefined);
    }
  });
});
