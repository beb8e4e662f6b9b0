/**
 * A real Prometheus (Debian's, unpacked by scripts/fetch-prometheus.sh)
 * scrapes `svctrace serve` in the lab while clients call the web ClusterIP:
 * the per-backend connection counts it stores equal the pods' own request
 * logs, the latency histograms are filled, conntrack use is there, and
 * promtool accepts the exposition and the alerting rules (whose unit tests
 * it runs).
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { ChildProcess, execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { kernelTest, IS_ROOT } from '../helpers/kernel';
import { waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { curlEach } from '../helpers/lab-traffic';
import { freePort } from '../helpers/stream';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const CLI = path.join(ROOT, 'bin', 'svctrace.js');
const PROM_BIN = path.join(ROOT, '.cache', 'prometheus', 'usr', 'bin');
const PROMETHEUS = path.join(PROM_BIN, 'prometheus');
const PROMTOOL = path.join(PROM_BIN, 'promtool');

function get(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http
      .get(url, (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`${url}: HTTP ${res.statusCode}: ${body.slice(0, 200)}`))));
      })
      .on('error', reject);
  });
}

interface Sample {
  metric: Record<string, string>;
  value: [number, string];
}

describe('metrics scraped by a real Prometheus (kernel)', () => {
  let lab: Lab | undefined;
  let serve: ChildProcess | undefined;
  let prometheus: ChildProcess | undefined;
  let dir: string | undefined;
  before(async () => {
    if (IS_ROOT) lab = await Lab.up();
  });
  after(async () => {
    prometheus?.kill('SIGTERM');
    serve?.kill('SIGINT');
    await lab?.down();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  kernelTest(
    "per-backend connections in Prometheus equal the pods' logs; histograms filled; promtool accepts metrics and rules",
    async () => {
      assert.ok(lab);
      assert.ok(fs.existsSync(PROMETHEUS) && fs.existsSync(PROMTOOL), 'prometheus/promtool missing: run scripts/fetch-prometheus.sh (scripts/setup.sh does)');
      const web = lab.service('web');
      const service = `${web.clusterIP}:80/tcp`;
      serve = spawn(process.execPath, [CLI, 'serve', '--netns', lab.nodeNetns, '--service', `${web.clusterIP}:80`, '--listen', '127.0.0.1:0'], { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      serve.stderr!.on('data', (d) => (err += d));
      assert.ok(await waitFor(() => /streaming at (ws:\S+) /.test(err), 10_000), `serve did not start: ${err}`);
      const base = /streaming at ws:\/\/(\S+?)\/v1\/events /.exec(err)![1]!;

      // Prometheus on loopback, scraping serve every second; its data in a temporary directory.
      dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svctrace-prom-'));
      const config = path.join(dir, 'prometheus.yml');
      fs.writeFileSync(config, ['global:', '  scrape_interval: 1s', 'scrape_configs:', '  - job_name: svctrace', '    static_configs:', `      - targets: ['${base}']`, ''].join('\n'));
      const promPort = await freePort();
      prometheus = spawn(PROMETHEUS, [`--config.file=${config}`, `--storage.tsdb.path=${path.join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${promPort}`], {
        stdio: ['ignore', 'ignore', 'pipe'],
      });
      let promErr = '';
      prometheus.stderr!.on('data', (d) => (promErr = (promErr + d).slice(-4000)));
      const api = `http://127.0.0.1:${promPort}/api/v1`;
      const query = async (q: string): Promise<Sample[]> => {
        const r = JSON.parse(await get(`${api}/query?query=${encodeURIComponent(q)}`)) as { status: string; data: { result: Sample[] } };
        assert.equal(r.status, 'success', q);
        return r.data.result;
      };
      const up = async () => (await query('up{job="svctrace"}').catch(() => []))[0]?.value[1] === '1';
      let ready = false;
      for (const deadline = Date.now() + 30_000; !ready && Date.now() < deadline; ) {
        ready = await up();
        if (!ready) await new Promise((r) => setTimeout(r, 250));
      }
      assert.ok(ready, `Prometheus never scraped serve: ${promErr}`);

      // 30 new connections, spread by the rules over the 3 backends.
      const N = 30;
      const served = await curlEach(lab, `http://${web.clusterIP}/`, N);
      const byPod = new Map<string, number>();
      for (const s of served) {
        const ip = lab.pods.find((p) => p.name === s.pod)!.ip;
        byPod.set(`${ip}:8080`, (byPod.get(`${ip}:8080`) ?? 0) + 1);
      }

      // Wait until Prometheus holds all of them, then compare backend by backend.
      const stored = async () => {
        const m = new Map<string, number>();
        for (const s of await query(`svctrace_connections_total{service="${service}"}`)) m.set(s.metric.backend!, Number(s.value[1]));
        return m;
      };
      let got = new Map<string, number>();
      const total = () => [...got.values()].reduce((a, b) => a + b, 0);
      for (const deadline = Date.now() + 20_000; total() < N && Date.now() < deadline; ) {
        got = await stored();
        if (total() < N) await new Promise((r) => setTimeout(r, 500));
      }
      assert.deepEqual(Object.fromEntries([...got].sort()), Object.fromEntries([...byPod].sort()), "connections per backend in Prometheus vs the pods' logs");

      const count = async (q: string) => (await query(q)).reduce((n, s) => n + Number(s.value[1]), 0);
      assert.equal(await count(`svctrace_first_reply_seconds_count{service="${service}"}`), N, 'DNAT-to-first-reply histogram: one per connection');
      assert.equal(await count(`svctrace_connection_setup_seconds_count{service="${service}"}`), N, 'setup histogram: one per connection');
      assert.ok((await count(`svctrace_first_reply_seconds_bucket{service="${service}",le="1"}`)) === N, 'every lab reply within 1 s');
      assert.equal(await count(`svctrace_connection_attempts_total{service="${service}"}`), N);
      const ratios = await query(`svctrace_backend_expected_ratio{service="${service}"}`);
      assert.equal(ratios.length, 3, 'the rules give each of the 3 backends a share');
      assert.ok(Math.abs(ratios.reduce((n, s) => n + Number(s.value[1]), 0) - 1) < 1e-6, 'shares sum to 1');
      let entries = 0;
      for (const deadline = Date.now() + 15_000; entries === 0 && Date.now() < deadline; ) {
        entries = await count(`svctrace_conntrack_entries{netns="${path.basename(lab.nodeNetns)}"}`);
        if (!entries) await new Promise((r) => setTimeout(r, 500));
      }
      assert.ok(entries > 0, 'conntrack entries of the node namespace');

      // promtool on the exposition itself, and on the alerting rules with their unit tests.
      execFileSync(PROMTOOL, ['check', 'metrics'], { input: await get(`http://${base}/metrics`), encoding: 'utf8' });
      execFileSync(PROMTOOL, ['check', 'rules', path.join(ROOT, 'deploy', 'prometheus', 'svctrace-alerts.yml')], { encoding: 'utf8' });
      execFileSync(PROMTOOL, ['test', 'rules', path.join(ROOT, 'deploy', 'prometheus', 'svctrace-alerts.test.yml')], { encoding: 'utf8' });
    },
    { timeout: 180_000 },
  );
});
