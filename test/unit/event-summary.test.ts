import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { FlowTable } from '../../src/flows/flow-table';
import { eventSummary } from '../../src/output/event-summary';
import { eventToJson } from '../../src/flows/to-proto';
import { parseServiceSpec } from '../../src/net/ipv4';
import { Dir, EventKind, NfStage } from '../../src/events/layout';
import { IPS_CONFIRMED, IPS_DST_NAT, IPS_SRC_NAT } from '../../src/events/conntrack';
import type { KernelEvent } from '../../src/events/decode';
import { svctrace } from '../../src/gen/svctrace';
import { ev, orig, reply, unNatted } from '../helpers/kernel-events';

import pb = svctrace.v1;

/**
 * Summaries are rendered at the edge from the wire event: these run the
 * records through the flow table (classification and mapping, which make no
 * text) and render what a sink would show.
 */
function summaries(events: KernelEvent[]): string[] {
  const t = new FlowTable({
    services: [parseServiceSpec('10.96.0.100:80')],
    dropReasons: { 12: 'NETFILTER_DROP', 3: 'TCP_CLOSE' },
    netnsName: (ino) => (ino === 222 ? 'pod-a' : ino === 111 ? 'node' : undefined),
  });
  const items = t.ingest(events);
  for (const i of items) assert.equal(i.event.summary ?? '', '', 'the pipeline makes no summary text');
  return items.map((i) => eventSummary(i.event));
}

const after = { nfStage: NfStage.AFTER_NAT, nfPriority: -99 };
const confirmed = IPS_CONFIRMED | IPS_DST_NAT;

describe('eventSummary (rendered at the edge)', () => {
  it('kube-proxy IPVS mode: not DNATed by NAT, then DNAT by IPVS where the entry first names the real server', () => {
    // A client elsewhere: NAT leaves the VIP (IPVS acts at LOCAL_IN), then
    // the packet IPVS re-sends through LOCAL_OUT has the entry's reply
    // tuple pointing at the real server, without conntrack's DST_NAT bit.
    const s = summaries([
      ev({ tsNs: 1n, nfHook: 0 }),
      ev({ tsNs: 2n, nfHook: 0, ...after, ctReply: unNatted }),
      ev({ tsNs: 3n, nfHook: 3, ctReply: reply, pkt: { ...orig, daddr: reply.saddr, dport: reply.sport } }),
      ev({ tsNs: 4n, nfHook: 3, ...after, ctReply: reply }),
    ]);
    assert.match(s[1]!, /^NOT DNATed @ PRE_ROUTING -99: .*in IPVS mode, IPVS translates it next/);
    assert.equal(s[2], 'DNAT by IPVS (seen @ LOCAL_OUT -101): 10.96.0.100:80 -> real server 10.244.1.12:8080');
  });

  it('the path of a connection: match, DNAT, SNAT, device into the pod, reply un-DNAT, close', () => {
    const s = summaries([
      ev({ tsNs: 1n }),
      ev({ tsNs: 2n, ...after, ctStatus: IPS_DST_NAT }),
      ev({ tsNs: 3n, nfHook: 4, nfStage: NfStage.AFTER_NAT, nfPriority: 100, ctStatus: IPS_DST_NAT | IPS_SRC_NAT, ctReply: { saddr: '10.244.1.12', daddr: '10.244.1.254', sport: 8080, dport: 40000, proto: 6 } }),
      ev({ tsNs: 4n, kind: EventKind.DEV_RECV, netnsIno: 222, ifname: 'eth0', linkKind: 'veth', ctStatus: IPS_DST_NAT }),
      ev({ tsNs: 5n, dir: Dir.REPLY, nfHook: 0, ...after, ctStatus: confirmed, ctTcpState: 2, pkt: { saddr: '10.96.0.100', daddr: '10.244.1.1', sport: 80, dport: 40000, proto: 6 } }),
      ev({ tsNs: 6n, kind: EventKind.CT_DESTROY, ctId: '', ctStatus: confirmed, ctTcpState: 7 }),
    ]);
    assert.equal(s[0], 'matches 10.96.0.100:80/tcp @ LOCAL_OUT -101: 10.244.1.1:40000 -> 10.96.0.100:80, conntrack NEW');
    assert.equal(s[1], 'DNAT @ LOCAL_OUT -99: 10.96.0.100:80 -> backend 10.244.1.12:8080');
    assert.equal(s[2], 'MASQUERADE/SNAT @ POST_ROUTING 100: backend sees 10.244.1.254:40000 (not the client 10.244.1.1:40000)');
    assert.match(s[3]!, /^recv eth0 \(veth\) in pod-a: 10\.244\.1\.1:40000 -> 10\.96\.0\.100:80$/);
    assert.equal(s[4], 'reply un-DNAT @ PRE_ROUTING -99: source 10.244.1.12:8080 rewritten to 10.96.0.100:80, to 10.244.1.1:40000 (conntrack TCP SYN_SENT -> SYN_RECV)');
    assert.equal(s[5], 'conntrack entry destroyed in TIME_WAIT [CONFIRMED,DST_NAT]');
  });

  it('a device in the node\'s own namespace is not called a pod\'s', () => {
    const s = summaries([ev({ tsNs: 1n }), ev({ tsNs: 2n, kind: EventKind.DEV_XMIT, netnsIno: 111, ifname: 'cni0', linkKind: 'bridge' })]);
    assert.equal(s[1], 'xmit cni0 (bridge): 10.244.1.1:40000 -> 10.96.0.100:80');
  });

  it('not DNATed, drops, frees, RST and ICMP errors', () => {
    const s = summaries([
      ev({ tsNs: 1n }),
      ev({ tsNs: 2n, ...after }),
      ev({ tsNs: 3n, kind: EventKind.DROP, reason: 12, ifname: 'eth0', netnsIno: 222 }),
      ev({ tsNs: 4n, kind: EventKind.DROP, reason: 3, ifname: '' }),
      ev({ tsNs: 5n, dir: Dir.REPLY, tcpFlags: 0x14, nfHook: 0 }),
      ev({ tsNs: 6n, pkt: { ...orig, proto: 1 }, icmpType: 3, icmpCode: 3 }),
    ]);
    assert.match(s[1]!, /^NOT DNATed @ LOCAL_OUT -99: .* still goes to the service address/);
    assert.equal(s[2], 'DROPPED (NETFILTER_DROP) at eth0 in pod-a: 10.244.1.1:40000 -> 10.96.0.100:80');
    assert.match(s[3]!, /^freed \(TCP_CLOSE\) in node: /);
    assert.equal(s[4], 'TCP RST from the backend: 10.244.1.1:40000 -> 10.96.0.100:80');
    assert.equal(s[5], 'ICMP destination unreachable (port unreachable) sent to 10.96.0.100');
  });

  it('routes, and the established packets between milestones', () => {
    const s = summaries([
      ev({ tsNs: 1n }),
      ev({ tsNs: 2n, kind: EventKind.FIB, reason: 254, gateway: '10.244.1.254', ifname: 'cni0', dir: Dir.ORIGINAL, pkt: { ...orig, daddr: '10.244.1.12' } }),
      ev({ tsNs: 3n, ctStatus: confirmed, ctTcpState: 3 }),
    ]);
    assert.equal(s[1], 'route to backend 10.244.1.12: via 10.244.1.254 dev cni0 (table main)');
    assert.equal(s[2], 'before DNAT @ LOCAL_OUT -101: 10.244.1.1:40000 -> 10.96.0.100:80 [CONFIRMED,DST_NAT] (conntrack TCP SYN_SENT -> ESTABLISHED)');
  });

  it('flow counters; a summary already on the event (rule traces, older recordings) is kept', () => {
    assert.equal(
      eventSummary({ kind: pb.EventKind.EVENT_KIND_FLOW_STATS, counters: { packetsOriginal: 6, bytesOriginal: 400, packetsReply: 4, bytesReply: 398, final: true, reason: 'closed' } }),
      'counters (final, closed): 6 pkts/400 B out, 4 pkts/398 B back',
    );
    assert.equal(eventSummary({ kind: pb.EventKind.EVENT_KIND_RULE_TRACE, summary: 'kube-proxy rules taken: X' }), 'kube-proxy rules taken: X');
  });

  it('JSON lines carry the rendered summary and status names; the wire event carries neither', () => {
    const t = new FlowTable({ services: [parseServiceSpec('10.96.0.100:80')] });
    const [i] = t.ingest([ev({ tsNs: 1n, ctStatus: IPS_CONFIRMED | IPS_DST_NAT | 0x6 })]);
    assert.equal(i!.event.conntrack!.statusNames, undefined);
    const json = JSON.parse(eventToJson(i!.event)) as { summary: string; conntrack: { statusNames: string[] } };
    assert.match(json.summary, /^before DNAT @ LOCAL_OUT -101: .*\[SEEN_REPLY,ASSURED,CONFIRMED,DST_NAT\]$/);
    assert.deepEqual(json.conntrack.statusNames, ['SEEN_REPLY', 'ASSURED', 'CONFIRMED', 'DST_NAT']);
    // The same account after the binary round trip a stream client makes.
    assert.equal(eventSummary(pb.Event.decode(pb.Event.encode(i!.event).finish())), json.summary);
  });
});
