/**
 * Memory under a storm: `svctrace serve` (its own process, launched with the
 * flags of its #! line, RSS sampled every second from /proc) tracing the web
 * ClusterIP while wrk opens new connections as fast as the lab allows, with
 * one WebSocket client that never reads. Reports whether serve survived (or
 * why it crashed), the RSS plateau, every lost event, and the flows serve saw
 * against the connections the pods served.
 */
import WebSocket from 'ws';
import { Lab } from '../src/lab/lab';
import { parseWrk } from './datapath';
import { fmt, rssOf, sleep, table, writeResult } from './common';
import { flowAccount, hubDropped, neverReadingClient, parseServeSummary, ServeProc, shebang, startServe, startStorm, stopServe } from './storm';

const PLATEAU_TARGET_MB = 200;

export async function benchMemory(opts: { quick: boolean }): Promise<object> {
  const seconds = opts.quick ? 20 : 120;
  const lab = await Lab.up();
  let serve: ServeProc | undefined;
  let slow: WebSocket | undefined;
  try {
    serve = await startServe(lab);
    slow = await neverReadingClient(serve.url);
    const servedBefore = lab.served.length;
    const samples: Array<{ t: number; rssMB: number }> = [];
    let dropped: number | undefined;
    const t0 = Date.now();
    const storm = await startStorm(lab, seconds);
    const s = serve;
    const sampler = setInterval(() => {
      const rss = rssOf(s.child.pid!);
      if (rss !== undefined) samples.push({ t: (Date.now() - t0) / 1000, rssMB: rss / 1e6 });
      if (s.exit) storm.stop(); // nothing left to measure
    }, 1000);
    // The slow client's drops, polled: once stuck long enough it is disconnected and leaves /metrics.
    let stormOver = false;
    const polling = (async () => {
      while (!stormOver && !s.exit) {
        const n = await hubDropped(s);
        if (n !== undefined) dropped = Math.max(dropped ?? 0, n);
        await sleep(2000);
      }
    })();
    const w = parseWrk(await storm.done);
    stormOver = true;
    clearInterval(sampler);
    await polling;
    // The last connections' conntrack entries are destroyed and reported within ~2 s (lab timeouts).
    await lab.reapConntrack();
    await sleep(2500);
    const served = lab.served.length - servedBefore;
    slow.terminate();
    const stop = await stopServe(s);
    const sum = parseServeSummary(stop.stderr);

    const half = Math.floor(samples.length / 2);
    const maxOf = (xs: typeof samples) => (xs.length ? Math.max(...xs.map((x) => x.rssMB)) : NaN);
    const firstMax = maxOf(samples.slice(0, half));
    const plateau = maxOf(samples.slice(half));
    const failed = Number.isFinite(w.errors) ? w.errors : 0;
    const flows = sum.flows;
    const unseen = sum.flowsUnseen ?? 0;
    const acct = flows === undefined ? undefined : flowAccount({ served, failed, flows, unseen, resets: sum.resets ?? 0 });
    const short = acct?.short ?? served;
    const uncounted = acct?.uncounted ?? served;
    const extra = acct?.extra ?? 0;
    const flowsMatch = acct?.matched ?? false;
    const flowsCounted = acct?.counted ?? false;
    const flowsVerdict = flowsMatch
      ? 'met'
      : flowsCounted
        ? `met: ${fmt(short)} short, ${fmt(unseen)} counted as lost whole by the kernel`
        : `MISSED (${short ? `${fmt(short)} short, ${fmt(unseen)} of them counted as lost` : `${fmt(extra)} more than connections`})`;
    const lost = { kernel: sum.lost, slowClientDropped: dropped, flowsUnseen: unseen, flowsUnaccounted: flowsCounted ? 0 : uncounted, flowsUnexplained: flowsCounted ? 0 : extra };
    const status = stop.clean ? 'alive (clean exit on SIGINT)' : `CRASHED: ${stop.why}`;

    console.log(`\nMemory under a storm of new connections (${seconds}s, wrk -t2 -c64 Connection: close, one client that never reads; serve ${shebang().flags.join(' ')})`);
    const na = (v: number | undefined) => (v === undefined ? 'n/a' : fmt(v));
    console.log(
      table(
        ['what', 'value', 'target'],
        [
          ['serve', status, 'alive'],
          ['new connections/s (wrk)', fmt(w.rps), ''],
          ['RSS max, 1st half (MB)', firstMax.toFixed(0), ''],
          ['RSS max, 2nd half = plateau (MB)', plateau.toFixed(0), `< ${PLATEAU_TARGET_MB}: ${plateau < PLATEAU_TARGET_MB ? 'met' : 'MISSED'}`],
          ['growth 2nd vs 1st half', `${(((plateau - firstMax) / firstMax) * 100).toFixed(1)}%`, ''],
          ['events lost (kernel/reader/netlink)', na(lost.kernel), ''],
          ['events dropped for the slow client', lost.slowClientDropped === undefined ? 'n/a (/metrics not answered while it was connected)' : fmt(lost.slowClientDropped), ''],
          ['connections the pods served', fmt(served), ''],
          ['connections wrk saw fail (never served)', fmt(failed), ''],
          ['flows reset, seen or lost whole (attempts a pod never served, or served and reset)', na(sum.resets), ''],
          [
            'flows serve saw',
            na(sum.flows),
            `within 1% of served..served+failed+reset, or counted as lost: ${flowsVerdict}`,
          ],
        ],
      ),
    );
    if (sum.eventsLine) console.log(`  serve: ${sum.eventsLine}`);
    const result = {
      seconds,
      serveFlags: shebang().flags,
      alive: stop.clean,
      crash: stop.why,
      connectionsPerSecond: w.rps,
      samples,
      firstHalfMaxMB: firstMax,
      plateauMB: plateau,
      plateauTargetMB: PLATEAU_TARGET_MB,
      served,
      failedConnections: failed,
      flowsSeen: sum.flows,
      flowsMatch: flowsMatch ? "matched" : flowsCounted ? "counted as lost" : "missed",
      lost,
      serveSummary: sum.eventsLine,
      serveStderrTail: stop.clean ? undefined : stop.stderr.slice(-2000),
    };
    console.log(`-> ${writeResult('memory', result)}`);
    return result;
  } finally {
    slow?.terminate();
    if (serve && !serve.exit) serve.child.kill('SIGKILL');
    await lab.down();
  }
}
