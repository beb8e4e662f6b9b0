/**
 * The data plane's promises, against the real kernel in the lab:
 * - counters kept in the kernel equal conntrack's own accounting (ctnetlink
 *   DESTROY counters, read by the conntrack tool, not by svctrace), exactly,
 *   for a TCP keep-alive connection of 150 requests and a UDP flow;
 * - a keep-alive connection costs a number of events that does not grow with
 *   its requests (1,000 requests cost what 100 do), while --all-packets still
 *   reports every packet;
 * - when JavaScript stalls, the reader holds back (records wait in the ring)
 *   instead of dropping: nothing the kernel wrote is lost between the ring
 *   and JS, and what did not fit in the ring is counted by the kernel.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import os from 'node:os';
import { kernelTest, IS_ROOT, sleep } from '../helpers/kernel';
import { FlowLog, TIME_SCALE, waitFor } from '../helpers/flows';
import { curlEach, reapUntil } from '../helpers/lab-traffic';
import { conntrackDestroys } from '../helpers/conntrack-events';
import { Lab, POD_HTTP_PORT } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { argvInNetns } from '../../src/netns/netns';
import { Pipeline } from '../../src/pipeline/pipeline';
import { Tracer } from '../../src/tracer/tracer';
import { parseNodePortSpec, parseServiceSpec } from '../../src/net/ipv4';
import { EventKind, StatsReason } from '../../src/events/layout';
import type { FlowStatsRecord } from '../../src/events/decode';
import type { Flow } from '../../src/flows/types';
import { svctrace } from '../../src/gen/svctrace';

import pb = svctrace.v1;

/** N request/response exchanges from one UDP socket; prints its local port. */
const UDP_EXCHANGES = `
const s = require('node:dgram').createSocket('udp4');
const [addr, port, n] = process.argv.slice(1);
let left = Number(n);
const t = setTimeout(() => { console.error('timeout, ' + left + ' left'); process.exit(1); }, 10000);
s.on('message', () => { if (--left === 0) { clearTimeout(t); console.log('port=' + s.address().port); s.close(); } else s.send('q' + left, Number(port), addr); });
s.send('q' + left, Number(port), addr);
`;

/** N HTTP GETs at once, each on its own connection; prints done=N when all were answered. */
const PARALLEL_GETS = `
const http = require('node:http');
const [url, n] = process.argv.slice(1);
let left = Number(n);
const t = setTimeout(() => { console.error('timeout, ' + left + ' left'); process.exit(1); }, 50000);
for (let i = 0; i < Number(n); i++) {
  http.get(url, { agent: false, headers: { connection: 'close' } }, (r) => {
    r.resume();
    r.on('end', () => { if (--left === 0) { clearTimeout(t); console.log('done=' + n); } });
  }).on('error', (e) => { console.error(e.message); process.exit(1); });
}
`;

/** One HTTP GET (Connection: close) from a given local port; prints the body. */
const GET_FROM_PORT = `
const http = require('node:http');
const [url, port] = process.argv.slice(1);
const t = setTimeout(() => { console.error('timeout'); process.exit(1); }, 10000);
http.get(url, { agent: false, localPort: Number(port), headers: { connection: 'close' } }, (r) => {
  let body = '';
  r.on('data', (d) => (body += d));
  r.on('end', () => { clearTimeout(t); process.stdout.write(body); });
}).on('error', (e) => { console.error(e.message); process.exit(1); });
`;

/** conntrack -E DESTROY lines with accounting: per flow, the kernel's own counters. */
interface CtCounters {
  proto: string;
  sport: number;
  packets: [number, number];
  bytes: [number, number];
}

function parseDestroy(line: string): CtCounters | undefined {
  if (!line.includes('DESTROY')) return undefined;
  const proto = /\b(tcp|udp)\b/.exec(line)?.[1];
  const sport = Number(/sport=(\d+)/.exec(line)?.[1]);
  const pk = [...line.matchAll(/packets=(\d+)/g)].map((m) => Number(m[1]));
  const by = [...line.matchAll(/bytes=(\d+)/g)].map((m) => Number(m[1]));
  if (!proto || pk.length !== 2 || by.length !== 2) return undefined;
  return { proto, sport, packets: [pk[0]!, pk[1]!], bytes: [by[0]!, by[1]!] };
}

describe('data plane: counted in the kernel, transitions on the ring (kernel)', () => {
  let lab: Lab;

  before(async () => {
    if (!IS_ROOT) return;
    lab = await Lab.up({ pods: 2 });
    // Conntrack accounting in the lab's node namespace only (per-namespace sysctl).
    await runIn(lab.nodeNetns, ['sysctl', '-qw', 'net.netfilter.nf_conntrack_acct=1']);
  });

  after(async () => {
    await lab?.down();
  });

  /** A pipeline over the lab node with a sink that keeps every event. */
  async function trace(opts: { allPackets?: boolean; detailRate?: number } = {}): Promise<{ p: Pipeline; log: FlowLog }> {
    const log = new FlowLog();
    const web = lab.service('web');
    const dns = lab.service('kube-dns');
    const p = await Pipeline.start(
      {
        services: [parseServiceSpec(`${web.clusterIP}:80`), parseServiceSpec(`${dns.clusterIP}:53/udp`)],
        netns: [lab.nodeNetns],
        kubeconfig: false,
        ruleTrace: false,
        closeGraceMs: 3_600_000,
        allPackets: opts.allPackets,
        detailRate: opts.detailRate,
      },
      () => [{ name: 'test', write: log.add }],
    );
    return { p, log };
  }

  /** N requests over one keep-alive connection (curl reuses it for a URL range); its local port. */
  async function keepAlive(n: number): Promise<number> {
    const url = `http://${lab.service('web').clusterIP}/r[1-${n}]`;
    const r = await runIn(lab.nodeNetns, ['curl', '-s', '--max-time', String(60 * TIME_SCALE), '-w', 'port=%{local_port}\\n', url], { timeoutMs: 90_000 * TIME_SCALE });
    const ports = new Set([...r.stdout.matchAll(/port=(\d+)/g)].map((m) => m[1]));
    assert.equal(ports.size, 1, `one connection for ${n} requests (local ports: ${[...ports].join(',')})`);
    return Number([...ports][0]);
  }

  kernelTest('per-flow counters equal conntrack accounting exactly: TCP keep-alive (150 requests) and UDP', async () => {
    // The kernel's own account, read independently of svctrace.
    const ct = await conntrackDestroys(lab.nodeNetns);
    const { p, log } = await trace();
    try {
      const tcpPort = await keepAlive(150);
      const dns = lab.service('kube-dns');
      const u = await runIn(lab.nodeNetns, [process.execPath, '-e', UDP_EXCHANGES, dns.clusterIP, '53', '40'], { timeoutMs: 20_000 });
      const udpPort = Number(/port=(\d+)/.exec(u.stdout)![1]);
      await sleep(2500); // TIME_WAIT is 2 s in the lab
      // A UDP entry lives 30 s or more: end it now (conntrack reports it like any destroy).
      await runIn(lab.nodeNetns, ['conntrack', '-D', '-p', 'udp', '--orig-port-src', String(udpPort)]);
      const flowOf = (port: number) => log.flowByClientPort(port);
      assert.ok(await reapUntil(lab, () => !!flowOf(tcpPort)?.countersFinal && !!flowOf(udpPort)?.countersFinal, 10_000), 'both flows ended with final counters');
      const truth = () => ct.text().split('\n').map(parseDestroy).filter((x): x is CtCounters => !!x);
      assert.ok(await waitFor(() => truth().some((c) => c.sport === tcpPort) && truth().some((c) => c.sport === udpPort), 5000), `conntrack -E saw both ends:\n${ct.text()}`);
      for (const [port, proto] of [
        [tcpPort, 'tcp'],
        [udpPort, 'udp'],
      ] as const) {
        const f = flowOf(port)!;
        const k = truth().find((c) => c.sport === port && c.proto === proto)!;
        assert.deepEqual(f.packets, k.packets, `${proto} packets [orig, reply]: svctrace ${f.packets} vs conntrack ${k.packets}`);
        assert.deepEqual(f.bytes, k.bytes, `${proto} bytes [orig, reply]: svctrace ${f.bytes} vs conntrack ${k.bytes}`);
        // The final counters also went out as an event, for every sink.
        // (The last one: packets the hooks missed, raised to conntrack's
        // at the destroy, come after the end's; see the test below.)
        const finals = log.eventsOf(f).filter((e) => e.kind === pb.EventKind.EVENT_KIND_FLOW_STATS && e.counters?.final);
        assert.equal(Number(finals.at(-1)?.counters?.packetsOriginal), k.packets[0]);
        // TCP's are the kernel's at the connection's end (TIME_WAIT), not
        // its destroy's: on a node that comes two minutes later, when the
        // flow has long left the table.
        assert.equal(finals[0]?.counters?.reason, proto === 'tcp' ? 'ended' : 'closed', `${proto}: whose final counters`);
      }
      assert.ok(flowOf(tcpPort)!.packets[0] > 150, 'a request per packet at least');
      // Both ends were handled by the destroy programs (one syscall each
      // side of the take) wherever the kernel has their type (Linux 5.14).
      const [major, minor] = os.release().split('.').map(Number) as [number, number];
      assert.equal(p.stats().ctDestroyPrograms, major > 5 || (major === 5 && minor >= 14), `the destroy programs are used on ${os.release()} when the kernel has BPF_PROG_TYPE_SYSCALL`);
    } finally {
      ct.stop();
      await p.stop();
    }
  });

  kernelTest('packets conntrack counted and the counting hook never saw (a mangle rule drops them in between) are counted, and the final counters are conntrack\'s', async () => {
    // Conntrack counts a packet at -200; a mangle rule (-150) drops every
    // fifth reply of the Service's connections before NAT's hooks, where
    // svctrace counts. (The same shortfall a kprobe the kernel skipped
    // leaves, with no rule to count it.) TCP resends what was dropped.
    const web = lab.service('web');
    const pods = web.endpoints.map((e) => e.ip);
    const rules = pods.map((ip) => ['PREROUTING', '-s', ip, '-p', 'tcp', '--sport', String(POD_HTTP_PORT), '-m', 'conntrack', '--ctstate', 'ESTABLISHED', '--ctdir', 'REPLY', '-m', 'statistic', '--mode', 'nth', '--every', '5', '--packet', '3', '-j', 'DROP']);
    for (const r of rules) await runIn(lab.nodeNetns, ['iptables', '-t', 'mangle', '-I', ...r]);
    const ct = await conntrackDestroys(lab.nodeNetns);
    const { p, log } = await trace();
    try {
      const missedBefore = p.stats().packetsMissedByHooks;
      const port = await keepAlive(30);
      await sleep(2500); // TIME_WAIT is 2 s in the lab
      const truth = () => ct.text().split('\n').map(parseDestroy).find((c) => c?.proto === 'tcp' && c.sport === port);
      assert.ok(await reapUntil(lab, () => !!truth(), 15_000), `conntrack -E saw the connection end:\n${ct.text()}`);
      const f = () => log.flowByClientPort(port);
      const records = () => (f() ? log.eventsOf(f()!).filter((e) => e.counters).map((e) => `${e.counters!.reason} ${e.counters!.packetsOriginal},${e.counters!.packetsReply}`) : []);
      assert.ok(await waitFor(() => records().some((r) => r.startsWith('closed')), 5000), `the destroy brought conntrack's counters: [${records().join('; ')}]`);
      // What the rules dropped, by their own counters (iptables-save -c: "[packets:bytes] -A ...").
      const saved = (await runIn(lab.nodeNetns, ['iptables-save', '-c', '-t', 'mangle'])).stdout;
      const dropped = [...saved.matchAll(/^\[(\d+):\d+\] -A PREROUTING .*-j DROP$/gm)].reduce((n, m) => n + Number(m[1]), 0);
      const k = truth()!;
      assert.ok(dropped >= 1, `the rule dropped some replies:\n${saved}`);
      assert.deepEqual(f()!.packets, k.packets, `packets [orig, reply]: svctrace ${f()!.packets} vs conntrack ${k.packets}; records [${records().join('; ')}]`);
      assert.deepEqual(f()!.bytes, k.bytes, `bytes: svctrace ${f()!.bytes} vs conntrack ${k.bytes}`);
      assert.equal(p.stats().packetsMissedByHooks - missedBefore, dropped, `every packet the rule dropped was counted as missed by the hooks; records [${records().join('; ')}]`);
      // The kernel's records before the destroy's are the hooks' own count:
      // the last of them, and the rule's drops, make conntrack's.
      const own = log.eventsOf(f()!).filter((e) => e.counters && e.counters.reason !== 'closed').at(-1);
      assert.equal(own?.counters?.reason, 'ended', 'the end was reported by the kernel');
      assert.equal(Number(own?.counters?.packetsReply) + dropped, k.packets[1], `the end said what the hooks saw; records [${records().join('; ')}]`);
    } finally {
      for (const r of rules) await runIn(lab.nodeNetns, ['iptables', '-t', 'mangle', '-D', ...r], { allowFail: true });
      ct.stop();
      await p.stop();
    }
  });

  kernelTest('past the detail budget a flow is counted only: every flow still seen, with exact counters and its backend, and no hook or device events, even with a drop inside the pod before its end (its resent SYNs counted apart, as conntrack accounts them: not at all)', async () => {
    // Every other SYN one pod receives is dropped there (resent a second
    // later): a drop found through the wire-tuple registry, which knows
    // the packet's tuple only, before the flow's first counters record.
    const dropper = lab.pods[0]!;
    const dropEveryOtherSyn = ['INPUT', '-p', 'tcp', '--syn', '--dport', String(POD_HTTP_PORT), '-m', 'statistic', '--mode', 'nth', '--every', '2', '--packet', '0', '-j', 'DROP'];
    await runIn(dropper.netns, ['iptables', '-I', ...dropEveryOtherSyn]);
    const ct = await conntrackDestroys(lab.nodeNetns);
    // One detailed flow per second (per CPU, rounded up): a burst of 40
    // connections in a second or two leaves most of them over the budget.
    const { p, log } = await trace({ detailRate: 1 });
    const web = lab.service('web');
    const n = 40;
    try {
      const r = await runIn(lab.clientNetns, [process.execPath, '-e', PARALLEL_GETS, `http://${web.clusterIP}/`, String(n)], { timeoutMs: 60_000 * TIME_SCALE });
      assert.match(r.stdout, /done=40/);
      await sleep(2500); // TIME_WAIT is 2 s in the lab
      const truth = () => ct.text().split('\n').map(parseDestroy).filter((x): x is CtCounters => x?.proto === 'tcp');
      assert.ok(await reapUntil(lab, () => truth().length >= n, 15_000), `conntrack -E saw the ${n} connections end (${truth().length}):\n${ct.text()}`);
      // What each connection without final counters was told as, to read a failure by.
      const flowsOf = (port: number) => [...log.flows.values()].filter((f) => f.orig.sport === port);
      const unfinished = () =>
        truth()
          .filter((k) => !log.flowByClientPort(k.sport)?.countersFinal || flowsOf(k.sport).length !== 1)
          .map((k) => {
            const flows = flowsOf(k.sport);
            const told = flows.map((f) => `#${f.id} to ${f.orig.daddr}${f.countedOnly ? ' counted only' : ''} [${log.eventsOf(f).map((e) => (e.counters ? `counters:${e.counters.reason}` : pb.EventKind[e.kind!])).join(' ')}]`);
            return `port ${k.sport}: ${told.join('; ') || 'no flow'}`;
          });
      assert.ok(await waitFor(() => unfinished().length === 0, 5000), `every connection has one flow with its final counters; not:\n${unfinished().join('\n')}`);
      // Every destroy handled by the addon (each takes its flow out of the
      // kernel's active count), and what it had to say delivered.
      assert.ok(await waitFor(() => p.stats().activeFlows === 0, 5000), `every destroy reached the addon (${p.stats().activeFlows} flows active)`);
      // A flow the hooks counted short gets conntrack's counters at its
      // destroy: a record on the netlink channel, which the channel merge
      // holds until the ring is idle (500 ms at most). Wait for them (the
      // assertions below say what is still wrong after that).
      const counted = () =>
        truth().every((k) => {
          const f = log.flowByClientPort(k.sport);
          return f !== undefined && f.packets[0] === k.packets[0] && f.packets[1] === k.packets[1];
        });
      await waitFor(counted, 3000 * TIME_SCALE);
      await sleep(300);
      const pods = new Set(lab.pods.map((pod) => pod.ip));
      let countedOnly = 0;
      let quietDestroys = 0;
      let droppedFirst = 0;
      let resentSeen = 0;
      for (const k of truth()) {
        const f = log.flowByClientPort(k.sport)!;
        // (Some guests also free every closing socket's last segment as a
        // drop: only a dropped SYN tells a resent one.)
        const synDrops = log.eventsOf(f).filter((e) => e.kind === pb.EventKind.EVENT_KIND_DROP && e.tcpFlags === 'SYN').length;
        const lostSyn = synDrops > 0;
        // Exact, detailed or not, SYN lost or not: the kernel counts every
        // packet conntrack accounts. A SYN the client resent while its entry
        // waited for any reply is one conntrack does not account (it does
        // not even refresh the entry for it): counted apart, in synsResent.
        // On a mismatch, each counter record the flow got, to read it by.
        const records = () =>
          log
            .eventsOf(f)
            .filter((e) => e.counters)
            .map((e) => `${e.counters!.reason}${e.counters!.final ? '(final)' : ''} ${e.counters!.packetsOriginal},${e.counters!.packetsReply} syns resent ${e.counters!.synsResent ?? 0}`)
            .join('; ');
        const why = () => `${synDrops} SYNs dropped, ${f.synsResent} resent; records [${records()}], flow table lost ${p.flows.summary().lateCounters} late counters, hooks missed ${p.stats().packetsMissedByHooks} packets (all flows)`;
        assert.deepEqual(f.packets, k.packets, `port ${k.sport} packets [orig, reply]: svctrace ${f.packets} vs conntrack ${k.packets}; ${why()}`);
        assert.deepEqual(f.bytes, k.bytes, `port ${k.sport} bytes: svctrace ${f.bytes} vs conntrack ${k.bytes}; ${why()}`);
        // Every SYN the pod dropped was sent again (all 40 connections were
        // answered); a slow answer can make the client resend one more.
        assert.ok(f.synsResent >= synDrops, `port ${k.sport}: ${why()}`);
        if (lostSyn) resentSeen++;
        assert.ok(f.dnat && pods.has(f.reply.saddr), `port ${k.sport}: its backend is known (${f.reply.saddr}:${f.reply.sport}, counted only: ${f.countedOnly})`);
        const kinds = new Set(log.eventsOf(f).map((e) => e.kind));
        if (f.countedOnly) {
          countedOnly++;
          // Its counters, its drops (reported for every flow: a 6.1 guest
          // frees a closing socket's last segment as a drop) and its end
          // (conntrack's destroy): nothing from the hooks, routes or devices.
          assert.ok(kinds.has(pb.EventKind.EVENT_KIND_FLOW_STATS), `a counted-only flow has its counter records (port ${k.sport})`);
          for (const kind of [pb.EventKind.EVENT_KIND_FLOW_STATS, pb.EventKind.EVENT_KIND_CT_DESTROY, pb.EventKind.EVENT_KIND_DROP]) kinds.delete(kind);
          assert.deepEqual([...kinds], [], `a counted-only flow has no hook, route or device events (port ${k.sport})`);
          const counters = log.eventsOf(f).filter((e) => e.counters);
          assert.ok(counters.every((e) => e.counters?.countedOnly), 'its counter records say so');
          // Its end comes from the kernel, final, the moment conntrack saw
          // it (TIME_WAIT); the destroy two minutes later (2 s here) tells
          // nothing more unless a packet was counted after that end.
          const reasons = counters.map((e) => e.counters!.reason);
          assert.ok(counters.some((e) => e.counters!.reason === 'ended' && e.counters!.final), `port ${k.sport}: its end is reported by the kernel (${reasons})`);
          if (log.eventsOf(f).some((e) => e.kind === pb.EventKind.EVENT_KIND_CT_DESTROY)) assert.equal(reasons.at(-1), 'closed', `port ${k.sport}: a destroy after its end comes with new counters (${reasons})`);
          else quietDestroys++;
          if (lostSyn) droppedFirst++;
        } else {
          assert.ok(kinds.has(pb.EventKind.EVENT_KIND_NETFILTER) && kinds.has(pb.EventKind.EVENT_KIND_DEV_XMIT), `a detailed flow has its hook and device events (port ${k.sport})`);
        }
      }
      // Packets conntrack counted and the hooks did not (their flows' final
      // counters were raised to conntrack's at the destroy): none with
      // netfilter links, which the kernel runs for every packet. A few
      // with the global backends: the kernel skips a kprobe's program
      // while the CPU runs another BPF program or a BPF syscall, and a
      // trampoline's (fentry) while the same program already runs on that
      // CPU (a softirq that interrupted it). CI's 6.1 guests, kprobe and
      // fentry: one retransmitted FIN and its ACK of some 480 packets.
      const ctPackets = truth().reduce((sum, k) => sum + k.packets[0] + k.packets[1], 0);
      const { packetsMissedByHooks: missed, hookRunsSkipped: skipped, backend } = p.stats();
      const missedWhy = `the ${backend} hooks missed ${missed} of ${ctPackets} packets (the kernel counted ${skipped} program runs it skipped)`;
      if (backend === 'netfilter') assert.equal(missed, 0, missedWhy);
      else assert.ok(missed <= ctPackets / 10, missedWhy);
      const cpus = (await import('node:os')).cpus().length;
      assert.ok(n - countedOnly >= 1, 'the budget gave at least one flow its detail');
      assert.ok(countedOnly >= Math.max(1, n - cpus * 8), `${countedOnly} of ${n} counted only: at most one detailed flow per CPU and second went out`);
      assert.ok(quietDestroys >= 1, `a counted-only connection's destroy adds no record when its end said it all (${quietDestroys} of ${countedOnly})`);
      assert.ok(droppedFirst >= 1, `a counted-only connection lost a SYN inside the pod (${droppedFirst}), and is still one flow`);
      assert.ok(resentSeen >= 1, `a connection whose SYN the pod dropped has exactly conntrack's counters and its resent SYNs apart (${resentSeen})`);
      assert.equal(p.stats().flowsCountedOnly, countedOnly, 'the kernel counted as many counted-only flows as the model shows');
      assert.equal(p.flows.summary().countedOnly, countedOnly, 'and the summary says so');
    } finally {
      await runIn(dropper.netns, ['iptables', '-D', ...dropEveryOtherSyn], { allowFail: true });
      ct.stop();
      await p.stop();
    }
  });

  kernelTest('a client reusing its port while the old entry waits in TIME_WAIT: the new SYN\'s crossings before conntrack are not told as the old flow\'s', async () => {
    const web = lab.service('web');
    const port = 40123;
    // The old entry must still be in TIME_WAIT when the port comes again,
    // however slow the machine (the lab's 2 s is for reaping).
    await runIn(lab.nodeNetns, ['sysctl', '-qw', 'net.netfilter.nf_conntrack_tcp_timeout_time_wait=60']);
    // Timestamps without a per-connection offset, and a port in TIME_WAIT
    // reusable at once: the pod's TIME_WAIT socket takes the new SYN.
    await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_timestamps=2', 'net.ipv4.tcp_tw_reuse=1']);
    const { p, log } = await trace({ detailRate: 0 });
    try {
      for (let i = 0; i < 2; i++) {
        // Node binds with SO_REUSEADDR (curl does not): the port is the
        // client's own TIME_WAIT socket's when it closed first.
        const r = await runIn(lab.clientNetns, [process.execPath, '-e', GET_FROM_PORT, `http://${web.clusterIP}/`, String(port)], { timeoutMs: 20_000 * TIME_SCALE, allowFail: true });
        assert.match(r.stdout, /^pod=/, `request ${i} from port ${port}: ${r.stderr}`);
        await sleep(1100); // past a second: the client's TIME_WAIT reuse needs one
      }
      const flows = () => [...log.flows.values()].filter((f) => f.orig.sport === port).sort((a, b) => a.id - b.id);
      assert.ok(await waitFor(() => flows().length === 2 && flows().every((f) => f.closed), 10_000), `two flows from port ${port}, both ended (${flows().length})`);
      const [first, second] = flows() as [Flow, Flow];
      const ns = (e: pb.IEvent) => BigInt(String(e.tsNs)); // a Long
      const told = (f: Flow) => log.eventsOf(f).map((e) => `${pb.EventKind[e.kind!]} ${e.tcpFlags ?? ''} ${e.device?.name ?? ''}`).join(' | ');
      // Its end: the final counters its TIME_WAIT wrote (a flow's last record).
      const firstEnd = log.eventsOf(first).filter((e) => e.kind === pb.EventKind.EVENT_KIND_FLOW_STATS).map(ns).reduce((a, b) => (b > a ? b : a), 0n);
      assert.ok(firstEnd > 0n, `the first connection's end was told: ${told(first)}`);
      const crossings = [pb.EventKind.EVENT_KIND_DEV_XMIT, pb.EventKind.EVENT_KIND_DEV_RECV];
      const late = log.eventsOf(first).filter((e) => crossings.includes(e.kind!) && ns(e) > firstEnd);
      assert.equal(late.length, 0, `no device crossing of the first connection after its end; it was told: ${told(first)}`);
      assert.ok(log.eventsOf(second).some((e) => e.kind === pb.EventKind.EVENT_KIND_DEV_XMIT && e.tcpFlags === 'SYN'), 'the second connection\'s SYN crossings after conntrack are its own');
      assert.equal(p.flows.summary().orphanEvents, 0, 'no event without its flow');
    } finally {
      await p.stop();
      await runIn(lab.nodeNetns, ['sysctl', '-qw', 'net.netfilter.nf_conntrack_tcp_timeout_time_wait=2']);
      await runIn(lab.clientNetns, ['sysctl', '-qw', 'net.ipv4.tcp_timestamps=1', 'net.ipv4.tcp_tw_reuse=2']); // the kernel's defaults
      await runIn(lab.nodeNetns, ['conntrack', '-D', '-p', 'tcp', '--orig-port-src', String(port)], { allowFail: true });
    }
  });

  kernelTest('the conntrack listener reads only traced services\' destroys: the kernel filters out the rest (same port, another ClusterIP), follows a change of services, and a NodePort key (any address) matches by port', async () => {
    const ct = await conntrackDestroys(lab.nodeNetns);
    const web = lab.service('web');
    const other = lab.service('other'); // 80/tcp too, at another ClusterIP
    // The first dst= of a DESTROY line is the entry's original destination.
    const destroysTo = (ip: string) => ct.text().split('\n').filter((l) => l.includes('DESTROY') && /dst=(\S+)/.exec(l)?.[1] === ip).length;
    const tracer = Tracer.open({});
    try {
      tracer.setServices([parseServiceSpec(`${other.clusterIP}:80`)]);
      tracer.attachNetns(lab.nodeNetns);
      tracer.start(() => {});
      const n = 12;
      await curlEach(lab, `http://${web.clusterIP}/`, n);
      await curlEach(lab, `http://${other.clusterIP}/`, 3);
      await sleep(2500); // TIME_WAIT is 2 s in the lab
      assert.ok(await reapUntil(lab, () => destroysTo(web.clusterIP) >= n && destroysTo(other.clusterIP) >= 3, 15_000), `conntrack -E saw the connections end:\n${ct.text()}`);
      assert.ok(await waitFor(() => tracer.stats().ctDestroyEvents >= 3, 5000), `the traced service's destroys were reported (${tracer.stats().ctDestroyEvents})`);
      await sleep(300);
      let st = tracer.stats();
      // Read: every destroy that reached the listener, traced or not.
      assert.equal(st.ctDestroysRead, destroysTo(other.clusterIP), `only the traced service's destroys reached the listener, not the ${n} to ${web.clusterIP}: ${JSON.stringify(st)}`);
      assert.equal(st.ctDestroyEvents, destroysTo(other.clusterIP), 'and each of them was reported');

      // Services changed while the listener runs: its filter follows. A
      // NodePort key (no address) keeps port 80's destroys at any address.
      tracer.setServices([parseNodePortSpec('80')]);
      const read = st.ctDestroysRead;
      await curlEach(lab, `http://${web.clusterIP}/`, 2);
      await sleep(2500);
      assert.ok(await reapUntil(lab, () => destroysTo(web.clusterIP) >= n + 2, 15_000), 'conntrack -E saw them end');
      assert.ok(await waitFor(() => tracer.stats().ctDestroysRead === read + 2, 5000), `a port-only key keeps any address's destroys (${tracer.stats().ctDestroysRead - read} of 2 read)`);
      // And a service on another port none.
      tracer.setServices([parseServiceSpec(`${other.clusterIP}:8080`)]);
      await curlEach(lab, `http://${other.clusterIP}/`, 2);
      await sleep(2500);
      assert.ok(await reapUntil(lab, () => destroysTo(other.clusterIP) >= 5, 15_000), 'conntrack -E saw them end');
      await sleep(300);
      st = tracer.stats();
      assert.equal(st.ctDestroysRead, read + 2, `no destroy of port 80 read once only 8080 is traced: ${JSON.stringify(st)}`);
    } finally {
      ct.stop();
      tracer.close();
    }
  });

  kernelTest("the idle sweep ends a flow whose destroy never came, and forgets its wire tuples: the node's packets are no longer looked up for it", async () => {
    const dns = lab.service('kube-dns');
    const tracer = Tracer.open({});
    const records: FlowStatsRecord[] = [];
    try {
      tracer.setServices([parseServiceSpec(`${dns.clusterIP}:53/udp`)]);
      tracer.attachNetns(lab.nodeNetns);
      tracer.start((b) => records.push(...b.stats));
      // A UDP flow whose entry lives on (30 s): as far as the sweep knows, a flow whose destroy was missed.
      const u = await runIn(lab.nodeNetns, [process.execPath, '-e', UDP_EXCHANGES, dns.clusterIP, '53', '3'], { timeoutMs: 20_000 });
      const udpPort = Number(/port=(\d+)/.exec(u.stdout)![1]);
      assert.ok(await waitFor(() => tracer.stats().activeFlows >= 1, 5000), `the flow is registered (${tracer.stats().activeFlows} active)`);
      const swept = tracer.expireIdleFlows(0);
      assert.ok(swept >= 1, `the sweep ended it (${swept})`);
      const expired = records.find((r) => r.reason === StatsReason.EXPIRED && r.orig.sport === udpPort);
      assert.ok(expired, 'its final counters went out (EXPIRED)');
      assert.deepEqual(expired.packets, [3, 3]);
      assert.equal(tracer.stats().activeFlows, 0, 'its wire tuples are forgotten: nothing is active, and the device hooks return at once again');
    } finally {
      tracer.close();
    }
  });

  kernelTest('events per keep-alive connection do not grow with requests; --all-packets reports every packet', async () => {
    const { p, log } = await trace();
    let small: number, large: number, largePackets: number;
    try {
      const p100 = await keepAlive(100);
      const p1000 = await keepAlive(1000);
      await sleep(2500);
      assert.ok(await reapUntil(lab, () => !!log.flowByClientPort(p1000)?.countersFinal && !!log.flowByClientPort(p100)?.countersFinal, 10_000), 'both keep-alive flows ended');
      const count = (port: number) => log.eventsOf(log.flowByClientPort(port)!).filter((e) => e.kind !== pb.EventKind.EVENT_KIND_FLOW_STATS).length;
      small = count(p100);
      large = count(p1000);
      const f = log.flowByClientPort(p1000)!;
      largePackets = f.packets[0] + f.packets[1];
    } finally {
      await p.stop();
    }
    // Both connections take the same transitions (handshake, first packet
    // per hook and device, state changes, close); only the periodic counter
    // records depend on duration, and they are not counted here.
    assert.ok(largePackets >= 2000, `1000 requests are >= 2000 packets (counted ${largePackets})`);
    assert.ok(large <= small + 4, `1000 requests cost ${large} events, 100 cost ${small}: the count must not grow with requests`);
    assert.ok(large < 80, `a keep-alive connection costs a bounded number of events (got ${large})`);

    const all = await trace({ allPackets: true });
    try {
      const port = await keepAlive(100);
      const nfOf = () => {
        const f = all.log.flowByClientPort(port);
        return f ? all.log.eventsOf(f).filter((e) => e.kind === pb.EventKind.EVENT_KIND_NETFILTER).length : 0;
      };
      // The connection's last events may still be on their way to JS.
      await waitFor(() => nfOf() >= 4 * 200, 5000);
      const nf = nfOf();
      assert.ok(nf >= 4 * 200, `--all-packets: every packet at every hook (${nf} netfilter events for >= 200 packets)`);
    } finally {
      await all.p.stop();
    }
  });

  kernelTest('a stalled consumer: the reader holds back, nothing is lost between ring and JS, ring overflow is counted by the kernel', async () => {
    const web = lab.service('web');
    // A small ring (64 KiB, ~390 events) so a 2 s stall overflows it.
    const tracer = Tracer.open({ ringBufferBytes: 64 * 1024 });
    let delivered = 0;
    let stalled = false;
    try {
      tracer.setServices([parseServiceSpec(`${web.clusterIP}:80`)]);
      tracer.attachNetns(lab.nodeNetns);
      tracer.start((b) => {
        delivered += b.events.length + b.stats.length;
        if (!stalled && delivered > 0) {
          stalled = true;
          // The JS thread blocks, as a slow sink would: 2 s at a time until
          // the reader has held back and the ring has overflowed (one slice
          // on a fast machine; more on a slow one, such as an emulated VM of
          // the kernel matrix, where the same traffic takes longer).
          const until = Date.now() + 60_000 * TIME_SCALE;
          const done = () => {
            const st = tracer.stats();
            return st.readerHeldBack > 0 && st.ringbufLost > 0;
          };
          do Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 2000);
          while (!done() && Date.now() < until);
        }
      });
      // Traffic from a process of its own, so it goes on while JS is
      // blocked; it runs until the stall is over, then a little longer.
      const [cmd, ...args] = argvInNetns(lab.clientNetns, ['sh', '-c', `while :; do curl -s -o /dev/null --max-time 2 http://${web.clusterIP}/; done`]);
      const load = spawn(cmd!, args, { stdio: 'ignore' });
      const loadDone = new Promise((r) => load.once('exit', r));
      try {
        assert.ok(await waitFor(() => stalled, 30_000), 'the first events arrived');
        // The callback returned: JS is back.
        await sleep(500);
      } finally {
        load.kill();
        await loadDone;
      }
      assert.ok(await tracer.drain(10_000), 'the reader caught up once JS was back');
      // The connections the load left end a moment later (resets, conntrack
      // destroys): records written after the drain arrive within it.
      // One snapshot for the check and the assertions: the lab's last
      // packets still write records (seen: 4 more, in the ring, between a
      // settled check and a second reading, on 6.12 fentry).
      let st = tracer.stats();
      const settled = () => {
        st = tracer.stats();
        return delivered === st.kernelEvents + st.ctDestroyEvents && st.recordsRead === st.kernelEvents;
      };
      const settledInTime = await waitFor(settled, 5_000);
      // On a mismatch, every counter of every stage: where the records went.
      const counters = () => `settled: ${settledInTime}, delivered to JS: ${delivered}, stats: ${JSON.stringify(st)}`;
      assert.ok(stalled, 'the consumer stalled');
      assert.ok(st.readerHeldBack > 0, `the reader held back while JS was stalled (${st.readerHeldBack})`);
      // Ring records (kernelEvents) plus the conntrack listener's (flows' ends).
      assert.equal(delivered, st.kernelEvents + st.ctDestroyEvents, `every record the kernel wrote reached JS (${counters()})`);
      assert.equal(st.recordsRead, st.kernelEvents, counters());
      assert.equal(st.readerLostAtClose, 0);
      assert.ok(st.ringbufLost > 0, `the ring overflowed during the stall and the kernel counted it (${st.ringbufLost})`);
    } finally {
      tracer.close();
    }
  });

  kernelTest('capture (record, --snaplen): each record carries the packet\'s first bytes from its IP header, at the hooks and at the devices', async () => {
    const web = lab.service('web');
    const SNAPLEN = 64;
    const tracer = Tracer.open({ snaplen: SNAPLEN });
    const events: Array<{ kind: number; pkt: { saddr: string; daddr: string }; capture?: Uint8Array }> = [];
    try {
      tracer.setServices([parseServiceSpec(`${web.clusterIP}:80`)]);
      tracer.attachNetns(lab.nodeNetns);
      tracer.start((b) => events.push(...b.events));
      assert.ok((await lab.curl(`http://${web.clusterIP}/`, 'client')).ok);
      const captured = (kind: number) => events.filter((e) => e.kind === kind && e.capture?.length);
      await waitFor(() => captured(EventKind.NF).length > 0 && captured(EventKind.DEV_RECV).length > 0, 10_000);
      const ip = (b: Uint8Array, o: number) => `${b[o]}.${b[o + 1]}.${b[o + 2]}.${b[o + 3]}`;
      // A hook (the network header) and a device crossing (skb->data on receive): the two ways the length is found.
      for (const kind of [EventKind.NF, EventKind.DEV_RECV]) {
        const got = captured(kind);
        assert.ok(got.length > 0, `kind ${kind}: records with packet bytes (${events.length} records)`);
        for (const e of got) {
          const c = e.capture!;
          assert.equal(c[0]! >> 4, 4, 'an IPv4 header');
          // The linear part up to the snaplen: at least the IP header, at most the packet.
          assert.ok(c.length >= 20 && c.length <= Math.min(SNAPLEN, (c[2]! << 8) | c[3]!), `kind ${kind}: captured length ${c.length}`);
          assert.deepEqual([ip(c, 12), ip(c, 16)], [e.pkt.saddr, e.pkt.daddr], 'the packet the record is about');
        }
        // A handshake segment is all header, all linear: captured whole.
        assert.ok(got.some((e) => e.capture!.length === Math.min(SNAPLEN, (e.capture![2]! << 8) | e.capture![3]!)), `kind ${kind}: a packet captured whole`);
      }
    } finally {
      tracer.close();
    }
  });

  kernelTest('closed before JS caught up (a drain out of time): what never reached JS is counted as lost at shutdown, exactly', async () => {
    const web = lab.service('web');
    const tracer = Tracer.open({ ringBufferBytes: 1024 * 1024 });
    let delivered = 0;
    try {
      tracer.setServices([parseServiceSpec(`${web.clusterIP}:80`)]);
      tracer.attachNetns(lab.nodeNetns);
      tracer.start((b) => {
        delivered += b.events.length + b.stats.length;
      });
      const [cmd, ...args] = argvInNetns(lab.clientNetns, ['sh', '-c', `while :; do curl -s -o /dev/null --max-time 2 http://${web.clusterIP}/; done`]);
      const load = spawn(cmd!, args, { stdio: 'ignore' });
      const loadDone = new Promise((r) => load.once('exit', r));
      let before = '';
      try {
        assert.ok(await waitFor(() => delivered > 0, 30_000), 'the first events arrived');
        // A slow sink, then the stop: the reader holds back while JS is
        // busy (batches queued for JS, records in the ring), and the
        // tracer closes before JS had another turn.
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1000 * TIME_SCALE);
        const st = tracer.stats();
        before = JSON.stringify(st);
        assert.ok(st.ringBacklogBytes > 0 || st.batchesInFlight > 0, `records were still on their way (${before})`);
        tracer.close();
      } finally {
        load.kill();
        await loadDone;
      }
      // Batches that were queued for JS land after the close: counted too.
      await sleep(300);
      const st = tracer.stats();
      const counters = `delivered to JS: ${delivered}, before close: ${before}, last: ${JSON.stringify(st)}`;
      assert.ok(st.readerLostAtClose > 0, `records were left at close (${counters})`);
      // Every record the kernel wrote (none after the programs were detached)
      // and every destroy the listener read reached JS or is counted lost.
      assert.equal(delivered + st.readerLostAtClose + st.listenerLostAtClose, st.kernelEvents + st.ctDestroyEvents, counters);
    } finally {
      tracer.close();
    }
  });
});
