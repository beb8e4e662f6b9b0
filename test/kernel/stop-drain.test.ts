/**
 * A stop delivers what the kernel reported just before it. Flows that end
 * in the last moments before a stop (an incident recording stopped right
 * after the failure) end through conntrack's DESTROY messages, which the
 * listener reads on its own thread and hands over in batches gathered for
 * a few ms. The drain at stop asks the listeners for what they hold and
 * for what their sockets hold, and waits for it: those ends reach the
 * sinks instead of being counted lost at shutdown.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { kernelTest, IS_ROOT } from '../helpers/kernel';
import { FlowLog, waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { Pipeline } from '../../src/pipeline/pipeline';
import { parseServiceSpec } from '../../src/net/ipv4';
import { svctrace } from '../../src/gen/svctrace';

import pb = svctrace.v1;

/** N UDP exchanges, each from a socket of its own (N conntrack entries); prints their local ports. */
const UDP_FLOWS = `
const dgram = require('node:dgram');
const [addr, port, n] = process.argv.slice(1);
let left = Number(n);
const ports = [];
const t = setTimeout(() => { console.error('timeout, ' + left + ' left'); process.exit(1); }, 10000);
for (let i = 0; i < Number(n); i++) {
  const s = dgram.createSocket('udp4');
  s.on('message', () => { ports.push(s.address().port); s.close(); if (--left === 0) { clearTimeout(t); console.log('ports=' + ports.join(',')); } });
  s.send('q' + i, Number(port), addr);
}
`;

const FLOWS = 20;

describe('stop: what the kernel reported just before reaches the sinks (kernel)', () => {
  let lab: Lab;

  before(async () => {
    if (!IS_ROOT) return;
    lab = await Lab.up({ pods: 2 });
  });

  after(async () => {
    await lab?.down();
  });

  kernelTest('conntrack destroys read just before the stop are delivered, none counted lost at shutdown', async (t) => {
    const dns = lab.service('kube-dns');
    const log = new FlowLog();
    const p = await Pipeline.start(
      {
        services: [parseServiceSpec(`${dns.clusterIP}:53/udp`)],
        netns: [lab.nodeNetns],
        kubeconfig: false,
        ruleTrace: false,
        closeGraceMs: 3_600_000,
      },
      () => [{ name: 'test', write: log.add }],
    );
    let stopped = false;
    try {
      const u = await runIn(lab.nodeNetns, [process.execPath, '-e', UDP_FLOWS, dns.clusterIP, '53', String(FLOWS)], { timeoutMs: 20_000 });
      const ports = /ports=([\d,]+)/.exec(u.stdout)![1]!.split(',').map(Number);
      assert.equal(new Set(ports).size, FLOWS, `${FLOWS} flows of their own (${u.stdout})`);
      assert.ok(await waitFor(() => ports.every((port) => log.flowByClientPort(port)), 10_000), 'every flow was seen');
      // The entries end now (a UDP entry lives 30 s): conntrack sends their
      // DESTROY messages before the command returns, and the stop follows at once.
      const del = await runIn(lab.nodeNetns, ['conntrack', '-D', '-p', 'udp', '-d', dns.clusterIP]);
      const deleted = Number(/(\d+) flow entries have been deleted/.exec(del.stderr)?.[1] ?? NaN);
      assert.ok(deleted >= FLOWS, `conntrack deleted the flows' entries: ${del.stderr.trim()}`);
      const stopAt = Date.now();
      const r = await p.stop();
      const stopMs = Date.now() - stopAt;
      stopped = true;
      const counts = `losses ${JSON.stringify(r.losses)}; listener lost at close ${r.stats.listenerLostAtClose}, reader ${r.stats.readerLostAtClose}`;
      assert.equal(r.losses.shutdown ?? 0, 0, `nothing lost at shutdown (${counts})`);
      // The drain got them without waiting out its limit (2 s): the listener was woken and asked.
      assert.ok(stopMs < 1500, `the stop took ${stopMs} ms`);
      t.diagnostic(`stop took ${stopMs} ms`);
      // Every flow's end arrived: its destroy, and its final counters.
      for (const port of ports) {
        const f = log.flowByClientPort(port)!;
        const kinds = log.eventsOf(f).map((e) => e.kind);
        assert.ok(kinds.includes(pb.EventKind.EVENT_KIND_CT_DESTROY), `flow from port ${port} has its conntrack destroy (${counts}; kinds ${kinds.join(',')})`);
        assert.ok(log.eventsOf(f).some((e) => e.kind === pb.EventKind.EVENT_KIND_FLOW_STATS && e.counters?.final), `flow from port ${port} has its final counters (${counts})`);
      }
    } finally {
      if (!stopped) await p.stop();
    }
  });
});
