/**
 * Kernel tests load the real BPF programs and assert on real kernel events.
 * Outside CI they skip when not root, saying why; under CI=true they always
 * run, and a missing privilege or kernel feature makes them fail.
 */
import { test, TestContext } from 'node:test';
import { execFileSync } from 'node:child_process';
import { Backend, defaultBackend } from '../../src/tracer/backend';
import { Tracer } from '../../src/tracer/tracer';
import { TIME_SCALE } from './flows';

export const IN_CI = process.env.CI === 'true';
export const IS_ROOT = process.getuid?.() === 0;

export function kernelTest(name: string, fn: (t: TestContext) => Promise<void> | void, opts: { timeout?: number } = {}): void {
  const skip = !IS_ROOT && !IN_CI ? 'kernel test: needs root (runs as root in CI, where CI=true makes it mandatory)' : false;
  test(name, { skip, timeout: (opts.timeout ?? 120_000) * TIME_SCALE }, async (t) => {
    if (!IS_ROOT) throw new Error('CI=true: kernel tests must run as root');
    await fn(t);
  });
}

/**
 * Attachments of svctrace's NAT-stage programs on the machine (bpftool's
 * view, independent of svctrace): netfilter links; with the fentry backend
 * the fentry/fexit links on NAT's hook functions; with the kprobe backend
 * the kprobes/kretprobes on them, from `bpftool perf` (which sees them on
 * every kernel: 5.10 attaches kprobes without a BPF link).
 */
export function netfilterLinks(): Array<{ id: number; hook?: number; prio?: number; prog_id?: number; pid?: number }> {
  const out = execFileSync('bpftool', ['-j', 'link', 'list'], { encoding: 'utf8' });
  const links = JSON.parse(out || '[]') as Array<{ id: number; type: string; attach_type?: string; hook?: number; prio?: number; prog_id?: number }>;
  const perf = JSON.parse(execFileSync('bpftool', ['-j', 'perf'], { encoding: 'utf8' }) || '[]') as Array<{ pid: number; fd: number; prog_id: number; fd_type?: string; func?: string }>;
  // One per attached program: bpftool finds them through the processes'
  // open fds, and a process forked by a tracer holds its fds until it execs
  // (a helper command starting, caught by the scan): counted once.
  const kprobes = [
    ...new Map(
      perf
        .filter((p) => (p.fd_type === 'kprobe' || p.fd_type === 'kretprobe') && /^nf_nat_ipv4_(pre_routing|local_fn|out|local_in)$/.test(p.func ?? ''))
        .map((p) => [p.prog_id, { id: -p.prog_id, prog_id: p.prog_id, pid: p.pid }] as const),
    ).values(),
  ];
  return [...links.filter((l) => l.type === 'netfilter' || (l.type === 'tracing' && (l.attach_type === 'trace_fentry' || l.attach_type === 'trace_fexit'))), ...kprobes];
}

/** A loaded program as bpftool shows it (runs counted while kernel.bpf_stats_enabled is on; recursion_misses absent when 0). */
export interface KernelProgram {
  id: number;
  run_cnt?: number;
  recursion_misses?: number;
  pids?: Array<{ pid: number }>;
}

/** The machine's loaded programs by id, bpftool's view (independent of svctrace's). */
export function kernelPrograms(): Map<number, KernelProgram> {
  const progs = JSON.parse(execFileSync('bpftool', ['-j', 'prog', 'show'], { encoding: 'utf8' }) || '[]') as KernelProgram[];
  return new Map(progs.map((p) => [p.id, p]));
}

let hasDropReasons: boolean | undefined;

/**
 * The name a drop with the kernel's reason `name` shows on this kernel: the
 * name itself where kfree_skb carries reasons (Linux >= 5.17: the kernel's
 * BTF has enum skb_drop_reason, asked of bpftool), else UNKNOWN (5.10).
 */
export function dropReasonName(name: string): string {
  if (hasDropReasons === undefined) {
    const btf = execFileSync('bpftool', ['btf', 'dump', 'file', '/sys/kernel/btf/vmlinux'], { encoding: 'utf8', maxBuffer: 512 << 20 });
    hasDropReasons = /^\[\d+\] ENUM 'skb_drop_reason' /m.test(btf);
  }
  return hasDropReasons ? name : 'UNKNOWN';
}

/**
 * What a drop with the kernel's reason `name` is called in its flow and the
 * summary on this kernel: the reason where kfree_skb carries one; before
 * 5.17, UNKNOWN and the function that freed the packet. Only for the drops
 * whose place is known: a netfilter rule's DROP is freed in nf_hook_slow.
 */
export function dropName(name: 'NETFILTER_DROP'): string {
  const reason = dropReasonName(name);
  return reason === 'UNKNOWN' ? 'UNKNOWN@nf_hook_slow' : reason;
}

let backendCache: Backend | undefined;

/** The attach backend a tracer opened now picks ($SVCTRACE_BACKEND, else the kernel's best). */
export function testBackend(): Backend {
  if (backendCache) return backendCache;
  backendCache = Tracer.backendFor(defaultBackend()).backend;
  return backendCache;
}

/**
 * Priority an event reports for a NAT stage: the netfilter backend's first
 * instance sits one from NAT (-101/-99 around DNAT, 99/101 around SNAT);
 * fentry observes NAT's own hook, at its priority.
 */
export function natStagePriority(nat: -100 | 100, stage: 'before' | 'after'): number {
  const gap = testBackend() === 'netfilter' ? 1 : 0;
  return stage === 'before' ? nat - gap : nat + gap;
}

export function netnsList(): string[] {
  return execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => l.split(' ')[0] ?? '')
    .filter(Boolean);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
