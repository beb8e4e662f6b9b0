/**
 * The core tracer against the real kernel, in the lab: every transition of a
 * ClusterIP flow (DNAT, SNAT, conntrack, route, bridge/veth, VXLAN, drops,
 * reply, destroy) must show up in the flows, and agree with what the pods
 * themselves logged.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { dropReasonName, kernelPrograms, kernelTest, IS_ROOT, sleep } from '../helpers/kernel';
import { FlowLog, settled, waitFor } from '../helpers/flows';
import { curlEach, reapUntil } from '../helpers/lab-traffic';
import { Lab, LAB_ADDR, POD_HTTP_PORT, POD_UDP_PORT } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { Pipeline } from '../../src/pipeline/pipeline';
import type { LoadedProgram } from '../../src/native/binding';
import { parseNodePortSpec, parseServiceSpec } from '../../src/net/ipv4';
import { UDP_QUERY } from '../../src/demo';
import { svctrace } from '../../src/gen/svctrace';
import { eventSummary } from '../../src/output/event-summary';
import { IPS_ASSURED, IPS_DST_NAT, IPS_SRC_NAT } from '../../src/events/conntrack';

import pb = svctrace.v1;

const hasStatus = (e: pb.IEvent, bit: number): boolean => ((e.conntrack?.status ?? 0) & bit) !== 0;
const S = pb.Stage;

/**
 * Events reach the flow log a batch or two after the traffic that caused them;
 * under TCG on a busy CI machine that can be well past 100 ms. Wait for the
 * facts a test is about to check (the assertions that follow still say what is
 * missing if they never come).
 */
const eventsArrive = (ready: () => boolean): Promise<boolean> => waitFor(ready, 5000);

describe('core tracer (kernel)', () => {
  let lab: Lab;
  let tracer: Pipeline;
  const log = new FlowLog();

  before(async () => {
    if (!IS_ROOT) return;
    lab = await Lab.up({ remoteNode: true });
    const svc = (name: string) => lab.service(name);
    tracer = await Pipeline.start(
      {
        services: [
          parseServiceSpec(`${svc('web').clusterIP}:80`),
          parseNodePortSpec(String(svc('web').nodePort)),
          parseServiceSpec(`${svc('kube-dns').clusterIP}:53/udp`),
          parseServiceSpec(`${svc('empty').clusterIP}:80`),
          parseServiceSpec(`${svc('closed').clusterIP}:80`),
          parseServiceSpec(`${svc('remote').clusterIP}:80`),
        ],
        netns: [lab.nodeNetns],
        kubeconfig: false, // the lab has no API server
        closeGraceMs: 3_600_000, // keep every flow for the assertions
      },
      () => [{ name: 'test log', write: log.add }],
    );
  });

  after(async () => {
    await tracer?.stop();
    await lab?.down();
  });

  kernelTest('30 curls to a ClusterIP with 3 endpoints: 30 complete flows matching the pods\' own logs', async () => {
    const web = lab.service('web');
    const N = 30;
    const served = await curlEach(lab, `http://${web.clusterIP}/`, N);
    // TIME_WAIT is 2 s in the lab's node; then have conntrack reap and report.
    await sleep(2500);
    const ports = served.map((s) => Number(s.client.split(':')[1]));
    const destroyed = (p: number) => {
      const f = log.flowByClientPort(p, web.clusterIP);
      return f !== undefined && log.stages(f, S.STAGE_CLOSE).length > 0;
    };
    const notDestroyed = () => ports.filter((p) => !destroyed(p)).map((p) => {
      const f = log.flowByClientPort(p, web.clusterIP);
      return f ? `${p} (flow ${f.id}: ${log.eventsOf(f).map(eventSummary).join('; ')})` : `${p} (no flow)`;
    });
    assert.ok(await reapUntil(lab, () => ports.every(destroyed), 10_000), `every flow was destroyed; not: ${notDestroyed().join('\n')}`);

    const perBackend = new Map<string, number>();
    for (const s of served) {
      const port = Number(s.client.split(':')[1]);
      const f = log.flowByClientPort(port, web.clusterIP);
      assert.ok(f, `no flow for client port ${port}`);
      const pod = lab.pods.find((p) => p.name === s.pod)!;
      const what = `flow ${f.id} (served by ${s.pod})`;

      const match = log.stages(f, S.STAGE_MATCH);
      assert.equal(match.length, 1, `${what}: one match`);
      assert.equal(match[0]!.packet!.dst, web.clusterIP);
      assert.equal(match[0]!.packet!.dstPort, 80);

      const dnat = log.stages(f, S.STAGE_DNAT).find((e) => e.afterNat && hasStatus(e, IPS_DST_NAT));
      assert.ok(dnat, `${what}: DNAT`);
      assert.equal(dnat.packet!.dst, pod.ip, `${what}: DNATed to the pod that served it`);
      assert.equal(dnat.packet!.dstPort, POD_HTTP_PORT);
      assert.equal(dnat.conntrack!.reply!.src, pod.ip);

      assert.ok(log.eventsOf(f).some((e) => hasStatus(e, IPS_ASSURED)), `${what}: conntrack ASSURED`);

      const intoPod = log.eventsOf(f).find((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_RECV && e.device?.netns === pod.netns);
      assert.ok(intoPod, `${what}: veth hop into ${pod.netns}`);
      assert.equal(intoPod.device!.name, 'eth0');
      assert.equal(intoPod.device!.kind, 'veth');
      assert.ok(
        log.eventsOf(f).some((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_XMIT && e.device?.name === pod.hostVeth && e.device?.kind === 'veth'),
        `${what}: host-side ${pod.hostVeth} egress`,
      );
      assert.ok(log.stages(f, S.STAGE_ROUTE).some((e) => e.packet?.dst === pod.ip && e.device?.name === 'cni0'), `${what}: route to the pod via cni0`);

      const reply = log.stages(f, S.STAGE_REPLY).find((e) => e.afterNat && e.packet?.src === web.clusterIP);
      assert.ok(reply, `${what}: reply un-DNATed back to the ClusterIP`);
      assert.equal(reply.packet!.srcPort, 80);
      assert.equal(reply.packet!.dst, '10.244.1.1');

      const close = log.stages(f, S.STAGE_CLOSE);
      assert.equal(close.length, 1, `${what}: one destroy`);
      assert.equal(f.backendNetns, pod.netns);
      perBackend.set(s.pod, (perBackend.get(s.pod) ?? 0) + 1);
    }
    // The tracer's per-backend counts equal the pods' own logs.
    const summary = tracer.flows.summary();
    let total = 0;
    for (const pod of lab.pods) {
      const traced = summary.perBackend[`${pod.ip}:${POD_HTTP_PORT}`] ?? 0;
      assert.equal(traced, perBackend.get(pod.name) ?? 0, `backend ${pod.name}`);
      total += traced;
    }
    assert.equal(total, N);
  });

  kernelTest('NodePort from a client namespace: MASQUERADE hides the client; without it the pod sees the client', async () => {
    const web = lab.service('web');
    const url = `http://${LAB_ADDR.nodeIP}:${web.nodePort}/`;

    let r = await lab.curl(url, 'client');
    assert.ok(r.ok, r.stderr);
    const seen = lab.served.at(-1)!;
    const nodePortFlow = () => [...log.flows.values()].find((x) => x.orig.daddr === LAB_ADDR.nodeIP && x.reply.daddr === seen.client.split(':')[0] && x.reply.dport === Number(seen.client.split(':')[1]));
    await eventsArrive(() => { const x = nodePortFlow(); return x !== undefined && log.stages(x, S.STAGE_SNAT).some((e) => e.afterNat); });
    let f = nodePortFlow();
    assert.ok(f, `no NodePort flow for ${seen.client}`);
    assert.equal(f.orig.saddr, LAB_ADDR.clientIP);
    assert.equal(f.masqueraded, true);
    assert.equal(seen.client.split(':')[0], LAB_ADDR.bridgeIP, 'the pod saw the node address');
    const snat = log.stages(f, S.STAGE_SNAT).find((e) => e.afterNat);
    assert.match(eventSummary(snat!), /MASQUERADE/);
    assert.ok(hasStatus(snat!, IPS_SRC_NAT));

    await lab.setMasquerade(false);
    r = await lab.curl(url, 'client');
    assert.ok(r.ok, r.stderr);
    const seen2 = lab.served.at(-1)!;
    assert.equal(seen2.client.split(':')[0], LAB_ADDR.clientIP, 'without MASQUERADE the pod sees the client');
    await eventsArrive(() => { const x = log.flowByClientPort(Number(seen2.client.split(':')[1]), LAB_ADDR.nodeIP); return x !== undefined && log.stages(x, S.STAGE_SNAT).some((e) => e.afterNat); });
    f = log.flowByClientPort(Number(seen2.client.split(':')[1]), LAB_ADDR.nodeIP);
    assert.ok(f);
    assert.equal(f.masqueraded, false);
    assert.match(eventSummary(log.stages(f, S.STAGE_SNAT).find((e) => e.afterNat)!), /no SNAT.*sees the client 10\.250\.0\.2/);
    await lab.setMasquerade(true);
  });

  kernelTest('UDP to a ClusterIP (DNS-like) is traced', async () => {
    const dns = lab.service('kube-dns');
    const r = await runIn(lab.nodeNetns, [process.execPath, '-e', UDP_QUERY, dns.clusterIP, '53']);
    assert.match(r.stdout, /^pod=/);
    const seen = lab.served.filter((s) => s.proto === 'udp').at(-1)!;
    const pod = lab.pods.find((p) => p.name === seen.pod)!;
    await eventsArrive(() => {
      const x = log.flowByClientPort(Number(seen.client.split(':')[1]), dns.clusterIP);
      return x !== undefined && log.stages(x, S.STAGE_REPLY).length > 0 && log.eventsOf(x).some((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_RECV && e.device?.netns === pod.netns);
    });
    const f = log.flowByClientPort(Number(seen.client.split(':')[1]), dns.clusterIP);
    assert.ok(f);
    assert.equal(f.proto, 17);
    const dnat = log.stages(f, S.STAGE_DNAT).find((e) => e.afterNat);
    assert.equal(dnat?.packet?.dst, pod.ip);
    assert.equal(dnat?.packet?.dstPort, POD_UDP_PORT);
    assert.ok(log.stages(f, S.STAGE_REPLY).some((e) => e.packet?.src === dns.clusterIP && e.packet?.srcPort === 53));
    assert.ok(log.eventsOf(f).some((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_RECV && e.device?.netns === pod.netns));
  });

  kernelTest('no endpoints (REJECT) and a backend not listening: drop and RST events name the reason', async () => {
    const empty = lab.service('empty');
    let r = await lab.curl(`http://${empty.clusterIP}/`);
    assert.equal(r.ok, false);
    const emptyFlows = () => [...log.flows.values()].filter((f) => f.orig.daddr === empty.clusterIP);
    await eventsArrive(() => emptyFlows().some((f) => log.eventsOf(f).some((e) => e.icmpType === 3) && log.eventsOf(f).some((e) => e.kind === pb.EventKind.EVENT_KIND_DROP)));
    const ef = emptyFlows();
    assert.equal(ef.length, 1);
    const eEvents = log.eventsOf(ef[0]!);
    assert.ok(eEvents.some((e) => e.stage === S.STAGE_DNAT && /NOT DNATed/.test(eventSummary(e))), 'not DNATed');
    assert.ok(eEvents.some((e) => e.kind === pb.EventKind.EVENT_KIND_DROP && e.dropReasonName === dropReasonName('NETFILTER_DROP')), 'REJECT drops the SYN');
    assert.ok(eEvents.some((e) => e.icmpType === 3 && e.icmpCode === 3 && /port unreachable/.test(eventSummary(e))), 'ICMP port unreachable');
    // The rule that refused it is named (kube-proxy's filter KUBE-SERVICES REJECT), from the nftables trace.
    // Up to 10 s (scaled): rule traces are held until the ring has caught up
    // with them, and in CI's emulated 6.12 guest, beside the fault
    // catalogue's, this test's events once took 18 s to arrive and 3 s was
    // not enough; alone there it takes 7 s in all.
    assert.ok(
      await waitFor(() => log.eventsOf(ef[0]!).some((e) => e.kind === pb.EventKind.EVENT_KIND_RULE_TRACE && /dropped or rejected by table filter chain KUBE-SERVICES rule handle \d+/.test(e.summary ?? '')), 10_000),
      `the REJECT rule is named: ${log.eventsOf(ef[0]!).filter((e) => e.kind === pb.EventKind.EVENT_KIND_RULE_TRACE).map((e) => e.summary).join(' | ')}`,
    );

    const closed = lab.service('closed');
    r = await lab.curl(`http://${closed.clusterIP}/`);
    assert.equal(r.ok, false);
    const closedFlows = () => [...log.flows.values()].filter((f) => f.orig.daddr === closed.clusterIP);
    await eventsArrive(() => closedFlows().some((f) => f.reset && log.eventsOf(f).some((e) => e.kind === pb.EventKind.EVENT_KIND_DROP && e.device?.netns === lab.pods[0]!.netns)));
    const cf = closedFlows();
    assert.equal(cf.length, 1);
    assert.equal(cf[0]!.reset, true);
    const cEvents = log.eventsOf(cf[0]!);
    assert.ok(cEvents.some((e) => e.stage === S.STAGE_DROP && /TCP RST from the backend/.test(eventSummary(e))));
    assert.ok(
      cEvents.some((e) => e.kind === pb.EventKind.EVENT_KIND_DROP && e.dropReasonName === dropReasonName('NO_SOCKET') && e.device?.netns === lab.pods[0]!.netns),
      'the SYN is dropped in the pod with NO_SOCKET',
    );
  });

  kernelTest('cross-node backend: VXLAN tunnel egress on the node', async () => {
    const remote = lab.service('remote');
    const r = await lab.curl(`http://${remote.clusterIP}/`);
    assert.ok(r.ok, r.stderr);
    assert.match(r.body, /pod=rpod0/);
    const remoteFlow = () => [...log.flows.values()].find((x) => x.orig.daddr === remote.clusterIP);
    await eventsArrive(() => { const x = remoteFlow(); return x !== undefined && log.eventsOf(x).some((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_RECV && e.device?.netns === lab.remotePod!.netns); });
    const f = remoteFlow();
    assert.ok(f);
    const ev = log.eventsOf(f);
    const egress = ev.find((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_XMIT && e.device?.kind === 'vxlan' && e.device?.netns === lab.nodeNetns);
    assert.ok(egress, 'xmit on the VXLAN device in the node namespace');
    assert.equal(egress.packet!.dst, LAB_ADDR.remotePodIP);
    assert.match(eventSummary(egress), /VXLAN tunnel egress/);
    assert.ok(log.stages(f, S.STAGE_ROUTE).some((e) => e.gateway === LAB_ADDR.tunnelNode2 && e.device?.name === 'flannel.1'), 'route via the tunnel');
    assert.ok(ev.some((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_RECV && e.device?.netns === lab.remotePod!.netns), 'into the remote pod');
  });

  kernelTest('untraced traffic through the same node produces zero events', async () => {
    const other = lab.service('other');
    // The earlier tests' connections may still be ending: wait until the reader has read nothing for a while.
    await settled(() => tracer.stats().recordsRead);
    const before = log.all.length;
    const kernelBefore = tracer.stats().recordsRead;
    for (let i = 0; i < 5; i++) assert.ok((await lab.curl(`http://${other.clusterIP}/`)).ok);
    await sleep(200);
    assert.equal(tracer.stats().recordsRead, kernelBefore, 'the kernel emitted events for an untraced service');
    // (conntrack may still report earlier flows' ends meanwhile; none may be about 'other')
    const newEvents = log.all.slice(before);
    assert.ok(!newEvents.some((e) => e.conntrack?.original?.dst === other.clusterIP || e.packet?.dst === other.clusterIP));
  });

  kernelTest("the kernel's own numbers for each loaded program, and the runs it skipped, as bpftool shows them", async () => {
    // Run counts are kept only while BPF statistics are on: on for this
    // test, restored after (a BPF_ENABLE_STATS descriptor would need the addon's help).
    const knob = '/proc/sys/kernel/bpf_stats_enabled';
    const was = readFileSync(knob, 'utf8').trim();
    writeFileSync(knob, '1');
    try {
      const runsBefore = new Map(tracer.programs().map((p) => [p.id, p.runs]));
      await curlEach(lab, `http://${lab.service('web').clusterIP}/`, 5);
      const mine = tracer.programs();
      const skipped = tracer.stats().hookRunsSkipped;
      const kernel = kernelPrograms();
      const backend = tracer.stats().backend;
      const expected = ['svt_dev_xmit', 'svt_dev_recv', 'svt_fib', ...(backend === 'netfilter' ? ['svt_nf_before_nat', 'svt_nf_after_nat'] : [])];
      for (const name of expected) assert.ok(mine.some((p) => p.name === name), `${name} among the loaded programs: ${mine.map((p) => p.name).join(', ')}`);
      const hookPrefix = { netfilter: 'svt_nf_', fentry: 'svt_fentry_', kprobe: 'svt_kprobe_' }[backend];
      assert.ok(mine.some((p) => p.name.startsWith(hookPrefix)), `the ${backend} backend's programs are loaded: ${mine.map((p) => p.name).join(', ')}`);
      for (const p of mine) {
        const k = kernel.get(p.id);
        assert.ok(k, `program ${p.name} (id ${p.id}) is loaded in the kernel`);
        if (k.pids) assert.ok(k.pids.some((x) => x.pid === process.pid), `program ${p.id} is held by this process`);
        // Read after ours: the kernel's count can only have grown (the device hooks are global).
        assert.ok((k.run_cnt ?? 0) >= p.runs, `${p.name}: runs ${p.runs}, bpftool ${k.run_cnt}`);
        assert.ok((k.recursion_misses ?? 0) >= p.runsSkipped, `${p.name}: skipped ${p.runsSkipped}, bpftool ${k.recursion_misses}`);
      }
      const ran = (p: LoadedProgram) => p.runs > (runsBefore.get(p.id) ?? 0) && p.runTimeNs > 0;
      const show = (p: LoadedProgram) => `${p.name} ${p.runs} runs (${runsBefore.get(p.id)} before), ${p.runTimeNs} ns`;
      for (const name of ['svt_dev_xmit', 'svt_dev_recv']) {
        const p = mine.find((x) => x.name === name)!;
        assert.ok(ran(p), `${name} ran for the requests: ${show(p)}`);
      }
      assert.ok(mine.some((p) => p.name.startsWith(hookPrefix) && ran(p)), `the NAT hooks ran for the requests: ${mine.map(show).join(', ')}`);
      assert.equal(skipped, mine.reduce((n, p) => n + p.runsSkipped, 0), 'stats().hookRunsSkipped is the programs\' runs skipped');
      assert.equal(tracer.losses().hook_runs_skipped, skipped, 'and a loss stage of its own');
    } finally {
      writeFileSync(knob, was);
    }
  });
});
