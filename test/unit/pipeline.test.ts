import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { describe, it } from 'node:test';
import { staleMarkerTables } from '../../src/pipeline/rule-marker';
import { LiveDiagnoser, MAX_PENDING } from '../../src/explain/live';
import assert from 'node:assert/strict';
import { SinkSet, Sink } from '../../src/pipeline/sink';
import { deferStopSignals, resetStoppingForTests, waitForStop } from '../../src/pipeline/lifecycle';
import { serviceById, serviceIdsOf, serviceLabel, serviceLabelById } from '../../src/flows/service-ids';
import { argvInNetns, CURRENT_NETNS, runInNetns } from '../../src/netns/netns';
import { parseNodePortSpec, parseServiceSpec } from '../../src/net/ipv4';
import type { Flow, Ingested } from '../../src/flows/types';
import type { DiscoveredService } from '../../src/discovery/model';
import { IPS_SEEN_REPLY } from '../../src/events/conntrack';
import { parseRouteGet } from '../../src/explain/node-state';
import { mergeObserved, observeFlows } from '../../src/explain/diagnose';

describe('SinkSet', () => {
  it('a throwing sink is reported once and never stops the others', async () => {
    const warnings: string[] = [];
    const got: string[] = [];
    const broken: Sink = {
      name: 'broken',
      write: () => {
        throw new Error('disk full');
      },
      expired: () => {
        throw new Error('nope');
      },
      close: () => {
        throw new Error('cannot close');
      },
    };
    const good: Sink = { name: 'good', write: (items) => got.push(`write ${items.length}`), expired: (f) => got.push(`expired ${f.length}`), close: async () => void got.push('close') };
    const set = new SinkSet([broken, good], (w) => warnings.push(w));
    set.write([{} as Ingested]);
    set.write([{} as Ingested, {} as Ingested]);
    set.expired([{} as Flow]);
    await set.close();
    assert.deepEqual(got, ['write 1', 'write 2', 'expired 1', 'close']);
    assert.equal(warnings.length, 2, warnings.join('\n'));
    assert.match(warnings[0]!, /^broken output failed \(write\): disk full; the other outputs go on$/);
    assert.match(warnings[1]!, /^broken output failed 4 times in all$/);
    // The events it failed on are lost to its output, and counted (stage internal_error), and so is
    // the flow it failed to expire (its flow line, its end-of-flow counts); the good one's are not.
    assert.equal(set.lostEvents, 4);
  });

  it('counts the events of every output that failed, once per output', () => {
    const throwing = (name: string): Sink => ({
      name,
      write: () => {
        throw new Error('bug');
      },
    });
    const set = new SinkSet([throwing('a'), { name: 'ok', write: () => undefined }, throwing('b')], () => undefined);
    assert.equal(set.lostEvents, 0);
    set.write([{} as Ingested, {} as Ingested]);
    assert.equal(set.lostEvents, 4);
  });

  it('closes sinks in order, awaiting each', async () => {
    const order: string[] = [];
    const slow: Sink = { name: 'a', write: () => undefined, close: () => new Promise<void>((r) => setTimeout(() => (order.push('a'), r()), 20)) };
    const fast: Sink = { name: 'b', write: () => undefined, close: () => void order.push('b') };
    await new SinkSet([slow, fast], () => undefined).close();
    assert.deepEqual(order, ['a', 'b']);
  });
});

describe('service ids', () => {
  it('are 1-based indices in the traced list, labelled one way', () => {
    const list = [parseServiceSpec('10.96.0.100:80'), parseNodePortSpec('30080/udp')];
    assert.deepEqual(serviceIdsOf(list).map((x) => x.id), [1, 2]);
    assert.equal(serviceById(list, 2), list[1]);
    assert.equal(serviceById(list, 0), undefined);
    assert.equal(serviceLabel(list[0]!), '10.96.0.100:80/tcp');
    assert.equal(serviceLabelById(list, 2), '*:30080/udp');
    assert.equal(serviceLabelById(list, 7), 'service#7');
  });
});

describe('entering a namespace', () => {
  it('one argv for every command: nsenter by path, nothing for our own namespace', () => {
    assert.deepEqual(argvInNetns('lab-node', ['nft', 'list', 'ruleset']), ['nsenter', '--net=/run/netns/lab-node', '--', 'nft', 'list', 'ruleset']);
    assert.deepEqual(argvInNetns('/proc/42/ns/net', ['ip', 'route']), ['nsenter', '--net=/proc/42/ns/net', '--', 'ip', 'route']);
    assert.deepEqual(argvInNetns(CURRENT_NETNS, ['ip', 'route']), ['ip', 'route']);
  });
});

describe('waitForStop', () => {
  it('stops on SIGHUP (a closed terminal) like SIGINT/SIGTERM, and removes its handlers', async () => {
    const before = process.listenerCount('SIGHUP');
    const intBefore = process.listenerCount('SIGINT');
    const stopped = waitForStop(30);
    assert.equal(process.listenerCount('SIGHUP'), before + 1);
    process.emit('SIGHUP', 'SIGHUP');
    assert.equal(await stopped, 'signal');
    // Its own handlers are gone; while the command stops, the next signal is
    // answered (a message), not obeyed: one handler per signal (the one
    // after quits at once, its 'exit' hooks run: the child test below).
    assert.equal(process.listenerCount('SIGHUP'), before + 1);
    assert.equal(process.listenerCount('SIGINT'), intBefore + 1);
    const write = process.stderr.write;
    let said = '';
    process.stderr.write = ((s: string) => ((said += s), true)) as typeof process.stderr.write;
    try {
      process.emit('SIGINT', 'SIGINT');
    } finally {
      process.stderr.write = write;
    }
    assert.match(said, /stopping: writing what is left/);
    assert.equal(process.listenerCount('SIGHUP'), before + 1);
    assert.equal(process.listenerCount('SIGINT'), intBefore + 1);
    resetStoppingForTests(); // (the next signal would exit this process)
    assert.equal(process.listenerCount('SIGINT'), intBefore);
  });
});

describe('deferStopSignals: Ctrl-C while a command starts', () => {
  // In a child: the second signal's exit is the point.
  const lifecycle = path.resolve(__dirname, '..', '..', 'src', 'pipeline', 'lifecycle.js');
  const child = (signals: number) =>
    spawnSync(
      process.execPath,
      [
        '-e',
        `const l = require(${JSON.stringify(lifecycle)});
         const release = l.deferStopSignals('stopping once started');
         // Apart: two pending SIGINTs would be one.
         for (let i = 0; i < ${signals}; i++) setTimeout(() => process.kill(process.pid, 'SIGINT'), i * 150);
         setTimeout(async () => {
           const t0 = Date.now();
           const stopped = l.waitForStop(30); // takes over from the deferral
           console.log(await stopped, Date.now() - t0 < 5000, process.listenerCount('SIGTERM'));
         }, 600);`,
      ],
      { encoding: 'utf8', timeout: 20_000 },
    );

  it('one: answered, and the next waitForStop returns at once (the command ends the usual way)', () => {
    const r = child(1);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stderr, /svctrace: stopping once started; Ctrl-C again quits at once/);
    // 'signal' at once; one handler left: the one that answers a later impatient signal.
    assert.equal(r.stdout.trim(), 'signal true 1');
  });

  it('nothing is held while a waitForStop waits (it answers signals itself); a deferral is let go of by stop', async () => {
    const before = process.listenerCount('SIGINT');
    const ac = new AbortController();
    const waiting = waitForStop(undefined, ac.signal);
    deferStopSignals('x')();
    assert.equal(process.listenerCount('SIGINT'), before + 1, 'only waitForStop\'s');
    ac.abort();
    assert.equal(await waiting, 'aborted');
    // Two startups at once (tests run pipelines side by side): held until both let go.
    const first = deferStopSignals('x');
    const second = deferStopSignals('y');
    assert.equal(process.listenerCount('SIGINT'), before + 1, 'one set of handlers');
    first();
    first();
    assert.equal(process.listenerCount('SIGINT'), before + 1, 'still held by the second');
    second();
    assert.equal(process.listenerCount('SIGINT'), before);
  });

  it('while stopping: the second signal is answered, the third quits at once with exit hooks run (exit 130)', () => {
    const r = spawnSync(
      process.execPath,
      [
        '-e',
        `const l = require(${JSON.stringify(lifecycle)});
         process.on('exit', (code) => console.log('exit hook', code));
         l.waitForStop(30).then(() => setTimeout(() => console.log('not killed'), 5000));
         for (let i = 0; i < 3; i++) setTimeout(() => process.kill(process.pid, 'SIGINT'), 200 + i * 150);`,
      ],
      { encoding: 'utf8', timeout: 20_000 },
    );
    assert.equal(r.status, 130, r.stderr);
    assert.match(r.stderr, /stopping: writing what is left/);
    assert.equal(r.stdout.trim(), 'exit hook 130');
  });

  it('two: the second quits at once (exit 130)', () => {
    const r = child(2);
    assert.equal(r.status, 130, r.stderr);
    assert.equal(r.stdout, '');
  });
});

describe('runInNetns: how a command ended', () => {
  it('a command a signal ended (a terminal\'s Ctrl-C reaches it too) is told as interrupted, not as an empty output', async () => {
    const r = await runInNetns(CURRENT_NETNS, ['sh', '-c', 'echo part; kill -INT $$']);
    assert.equal(r.code, 130);
    assert.match(r.stderr, /^interrupted \(SIGINT\)/);
    assert.equal(r.stdout, 'part\n');
    const missing = await runInNetns(CURRENT_NETNS, ['svt-no-such-tool']);
    assert.equal(missing.code, 127);
    assert.match(missing.stderr, /not installed/);
    assert.equal((await runInNetns(CURRENT_NETNS, ['sh', '-c', 'exit 3'])).code, 3);
  });
});

describe('marker tables left by dead svctrace processes', () => {
  it('are the svctrace_<pid> tables of the ip family whose PID runs no svctrace', () => {
    const listed = JSON.stringify({
      nftables: [
        { metainfo: { version: '1.0.6' } },
        { table: { family: 'ip', name: 'svctrace_111', handle: 1 } },
        { table: { family: 'ip', name: 'svctrace_222', handle: 2 } },
        { table: { family: 'ip', name: `svctrace_${process.pid}`, handle: 3 } },
        { table: { family: 'ip', name: 'nat', handle: 4 } },
        { table: { family: 'ip6', name: 'svctrace_333', handle: 5 } },
        { table: { family: 'ip', name: 'svctrace_x', handle: 6 } },
      ],
    });
    assert.deepEqual(staleMarkerTables(listed, (pid) => pid === 222), ['svctrace_111']);
    assert.deepEqual(staleMarkerTables('not json', () => false), []);
  });
});

describe('live diagnoses as evidence accumulates', () => {
  it('a skew is judged on the last minute of flows: windows of a slow Service add up to the evidence', (t) => {
    t.mock.timers.enable({ apis: ['Date', 'setInterval'], now: 1_000_000 });
    const svc: DiscoveredService = {
      name: 'default/web:http', namespace: 'default', service: 'web', portName: 'http', clusterIP: '10.96.0.100', port: 80, proto: 'tcp', nodePorts: [],
      endpoints: ['10.244.1.10', '10.244.1.11', '10.244.1.12'].map((ip) => ({ ip, port: 8080, probability: 1 / 3, chain: 'KUBE-SEP-X' })),
      chain: 'KUBE-SVC-X', rejects: false, nodePortMasquerade: false, source: 'iptables',
    };
    let port = 40_000;
    // An answered connection to pod .12, started at `startS` seconds.
    const flow = (startS: number): Flow => {
      const sport = port++;
      return {
        id: sport, key: `ct:${sport}`, tupleIndexKey: '', service: '10.96.0.100:80/tcp', serviceId: 1, proto: 6, ctId: String(sport), ctBirth: 0, nodeNetnsIno: 1,
        orig: { saddr: '10.250.0.2', daddr: '10.96.0.100', sport, dport: 80, proto: 6 },
        reply: { saddr: '10.244.1.12', daddr: '10.250.0.2', sport: 8080, dport: sport, proto: 6 },
        status: IPS_SEEN_REPLY, tcpState: 0, dnat: true, masqueraded: false, packets: [5, 5], bytes: [0, 0], kernelDrops: 0, synsResent: 0, countersFinal: false,
        firstTsNs: BigInt(startS) * 1_000_000_000n, lastTsNs: 0n, closed: false, drops: [], reset: false, icmpErrors: [], rulePath: [], seen: [], countedOnly: false,
      };
    };
    const said: string[] = [];
    const live = new LiveDiagnoser([svc], (ds) => said.push(...ds.map((d) => d.code)), 5000);
    // Four windows of four connections each: no window alone holds enough (15) to judge.
    for (let w = 0; w < 4; w++) {
      live.observe(Array.from({ length: 4 }, () => ({ flow: flow(w * 5) }) as Ingested));
      live.tick(BigInt(w * 5 + 3) * 1_000_000_000n);
      assert.equal(said.includes('SKEWED_DISTRIBUTION'), w === 3, `after window ${w}: ${said}`);
    }
    // A connection with nothing to show yet waits (a neighbour is given up after 3 s), then is judged.
    said.length = 0;
    const quiet = { ...flow(30), status: 0 };
    live.observe([{ flow: quiet } as Ingested]);
    live.tick(32n * 1_000_000_000n + 500_000_000n);
    assert.equal(said.length, 0, 'not judged at 2.5 s');
    live.tick(35n * 1_000_000_000n + 500_000_000n);
    assert.ok(said.includes('REPLY_PATH_BROKEN'), `judged at 5.5 s: ${said}`);
    // A connection not DNATed yet (IPVS translates as it forwards) is not judged "not DNATed" at 2.5 s...
    said.length = 0;
    const early = { ...flow(40), status: 0, dnat: false, reply: { saddr: '10.244.1.12', daddr: '10.250.0.2', sport: 8080, dport: 1, proto: 6 } };
    live.observe([{ flow: early } as Ingested]);
    live.tick(42n * 1_000_000_000n + 500_000_000n);
    assert.equal(said.length, 0, `not judged at 2.5 s: ${said}`);
    // ...and once its reset shows the translation, it is a refusal, not missing rules.
    Object.assign(early, { dnat: true, reset: true, backendReset: true, backendRefused: true });
    live.tick(43n * 1_000_000_000n);
    assert.ok(!said.includes('RULES_MISSING'), `${said}`);
    // One that stays un-DNATed with nothing to show is judged after the longer grace.
    said.length = 0;
    const lost = { ...flow(50), status: 0, dnat: false };
    live.observe([{ flow: lost } as Ingested]);
    live.tick(52n * 1_000_000_000n + 500_000_000n);
    assert.equal(said.length, 0, `not judged at 2.5 s: ${said}`);
    live.tick(55n * 1_000_000_000n + 500_000_000n);
    assert.ok(said.includes('RULES_MISSING'), `judged at 5.5 s: ${said}`);
    // A minute later the old flows no longer count: a few new ones are not a skew.
    said.length = 0;
    t.mock.timers.tick(120_000);
    live.observe(Array.from({ length: 4 }, () => ({ flow: flow(100) }) as Ingested));
    live.tick(103n * 1_000_000_000n);
    assert.ok(!said.includes('SKEWED_DISTRIBUTION'), `${said}`);
    live.stop();
  });

  it('a neighbour failure whose ICMP error and drop come in two batches is judged once, on both: not a broken reply path', () => {
    const svc: DiscoveredService = {
      name: 'default/web:http', namespace: 'default', service: 'web', portName: 'http', clusterIP: '10.96.0.100', port: 80, proto: 'tcp', nodePorts: [],
      endpoints: ['10.244.1.10', '10.244.1.11'].map((ip) => ({ ip, port: 8080, probability: 1 / 2, chain: 'KUBE-SEP-X' })),
      chain: 'KUBE-SVC-X', rejects: false, nodePortMasquerade: false, source: 'ipvs',
    };
    const s = 1_000_000_000n;
    const said: string[] = [];
    let delivered = 0n;
    const live = new LiveDiagnoser([svc], (ds) => said.push(...ds.map((d) => `${d.code} ${d.summary}`)), 5000, true, undefined, () => delivered);
    // Both pods are on this node.
    live.view = { holderOf: (ip) => `pod ${ip}`, routeOf: () => undefined, replyPathOf: () => undefined, tunnelOf: () => undefined };
    // A SYN at 0 s to .11, which answers no ARP: at 3 s the kernel sends the
    // client a host unreachable, then frees the queued SYN (NEIGH_FAILED).
    const f: Flow = {
      id: 1, key: 1, tupleIndexKey: '', service: '10.96.0.100:80/tcp', serviceId: 1, proto: 6, ctId: '1', ctBirth: 1, nodeNetnsIno: 1,
      orig: { saddr: '10.250.0.2', daddr: '10.96.0.100', sport: 40_000, dport: 80, proto: 6 },
      reply: { saddr: '10.244.1.11', daddr: '10.250.0.2', sport: 8080, dport: 40_000, proto: 6 },
      status: 0, tcpState: 1, dnat: true, masqueraded: false, packets: [2, 0], bytes: [120, 0], kernelDrops: 0, synsResent: 0, countersFinal: false,
      firstTsNs: 0n, lastTsNs: 3n * s, closed: false, drops: [], reset: false, icmpErrors: ['host unreachable'], rulePath: [], seen: [], countedOnly: false,
    };
    // The batch ended after the ICMP error: a window closes before the next batch.
    live.observe([{ flow: f } as Ingested]);
    delivered = 3n * s + 1_000_000n;
    live.tick();
    assert.deepEqual(said, [], 'not judged on the ICMP error alone, its drop not yet delivered');
    // The next batch: the drop.
    f.drops.push('NEIGH_FAILED');
    live.observe([{ flow: f } as Ingested]);
    delivered = 3n * s + 400_000_000n;
    live.tick();
    assert.equal(said.length, 1, `${said}`);
    assert.match(said[0]!, /^NEIGHBOUR_FAILED 1 of 1 connections to 10\.244\.1\.11:8080/);
    // Its final counters come later: the flow was judged, it is not counted again.
    said.length = 0;
    live.observe([{ flow: f } as Ingested]);
    delivered = 20n * s;
    live.tick();
    live.stop();
    assert.deepEqual(said, []);
  });

  /** A Service with one endpoint, ip:8080. */
  const serviceTo = (ip: string, source: DiscoveredService['source']): DiscoveredService => ({
    name: 'default/web:http', namespace: 'default', service: 'web', portName: 'http', clusterIP: '10.96.0.100', port: 80, proto: 'tcp', nodePorts: [],
    endpoints: [{ ip, port: 8080, probability: 1, chain: 'KUBE-SEP-X' }],
    chain: 'KUBE-SVC-X', rejects: false, nodePortMasquerade: false, source,
  });
  const S = 1_000_000_000n;
  /** A connection to ip:8080 whose SYN left at firstS seconds and got nothing back (so far). */
  const unanswered = (ip: string, sport: number, firstS: bigint, over: Partial<Flow> = {}): Flow => ({
    id: sport, key: sport, tupleIndexKey: '', service: '10.96.0.100:80/tcp', serviceId: 1, proto: 6, ctId: String(sport), ctBirth: 1, nodeNetnsIno: 1,
    orig: { saddr: '10.250.0.2', daddr: '10.96.0.100', sport, dport: 80, proto: 6 },
    reply: { saddr: ip, daddr: '10.250.0.2', sport: 8080, dport: sport, proto: 6 },
    status: 0, tcpState: 1, dnat: true, masqueraded: false, packets: [1, 0], bytes: [60, 0], kernelDrops: 0, synsResent: 0, countersFinal: false,
    firstTsNs: firstS * S, lastTsNs: firstS * S, closed: false, drops: [], reset: false, icmpErrors: [], rulePath: [], seen: [], countedOnly: false, ...over,
  });

  it('the last judgement waits for delivery too: a flow whose reply was still in the ring when the drain ran out of time is not judged', () => {
    const said: string[] = [];
    // The ring delivered through 10 s when the trace stopped.
    const live = new LiveDiagnoser([serviceTo('10.244.1.10', 'ipvs')], (ds) => said.push(...ds.map((d) => `${d.code} ${d.summary}`)), 5000, true, undefined, () => 10n * S);
    live.view = { holderOf: (ip) => `pod ${ip}`, routeOf: () => undefined, replyPathOf: () => undefined, tunnelOf: () => undefined };
    // Stopped with the ring delivered through 10 s (its drain ran out of time): judged at that time, not the clock's.
    // One retransmitted its SYN at 9.9 s: what came after (an answer?) is not known. One is silent since 1 s.
    live.observe([{ flow: unanswered('10.244.1.10', 40_001, 7n, { lastTsNs: 9n * S + 900_000_000n }) } as Ingested, { flow: unanswered('10.244.1.10', 40_002, 1n) } as Ingested]);
    live.stop();
    assert.equal(said.length, 1, `${said}`);
    assert.match(said[0]!, /^REPLY_PATH_BROKEN 1 of 1 connections/);
  });

  it('windows wait for the first look at the node (routes, reply paths): a verdict needs it', () => {
    const said: string[] = [];
    const live = new LiveDiagnoser([serviceTo('10.244.1.11', 'iptables')], (ds) => said.push(...ds.map((d) => d.code)), 5000, true, undefined, () => 20n * S);
    live.waitingForView = true;
    // Its SYN reached the pod, whose answers leave by another interface; the retransmitted SYN was dropped there.
    const f = unanswered('10.244.1.11', 40_000, 1n, { lastTsNs: 2n * S, packets: [2, 0], drops: ['NOT_SPECIFIED'], kernelDrops: 1, masqueraded: true });
    live.observe([{ flow: f } as Ingested]);
    live.tick();
    assert.deepEqual(said, [], 'no verdict before the node was looked at');
    live.view = { holderOf: (ip) => `pod ${ip}`, routeOf: () => ({ ok: true, dev: 'cni0', src: '10.244.1.1' }), replyPathOf: () => ({ dev: 'other0', expected: 'eth0', netns: 'pod1' }), tunnelOf: () => undefined };
    live.waitingForView = false;
    live.tick();
    assert.deepEqual(said, ['REPLY_PATH_BROKEN']);
    live.stop();
  });

  it('a judged flow is not held: the diagnoser keeps per-backend counts, and a window reports every flow judged in it', () => {
    const svc = serviceTo('10.244.1.10', 'iptables');
    let delivered = 0n;
    const said: string[] = [];
    const live = new LiveDiagnoser([svc], (ds) => said.push(...ds.map((d) => `${d.code} ${d.summary}`)), 5000, true, undefined, () => delivered);
    live.view = { holderOf: (ip) => `pod ${ip}`, routeOf: () => undefined, replyPathOf: () => undefined, tunnelOf: () => undefined };
    // 300 unanswered connections, 100 a second: each is judged (and let go) by the sweep once 5 s old, before the window closes.
    for (let s = 0; s < 3; s++) live.observe(Array.from({ length: 100 }, (_, i) => ({ flow: unanswered('10.244.1.10', 40_000 + s * 100 + i, BigInt(s)) }) as Ingested));
    assert.equal(live.heldFlows, 300);
    delivered = 6n * S;
    live.sweep(delivered);
    assert.equal(live.heldFlows, 100, 'the two oldest seconds were judged and let go');
    delivered = 8n * S;
    live.tick();
    assert.equal(live.heldFlows, 0);
    live.stop();
    assert.equal(said.length, 1, `${said}`);
    assert.match(said[0]!, /^REPLY_PATH_BROKEN 300 of 300 connections/);
  });

  it('flows left unjudged because the diagnoser was full are counted, once each, in the window\'s verdicts', () => {
    let delivered = 0n;
    const said: Array<{ summary: string; evidence: string[] }> = [];
    const live = new LiveDiagnoser([serviceTo('10.244.1.10', 'iptables')], (ds) => said.push(...ds), 5000, true, undefined, () => delivered);
    live.view = { holderOf: (ip) => `pod ${ip}`, routeOf: () => undefined, replyPathOf: () => undefined, tunnelOf: () => undefined };
    const flows = Array.from({ length: MAX_PENDING + 5 }, (_, i) => unanswered('10.244.1.10', 1024 + i, 0n));
    live.observe(flows.map((flow) => ({ flow }) as Ingested));
    live.observe(flows.slice(-5).map((flow) => ({ flow }) as Ingested)); // their later records: not counted again
    assert.equal(live.heldFlows, MAX_PENDING);
    delivered = 6n * S;
    live.tick();
    assert.equal(said.length, 1);
    assert.match(said[0]!.summary, new RegExp(`^${MAX_PENDING} of ${MAX_PENDING} connections`));
    assert.ok(said[0]!.evidence.some((e) => e.startsWith('5 new flows of the traced services were not judged in this window')), `${said[0]!.evidence}`);
    live.stop();
  });

  it('windows merged give what their flows give together (the last minute is kept as counts)', () => {
    const svc: DiscoveredService = { ...serviceTo('10.244.1.10', 'iptables'), endpoints: ['10.244.1.10', '10.244.1.11'].map((ip) => ({ ip, port: 8080, probability: 0.5, chain: 'KUBE-SEP-X' })) };
    const flows: Flow[] = [];
    for (let i = 0; i < 60; i++) {
      const ip = i % 3 ? '10.244.1.10' : '10.244.1.11';
      const over: Partial<Flow> =
        i % 5 === 0 ? { status: IPS_SEEN_REPLY, packets: [i, i], orig: { saddr: `10.250.0.${i % 7}`, daddr: '10.96.0.100', sport: 40_000 + i, dport: 80, proto: 6 } }
        : i % 5 === 1 ? { drops: ['NETFILTER_DROP', 'NETFILTER_DROP'], replyDrops: ['NETFILTER_DROP at eth0 in node'] }
        : i % 5 === 2 ? { icmpErrors: ['port unreachable'], reset: true, backendReset: true, backendRefused: i % 2 === 0 }
        : i % 5 === 3 ? { drops: ['PKT_TOO_BIG'], replyDrops: ['PKT_TOO_BIG at veth1 in node'], backendDropRule: 'filter INPUT drop' }
        : { dnat: i % 2 === 0, masqueraded: true };
      flows.push(unanswered(ip, 40_000 + i, 1n, over));
    }
    const whole = observeFlows(svc, flows, 60);
    const parts = [flows.slice(0, 7), flows.slice(7, 31), [], flows.slice(31)].map((p) => observeFlows(svc, p, 5));
    const merged = mergeObserved(parts, 60);
    const byBackend = (t: typeof whole) => Object.fromEntries(t.backends.map((b) => [b.backend, { ...b, clients: [...b.clients].sort(), droppedBy: [...(b.droppedBy ?? [])].sort(), icmpBy: [...(b.icmpBy ?? [])].sort(), replyDroppedAt: [...(b.replyDroppedAt ?? [])].sort(), dropRules: [...(b.dropRules ?? [])].sort(), tooBigAt: [...(b.tooBigAt ?? [])].sort() }]));
    assert.deepEqual({ ...merged, backends: byBackend(merged) }, { ...whole, backends: byBackend(whole) });
    assert.ok(whole.flows === 60 && whole.notDnated > 0 && whole.masqueraded > 0 && whole.backends.length === 2);
  });

  it('a route lookup with no kernel answer is unknown, never "no route"', () => {
    assert.deepEqual(parseRouteGet({ code: 0, stdout: '[{"dst":"10.244.1.10","dev":"cni0","prefsrc":"10.244.1.1","flags":[],"uid":0,"cache":[]}]', stderr: '' }), { ok: true, dev: 'cni0', gateway: undefined, src: '10.244.1.1' });
    assert.deepEqual(parseRouteGet({ code: 2, stdout: '', stderr: 'RTNETLINK answers: Invalid argument\n' }), { ok: false, error: 'Invalid argument' });
    assert.deepEqual(parseRouteGet({ code: 0, stdout: '[{"type":"unreachable","dst":"10.9.9.9"}]', stderr: '' }), { ok: false, error: 'unreachable' });
    // Seen on a loaded node: exit 2, nothing printed; and empty output.
    assert.equal(parseRouteGet({ code: 2, stdout: '', stderr: '' }), undefined);
    assert.equal(parseRouteGet({ code: 0, stdout: '', stderr: '' }), undefined);
    assert.equal(parseRouteGet({ code: 0, stdout: '[]', stderr: '' }), undefined);
  });

  it('a diagnosis is said at once, again when its numbers change (at most every 15 s), and again after a minute', (t) => {
    t.mock.timers.enable({ apis: ['Date', 'setInterval'], now: 1_000_000 });
    const said: string[] = [];
    const live = new LiveDiagnoser([], (ds) => said.push(...ds.map((d) => d.summary)), 5000);
    const emit = (summary: string) => (live as unknown as { emit(ds: object[]): void }).emit([{ code: 'REPLY_PATH_BROKEN', severity: 'error', service: 's', summary, evidence: [] }]);
    emit('1 of 1 connections got no reply');
    emit('2 of 3 connections got no reply');
    t.mock.timers.tick(16_000);
    emit('5 of 9 connections got no reply');
    t.mock.timers.tick(20_000);
    emit('5 of 9 connections got no reply');
    t.mock.timers.tick(45_000);
    emit('5 of 9 connections got no reply');
    live.stop();
    assert.deepEqual(said, ['1 of 1 connections got no reply', '5 of 9 connections got no reply', '5 of 9 connections got no reply']);
  });
});
