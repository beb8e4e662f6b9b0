/**
 * The dashboard in Debian's Chromium (driven by playwright-core) against a
 * live `svctrace serve` in the lab: flows with the right backends, a flow's
 * path (DNAT to the pod, the veth hop), distribution totals equal to the
 * requests, reconnect after a server restart, and a 50k-event burst that
 * leaves the page responsive. Screenshots go to test-output/dashboard/.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { chromium, Browser, Page } from 'playwright-core';
import { kernelTest, IS_ROOT, sleep } from '../helpers/kernel';
import { makeEvent, syntheticSource } from '../helpers/stream';
import { Lab } from '../../src/lab/lab';
import { StreamServer } from '../../src/stream/server';
import { dashboardHandler } from '../../src/stream/static';
import { nodeName } from '../../src/node-name';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const CLI = path.join(ROOT, 'bin', 'svctrace.js');
const OUT = path.join(ROOT, 'test-output', 'dashboard');
const CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-quic', '--disable-sync'];

function startServe(lab: Lab, listen: string): { child: ChildProcess; url: Promise<string> } {
  const child = spawn(process.execPath, [CLI, 'serve', '--netns', lab.nodeNetns, '--service', '10.96.0.100:80', '--listen', listen], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const url = new Promise<string>((resolve, reject) => {
    child.stderr!.on('data', (d) => {
      err += d;
      const m = /dashboard: (http:\S+);/.exec(err);
      if (m) resolve(m[1]!);
    });
    child.once('exit', (code) => reject(new Error(`serve exited ${code}: ${err}`)));
  });
  return { child, url };
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  child.kill('SIGINT');
  await new Promise((r) => child.once('exit', r));
}

async function connected(page: Page, want: boolean): Promise<void> {
  await page.waitForSelector(`[data-testid=conn-status][data-state=${want ? 'connected' : 'disconnected'}]`, { timeout: 15_000 });
}

describe('dashboard in Chromium (kernel)', () => {
  let lab: Lab;
  let browser: Browser;
  let serve: ChildProcess | undefined;
  before(async () => {
    if (!IS_ROOT) return;
    fs.mkdirSync(OUT, { recursive: true });
    lab = await Lab.up();
    browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: CHROMIUM_FLAGS });
  });
  after(async () => {
    await browser?.close();
    if (serve) await stop(serve);
    await lab?.down();
  });

  kernelTest('flows, path, distribution; survives a server restart', async () => {
    const s = startServe(lab, '127.0.0.1:0');
    serve = s.child;
    const pageUrl = await s.url;
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    await page.goto(pageUrl);
    await connected(page, true);

    const N = 6;
    for (let i = 0; i < N; i++) assert.ok((await lab.curl('http://10.96.0.100/')).ok);
    const served = lab.served.slice(-N);
    await page.waitForFunction((n) => document.querySelectorAll('[data-testid=flow-row]').length >= n, N, { timeout: 10_000 });
    await page.waitForFunction((n) => Number(document.querySelector('[data-testid=dist-total]')?.textContent) === n, N, { timeout: 10_000 });
    await page.screenshot({ path: path.join(OUT, 'flows.png'), fullPage: true });

    // Each request's row names the pod that really served it.
    const rows = await page.$$eval('[data-testid=flow-row]', (trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent ?? '')));
    for (const sv of served) {
      const pod = lab.pods.find((p) => p.name === sv.pod)!;
      const row = rows.find((r) => r[3] === sv.client);
      assert.ok(row, `no row for client ${sv.client}`);
      assert.equal(row[1], nodeName(), 'the node that traced it');
      assert.equal(row[5], `${pod.ip}:8080`, `backend of ${sv.client}`);
      assert.equal(row[6], pod.netns);
    }
    // Distribution: totals equal the requests, per backend equal the pods' logs.
    const dist = await page.$$eval('[data-testid=dist-row]', (trs) => trs.map((tr) => [tr.getAttribute('data-backend'), Number(tr.querySelector('[data-testid=dist-count]')?.textContent)]));
    for (const pod of lab.pods) {
      const want = served.filter((x) => x.pod === pod.name).length;
      const got = dist.find((d) => d[0] === `${pod.ip}:8080`)?.[1] ?? 0;
      assert.equal(got, want, `distribution for ${pod.name}`);
    }
    // Next to it, what the kube-proxy rules give each backend: 1/3.
    const expected = await page.$$eval('[data-testid=dist-expected]', (tds) => tds.map((td) => td.textContent));
    assert.ok(expected.length > 0 && expected.every((x) => x === '33.3%'), JSON.stringify(expected));

    // The path of one flow: DNAT from the ClusterIP to its pod, and the veth hop into it.
    const first = served[0]!;
    const pod = lab.pods.find((p) => p.name === first.pod)!;
    await page.click(`[data-testid=flow-row] >> text=${first.client}`);
    await page.waitForSelector('[data-testid=hop][data-stage=dnat]');
    const hops = await page.$$eval('[data-testid=hop]', (lis) => lis.map((li) => ({ stage: li.getAttribute('data-stage'), text: li.textContent ?? '' })));
    assert.ok(hops.some((h) => h.stage === 'dnat' && h.text.includes(`10.96.0.100:80 → ${pod.ip}:8080`)), JSON.stringify(hops));
    assert.ok(hops.some((h) => h.stage === 'device' && h.text.includes('recv eth0 (veth)') && h.text.includes(pod.netns)), 'veth hop into the pod');
    assert.ok(hops.some((h) => h.stage === 'reply'));
    await page.screenshot({ path: path.join(OUT, 'path.png'), fullPage: true });

    // Server restart: the page notices, then reconnects by itself.
    const port = new URL(pageUrl).port;
    await stop(serve);
    await connected(page, false);
    const s2 = startServe(lab, `127.0.0.1:${port}`);
    serve = s2.child;
    await s2.url;
    await connected(page, true);
    assert.ok((await lab.curl('http://10.96.0.100/')).ok);
    await page.waitForFunction((n) => Number(document.querySelector('[data-testid=dist-total]')?.textContent) >= n, N + 1, { timeout: 10_000 });
    await page.screenshot({ path: path.join(OUT, 'reconnected.png'), fullPage: true });
    await page.close();
  });

  kernelTest('a burst of 50k events leaves the page responsive', async () => {
    const server = await StreamServer.start(syntheticSource(), { listen: '127.0.0.1:0', staticHandler: dashboardHandler() });
    try {
      const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
      await page.goto(server.url().replace('ws://', 'http://').replace('/v1/events', '/'));
      await connected(page, true);
      const N = 50_000;
      let worstMs = 0;
      const probe = async () => {
        const t = Date.now();
        await page.evaluate(() => 1);
        worstMs = Math.max(worstMs, Date.now() - t);
      };
      for (let i = 0; i < N; i += 2500) {
        server.publish(Array.from({ length: 2500 }, (_, j) => makeEvent(i + j)));
        await sleep(5);
        if (i % 10_000 === 0) await probe();
      }
      await page.waitForFunction((n) => Number(document.querySelector('[data-testid=received]')?.textContent) >= n, N, { timeout: 30_000 });
      await probe();
      await page.screenshot({ path: path.join(OUT, 'burst.png'), fullPage: true });
      // Responsive: a round trip into the page never waited long behind rendering.
      assert.ok(worstMs < 2000, `page.evaluate round trip took ${worstMs} ms during the burst`);
      const flows = await page.evaluate(() => (window as unknown as { svctrace: { store: { flows: Map<string, unknown> } } }).svctrace.store.flows.size);
      assert.ok(flows <= 2000, `retained flows are capped (${flows})`);
      await page.close();
    } finally {
      await server.close();
    }
  });
});
