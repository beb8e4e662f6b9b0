/** Shared helpers for the benchmarks: statistics, tables, results files. */
import fs from 'node:fs';
import path from 'node:path';

export const RESULTS_DIR = path.resolve(__dirname, '..', '..', 'bench-results');

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function table(headers: string[], rows: Array<Array<string | number>>): string {
  const cells = [headers, ...rows.map((r) => r.map(String))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [line(headers), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.slice(1).map(line)].join('\n');
}

export function writeResult(name: string, data: unknown): string {
  fs.mkdirSync(RESULTS_DIR, { recursive: true });
  const file = path.join(RESULTS_DIR, `${name}.json`);
  fs.writeFileSync(file, JSON.stringify({ when: new Date().toISOString(), ...(data as object) }, null, 2) + '\n');
  return file;
}

/**
 * xs starting at its n-th element (modulo its length), wrapping around: the
 * modes of a benchmark take turns going first from round to round, so the
 * drift within a round (pods warming up, neighbours) is not given to the
 * same mode every time.
 */
export function rotate<T>(xs: readonly T[], n: number): T[] {
  return xs.map((_, i) => xs[(i + n) % xs.length]!);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export function fmt(n: number, digits = 0): string {
  return n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

/** RSS of a process in bytes (from /proc); undefined once the process is gone (never throws). */
export function rssOf(pid: number): number | undefined {
  let status: string;
  try {
    status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return undefined;
  }
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(status);
  return m ? Number(m[1]) * 1024 : undefined;
}

/** Polls `cond` until it holds or `ms` pass: every wait in the benchmarks has a deadline. */
export async function waitUntil(cond: () => boolean, ms: number, every = 5): Promise<boolean> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) return false;
    await sleep(every);
  }
  return true;
}

/** `p`, or a rejection naming `what` after `ms`. */
export function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, j) => (timer = setTimeout(() => j(new Error(`${what}: no result within ${ms / 1000} s`)), ms)));
  return Promise.race([p, deadline]).finally(() => clearTimeout(timer));
}

/** Why a child process ended badly, from its exit status and stderr; undefined for a clean exit. */
export function crashReason(code: number | null, signal: NodeJS.Signals | null, stderr: string): string | undefined {
  const oom = /(FATAL ERROR:[^\n]*|JavaScript heap out of memory|Reached heap limit[^\n]*)/.exec(stderr)?.[0];
  if (oom) return `out of memory: ${oom.trim()}`;
  if (signal) return `killed by ${signal}`;
  if (code !== 0 && code !== null) return `exit code ${code}: ${stderr.trim().split('\n').at(-1) ?? ''}`;
  return undefined;
}
