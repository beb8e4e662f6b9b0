/**
 * Kernel tests load the real BPF programs and assert on real kernel events.
 * Outside CI they skip when not root, saying why; under CI=true they always
 * run, and a missing privilege or kernel feature makes them fail.
 */
import { test, TestContext } from 'node:test';
import { execFileSync } from 'node:child_process';

export const IN_CI = process.env.CI === 'true';
export const IS_ROOT = process.getuid?.() === 0;

export function kernelTest(name: string, fn: (t: TestContext) => Promise<void> | void, opts: { timeout?: number } = {}): void {
  const skip = !IS_ROOT && !IN_CI ? 'kernel test: needs root (runs as root in CI, where CI=true makes it mandatory)' : false;
  test(name, { skip, timeout: opts.timeout ?? 120_000 }, async (t) => {
    if (!IS_ROOT) throw new Error('CI=true: kernel tests must run as root');
    await fn(t);
  });
}

/** Netfilter BPF links currently attached on the machine (bpftool's view, independent of svctrace). */
export function netfilterLinks(): Array<{ id: number; hook?: number; prio?: number; prog_id?: number }> {
  const out = execFileSync('bpftool', ['-j', 'link', 'list'], { encoding: 'utf8' });
  const links = JSON.parse(out || '[]') as Array<{ id: number; type: string; hook?: number; prio?: number; prog_id?: number }>;
  return links.filter((l) => l.type === 'netfilter');
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
