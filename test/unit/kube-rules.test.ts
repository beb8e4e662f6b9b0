import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { endpointProbability, renderNatTable, svcChain, KubeService } from '../../src/lab/kube-rules';
import { renderIpvs } from '../../src/lab/kube-ipvs';

const web: KubeService = {
  namespace: 'default', name: 'web', portName: 'http', clusterIP: '10.96.0.100', port: 80, proto: 'tcp', nodePort: 30080,
  endpoints: [{ ip: '10.244.1.10', port: 8080 }, { ip: '10.244.1.11', port: 8080 }, { ip: '10.244.1.12', port: 8080 }],
};

describe('kube-proxy rule rendering', () => {
  it('chains probabilities like kube-proxy: 1/3, 1/2, then the rest', () => {
    assert.equal(endpointProbability(0, 3), '0.33333333333');
    assert.equal(endpointProbability(1, 3), '0.50000000000');
    const text = renderNatTable([web], { clusterCIDR: '10.244.0.0/16' });
    const svcRules = text.split('\n').filter((l) => l.startsWith(`-A ${svcChain(web)} `) && l.includes('KUBE-SEP-'));
    assert.equal(svcRules.length, 3);
    assert.match(svcRules[0]!, /--probability 0\.33333333333/);
    assert.match(svcRules[1]!, /--probability 0\.50000000000/);
    assert.doesNotMatch(svcRules[2]!, /probability/);
  });
  it('uses kube-proxy chain names and comments', () => {
    assert.match(svcChain(web), /^KUBE-SVC-[A-Z2-7]{16}$/);
    const text = renderNatTable([web], { clusterCIDR: '10.244.0.0/16' });
    assert.match(text, /-A KUBE-SERVICES -d 10\.96\.0\.100\/32 -p tcp -m comment --comment "default\/web:http cluster IP"/);
    assert.match(text, /-j DNAT --to-destination 10\.244\.1\.12:8080/);
    assert.match(text, /-A KUBE-NODEPORTS -p tcp .* --dport 30080 -j KUBE-EXT-/);
    assert.match(text, /MASQUERADE --random-fully/);
  });
  it('omits MASQUERADE when asked', () => {
    assert.doesNotMatch(renderNatTable([web], { clusterCIDR: '10.244.0.0/16', masquerade: false }), /MASQUERADE/);
  });
});

describe('kube-proxy IPVS mode rendering', () => {
  const dns: KubeService = { namespace: 'kube-system', name: 'kube-dns', portName: 'dns', clusterIP: '10.96.0.10', port: 53, proto: 'udp', endpoints: [{ ip: '10.244.1.10', port: 5353 }], affinitySeconds: 10800 };
  const r = renderIpvs([web, dns], { clusterCIDR: '10.244.0.0/16', nodeIPs: ['10.250.0.1'] });
  it('a virtual server per ClusterIP:port and node address:NodePort, real servers in masquerade mode', () => {
    const lines = r.ipvsadm.trim().split('\n');
    assert.deepEqual(lines.filter((l) => l.startsWith('-A ')), ['-A -t 10.96.0.100:80 -s rr', '-A -t 10.250.0.1:30080 -s rr', '-A -u 10.96.0.10:53 -s rr -p 10800']);
    assert.equal(lines.filter((l) => l.startsWith('-a -t 10.96.0.100:80 -r ') && l.endsWith(' -m -w 1')).length, 3);
    assert.ok(lines.includes('-a -u 10.96.0.10:53 -r 10.244.1.10:5353 -m -w 1'));
    assert.deepEqual(r.addresses, ['10.96.0.100', '10.96.0.10']);
  });
  it('ipsets and mark-only nat rules, as kube-proxy writes them', () => {
    assert.match(r.ipset, /^add KUBE-CLUSTER-IP 10\.96\.0\.100,tcp:80$/m);
    assert.match(r.ipset, /^add KUBE-NODE-PORT-TCP 30080$/m);
    assert.match(r.iptables, /-A KUBE-SERVICES ! -s 10\.244\.0\.0\/16 .*--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ/);
    assert.doesNotMatch(r.iptables, /DNAT/, 'the balancing is IPVS\'s');
    assert.match(r.iptables, /MASQUERADE --random-fully/);
    assert.doesNotMatch(renderIpvs([web], { clusterCIDR: '10.244.0.0/16', nodeIPs: [], masquerade: false }).iptables, /MASQUERADE/);
  });
  it('externalTrafficPolicy: Local: the NodePort\'s real servers are the local endpoints, its port in KUBE-NODE-PORT-LOCAL-TCP and exempt from the mark', () => {
    const local: KubeService = { ...web, externalTrafficPolicy: 'Local', endpoints: [{ ip: '10.244.1.10', port: 8080 }, { ip: '10.244.2.10', port: 8080, remote: true }] };
    const l = renderIpvs([local], { clusterCIDR: '10.244.0.0/16', nodeIPs: ['10.250.0.1'] });
    const lines = l.ipvsadm.trim().split('\n');
    assert.deepEqual(lines.filter((x) => x.startsWith('-a -t 10.250.0.1:30080 ')), ['-a -t 10.250.0.1:30080 -r 10.244.1.10:8080 -m -w 1']);
    assert.equal(lines.filter((x) => x.startsWith('-a -t 10.96.0.100:80 ')).length, 2, 'the ClusterIP keeps every endpoint');
    assert.match(l.ipset, /^add KUBE-NODE-PORT-LOCAL-TCP 30080$/m);
    const nat = l.iptables.split('\n');
    const ret = nat.findIndex((x) => /--match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN/.test(x));
    assert.ok(ret >= 0 && ret < nat.findIndex((x) => /--match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ/.test(x)));
    assert.doesNotMatch(r.ipset, /^add KUBE-NODE-PORT-LOCAL/m);
  });
});
