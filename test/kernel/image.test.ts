/**
 * The image (`npm run image`: Debian packages only, no registry) run as the
 * DaemonSet declares it. The podman flags are derived from
 * deploy/kubernetes/agent.yaml (test/helpers/podman.ts): the user, the five
 * capabilities and nothing more, host network and PID, the read-only root,
 * the mounts and the memory limit tested are the manifest's. Two things
 * differ, and only these: the listen address (loopback and a free port, not
 * the node's 0.0.0.0:7643) and `--netns` (the lab's node namespace, where the
 * DaemonSet traces the node's own).
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { IN_CI, IS_ROOT, kernelTest, netfilterLinks } from '../helpers/kernel';
import { TIME_SCALE, waitFor } from '../helpers/flows';
import { manifest, Manifest, podmanRunOf, withFlag } from '../helpers/podman';
import { freePort } from '../helpers/stream';
import { Lab } from '../../src/lab/lab';
import { connect } from '../../src/client/node';
import { svctrace } from '../../src/gen/svctrace';

import pb = svctrace.v1;

const REPO = path.resolve(__dirname, '..', '..', '..');
/** What this machine needs of every podman run (crun rejects its cgroups; podman's own ulimits are too high here). */
const MACHINE_FLAGS = ['--runtime', 'runc', '--ulimit', 'nofile=1024:1024', '--ulimit', 'nproc=1024:1024'];
const NODE_NAME = 'svt-image-node';

const missing = ['podman', 'mmdebstrap'].filter((tool) => spawnSync(tool, ['--version'], { stdio: 'ignore' }).status !== 0);

function healthz(port: number): Promise<number> {
  return new Promise((resolve) => {
    http.get({ host: '127.0.0.1', port, path: '/healthz', timeout: 2000 }, (res) => (res.resume(), resolve(res.statusCode ?? 0))).on('error', () => resolve(0));
  });
}

describe('the image, run with the DaemonSet\'s privileges (kernel)', () => {
  let daemonSet: Manifest;
  let image = '';
  let lab: Lab | undefined;
  let tokenDir = '';
  let token = '';
  let unavailable = '';
  const containers: string[] = [];

  const podman = (extraFlags: string[], args: string[], opts: { detach?: boolean; name?: string } = {}) => {
    const run = podmanRunOf(daemonSet.spec.template, 'svctrace', { secrets: { 'svctrace-token': tokenDir }, fieldRefs: { 'spec.nodeName': NODE_NAME } });
    const name = opts.name ?? `svt-image-${process.pid}-${containers.length}`;
    containers.push(name);
    return spawnSync('podman', ['run', '--name', name, ...(opts.detach ? ['--detach'] : ['--rm']), ...MACHINE_FLAGS, ...run.flags, ...extraFlags, image, ...args], { encoding: 'utf8', timeout: 120_000 });
  };

  before(async () => {
    if (!IS_ROOT) return;
    if (missing.length) {
      if (IN_CI) throw new Error(`${missing.join(' and ')} not installed (scripts/setup-system.sh installs them)`);
      unavailable = `${missing.join(' and ')} not installed`;
      return;
    }
    daemonSet = await manifest('DaemonSet', 'svctrace-agent');
    image = daemonSet.spec.template.spec.containers[0].image as string;
    execFileSync('bash', ['scripts/image.sh'], { cwd: REPO, env: { ...process.env, SVT_IMAGE_NO_BUILD: '1' }, stdio: ['ignore', 'ignore', 'pipe'], timeout: 900_000 });
    tokenDir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-image-token-'));
    token = crypto.randomBytes(24).toString('hex');
    fs.writeFileSync(path.join(tokenDir, 'token'), `${token}\n`, { mode: 0o600 });
    lab = await Lab.up();
  });

  after(async () => {
    for (const name of containers) spawnSync('podman', ['rm', '--force', '--time', '5', name], { stdio: 'ignore' });
    await lab?.down();
    if (tokenDir) fs.rmSync(tokenDir, { recursive: true, force: true });
  });

  kernelTest('svctrace doctor in the image: ready with exactly the capabilities the DaemonSet adds', async (t) => {
    if (unavailable) return t.skip(unavailable);
    const r = podman([], ['doctor', '--json']);
    assert.equal(r.status, 0, `doctor: ${r.stderr}`);
    const report = JSON.parse(r.stdout) as { ready: boolean; checks: Array<{ id: string; ok: boolean; detail: string }> };
    assert.equal(report.ready, true, JSON.stringify(report.checks.filter((c) => !c.ok)));
    const check = (id: string) => report.checks.find((c) => c.id === id)!;
    assert.match(check('privileges').detail, /^uid 0; effective: CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF$/);
    assert.equal(check('addon').detail, `prebuilt: /usr/local/lib/node_modules/svctrace/prebuilds/linux-${process.arch}/svctrace.napi.glibc.node`);
    // The tools explain and the snapshots read the node with are in the image.
    assert.equal(check('iptables').ok, true, check('iptables').detail);
  });

  kernelTest('the DaemonSet\'s serve in the image: /healthz, then every curl to the ClusterIP on the stream, named with the node', async (t) => {
    if (unavailable) return t.skip(unavailable);
    const port = await freePort();
    const args = [...withFlag(daemonSet.spec.template.spec.containers[0].args as string[], '--listen', `127.0.0.1:${port}`), '--netns', lab!.nodeNetns];
    const linksBefore = netfilterLinks().length;
    const name = `svt-image-serve-${process.pid}`;
    const started = podman([], args, { detach: true, name });
    assert.equal(started.status, 0, `podman run: ${started.stderr}`);
    const logs = () => spawnSync('podman', ['logs', name], { encoding: 'utf8' }).stderr;
    // What the readiness probe asks.
    let ready = false;
    for (let i = 0; i < 60 * TIME_SCALE && !ready; i++) {
      ready = (await healthz(port)) === 200;
      if (!ready) await new Promise((r) => setTimeout(r, 500));
    }
    assert.ok(ready, `no /healthz: ${logs()}`);
    const events: pb.Event[] = [];
    const client = await connect({ url: `ws://127.0.0.1:${port}/v1/events`, token }, { events: (b) => events.push(...b) });
    try {
      assert.equal(client.hello?.node, NODE_NAME, 'the node name comes from NODE_NAME (the downward API)');
      const web = lab!.service('web');
      const served = lab!.served.length;
      for (let i = 0; i < 3; i++) {
        const r = await lab!.curl(`http://${web.clusterIP}:${web.port}/image-${i}`);
        assert.ok(r.ok, r.stderr);
      }
      const mine = lab!.served.slice(served);
      const dnatOf = (client: string) => events.find((e) => e.stage === pb.Stage.STAGE_DNAT && e.afterNat && `${e.packet?.src}:${e.packet?.srcPort}` === client);
      assert.ok(await waitFor(() => mine.every((s) => dnatOf(s.client)), 10_000 * TIME_SCALE), `DNAT events for ${mine.map((s) => s.client)}: ${events.length} events; ${logs()}`);
      for (const s of mine) assert.equal(dnatOf(s.client)!.packet!.dst, lab!.pods.find((p) => p.name === s.pod)!.ip, `${s.client} was served by ${s.pod}`);
    } finally {
      client.close();
    }
    // Stopped as Kubernetes stops a pod (SIGTERM): it detaches and exits 0.
    const stopped = spawnSync('podman', ['stop', '--time', '10', name], { encoding: 'utf8' });
    assert.equal(stopped.status, 0, stopped.stderr);
    const exit = spawnSync('podman', ['inspect', '--format', '{{.State.ExitCode}}', name], { encoding: 'utf8' }).stdout.trim();
    assert.equal(exit, '0', logs());
    assert.equal(netfilterLinks().length, linksBefore, 'its links are gone');
  });
});
