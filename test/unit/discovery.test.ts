/**
 * Rule discovery on kube-proxy-format rules (rendered by the lab in
 * kube-proxy's exact format): endpoints with their effective probabilities,
 * NodePorts, masquerade, affinity and services without endpoints, in
 * iptables and nftables modes.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import fs from 'node:fs';
import { parseIptablesSave, splitRule } from '../../src/discovery/iptables';
import { parseNftKubeProxy } from '../../src/discovery/nftables';
import { findByName, findByAddress, findByAnyAddress, tracedAddressesOf } from '../../src/discovery/model';
import { parseIpvsadm, withIptablesMasquerade, withIpvsNodePorts } from '../../src/discovery/ipvs';
import { renderIpvs } from '../../src/lab/kube-ipvs';
import { explain, formatExplanation } from '../../src/explain/explain';
import { runDoctor } from '../../src/doctor/doctor';
import { BackendState, BackendView, Diagnosis, diagnoseBackends, diagnoseRules, diagnoseTraffic } from '../../src/explain/diagnose';
import { KubeService, renderFilterTable, renderNatTable } from '../../src/lab/kube-rules';

const eps = [10, 11, 12].map((h) => ({ ip: `10.244.1.${h}`, port: 8080 }));
const services: KubeService[] = [
  { namespace: 'default', name: 'web', portName: 'http', clusterIP: '10.96.0.100', port: 80, proto: 'tcp', nodePort: 30080, endpoints: eps },
  { namespace: 'kube-system', name: 'kube-dns', portName: 'dns', clusterIP: '10.96.0.10', port: 53, proto: 'udp', endpoints: eps.map((e) => ({ ...e, port: 5353 })).slice(0, 2) },
  { namespace: 'default', name: 'empty', portName: 'http', clusterIP: '10.96.0.200', port: 80, proto: 'tcp', endpoints: [] },
];

describe('iptables-save discovery', () => {
  const save = renderNatTable(services, { clusterCIDR: '10.244.0.0/16' }) + renderFilterTable(services);
  const d = parseIptablesSave(save);

  it('splits quoted comments', () => {
    assert.deepEqual(splitRule('-A X -m comment --comment "default/web:http cluster IP" -j Y'), ['-A', 'X', '-m', 'comment', '--comment', 'default/web:http cluster IP', '-j', 'Y']);
  });

  it('finds each service with its endpoints and effective probabilities (1/3 each from 0.333/0.5/1)', () => {
    assert.equal(d.mode, 'iptables');
    const web = findByName(d, 'default/web')[0]!;
    assert.equal(web.clusterIP, '10.96.0.100');
    assert.deepEqual(web.endpoints.map((e) => e.ip), ['10.244.1.10', '10.244.1.11', '10.244.1.12']);
    for (const e of web.endpoints) assert.ok(Math.abs(e.probability - 1 / 3) < 1e-6, `${e.ip}: ${e.probability}`);
    assert.match(web.endpoints[0]!.chain, /^KUBE-SEP-/);
    assert.deepEqual(web.nodePorts, [30080]);
    assert.equal(web.nodePortMasquerade, true);
    assert.equal(web.masqueradeUnless, '10.244.0.0/16');
    const dns = findByName(d, 'kube-system/kube-dns:dns')[0]!;
    assert.equal(dns.proto, 'udp');
    assert.deepEqual(dns.endpoints.map((e) => e.probability), [0.5, 0.5]);
    assert.equal(d.masqueradeRule, true);
  });

  it('marks services without endpoints (REJECT), and explain says so instead of an empty chain', () => {
    const empty = findByName(d, 'default/empty:http')[0]!;
    assert.equal(empty.rejects, true);
    assert.equal(empty.endpoints.length, 0);
    const text = formatExplanation({ target: 'default/empty', netns: 'node', mode: d.mode, service: empty, backends: [], diagnoses: [] });
    assert.match(text, /rules: KUBE-SERVICES in the filter table REJECTs it \(no endpoints\)/);
    assert.doesNotMatch(text, /\(none\)/);
  });

  it('finds externalIPs and LoadBalancer IPs, and a Service by name covers every address kube-proxy DNATs for it', () => {
    const more = save.replace(
      '-A KUBE-NODEPORTS ',
      [
        '-A KUBE-SERVICES -d 192.168.99.22/32 -p tcp -m comment --comment "default/web:http external IP" -m tcp --dport 80 -j KUBE-EXT-CDGGSHYLG3RE2FKL',
        '-A KUBE-SERVICES -d 203.0.113.7/32 -p tcp -m comment --comment "default/web:http loadbalancer IP" -m tcp --dport 80 -j KUBE-EXT-CDGGSHYLG3RE2FKL',
        '-A KUBE-NODEPORTS ',
      ].join('\n'),
    );
    const web = findByName(parseIptablesSave(more), 'default/web')[0]!;
    assert.deepEqual(web.externalIPs, ['192.168.99.22', '203.0.113.7']);
    // Traced by name, its external address is in the rules (not RULES_MISSING for the live diagnoser).
    assert.equal(findByAnyAddress(parseIptablesSave(more), '203.0.113.7', 80, 'tcp')?.name, 'default/web:http');
    assert.equal(findByAnyAddress(parseIptablesSave(more), '203.0.113.8', 80, 'tcp'), undefined);
    assert.deepEqual(
      tracedAddressesOf(web).map((a) => `${a.kind} ${a.address ?? '*'}:${a.port}/${a.proto}`),
      ['cluster-ip 10.96.0.100:80/tcp', 'external-ip 192.168.99.22:80/tcp', 'external-ip 203.0.113.7:80/tcp', 'nodeport *:30080/tcp'],
    );
  });

  it('a Service without endpoints is NO_ENDPOINTS, never also RULES_MISSING for the connections it refused', () => {
    const empty = findByName(d, 'default/empty:http')[0]!;
    const refused = { seconds: 5, flows: 1, notDnated: 1, backends: [], masqueraded: 0 };
    const codes = [...diagnoseRules(empty, 'default/empty', true), ...diagnoseTraffic(empty, refused)].map((x) => x.code);
    assert.ok(codes.includes('NO_ENDPOINTS'), codes.join());
    assert.ok(!codes.includes('RULES_MISSING'), codes.join());
    // With endpoints, a connection left undnated does mean the rules failed it.
    const web = findByName(d, 'default/web:http')[0]!;
    assert.ok(diagnoseTraffic(web, refused).some((x) => x.code === 'RULES_MISSING'));
  });

  it('unanswered connections: the drop the kernel saw is cited (pod firewall); without one, a broken reply path', () => {
    const web = findByName(d, 'default/web:http')[0]!;
    const backend = (over: object) => ({ backend: '10.244.1.11:8080', flows: 4, answered: 0, resets: 0, maxPacketsPerFlow: 3, clients: new Set(['10.250.0.2']), ...over });
    const dropped = diagnoseTraffic(web, { seconds: 5, flows: 4, notDnated: 0, masqueraded: 0, backends: [backend({ droppedBy: new Map([['NETFILTER_DROP', 4]]), dropRules: new Set(['table filter chain INPUT rule handle 2']) })] });
    const f = dropped.find((x) => x.code === 'BACKEND_FILTERED')!;
    assert.match(f.summary, /4 of 4 connections to 10\.244\.1\.11:8080 got no reply: the kernel dropped their packets \(NETFILTER_DROP in 4\), by table filter chain INPUT rule handle 2/);
    assert.ok(!dropped.some((x) => x.code === 'REPLY_PATH_BROKEN'));
    const silent = diagnoseTraffic(web, { seconds: 5, flows: 4, notDnated: 0, masqueraded: 0, backends: [backend({})] });
    assert.ok(silent.some((x) => x.code === 'REPLY_PATH_BROKEN' && /no drop was seen/.test(x.summary)));
  });

  it('unanswered connections are told apart by the kernel\'s evidence: ARP, route, ICMP reject, a reply routed away, a gone pod', () => {
    const web = findByName(d, 'default/web:http')[0]!;
    const backend = (over: object) => ({ backend: '10.244.1.11:8080', flows: 4, answered: 0, resets: 0, maxPacketsPerFlow: 3, clients: new Set(['10.250.0.2']), ...over });
    const traffic = (over: object) => ({ seconds: 5, flows: 4, notDnated: 0, masqueraded: 0, backends: [backend(over)] });
    const route = { ok: true, dev: 'cni0', src: '10.244.1.1' };
    const view = (over: Partial<BackendView>): BackendView => ({ holderOf: () => 'pod1-ns', routeOf: () => route, replyPathOf: () => undefined, tunnelOf: () => undefined, ...over });
    const one = (ds: Diagnosis[]) => ds.filter((x) => x.severity === 'error').map((x) => `${x.code} ${x.object}`);
    const arp = traffic({ droppedBy: new Map([['NEIGH_FAILED', 4]]) });
    assert.deepEqual(one(diagnoseTraffic(web, arp, view({}))), ['NEIGHBOUR_FAILED backend 10.244.1.11:8080'], 'the pod is here but deaf to ARP');
    assert.deepEqual(one(diagnoseTraffic(web, arp, view({ holderOf: () => null }))), ['GHOST_BACKEND backend 10.244.1.11:8080'], 'no pod has the address');
    assert.deepEqual(one(diagnoseTraffic(web, traffic({ droppedBy: new Map([['NOT_SPECIFIED', 4]]) }), view({ routeOf: () => ({ ok: false, error: 'blackhole' }) }))), ['NO_ROUTE backend 10.244.1.11:8080']);
    const rejected = diagnoseTraffic(web, traffic({ droppedBy: new Map([['NETFILTER_DROP', 4]]), icmpBy: new Map([['port unreachable', 4]]) }), view({}));
    assert.deepEqual(one(rejected), ['BACKEND_FILTERED backend 10.244.1.11:8080']);
    assert.match(rejected.find((x) => x.code === 'BACKEND_FILTERED')!.summary, /a firewall rejected them/);
    // A pod dropping its own replies: a firewall (by its reason, or before
    // Linux 5.17 by where netfilter freed them), not a broken reply path.
    for (const [reason, code] of [['NETFILTER_DROP', 'BACKEND_FILTERED'], ['UNKNOWN@nf_hook_slow', 'BACKEND_FILTERED'], ['UNKNOWN@ip_rcv_core', 'REPLY_PATH_BROKEN']]) {
      const replies = traffic({ droppedBy: new Map([[reason, 4]]), replyDroppedAt: new Map([[`${reason} at eth0 in pod1-ns`, 4]]) });
      assert.deepEqual(one(diagnoseTraffic(web, replies, view({}))), [`${code} backend 10.244.1.11:8080`], reason);
    }
    const away = diagnoseTraffic(web, traffic({}), view({ replyPathOf: () => ({ dev: 'other0', expected: 'eth0', netns: 'pod1-ns' }) }));
    assert.deepEqual(one(away), ['REPLY_PATH_BROKEN backend 10.244.1.11:8080']);
    assert.match(away[0]!.summary, /out of other0, not eth0/);
    // A backend on another node, nothing answering through the tunnel: the overlay, not the pod.
    const tunnel = { dev: 'flannel.1', kind: 'vxlan', remote: '10.250.1.2', gateway: '10.244.100.2', gatewayNeighbour: 'FAILED' };
    assert.deepEqual(one(diagnoseTraffic(web, arp, view({ holderOf: () => undefined, tunnelOf: () => tunnel }))), ['TUNNEL_BROKEN tunnel flannel.1']);
    // Packets dropped as too big for the path, in answered flows too: the MTU, with where.
    const big = diagnoseTraffic(web, traffic({ answered: 4, tooBig: 2, tooBigAt: new Set(['at veth0 in node2']) }), view({}));
    assert.deepEqual(one(big), ['MTU_MISMATCH backend 10.244.1.11:8080']);
    assert.match(big[0]!.summary, /PKT_TOO_BIG at veth0 in node2/);
    // Reply packets dropped on their way back (not by a firewall): the reply path, citing where.
    const lost = diagnoseTraffic(web, traffic({ droppedBy: new Map([['NOT_SPECIFIED', 4]]), replyDroppedAt: new Map([['NOT_SPECIFIED at other0 in pod1-ns', 4]]) }), view({}));
    assert.deepEqual(one(lost), ['REPLY_PATH_BROKEN backend 10.244.1.11:8080']);
    // No drop seen, and no namespace on this node has the address of a local pod subnet: gone, not a reply path.
    assert.deepEqual(one(diagnoseTraffic(web, traffic({}), view({ holderOf: () => null }))), ['GHOST_BACKEND backend 10.244.1.11:8080']);
  });

  it('the probe: a reset is nothing listening, an ICMP refusal a firewall, a timeout with replies routed away the reply path', () => {
    const web = findByName(d, 'default/web:http')[0]!;
    const state = (over: Partial<BackendState>): BackendState => ({ ip: '10.244.1.11', port: 8080, route: { ok: true, dev: 'cni0' }, neighbour: { state: 'REACHABLE' }, ...over });
    const codes = (b: BackendState) => diagnoseBackends(web, [b]).map((x) => x.code);
    assert.deepEqual(codes(state({ probe: 'refused' })), ['BACKEND_NOT_LISTENING']);
    assert.deepEqual(codes(state({ probe: 'rejected' })), ['BACKEND_FILTERED']);
    assert.deepEqual(codes(state({ probe: 'timeout' })), ['BACKEND_FILTERED']);
    assert.deepEqual(codes(state({ probe: 'timeout', holder: 'pod1-ns', replyPath: { dev: 'other0', expected: 'eth0', netns: 'pod1-ns' } })), ['REPLY_PATH_BROKEN']);
    assert.deepEqual(codes(state({ probe: 'silent', neighbour: { state: 'FAILED' }, holder: 'pod1-ns' })), ['NEIGHBOUR_FAILED']);
    assert.deepEqual(codes(state({ probe: 'silent', neighbour: { state: 'FAILED' }, holder: null })), ['GHOST_BACKEND']);
    assert.deepEqual(codes(state({ probe: 'silent', holder: 'pod1-ns' })), ['REPLY_PATH_BROKEN']);
    assert.deepEqual(codes(state({ route: { ok: false, error: 'blackhole' } })), ['NO_ROUTE']);
    // Every diagnosis names its object.
    assert.equal(diagnoseBackends(web, [state({ probe: 'refused' })])[0]!.object, 'backend 10.244.1.11:8080');
  });

  it('externalTrafficPolicy: Local with no endpoint on this node: NodePort traffic is dropped here, and said so', () => {
    const remote: KubeService = { namespace: 'default', name: 'remote', portName: 'http', clusterIP: '10.96.0.50', port: 80, proto: 'tcp', nodePort: 30050, externalTrafficPolicy: 'Local', endpoints: [{ ip: '10.244.2.10', port: 8080, remote: true }] };
    const all = [...services, remote];
    const parsed = parseIptablesSave(renderNatTable(all, { clusterCIDR: '10.244.0.0/16' }) + renderFilterTable(all));
    const svc = findByName(parsed, 'default/remote')[0]!;
    assert.equal(svc.noLocalEndpoints, true);
    assert.deepEqual(svc.nodePorts, [30050]);
    const nle = diagnoseRules(svc, 'default/remote', true).find((x) => x.code === 'NO_LOCAL_ENDPOINTS');
    assert.ok(nle && nle.severity === 'error' && nle.object === 'service default/remote:http');
    // With a local endpoint, or with policy Cluster, nothing is dropped.
    const withLocal = { ...remote, endpoints: [...remote.endpoints, { ip: '10.244.1.10', port: 8080 }] };
    assert.equal(findByName(parseIptablesSave(renderNatTable([withLocal], { clusterCIDR: '10.244.0.0/16' }) + renderFilterTable([withLocal])), 'default/remote')[0]!.noLocalEndpoints, undefined);
    assert.equal(findByName(d, 'default/web')[0]!.noLocalEndpoints, undefined);
    // kube-proxy before 1.24: a nat KUBE-XLB-* chain drops it (KUBE-MARK-DROP), same comment.
    const old = save.replace('COMMIT', '-A KUBE-XLB-AAAA -m comment --comment "default/web:http has no local endpoints" -j KUBE-MARK-DROP\nCOMMIT');
    assert.equal(findByName(parseIptablesSave(old), 'default/web')[0]!.noLocalEndpoints, true);
  });

  it('lists a NodePort once when kube-proxy writes it in several KUBE-NODEPORTS rules', () => {
    const nodeport = save.split('\n').find((l) => l.startsWith('-A KUBE-NODEPORTS '))!;
    const twice = save.replace(nodeport, `${nodeport}\n${nodeport.replace('-A KUBE-NODEPORTS ', '-A KUBE-NODEPORTS -d 127.0.0.0/8 ')}`);
    const web = findByName(parseIptablesSave(twice), 'default/web')[0]!;
    assert.deepEqual(web.nodePorts, [30080]);
    assert.match(formatExplanation({ target: 'default/web', netns: 'node', mode: 'iptables', service: web, backends: [], diagnoses: [] }), /NodePorts: 30080 \(/);
  });

  it('reads session affinity from -m recent rules', () => {
    const aff = save.replace(
      /(-A (KUBE-SVC-\S+) -m comment --comment "default\/web:http -> 10\.244\.1\.10:8080")/,
      '-A $2 -m comment --comment "default/web:http -> 10.244.1.10:8080" -m recent --name KUBE-SEP-AAAA --mask 255.255.255.255 --rsource --rcheck --seconds 10800 --reap -j KUBE-SEP-AAAA\n$1',
    );
    assert.equal(findByName(parseIptablesSave(aff), 'default/web')[0]!.affinitySeconds, 10800);
  });
});

describe('nftables discovery', () => {
  it('reads kube-proxy\'s nftables table from nft -j (libnftables JSON)', () => {
    // test/fixtures/kube-proxy-nft.json: the lab's rules as a live nft lists them (scripts/gen-nft-fixture.sh).
    const json = fs.readFileSync(path.join(__dirname, '..', '..', '..', 'test', 'fixtures', 'kube-proxy-nft.json'), 'utf8');
    const d = parseNftKubeProxy(json);
    assert.equal(d.mode, 'nftables');
    assert.deepEqual(d.warnings, []);
    const web = findByName(d, 'default/web:http')[0]!;
    assert.equal(web.clusterIP, '10.96.0.100');
    assert.deepEqual(web.endpoints.map((e) => `${e.ip}:${e.port}`), ['10.244.1.10:8080', '10.244.1.11:8080', '10.244.1.12:8080']);
    for (const e of web.endpoints) assert.ok(Math.abs(e.probability - 1 / 3) < 1e-9);
    assert.match(web.chain, /^service-[A-Z0-9]{8}-default\/web\/tcp\/http$/);
    assert.deepEqual(web.nodePorts, [30080]);
    assert.equal(web.nodePortMasquerade, true);
    assert.equal(web.masqueradeUnless, '10.244.0.0/16');
    const dns = findByName(d, 'kube-system/kube-dns:dns')[0]!;
    assert.equal(dns.proto, 'udp');
    assert.deepEqual(dns.endpoints.map((e) => e.probability), [0.5, 0.5]);
    assert.equal(findByName(d, 'default/empty')[0]!.rejects, true);
    assert.equal(d.masqueradeRule, true);
    // An externalIP in service-ips goes to the Service's external-* chain: an address of web, not a Service of its own.
    const doc = JSON.parse(json) as { nftables: Array<{ map?: { name: string; elem: unknown[] } }> };
    const ips = doc.nftables.find((x) => x.map?.name === 'service-ips')!.map!;
    const ext = web.chain.replace(/^service-/, 'external-');
    ips.elem.push([{ concat: ['192.168.99.22', 'tcp', 80] }, { goto: { target: ext } }]);
    const d2 = parseNftKubeProxy(JSON.stringify(doc));
    assert.deepEqual(findByName(d2, 'default/web:http')[0]!.externalIPs, ['192.168.99.22']);
    assert.equal(d2.services.length, d.services.length, 'no pseudo-service for the external address');
    // An endpoint chain whose DNAT was changed: its name and hairpin rule still name the pod (a stale rule).
    const stale = JSON.parse(json) as { nftables: Array<{ rule?: { chain: string; expr: Array<{ dnat?: { addr: string } }> } }> };
    const epRule = stale.nftables.find((x) => x.rule?.chain.includes('__10.244.1.11/8080') && x.rule.expr.some((st) => st.dnat))!.rule!;
    epRule.expr.find((st) => st.dnat)!.dnat!.addr = '10.244.1.99';
    const ep = findByName(parseNftKubeProxy(JSON.stringify(stale)), 'default/web:http')[0]!.endpoints.find((x) => x.ip === '10.244.1.99')!;
    assert.equal(ep.ruleAddress, '10.244.1.11');
    // Not JSON at all: no rules, said so.
    assert.equal(parseNftKubeProxy('table ip kube-proxy {').mode, 'none');
  });
});

describe('IPVS discovery (ipvsadm -Ln)', () => {
  it('reads virtual services, real servers and their shares as the scheduler gives them', () => {
    const text = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.100:80 rr
  -> 10.244.1.10:8080             Masq    1      0          0
  -> 10.244.1.11:8080             Masq    1      3          1
  -> 10.244.1.12:8080             Masq    2      0          0
  -> 10.244.1.13:8080             Masq    0      0          7
TCP  10.96.0.101:80 wrr
  -> 10.244.1.10:8080             Masq    1      0          0
  -> 10.244.1.11:8080             Masq    1      0          0
  -> 10.244.1.12:8080             Masq    2      0          0
  -> 10.244.1.13:8080             Masq    0      0          0
UDP  10.96.0.10:53 rr persistent 10800
  -> 10.244.1.10:5353             Masq    1      0          4
TCP  10.96.0.102:80 rr
  -> 10.244.1.10:8080             Masq    0      0          0
`;
    const d = parseIpvsadm(text);
    assert.equal(d.mode, 'ipvs');
    // rr ignores weights but 0 (a terminating endpoint, as kube-proxy sets it).
    const web = findByAddress(d, '10.96.0.100', 80, 'tcp')!;
    assert.deepEqual(web.endpoints.map((e) => e.probability), [1 / 3, 1 / 3, 1 / 3, 0]);
    assert.equal(web.chain, 'ipvs rr');
    const weighted = findByAddress(d, '10.96.0.101', 80, 'tcp')!;
    assert.deepEqual(weighted.endpoints.map((e) => e.probability), [0.25, 0.25, 0.5, 0]);
    // Persistence is session affinity, with IPVS's own words as evidence.
    const affinity = diagnoseRules(findByAddress(d, '10.96.0.10', 53, 'udp')!, '10.96.0.10:53/udp', true).find((x) => x.code === 'SESSION_AFFINITY');
    assert.deepEqual(affinity?.evidence, ['IPVS virtual service 10.96.0.10:53 is persistent (ipvsadm: persistent 10800)']);
    // The masquerade stays in iptables: read from kube-proxy's IPVS-mode nat table, and its absence diagnosed.
    for (const masquerade of [true, false]) {
      const nat = renderIpvs([], { clusterCIDR: '10.244.0.0/16', nodeIPs: ['10.250.0.1'], masquerade }).iptables;
      const m = withIptablesMasquerade(d, nat);
      assert.equal(m.masqueradeRule, masquerade);
      const web2 = findByAddress(m, '10.96.0.100', 80, 'tcp')!;
      assert.equal(web2.masqueradeUnless, '10.244.0.0/16');
      assert.equal(diagnoseRules(web2, '10.96.0.100:80', m.masqueradeRule).some((x) => x.code === 'MASQUERADE_RULE_MISSING'), !masquerade);
    }
    // Every real server quiesced: no connection goes anywhere.
    assert.deepEqual(findByAddress(d, '10.96.0.102', 80, 'tcp')!.endpoints.map((e) => e.probability), [0]);
    const dns = findByAddress(d, '10.96.0.10', 53, 'udp')!;
    assert.equal(dns.affinitySeconds, 10800);
    assert.equal(dns.endpoints[0]!.probability, 1);
  });

  it('NodePorts and their traffic policy from kube-proxy\'s ipsets: a Local NodePort without a real server here is NO_LOCAL_ENDPOINTS, not NO_ENDPOINTS', () => {
    const svc = (externalTrafficPolicy: 'Cluster' | 'Local') => ({
      namespace: 'default', name: 'remote', portName: 'http', clusterIP: '10.96.0.50', port: 80, proto: 'tcp' as const, nodePort: 30050, externalTrafficPolicy,
      endpoints: [{ ip: '10.244.2.10', port: 8080, remote: true }],
    });
    const ipvsadm = `TCP  10.96.0.50:80 rr
  -> 10.244.2.10:8080             Masq    1      0          0
TCP  10.250.0.1:30050 rr
  -> 10.244.2.10:8080             Masq    1      0          0
`;
    // Cluster: the NodePort has the remote pod and is masqueraded.
    const cluster = withIpvsNodePorts(parseIpvsadm(ipvsadm), renderIpvs([svc('Cluster')], { clusterCIDR: '10.244.0.0/16', nodeIPs: ['10.250.0.1'] }).ipset);
    const np = findByAddress(cluster, '10.250.0.1', 30050, 'tcp')!;
    assert.deepEqual([np.nodePorts, np.nodePortMasquerade, np.noLocalEndpoints], [[30050], true, undefined]);
    assert.deepEqual(findByAddress(cluster, '10.96.0.50', 80, 'tcp')!.nodePorts, [], 'a ClusterIP virtual service is not a NodePort');
    // Local, its only pod on another node: no real server here.
    const localText = ipvsadm.split('\n').filter((l, i) => i !== 3).join('\n');
    const local = withIpvsNodePorts(parseIpvsadm(localText), renderIpvs([svc('Local')], { clusterCIDR: '10.244.0.0/16', nodeIPs: ['10.250.0.1'] }).ipset);
    const lnp = findByAddress(local, '10.250.0.1', 30050, 'tcp')!;
    assert.deepEqual([lnp.nodePortMasquerade, lnp.noLocalEndpoints], [false, true]);
    const codes = diagnoseRules(lnp, '10.250.0.1:30050', true).filter((x) => x.severity === 'error');
    assert.deepEqual(codes.map((x) => `${x.code} ${x.object}`), ['NO_LOCAL_ENDPOINTS service 10.250.0.1:30050']);
    assert.match(codes[0]!.summary, /IPVS has no real server for it here and refuses/);
  });

  it('connections IPVS could not route to a real server look un-DNATed: NO_ROUTE for that server, not RULES_MISSING', () => {
    const web = findByAddress(parseIpvsadm(`TCP  10.96.0.100:80 rr
  -> 10.244.1.10:8080             Masq    1      0          0
  -> 10.244.1.11:8080             Masq    1      0          0
`), '10.96.0.100', 80, 'tcp')!;
    const traffic = { seconds: 5, flows: 6, notDnated: 3, masqueraded: 0, backends: [] };
    const view = (blackholed: string | undefined): BackendView => ({
      holderOf: () => undefined,
      routeOf: (ip) => (ip === blackholed ? { ok: false, error: 'blackhole' } : { ok: true, dev: 'cni0' }),
      replyPathOf: () => undefined,
      tunnelOf: () => undefined,
    });
    const errors = (ds: Diagnosis[]) => ds.filter((x) => x.severity === 'error').map((x) => `${x.code} ${x.object}`);
    const said = diagnoseTraffic(web, traffic, view('10.244.1.11'));
    assert.deepEqual(errors(said), ['NO_ROUTE backend 10.244.1.11:8080']);
    assert.match(said[0]!.summary, /3 of 6 connections .* no usable route to the real server 10\.244\.1\.11:8080 \(blackhole\)/);
    // Every real server routable: the un-DNATed connections stay unexplained
    // by routing, and the rules (the virtual service) are there: a warning, not RULES_MISSING.
    const unexplained = diagnoseTraffic(web, traffic, view(undefined));
    assert.deepEqual(errors(unexplained), []);
    assert.deepEqual(unexplained.map((d) => `${d.code} ${d.severity}`), ['IPVS_NOT_FORWARDED warning']);
    assert.match(unexplained[0]!.summary, /^3 of 6 connections to 10\.96\.0\.100:80 showed no DNAT by IPVS/);
  });
});

describe('--netns given empty', () => {
  it("doctor and explain refuse it (bad input), never inspecting their own namespace's rules instead", async () => {
    assert.throws(() => runDoctor({ netns: '' }), { code: 'BAD_INPUT', message: /empty/ });
    await assert.rejects(explain({ target: '10.96.0.100:80', netns: '' }), { code: 'BAD_INPUT', message: /empty/ });
  });
});
