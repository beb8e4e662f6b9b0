/**
 * The addon hands JS whole batches: a burst of kernel events must arrive in
 * far fewer JS callbacks than events.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import os from 'node:os';
import { kernelTest, sleep, IS_ROOT, testBackend } from '../helpers/kernel';
import { Lab } from '../../src/lab/lab';
import { runIn } from '../../src/lab/exec';
import { TIME_SCALE } from '../helpers/flows';
import { Tracer } from '../../src/tracer/tracer';
import { parseServiceSpec } from '../../src/net/ipv4';
import { loadBinding, type NativeStats } from '../../src/native/binding';
import { decodeBatch } from '../../src/events/decode';
import { EventKind, NfStage, StatsReason } from '../../src/events/layout';

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
      // Ring records only (what recordsRead counts): conntrack destroys and
      // their final counters come by netlink, once the lab's entries expire.
      events += b.events.filter((e) => e.kind !== EventKind.CT_DESTROY).length + b.stats.filter((s) => s.reason !== StatsReason.CLOSED).length;
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
    await runIn(lab.nodeNetns, [process.execPath, '-e', sender], { timeoutMs: 60_000 * TIME_SCALE });
    // Quiet (nothing more read for a second: on an emulated CPU the last
    // packets and replies take longer than any fixed wait), and everything
    // read has reached the callback.
    let st = tracer.stats();
    for (const end = Date.now() + 60_000 * TIME_SCALE; ; ) {
      await sleep(1000);
      assert.ok(await tracer.drain(30_000 * TIME_SCALE), `the ring did not drain within ${30 * TIME_SCALE} s`);
      const now = tracer.stats();
      const quiet = now.recordsRead === st.recordsRead;
      st = now;
      if (quiet) break;
      assert.ok(Date.now() < end, `records kept coming for ${60 * TIME_SCALE} s after the burst`);
    }
    assert.ok(events >= 3000, `expected >= 3000 events, got ${events}`);
    assert.equal(st.recordsRead, events);
    assert.equal(st.batchCallbacks, callbacks);
    assert.ok(callbacks * 10 <= events, `${events} events took ${callbacks} callbacks`);
  });

  // The reader maps the ring's data once (native/ring_reader.cc), so a
  // record that crosses the ring's end is copied out in two parts. A
  // one-page ring makes that happen every lap: every record must still
  // arrive whole and in order (the synthetic source numbers them).
  kernelTest('records that wrap around the ring arrive whole and in order', async (t) => {
    // The synthetic source is a BPF_PROG_TYPE_SYSCALL program (Linux >=
    // 5.14). The reader under test is user space, the same on every kernel.
    const [major = 0, minor = 0] = os.release().split('.').map(Number);
    if (major < 5 || (major === 5 && minor < 14)) {
      t.skip(`the synthetic event source needs Linux >= 5.14 (syscall programs); this is ${os.release()}`);
      return;
    }
    // The attach programs are loaded too: this kernel's backend (a kernel
    // without netfilter links cannot load those).
    const native = new (loadBinding().Tracer)({ backend: testBackend(), benchSource: true, ringBufferBytes: 4096 });
    const FLOWS = 7;
    const seen: Array<{ sport: number; after: boolean }> = [];
    try {
      native.load();
      native.start((buf) => {
        for (const e of decodeBatch(buf).events) seen.push({ sport: e.ctOrig.sport, after: e.nfStage === NfStage.AFTER_NAT });
      });
      // Bursts of 9 records (less than a lap): ~15 laps, records wrap at
      // every offset the record size allows.
      const idleLike = (st: NativeStats) => st.ringBacklogBytes === 0 && st.readerPending === 0 && st.batchesInFlight === 0;
      for (let burst = 0; burst < 200; burst++) {
        const want = seen.length + 9;
        native.benchEmit(9, FLOWS);
        // Written and not yet through this (busy) JS thread: in the ring,
        // pending in the reader, or in flight. deliveryIdle says so without
        // stats()'s syscalls, and agrees with the three counts it stands for.
        assert.equal(native.deliveryIdle(), false, `burst ${burst}: idle with 9 records just written`);
        const deadline = Date.now() + 5000;
        while ((seen.length < want || !native.deliveryIdle()) && Date.now() < deadline) await sleep(2);
        assert.ok(native.deliveryIdle(), `burst ${burst}: not idle 5 s after its records arrived`);
        assert.ok(idleLike(native.stats()), `burst ${burst}: deliveryIdle() said idle, stats() did not`);
      }
      const st = native.stats();
      assert.equal(st.malformed, 0, 'records the reader could not read');
      assert.equal(st.ringbufLost, 0, 'the ring overflowed: bursts must fit');
      assert.equal(seen.length, 1800);
      seen.forEach((e, n) => {
        assert.equal(e.sport, 10000 + (n % FLOWS), `record ${n}: source port`);
        assert.equal(e.after, (n & 1) === 1, `record ${n}: NAT stage`);
      });
    } finally {
      native.close();
    }
  });
});
