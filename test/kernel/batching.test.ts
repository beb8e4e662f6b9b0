/**
 * The addon hands JS whole batches: a burst of kernel events must arrive in
 * far fewer JS callbacks than events.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { kernelTest, sleep, IS_ROOT } from '../helpers/kernel';
import { Lab } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { Tracer } from '../../src/tracer/tracer';
import { parseServiceSpec } from '../../src/net/ipv4';

describe('batch delivery (kernel)', () => {
  let lab: Lab | undefined;
  let tracer: Tracer | undefined;
  before(async () => {
    if (IS_ROOT) lab = await Lab.up({ pods: 1 });
  });
  after(async () => {
    tracer?.close();
    await lab?.down();
  });

  kernelTest('N events arrive in far fewer than N callbacks', async () => {
    assert.ok(lab);
    const dns = lab.service('kube-dns');
    tracer = Tracer.open();
    tracer.setServices([parseServiceSpec(`${dns.clusterIP}:${dns.port}/udp`)]);
    tracer.attachNetns(lab.nodeNetns);
    let events = 0;
    let callbacks = 0;
    tracer.start((b) => {
      callbacks++;
      events += b.events.length + b.stats.length;
    });
    // 3000 datagrams from distinct source ports in one burst: each is its
    // own conntrack entry, seen at several hooks.
    const sender = `
      const dgram = require('node:dgram');
      let left = 3000, open = 0;
      function one() {
        const s = dgram.createSocket('udp4'); open++;
        s.send('x', ${dns.port}, '${dns.clusterIP}', () => { s.close(); open--; if (left > 0) { left--; one(); } });
      }
      for (let i = 0; i < 50; i++) { left--; one(); }
      const t = setInterval(() => { if (left <= 0 && open === 0) { clearInterval(t); } }, 10);
    `;
    await runIn(lab.nodeNetns, [process.execPath, '-e', sender], { timeoutMs: 60_000 });
    await sleep(300);
    const st = tracer.stats();
    assert.ok(events >= 3000, `expected >= 3000 events, got ${events}`);
    assert.equal(st.recordsRead, events);
    assert.equal(st.batchCallbacks, callbacks);
    assert.ok(callbacks * 10 <= events, `${events} events took ${callbacks} callbacks`);
  });
});
