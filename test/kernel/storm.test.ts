/**
 * A short storm, in CI: `svctrace serve` (its own process, launched with the
 * flags of bin/svctrace.js's #! line, as the installed command runs) tracing
 * the web ClusterIP while wrk -t2 -c64 opens new connections (Connection:
 * close) for 20 s, with one WebSocket client that never reads. serve must
 * stay alive throughout, keep its memory bounded, and exit cleanly on SIGINT
 * with a summary that counts lost events; every connection the pods served
 * is a flow serve saw or one the kernel counted as lost whole (within 1%).
 * The same storm, longer, is bench/memory.ts.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { kernelTest, IS_ROOT } from '../helpers/kernel';
import { Lab } from '../../src/lab/lab';
import fs from 'node:fs';
import { parseWrk } from '../../bench/datapath';
import { flowAccount, neverReadingClient, parseServeSummary, ServeProc, shebang, startServe, startStorm, stopServe } from '../../bench/storm';
import { TIME_SCALE } from '../helpers/flows';

const STORM_SECONDS = 20;
/**
 * How far serve's anonymous memory (RssAnon: the heap, malloc, buffers — not
 * the node binary or the kernel ring buffer, which are file mappings of a
 * fixed size) may exceed its --max-old-space-size. That flag caps V8's old
 * space (serve's own summary reports the heap's peak against its limit, and
 * past it V8 aborts, which the liveness assertions catch); the rest of a
 * healthy process lives outside it: the young generation (3 x 16 MiB
 * semi-spaces), Node itself, the addon's in-flight batches (3 x 256 KiB),
 * the slow client's queue (8 MiB), socket buffers and malloc arenas. Past
 * limit + margin, memory grows outside every bound serve is meant to have
 * (external memory V8 does not see, for one: that leak grew 20 MiB/s).
 */
const RSS_MARGIN_MB = 192;

function rssAnonOf(pid: number): number | undefined {
  try {
    const m = /^RssAnon:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : undefined;
  } catch {
    return undefined; // gone
  }
}

describe('storm (kernel)', () => {
  let lab: Lab | undefined;
  let serve: ServeProc | undefined;
  let slow: WebSocket | undefined;
  before(async () => {
    if (IS_ROOT) lab = await Lab.up();
  });
  after(async () => {
    slow?.terminate();
    if (serve && !serve.exit) serve.child.kill('SIGKILL');
    await lab?.down();
  });

  kernelTest(
    `serve survives ${STORM_SECONDS} s of new connections with a client that never reads, memory bounded`,
    async () => {
      assert.ok(lab);
      const { maxOldSpaceMB } = shebang();
      assert.ok(maxOldSpaceMB, 'the #! line of bin/svctrace.js sets --max-old-space-size');
      const boundMB = maxOldSpaceMB + RSS_MARGIN_MB;

      serve = await startServe(lab, 15_000 * TIME_SCALE);
      const s = serve;
      slow = await neverReadingClient(s.url);
      const servedBefore = lab.served.length;
      const storm = await startStorm(lab, STORM_SECONDS);
      // VmRSS every second; a dead serve ends the storm early (the test fails below).
      const rssMB: number[] = [];
      const sampler = setInterval(() => {
        const rss = rssAnonOf(s.child.pid!);
        if (rss !== undefined) rssMB.push(rss / 2 ** 20);
        if (s.exit) storm.stop();
      }, 1000);
      const w = parseWrk(await storm.done);
      clearInterval(sampler);
      const tail = () => s.stderr().slice(-1500);

      assert.equal(s.exit, undefined, `serve died during the storm (${s.crash()}):\n${tail()}`);
      assert.ok(w.requests > 1000, `the storm did not happen: wrk made ${w.requests} requests`);
      assert.ok(rssMB.length >= STORM_SECONDS - 2, `only ${rssMB.length} RSS samples`);
      const peak = Math.max(...rssMB);
      assert.ok(peak < boundMB, `serve's anonymous RSS reached ${peak.toFixed(0)} MiB, over --max-old-space-size=${maxOldSpaceMB} + ${RSS_MARGIN_MB} MiB (samples: ${rssMB.map((x) => x.toFixed(0)).join(' ')})`);

      // The last connections' conntrack entries are destroyed and reported within ~2 s (lab timeouts).
      await lab.reapConntrack();
      await new Promise((r) => setTimeout(r, 2500));
      const served = lab.served.length - servedBefore;
      slow.terminate();
      const stop = await stopServe(s, 15_000 * TIME_SCALE);
      assert.ok(stop.clean, `serve did not exit cleanly on SIGINT (${stop.why}):\n${tail()}`);
      assert.equal(stop.code, 0, tail());
      const sum = parseServeSummary(stop.stderr);
      assert.ok(sum.flows !== undefined && sum.flows > 0, `no "summary: N flows" line:\n${tail()}`);
      assert.ok(sum.lost !== undefined, `the summary does not count lost events ("events: ... lost: N"):\n${tail()}`);
      // serve's own account of its V8 heap: the peak stayed under the limit.
      const mem = /memory: V8 heap peak (\d+) MiB of a (\d+) MiB limit/.exec(stop.stderr);
      assert.ok(mem, `no memory line in the summary:\n${tail()}`);
      console.log(`storm: ${w.requests} requests, anonymous RSS peak ${peak.toFixed(0)} MiB (bound ${boundMB}), ${mem[0]}, ${sum.eventsLine ?? ''}`);
      assert.ok(Number(mem[1]) < Number(mem[2]), mem[0]);
      // Every served connection is a flow seen or counted lost; none split in two.
      const unseen = sum.flowsUnseen ?? 0;
      const acct = flowAccount({ served, failed: Number.isFinite(w.errors) ? w.errors : 0, flows: sum.flows, unseen, resets: sum.resets ?? 0 });
      const flowsLine = `${served} connections served; ${sum.flows} flows seen, ${unseen} counted as lost whole: ${acct.uncounted} neither, ${acct.extra} more than connections`;
      console.log(`storm: ${flowsLine}`);
      assert.ok(acct.counted, `flows do not add up within 1%: ${flowsLine}`);
    },
    { timeout: 60_000 },
  );
});
