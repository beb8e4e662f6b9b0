/**
 * Bad input and missing privileges give one clear line on stderr and a
 * non-zero exit, never a stack trace.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import os from 'node:os';
import fs from 'node:fs';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { kernelTest } from '../helpers/kernel';
import { readKernelConfig } from '../../src/doctor/kernel-config';

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');

function svctrace(args: string[], wrap: string[] = []): { status: number | null; stdout: string; stderr: string } {
  const argv = [...wrap, process.execPath, CLI, ...args];
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

function assertOneLineError(r: { status: number | null; stderr: string }, re: RegExp): void {
  assert.notEqual(r.status, 0);
  const lines = r.stderr.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('(run svctrace --help'));
  assert.equal(lines.length, 1, `expected one line, got:\n${r.stderr}`);
  assert.match(lines[0]!, re);
  assert.doesNotMatch(r.stderr, /\n\s+at /, 'stack trace printed');
}

describe('CLI errors', () => {
  it('unknown flag: doctor --bogus', () => {
    assertOneLineError(svctrace(['doctor', '--bogus']), /unknown option '--bogus'/);
  });

  it('bad service address', () => {
    const r = svctrace(['trace', '--service', '10.96.0.300:80', '--duration', '1']);
    assertOneLineError(r, /'10\.96\.0\.300' is not an IPv4 address/);
    assert.equal(r.status, 2);
  });

  it('bad output format and duration', () => {
    assertOneLineError(svctrace(['trace', '--service', '10.96.0.1:80', '-o', 'xml']), /--output must be text, flows or json/);
    assertOneLineError(svctrace(['trace', '--service', '10.96.0.1:80', '--duration', '-3']), /--duration/);
  });

  it('unknown command', () => {
    assertOneLineError(svctrace(['frobnicate']), /unknown command 'frobnicate'/);
  });

  kernelTest('unknown network namespace', async () => {
    const r = svctrace(['trace', '--service', '10.96.0.100:80', '--netns', 'svt-does-not-exist', '--duration', '1']);
    assertOneLineError(r, /network namespace 'svt-does-not-exist' not found/);
    assert.equal(r.status, 2);
  });

  kernelTest('a file that is not a network namespace: bad input, exit 2', async () => {
    for (const ns of ['/etc/passwd', '/proc/self/ns/uts']) {
      const r = svctrace(['trace', '--service', '10.96.0.100:80', '--netns', ns, '--duration', '1']);
      assertOneLineError(r, /is not a network namespace/);
      assert.equal(r.status, 2, ns);
    }
  });

  kernelTest('attach without privileges: capabilities dropped with setpriv', async () => {
    // Root without any capability (empty bounding set): the kernel refuses.
    const r = svctrace(['trace', '--service', '10.96.0.100:80', '--duration', '1'], [
      'setpriv', '--bounding-set=-all', '--inh-caps=-all', '--',
    ]);
    assertOneLineError(r, /not permitted: this root process lacks CAP_NET_ADMIN\+CAP_BPF\+CAP_PERFMON/);
    assert.equal(r.status, 77);
  });

  kernelTest('explain as a user who cannot read the rules: says so, never a false RULES_MISSING', async () => {
    const r = svctrace(['explain', '10.96.0.100:80'], ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', '--']);
    assertOneLineError(r, /cannot read the node's kube-proxy rules \(.*\): run as root/);
    assert.doesNotMatch(r.stdout + r.stderr, /RULES_MISSING/);
    assert.equal(r.status, 77);
  });

  kernelTest('a record that cannot attach leaves no half-written recording behind', async () => {
    const out = path.join(os.tmpdir(), `svctrace-noattach-${process.pid}.svtr`);
    fs.rmSync(out, { force: true });
    const r = svctrace(['record', '-o', out, '--service', '10.96.0.100:80', '--duration', '1'], ['setpriv', '--bounding-set=-net_admin', '--inh-caps=-net_admin', '--']);
    assertOneLineError(r, /lacks CAP_NET_ADMIN/);
    assert.equal(r.status, 77);
    assert.equal(fs.existsSync(out), false, `${out} was left behind`);
  });

  kernelTest('verify of a file it may not read: not permitted (77), never "altered" (1)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svctrace-unreadable-'));
    try {
      fs.chmodSync(dir, 0o755);
      const file = path.join(dir, 'secret.svtr');
      fs.writeFileSync(file, 'SVTR', { mode: 0o600 });
      const r = svctrace(['verify', file], ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', '--']);
      assertOneLineError(r, /cannot read .*secret\.svtr: permission denied/);
      assert.equal(r.status, 77);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  kernelTest('root without CAP_NET_ADMIN alone: the error names that capability', async () => {
    // Loading works (CAP_SYS_ADMIN covers BPF); the first netfilter/netlink step is refused, before anything is attached.
    const r = svctrace(['trace', '--service', '10.96.0.100:80', '--duration', '1'], ['setpriv', '--bounding-set=-net_admin', '--inh-caps=-net_admin', '--']);
    assertOneLineError(r, /not permitted: this root process lacks CAP_NET_ADMIN \(/);
    assert.doesNotMatch(r.stderr, /locked down/);
    assert.equal(r.status, 77);
  });

  kernelTest('--backend the kernel cannot run: one line naming the mechanism it lacks, exit 3', async (t) => {
    // Independent of svctrace: the kernel's config says which mechanisms exist.
    const config = readKernelConfig();
    assert.ok(config, 'this test needs the kernel config');
    const lacking = config.get('CONFIG_KPROBES') !== 'y' ? 'kprobe' : undefined;
    if (!lacking) {
      t.skip('this kernel has kprobes (CONFIG_KPROBES=y): no backend to ask for in vain');
      return;
    }
    const r = svctrace(['trace', '--backend', lacking, '--service', '10.96.0.100:80', '--duration', '1']);
    assertOneLineError(r, /^svctrace: the kprobe backend does not work on this kernel: .*needs CONFIG_KPROBES=y\); try --backend auto$/);
    assert.equal(r.status, 3);
  });
});
