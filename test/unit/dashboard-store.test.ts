/** The dashboard's pure state (no browser): what counts as an open flow, and how failures are labelled on a flow's path. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Store } from '../../src/dashboard/store';
import { hops } from '../../src/dashboard/path-view';
import { svctrace } from '../../src/gen/svctrace';

import pb = svctrace.v1;

const SVC = '10.96.0.100:80/tcp';
const B = '10.244.1.11:8080';

function ev(flowId: number, over: Partial<pb.IEvent>): pb.IEvent {
  return { flowId, service: SVC, backend: B, tsNs: 1_000 + flowId, kind: pb.EventKind.EVENT_KIND_NETFILTER, stage: pb.Stage.STAGE_DNAT, ...over };
}

describe('dashboard store', () => {
  it('open flows are established ones: never a failed or unanswered one', () => {
    const s = new Store();
    s.addEvents([
      ev(1, { conntrack: { tcpState: 'ESTABLISHED' } }),
      ev(2, { conntrack: { tcpState: 'SYN_SENT' } }), // never answered
      ev(3, { conntrack: { tcpState: 'ESTABLISHED' }, tcpFlags: 'RST|ACK', stage: pb.Stage.STAGE_DROP }), // reset
      ev(4, { conntrack: { tcpState: 'SYN_SENT' } }),
      ev(4, { kind: pb.EventKind.EVENT_KIND_DROP, stage: pb.Stage.STAGE_DROP, dropReasonName: 'NETFILTER_DROP' }),
      ev(5, { conntrack: { tcpState: 'TIME_WAIT' } }),
    ]);
    assert.equal(s.openFlows(SVC, B), 1);
  });

  it("a flow's resent SYNs come from its counters, apart from its packets", () => {
    const s = new Store();
    s.addEvents([ev(1, { kind: pb.EventKind.EVENT_KIND_FLOW_STATS, counters: { packetsOriginal: 1, bytesOriginal: 60, synsResent: 2, countedOnly: true } })]);
    const f = [...s.flows.values()][0]!;
    assert.equal(f.synsResent, 2);
    assert.deepEqual(f.packets, [1, 0]);
  });

  it('on a flow\'s path, a reset and an ICMP error are labelled as such, a kernel drop as DROP', () => {
    const s = new Store();
    s.addEvents([
      ev(1, { tsNs: 1, stage: pb.Stage.STAGE_MATCH }),
      ev(1, { tsNs: 2, stage: pb.Stage.STAGE_DROP, tcpFlags: 'RST|ACK', direction: pb.Direction.DIRECTION_REPLY }),
      ev(1, { tsNs: 3, stage: pb.Stage.STAGE_DROP, icmpType: 3, icmpCode: 3, direction: pb.Direction.DIRECTION_REPLY, packet: { src: '10.244.1.1', dst: '10.244.1.1', protocol: 1 as pb.Protocol } }),
      ev(1, { tsNs: 4, stage: pb.Stage.STAGE_DROP, kind: pb.EventKind.EVENT_KIND_DROP, dropReasonName: 'NETFILTER_DROP' }),
    ]);
    const titles = hops([...s.flows.values()][0]!).filter((h) => h.stage === 'drop').map((h) => h.title);
    assert.deepEqual(titles, ['RESET', 'ICMP', 'DROP']);
  });

  it('behind a relay, flows are per node: the same id from two nodes is two flows, each named by its node', () => {
    const s = new Store();
    s.setHello({ node: 'relay-0', instance: 'r1', nodes: [{ node: 'node-a', state: 'connected' }, { node: 'node-b', state: 'down' }] });
    s.addEvents([ev(7, { node: 'node-a', conntrack: { tcpState: 'ESTABLISHED' } }), ev(7, { node: 'node-b', conntrack: { tcpState: 'SYN_SENT' } })]);
    s.addFlows([{ id: 7, node: 'node-b', service: SVC, state: 'SYN_SENT', packetsOriginal: 3 }]);
    const flows = [...s.flows.values()].map((f) => [f.node, f.id, f.state, f.packets[0]]);
    assert.deepEqual(flows.sort(), [['node-a', '7', 'ESTABLISHED', 0], ['node-b', '7', 'SYN_SENT', 3]]);
    assert.deepEqual(s.nodes().map((n) => `${n.node} ${n.state}`), ['node-a connected', 'node-b down']);
    // A node server's own stream: its events carry no node; they are its Hello's.
    const one = new Store();
    one.setHello({ node: 'worker-1', instance: 'x' });
    one.addEvents([ev(1, {})]);
    assert.equal([...one.flows.values()][0]!.node, 'worker-1');
  });
  it('names the stages that lost something, program runs and packets the hooks missed included', () => {
    const s = new Store();
    assert.equal(s.lossesByStage(), '');
    s.status = { kernelLost: 3, lostByStage: { ring_buffer: 3, flow_table: 0, hook_runs_skipped: 2 } };
    assert.equal(s.lossesByStage(), 'ring_buffer=3 hook_runs_skipped=2');
  });
});
