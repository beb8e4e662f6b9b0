import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { classifyEvent, rulePathOf, tcpStateLeft } from '../../src/flows/classify';
import type { Flow } from '../../src/flows/types';
import type { RuleTrace } from '../../src/events/decode';
import { Dir, EventKind, NfStage } from '../../src/events/layout';
import { IPS_CONFIRMED, IPS_DST_NAT, IPS_SRC_NAT } from '../../src/events/conntrack';
import { svctrace } from '../../src/gen/svctrace';
import { ev, orig, reply } from '../helpers/kernel-events';

import S = svctrace.v1.Stage;



function flow(over: Partial<Flow> = {}): Flow {
  return {
    id: 1, key: 'ct:ffff1', tupleIndexKey: '', service: '10.96.0.100:80/tcp', serviceId: 1, proto: 6, orig, reply, ctId: 'ffff1', ctBirth: 0,
    nodeNetnsIno: 111, status: 0, tcpState: 0, dnat: false, masqueraded: false, packets: [0, 0], bytes: [0, 0], kernelDrops: 0, synsResent: 0, countersFinal: false, firstTsNs: 0n, lastTsNs: 0n,
    closed: false, drops: [], reset: false, icmpErrors: [], rulePath: [], seen: [], countedOnly: false, ...over,
  };
}

const ctx = { dropReasonName: (r: number) => ({ 2: 'NO_SOCKET', 12: 'NETFILTER_DROP', 3: 'TCP_CLOSE' })[r] ?? `reason ${r}`, netnsName: (ino: number) => (ino === 222 ? 'pod-a' : undefined) };

describe('classifyEvent (pure)', () => {
  it('a new connection matches its service; the milestone is reported once, and the flow is not written', () => {
    const f = flow();
    const c = classifyEvent(f, ev({}), ctx);
    assert.equal(c.stage, S.STAGE_MATCH);
    assert.equal(c.milestone, true);
    assert.equal(c.seenKey, 'match');
    assert.equal(f.seen.length, 0, 'classification does not touch the flow');
    assert.equal(classifyEvent(flow({ seen: ['match'] }), ev({}), ctx).milestone, false);
  });

  it('DNAT, no DNAT, SNAT and the reply un-DNAT', () => {
    const after = { nfStage: NfStage.AFTER_NAT, nfPriority: -99 };
    const dnat = classifyEvent(flow(), ev({ ...after, ctStatus: IPS_DST_NAT }), ctx);
    assert.equal(dnat.stage, S.STAGE_DNAT);
    assert.equal(dnat.seenKey, 'dnat');
    const none = classifyEvent(flow(), ev({ ...after }), ctx);
    assert.equal(none.seenKey, 'no-dnat');
    const snat = classifyEvent(flow(), ev({ nfHook: 4, nfStage: NfStage.AFTER_NAT, nfPriority: 100, ctStatus: IPS_DST_NAT | IPS_SRC_NAT | IPS_CONFIRMED }), ctx);
    assert.equal(snat.stage, S.STAGE_SNAT);
    assert.equal(snat.seenKey, 'snat');
    const back = classifyEvent(flow(), ev({ dir: Dir.REPLY, nfHook: 1, ...after, pkt: { saddr: '10.96.0.100', daddr: '10.244.1.1', sport: 80, dport: 40000, proto: 6 } }), ctx);
    assert.equal(back.stage, S.STAGE_REPLY);
    assert.equal(back.seenKey, 'reply');
  });

  it('a device crossing in a pod namespace names the backend namespace as an effect', () => {
    const c = classifyEvent(flow(), ev({ kind: EventKind.DEV_RECV, netnsIno: 222, ifname: 'eth0', linkKind: 'veth' }), ctx);
    assert.equal(c.stage, S.STAGE_DEVICE);
    assert.equal(c.podSide, true);
    assert.equal(classifyEvent(flow(), ev({ kind: EventKind.DEV_RECV, netnsIno: 111 }), ctx).podSide, false, 'the node\'s own device');
    assert.deepEqual(c.effects, { backendNetns: 'pod-a' });
    assert.equal(c.seenKey, 'dev:0:recv:eth0:222');
  });

  it('device milestone keys name the device, direction and verb, for many devices sharing names, indexes and renamed', () => {
    // Pods' devices share a name and an ifindex and differ by namespace; a
    // device can be renamed under its ifindex: each key is its own.
    const want = (e: Parameters<typeof classifyEvent>[1]) => `dev:${e.dir}:${e.kind === EventKind.DEV_XMIT ? 'xmit' : 'recv'}:${e.ifname}:${e.netnsIno}`;
    for (let pass = 0; pass < 2; pass++) {
      for (let ino = 4026531840; ino < 4026531840 + 700; ino++) {
        for (const kind of [EventKind.DEV_RECV, EventKind.DEV_XMIT]) {
          for (const dir of [Dir.ORIGINAL, Dir.REPLY]) {
            for (const ifname of ['eth0', pass ? 'eth1' : 'eth0']) {
              const e = ev({ kind, dir, netnsIno: ino, ifindex: 2 + (ino % 3), ifname, linkKind: 'veth' });
              assert.equal(classifyEvent(flow(), e, ctx).seenKey, want(e));
            }
          }
        }
      }
    }
  });

  it('drops: failures are effects and milestones; benign frees are neither', () => {
    const d = classifyEvent(flow(), ev({ kind: EventKind.DROP, reason: 12 }), ctx);
    assert.deepEqual(d.effects, { drop: 'NETFILTER_DROP' });
    assert.equal(d.milestone, true);
    const benign = classifyEvent(flow(), ev({ kind: EventKind.DROP, reason: 3 }), ctx);
    assert.deepEqual(benign.effects, {});
    assert.equal(benign.milestone, false);
  });

  it('RST, ICMP errors and the conntrack destroy are first-time milestones with their effects', () => {
    const rst = classifyEvent(flow(), ev({ dir: Dir.REPLY, tcpFlags: 0x14 }), ctx);
    assert.equal(rst.stage, S.STAGE_DROP);
    assert.deepEqual(rst.effects, { reset: true, backendReset: true }, 'a reset in the reply direction is the backend\'s');
    assert.equal(rst.milestone, true);
    assert.deepEqual(classifyEvent(flow(), ev({ dir: Dir.ORIGINAL, tcpFlags: 0x14 }), ctx).effects, { reset: true }, 'the client\'s reset is not the backend refusing');
    assert.equal(classifyEvent(flow({ reset: true }), ev({ tcpFlags: 0x04 }), ctx).milestone, false);
    const icmp = classifyEvent(flow(), ev({ pkt: { ...orig, proto: 1 }, icmpType: 3, icmpCode: 3 }), ctx);
    assert.deepEqual(icmp.effects, { icmpError: 'port unreachable' });
    const again = classifyEvent(flow({ seen: ['icmp:3'] }), ev({ pkt: { ...orig, proto: 1 }, icmpType: 3, icmpCode: 3 }), ctx);
    assert.deepEqual(again.effects, {});
    const destroy = classifyEvent(flow(), ev({ kind: EventKind.CT_DESTROY, ctTcpState: 7 }), ctx);
    assert.equal(destroy.stage, S.STAGE_CLOSE);
    assert.deepEqual(destroy.effects, { closed: true });
    assert.equal(classifyEvent(flow({ closed: true }), ev({ kind: EventKind.CT_DESTROY }), ctx).milestone, false);
  });

  it('notes a TCP state change only when conntrack had a state before', () => {
    assert.equal(tcpStateLeft(ev({}), 0, 1), 0);
    assert.equal(tcpStateLeft(ev({}), 1, 1), 0);
    assert.equal(tcpStateLeft(ev({}), 1, 3), 1);
    assert.equal(tcpStateLeft(ev({ kind: EventKind.DROP }), 1, 3), 0);
  });
});

describe('rulePathOf (pure)', () => {
  const t = (table: string, chain: string): RuleTrace => ({ traceId: 1, tsNs: 1n, netnsIno: 111, table, chain, pkt: orig }) as unknown as RuleTrace;

  it('keeps the NAT chains from the base chain to the DNATing one, without our marking table', () => {
    const r = rulePathOf([t('svctrace_1', 'output'), t('filter', 'KUBE-FIREWALL'), t('nat', 'OUTPUT'), t('nat', 'KUBE-SERVICES'), t('nat', 'KUBE-SVC-X'), t('nat', 'KUBE-MARK-MASQ'), t('nat', 'KUBE-SEP-Y'), t('nat', 'KUBE-POSTROUTING')]);
    assert.ok(r);
    assert.deepEqual(r.path, ['OUTPUT', 'KUBE-SERVICES', 'KUBE-SVC-X', 'KUBE-SEP-Y']);
    assert.equal(r.masquerade, true);
    assert.match(r.summary, /observed, nftables trace, table nat\): OUTPUT -> KUBE-SERVICES -> KUBE-SVC-X -> KUBE-SEP-Y \(marked for masquerade\)$/);
  });

  it('names the rule whose verdict dropped or rejected the packet, in any table', () => {
    const v = (table: string, chain: string, type: number, verdict: number, ruleHandle: bigint): RuleTrace => ({ ...t(table, chain), type, verdict, ruleHandle }) as RuleTrace;
    // A Service without endpoints: nat finds no service chain, filter KUBE-SERVICES REJECTs (a drop verdict).
    const r = rulePathOf([t('nat', 'OUTPUT'), t('nat', 'KUBE-SERVICES'), v('filter', 'OUTPUT', 3, -3, 2n), v('filter', 'KUBE-SERVICES', 3, 0, 7n)]);
    assert.ok(r);
    assert.equal(r.droppedBy, 'table filter chain KUBE-SERVICES rule handle 7');
    assert.match(r.summary, /OUTPUT -> KUBE-SERVICES; dropped or rejected by table filter chain KUBE-SERVICES rule handle 7$/);
    // A chain's policy.
    assert.equal(rulePathOf([v('filter', 'FORWARD', 1, 0, 0n)])?.droppedBy, 'table filter chain FORWARD (its policy)');
    // Accept, jump and continue verdicts are not drops.
    assert.equal(rulePathOf([v('filter', 'INPUT', 3, 1, 1n), v('filter', 'INPUT', 3, -1, 2n)]), undefined);
  });

  it('nothing kube-proxy related: no path', () => {
    assert.equal(rulePathOf([t('svctrace_1', 'output'), t('filter', 'INPUT')]), undefined);
  });
});
