/**
 * `svctrace doctor --json` must be right about this kernel. The evidence is
 * independent of svctrace's own probes: the kernel's build config, bpftool
 * (its own loader) loading tiny programs compiled by this test, and the
 * kernel's own kprobe tracer.
 */
import { describe } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { kernelTest } from '../helpers/kernel';
import { readKernelConfig } from '../../src/doctor/kernel-config';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const CLI = path.join(ROOT, 'bin', 'svctrace.js');
const VMLINUX_DIR = path.join(ROOT, 'build', 'bpf');

/** Compiles `src` (a BPF C program) and asks bpftool to load and attach it, in a private mount namespace. */
function bpftoolLoads(name: string, src: string): boolean {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-doctor-'));
  try {
    fs.writeFileSync(path.join(dir, `${name}.bpf.c`), src);
    fs.mkdirSync(path.join(dir, 'fs'));
    execFileSync('clang', ['-g', '-O2', '-target', 'bpf', '-D__TARGET_ARCH_x86', '-I', VMLINUX_DIR, '-c', `${name}.bpf.c`, '-o', `${name}.o`], { cwd: dir });
    // unshare -m: the bpffs mount bpftool pins into exists only for this command.
    const script = `mount -t bpf bpf "${dir}/fs" && bpftool prog load "${dir}/${name}.o" "${dir}/fs/p" autoattach`;
    return spawnSync('unshare', ['-m', 'sh', '-c', script], { stdio: 'ignore' }).status === 0;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Whether the kernel's own kprobe tracer can probe `func` (tracefs
 * kprobe_events, no BPF involved), in a private mount namespace; the probe
 * is removed at once.
 */
function kprobeEventWorks(func: string): boolean {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-doctor-'));
  const name = `svt_doctor_${process.pid}`;
  try {
    const script = `mount -t tracefs none "${dir}" && echo 'p:${name} ${func}' >> "${dir}/kprobe_events" && echo '-:${name}' >> "${dir}/kprobe_events"`;
    return spawnSync('unshare', ['-m', 'sh', '-c', script], { stdio: 'ignore' }).status === 0;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

const HEADER = '#include "vmlinux.h"\n#include <bpf/bpf_helpers.h>\n#include <bpf/bpf_tracing.h>\nchar LICENSE[] SEC("license") = "GPL";\n';

describe('svctrace doctor (kernel)', () => {
  kernelTest('doctor --json agrees with the kernel config and with bpftool', async () => {
    // On a node kube-proxy's rules keep conntrack and NAT loaded; a fresh VM has neither yet.
    spawnSync('modprobe', ['nf_nat'], { stdio: 'ignore' });
    // Exit 1 when not ready: the report says why either way.
    const run = spawnSync(process.execPath, [CLI, 'doctor', '--json'], { encoding: 'utf8' });
    const out = run.stdout;
    const report = JSON.parse(out) as { ready: boolean; checks: Array<{ id: string; ok: boolean; required: boolean; backend?: string }> };
    const ok = (id: string) => {
      const c = report.checks.find((x) => x.id === id);
      assert.ok(c, `doctor has no '${id}' check`);
      return c.ok;
    };

    const config = readKernelConfig();
    assert.ok(config, 'this test needs the kernel config (/proc/config.gz or /boot/config-*)');
    const yes = (k: string) => config.get(k) === 'y';
    assert.equal(ok('netfilterLink'), yes('CONFIG_NETFILTER_BPF_LINK'), 'netfilter link vs CONFIG_NETFILTER_BPF_LINK');
    assert.equal(ok('kprobe'), yes('CONFIG_KPROBES'), 'kprobes vs CONFIG_KPROBES');
    assert.equal(ok('ipvs'), fs.existsSync('/proc/net/ip_vs') || yes('CONFIG_IP_VS'), 'IPVS vs CONFIG_IP_VS');
    assert.equal(ok('conntrackEvents'), yes('CONFIG_NF_CONNTRACK_EVENTS'), 'conntrack events vs CONFIG_NF_CONNTRACK_EVENTS');
    assert.equal(ok('btf'), yes('CONFIG_DEBUG_INFO_BTF'));

    // fentry and tp_btf: whatever bpftool's loader gets from this kernel.
    const fentry = bpftoolLoads('fentry', HEADER + 'SEC("fentry/nf_conntrack_destroy") int BPF_PROG(f) { return 0; }\n');
    const tpBtf = bpftoolLoads('tpbtf', HEADER + 'SEC("tp_btf/kfree_skb") int BPF_PROG(t, struct sk_buff *skb) { return 0; }\n');
    // With the drop reason, as svctrace reads it where it exists (Linux >= 5.17).
    const dropReason = bpftoolLoads('dropreason', HEADER + 'SEC("tp_btf/kfree_skb") int BPF_PROG(t, struct sk_buff *skb, void *loc, enum skb_drop_reason reason) { return reason; }\n');
    assert.equal(ok('fentry'), fentry, `fentry: doctor says ${ok('fentry')}, bpftool load says ${fentry}`);
    assert.equal(ok('tpBtf'), tpBtf, `tp_btf: doctor says ${ok('tpBtf')}, bpftool load says ${tpBtf}`);
    assert.equal(ok('dropReason'), dropReason, `drop reasons: doctor says ${ok('dropReason')}, bpftool load says ${dropReason}`);

    // The backend: netfilter links where the config has them, else fentry
    // on nf_nat's hook where bpftool can attach one there, else a kprobe
    // there.
    const natFentry = bpftoolLoads('natfentry', HEADER + 'SEC("fentry/nf_nat_ipv4_pre_routing") int BPF_PROG(f) { return 0; }\n');
    // bpftool cannot pin a kprobe attachment where the kernel has no BPF
    // link for it (5.10): the kernel's own kprobe tracer is the evidence.
    const natKprobe = kprobeEventWorks('nf_nat_ipv4_pre_routing');
    assert.equal(ok('natFentry'), natFentry, `fentry on nf_nat: doctor says ${ok('natFentry')}, bpftool load says ${natFentry}`);
    assert.equal(ok('natKprobe'), natKprobe, `kprobe on nf_nat: doctor says ${ok('natKprobe')}, the kernel's kprobe tracer says ${natKprobe}`);
    assert.equal(natKprobe, yes('CONFIG_KPROBES'), 'kprobe on nf_nat vs CONFIG_KPROBES');
    const backend = report.checks.find((c) => c.id === 'backend')?.backend;
    const expected = yes('CONFIG_NETFILTER_BPF_LINK') ? 'netfilter' : natFentry ? 'fentry' : natKprobe ? 'kprobe' : undefined;
    assert.equal(backend, expected, 'the backend auto picks');
    if (process.env.SVT_EXPECT_BACKEND) assert.equal(backend, process.env.SVT_EXPECT_BACKEND, 'the backend this kernel row expects');

    // Ready exactly where a backend and the drop tracepoint work (this
    // project's hosts, 5.10, 6.1, 6.12).
    assert.equal(report.ready, expected !== undefined && tpBtf && yes('CONFIG_DEBUG_INFO_BTF') && yes('CONFIG_NF_CONNTRACK_EVENTS'), 'ready');
    assert.equal(run.status, report.ready ? 0 : 1, `doctor's exit code: ${run.stderr}`);
  });
});
