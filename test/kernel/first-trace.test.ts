/**
 * The first real trace: the lab's node namespace, svctrace's netfilter
 * programs around DNAT, curls to the ClusterIP. For every connection the
 * TypeScript side must receive a before-DNAT record with the ClusterIP and an
 * after-DNAT record whose destination is the pod that actually served it.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { kernelTest, natStagePriority, netfilterLinks, netnsList, IS_ROOT } from '../helpers/kernel';
import { Lab, LabPod, POD_HTTP_PORT } from '../../src/lab/lab';
import { Tracer } from '../../src/tracer/tracer';
import { KernelEvent } from '../../src/events/decode';
import { parseServiceSpec } from '../../src/net/ipv4';
import { EventKind, NfStage } from '../../src/events/layout';
import { IPS_DST_NAT, NF_HOOK_NAMES } from '../../src/events/conntrack';
import { SvctraceError } from '../../src/errors';
import { settled, waitFor } from '../helpers/flows';

describe('first real trace (kernel)', () => {
  let lab: Lab | undefined;
  let tracer: Tracer | undefined;
  const events: KernelEvent[] = [];
  let linksBefore = 0;

  before(async () => {
    if (!IS_ROOT) return;
    linksBefore = netfilterLinks().length;
    lab = await Lab.up();
  });

  after(async () => {
    tracer?.close();
    await lab?.down();
  });

  kernelTest('each curl to the ClusterIP shows before-DNAT (ClusterIP) and after-DNAT (serving pod)', async () => {
    assert.ok(lab);
    const web = lab.service('web');
    tracer = Tracer.open();
    tracer.setServices([parseServiceSpec(`${web.clusterIP}:${web.port}`)]);
    const att = tracer.attachNetns(lab.nodeNetns);
    assert.equal(att.links, 8);
    // bpftool (not svctrace) sees our eight links (netfilter, or fentry/fexit on NAT's four hook functions).
    assert.equal(netfilterLinks().length, linksBefore + 8);
    let statsRecords = 0;
    tracer.start((b) => {
      events.push(...b.events);
      statsRecords += b.stats.length;
    });

    const N = 6;
    const clientPorts: string[] = [];
    for (let i = 0; i < N; i++) {
      const r = await lab.curl(`http://${web.clusterIP}:${web.port}/req${i}`);
      assert.ok(r.ok, `curl ${i} failed: ${r.stderr}`);
      clientPorts.push(/client=[\d.]+:(\d+)/.exec(r.body)![1]!);
    }
    // Records arrive a batch after the traffic, and keep coming after the
    // replies (FINs, each connection's counters as it enters TIME_WAIT):
    // wait (bounded) for every reply and counters record, then until the
    // reader has read nothing more for a while.
    const replied = (port: number) => events.some((e) => e.kind === EventKind.NF && e.ctOrig.sport === port && NF_HOOK_NAMES[e.nfHook] === 'LOCAL_IN' && e.nfStage === NfStage.AFTER_NAT);
    await waitFor(() => lab!.served.filter((s) => s.proto === 'tcp').length === N && clientPorts.every((p) => replied(Number(p))) && statsRecords >= N, 5000);
    await settled(() => {
      const st = tracer!.stats();
      return st.recordsRead + st.ctDestroyEvents + events.length + statsRecords;
    });
    assert.equal(lab.served.filter((s) => s.proto === 'tcp').length, N);

    for (const served of lab.served) {
      const port = Number(served.client.split(':')[1]);
      const mine = events.filter((e) => e.kind === EventKind.NF && e.ctOrig.sport === port);
      const out = mine.filter((e) => NF_HOOK_NAMES[e.nfHook] === 'LOCAL_OUT');
      const beforeDnat = out.find((e) => e.nfStage === NfStage.BEFORE_NAT && e.nfPriority === natStagePriority(-100, 'before'));
      const afterDnat = out.find((e) => e.nfStage === NfStage.AFTER_NAT && e.nfPriority === natStagePriority(-100, 'after'));
      assert.ok(beforeDnat, `no before-DNAT record for client port ${port}`);
      assert.ok(afterDnat, `no after-DNAT record for client port ${port}`);
      assert.equal(beforeDnat.pkt.daddr, web.clusterIP);
      assert.equal(beforeDnat.pkt.dport, web.port);
      const pod: LabPod = lab.pods.find((p) => p.name === served.pod)!;
      assert.equal(afterDnat.pkt.daddr, pod.ip, `connection ${port} was served by ${served.pod}`);
      assert.equal(afterDnat.pkt.dport, POD_HTTP_PORT);
      assert.ok(afterDnat.ctStatus & IPS_DST_NAT, 'conntrack shows DST_NAT on the first packet after DNAT');
      assert.equal(afterDnat.ctReply.saddr, pod.ip, 'the reply tuple names the pod');
      assert.equal(afterDnat.ctOrig.daddr, web.clusterIP);
      assert.ok(afterDnat.tcpFlags & 0x02, 'the first observed packet is the SYN');
      // The reply is un-DNATed back to the ClusterIP as its source.
      const unDnat = mine.find((e) => NF_HOOK_NAMES[e.nfHook] === 'LOCAL_IN' && e.nfStage === NfStage.AFTER_NAT);
      assert.equal(unDnat?.pkt.saddr, web.clusterIP);
    }
    assert.deepEqual(new Set(clientPorts).size, N);
    const st = tracer.stats();
    assert.equal(st.ringbufLost, 0);
    // Every record read reached the callback: events, and flow counters
    // (one per connection as it entered TIME_WAIT, written at once). The
    // lab's TIME_WAIT lasts 2 s: on a slow machine conntrack destroys some
    // of these connections before the test ends, and their records come by
    // netlink (ctDestroyEvents), not from the ring (recordsRead).
    assert.equal(st.recordsRead + st.ctDestroyEvents, events.length + statsRecords);
    assert.ok(statsRecords >= N, `counters of each ended connection: ${statsRecords}`);
  });

  kernelTest('untraced services and an unknown netns produce no events / a clear error', async () => {
    assert.ok(lab && tracer);
    const count = events.length;
    const other = lab.service('other');
    const r = await lab.curl(`http://${other.clusterIP}:${other.port}/`);
    assert.ok(r.ok, r.stderr);
    // Until the reader has nothing more (the earlier connections' ends may still come: they are not this traffic's).
    await settled(() => tracer!.stats().recordsRead);
    const theirs = events.slice(count).filter((e) => e.ctOrig.daddr === other.clusterIP || e.pkt.daddr === other.clusterIP);
    assert.deepEqual(theirs, [], 'traffic to an untraced ClusterIP produced events');
    assert.throws(() => tracer!.attachNetns('svt-no-such-netns'), (e: unknown) => e instanceof SvctraceError && e.code === 'NETNS_NOT_FOUND');
  });

  kernelTest('teardown leaves no namespaces and no BPF links', async () => {
    assert.ok(lab && tracer);
    const names = [lab.nodeNetns, lab.clientNetns, ...lab.pods.map((p) => p.netns)];
    tracer.close();
    await lab.down();
    assert.deepEqual(netnsList().filter((n) => names.includes(n)), []);
    assert.equal(netfilterLinks().length, linksBefore);
  });
});
