/**
 * The npm package on a machine with only Node. The prebuilt addon
 * (scripts/prebuild.sh) is packed with `npm pack`; a minimal Debian root is
 * made by mmdebstrap from Debian's packages alone (no clang, cmake, bpftool,
 * libbpf, libelf, libmnl, iptables nor nft in it); this machine's Node and
 * npm are copied in; the tarball is installed there with no network at all
 * (its dependencies are bundled); then `svctrace doctor --json` and a short
 * `svctrace trace` of the lab run from inside that root.
 *
 * The root runs in a mount namespace of its own (unshare), with /proc, /sys,
 * /dev and /run/netns bound in: what the DaemonSet mounts. The lab's
 * namespaces are the host's; traffic stays between them.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { IN_CI, IS_ROOT, kernelTest } from '../helpers/kernel';
import { TIME_SCALE, waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { ended } from '../helpers/child';

const REPO = path.resolve(__dirname, '..', '..', '..');
/** The Debian root, made once per machine and kept (mmdebstrap: about 15 s and 60 MB of packages). */
const ROOT_TAR = path.join(REPO, '.cache', 'clean-root', 'bookworm-minbase.tar');
/** Inside the root: this machine's Node, npm beside it. */
const NODE = '/usr/local/bin/node';
const INSTALLED = '/usr/local/lib/node_modules/svctrace';

const hasMmdebstrap = (() => {
  try {
    execFileSync('mmdebstrap', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

/** Runs argv chrooted in `root`, in a private mount namespace with the host's /proc, /sys, /dev and /run/netns. */
function inRoot(root: string, argv: string[], opts: { timeoutMs?: number } = {}): { done: Promise<number>; out: () => string; err: () => string } {
  const script = [
    'set -e',
    'R="$1"; shift',
    'mount -t proc proc "$R/proc"',
    'mount --rbind /sys "$R/sys"',
    'mount --rbind /dev "$R/dev"',
    'mkdir -p "$R/run/netns" && mount --rbind /run/netns "$R/run/netns"',
    'exec chroot "$R" "$@"',
  ].join('\n');
  const child = spawn('unshare', ['--mount', '--propagation', 'private', 'sh', '-c', script, 'sh', root, ...argv], {
    stdio: ['ignore', 'pipe', 'pipe'],
    // Nothing of this machine's environment: a clean node's.
    env: { PATH: '/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin', HOME: '/root', LANG: 'C.UTF-8' },
  });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (err += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
  const done = ended(child).then((code) => (clearTimeout(timer), code ?? (child.signalCode ? 128 : 1)));
  return { done, out: () => out, err: () => err };
}

describe('the npm package on a clean Debian root with only Node (kernel)', () => {
  let work = '';
  let root = '';
  let lab: Lab | undefined;
  let unavailable = '';

  before(async () => {
    if (!IS_ROOT) return;
    if (!hasMmdebstrap) {
      // CI installs it (scripts/setup-system.sh): there its absence is a failure.
      if (IN_CI) throw new Error('mmdebstrap is not installed (scripts/setup-system.sh installs it)');
      unavailable = 'mmdebstrap is not installed (apt-get install mmdebstrap)';
      return;
    }
    work = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-package-'));
    root = path.join(work, 'root');
    if (!fs.existsSync(ROOT_TAR)) {
      fs.mkdirSync(path.dirname(ROOT_TAR), { recursive: true });
      execFileSync('mmdebstrap', ['--variant=minbase', '--mode=root', '--format=tar', '--quiet', 'bookworm', `${ROOT_TAR}.part`, 'http://deb.debian.org/debian'], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 600_000 });
      fs.renameSync(`${ROOT_TAR}.part`, ROOT_TAR);
    }
    fs.mkdirSync(root);
    execFileSync('tar', ['-C', root, '-xf', ROOT_TAR]);
    // Node and npm, as a node that has "only Node" has them.
    fs.copyFileSync(process.execPath, path.join(root, NODE));
    fs.chmodSync(path.join(root, NODE), 0o755);
    const npmDir = path.resolve(fs.realpathSync(execFileSync('sh', ['-c', 'command -v npm'], { encoding: 'utf8' }).trim()), '..', '..');
    fs.mkdirSync(path.join(root, 'usr/local/lib/node_modules'), { recursive: true });
    execFileSync('cp', ['-a', npmDir, path.join(root, 'usr/local/lib/node_modules/npm')]);
    fs.symlinkSync('../lib/node_modules/npm/bin/npm-cli.js', path.join(root, 'usr/local/bin/npm'));
    // The package, as `npm pack` makes it (prepack's build is already done: only the prebuilt addon is made here).
    execFileSync('bash', ['scripts/prebuild.sh'], { cwd: REPO, stdio: ['ignore', 'ignore', 'pipe'], timeout: 600_000 });
    const packed = JSON.parse(execFileSync('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', path.join(root, 'tmp')], { cwd: REPO, encoding: 'utf8', maxBuffer: 64 << 20 })) as Array<{ filename: string }>;
    fs.renameSync(path.join(root, 'tmp', packed[0]!.filename), path.join(root, 'tmp', 'svctrace.tgz'));
    lab = await Lab.up();
  });

  after(async () => {
    await lab?.down();
    // The mounts lived in the install's and the runs' own mount namespaces; none is left under the root.
    if (work) fs.rmSync(work, { recursive: true, force: true });
  });

  kernelTest('npm installs the tarball offline; no compiler, libbpf, libelf or libmnl is on the root', async (t) => {
    if (unavailable) return t.skip(unavailable);
    for (const tool of ['clang', 'cmake', 'bpftool', 'gcc', 'iptables-save', 'nft']) {
      assert.ok(!fs.existsSync(path.join(root, 'usr/bin', tool)) && !fs.existsSync(path.join(root, 'usr/sbin', tool)), `${tool} is on the clean root`);
    }
    const libs = execFileSync('find', [root, '-name', 'libbpf.so*', '-o', '-name', 'libelf*.so*', '-o', '-name', 'libmnl.so*'], { encoding: 'utf8' }).trim().split('\n').filter(Boolean);
    assert.deepEqual(libs, [], 'the root has none of the libraries the addon needs, before the install');
    const install = inRoot(root, [NODE, '/usr/local/bin/npm', 'install', '--global', '--offline', '--no-audit', '--no-fund', '--cache', '/tmp/npm-cache', '/tmp/svctrace.tgz'], { timeoutMs: 180_000 });
    assert.equal(await install.done, 0, `npm install: ${install.err()}`);
    assert.ok(fs.existsSync(path.join(root, 'usr/local/bin/svctrace')), 'the svctrace command is installed');
    assert.ok(!fs.existsSync(path.join(root, INSTALLED, 'build')), 'nothing was built on install');
    const prebuilt = fs.readdirSync(path.join(root, INSTALLED, 'prebuilds', `linux-${process.arch}`)).sort();
    assert.deepEqual(prebuilt, ['libelf.so.1', 'libmnl.so.0', 'svctrace.napi.glibc.node']);
  });

  kernelTest('svctrace doctor --json on the clean root: ready, with the prebuilt addon', async (t) => {
    if (unavailable) return t.skip(unavailable);
    const doctor = inRoot(root, ['svctrace', 'doctor', '--json']);
    const code = await doctor.done;
    const report = JSON.parse(doctor.out()) as { ready: boolean; checks: Array<{ id: string; ok: boolean; detail: string }> };
    assert.equal(code, 0, `doctor: ${doctor.err()}`);
    assert.equal(report.ready, true, JSON.stringify(report.checks.filter((c) => !c.ok)));
    const check = (id: string) => report.checks.find((c) => c.id === id);
    assert.equal(check('addon')?.detail, `prebuilt: ${INSTALLED}/prebuilds/linux-${process.arch}/svctrace.napi.glibc.node`);
    for (const id of ['ringbuf', 'tpBtf', 'backend']) assert.equal(check(id)?.ok, true, `${id}: ${check(id)?.detail}`);
  });

  kernelTest('svctrace trace on the clean root: every curl to the ClusterIP, DNATed to the pod that served it; explain says no rule reader is installed', async (t) => {
    if (unavailable) return t.skip(unavailable);
    const web = lab!.service('web');
    const trace = inRoot(root, ['svctrace', 'trace', '--netns', lab!.nodeNetns, '--service', `${web.clusterIP}:${web.port}`, '-o', 'json', '--duration', String(6 * TIME_SCALE)]);
    assert.ok(await waitFor(() => trace.err().includes('Ctrl-C to stop'), 20_000), `trace did not start: ${trace.err()}`);
    const served = lab!.served.length;
    for (let i = 0; i < 3; i++) {
      const r = await lab!.curl(`http://${web.clusterIP}:${web.port}/clean-root-${i}`);
      assert.ok(r.ok, r.stderr);
    }
    assert.equal(await trace.done, 0, trace.err());
    // The root has no nft nor iptables: said, and no diagnosis claims the rules are missing.
    assert.match(trace.err(), /none of nft, iptables-save, iptables-legacy-save, ipvsadm is installed/);
    const lines = trace.out().trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as { diagnosis?: { code: string }; stage?: string; packet?: { src?: string; srcPort?: number; dst?: string } });
    assert.deepEqual(lines.filter((l) => l.diagnosis).map((l) => l.diagnosis!.code), []);
    // explain needs the rules: without a reader it says so and exits 9, not "rules missing".
    const explain = inRoot(root, ['svctrace', 'explain', '--netns', lab!.nodeNetns, `${web.clusterIP}:${web.port}`]);
    assert.equal(await explain.done, 9, explain.out() + explain.err());
    assert.match(explain.err(), /cannot read the node's kube-proxy rules: none of nft, iptables-save, iptables-legacy-save, ipvsadm is installed/);
    for (const s of lab!.served.slice(served)) {
      const [client, port] = s.client.split(':');
      const pod = lab!.pods.find((p) => p.name === s.pod)!;
      const dnat = lines.find((l) => l.stage === 'STAGE_DNAT' && l.packet?.src === client && l.packet?.srcPort === Number(port));
      assert.ok(dnat, `no DNAT event for ${s.client}`);
      assert.equal(dnat.packet!.dst, pod.ip, `${s.client} was served by ${s.pod}`);
    }
  });
});
