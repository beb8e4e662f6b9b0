/**
 * CPU time of this process's threads, by role, from /proc/self/task: where
 * a traced connection's user-space cost goes. The replay benchmark times
 * decode, model and encode on one quiet thread; a live trace also pays for
 * batch hand-over, timers, the V8 helpers' garbage collection and the
 * addon's own threads (named svt-* for `top -H`), on the same two cores as
 * the traffic.
 */
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';

export const MAIN_THREAD = 'main (JS)';
export const NODE_HELPERS = 'node helpers (V8 GC and compiler, libuv)';

/** Thread name and CPU ticks (user + system) from one /proc/.../stat line; undefined when it is not one. */
export function parseTaskStat(line: string): { name: string; ticks: number } | undefined {
  // The name is in parentheses and may itself hold spaces and parentheses.
  const open = line.indexOf('(');
  const close = line.lastIndexOf(')');
  if (open < 0 || close < open) return undefined;
  const fields = line.slice(close + 2).split(' ');
  // After the name: state (field 3) ... utime (14) and stime (15).
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  if (!Number.isFinite(utime) || !Number.isFinite(stime)) return undefined;
  return { name: line.slice(open + 1, close), ticks: utime + stime };
}

/** The role a thread's CPU is shown under. */
export function threadRole(tid: number, pid: number, name: string): string {
  if (tid === pid) return MAIN_THREAD;
  if (name.startsWith('svt-')) return name;
  return NODE_HELPERS;
}

let ticksPerSecond: number | undefined;

function clockTicks(): number {
  if (ticksPerSecond === undefined) {
    try {
      ticksPerSecond = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    } catch {
      ticksPerSecond = 100;
    }
  }
  return ticksPerSecond;
}

/** Seconds of CPU per thread (keyed by thread id) of this process; threads that end while read are left out. */
export function threadCpu(): Map<number, { role: string; seconds: number }> {
  const hz = clockTicks();
  const out = new Map<number, { role: string; seconds: number }>();
  for (const entry of fs.readdirSync('/proc/self/task')) {
    let line: string;
    try {
      line = fs.readFileSync(`/proc/self/task/${entry}/stat`, 'utf8');
    } catch {
      continue; // the thread ended meanwhile
    }
    const s = parseTaskStat(line);
    if (s) out.set(Number(entry), { role: threadRole(Number(entry), process.pid, s.name), seconds: s.ticks / hz });
  }
  return out;
}

/** CPU seconds spent between two readings, per role (a thread born in between counts from zero). */
export function cpuBetween(a: ReturnType<typeof threadCpu>, b: ReturnType<typeof threadCpu>): Map<string, number> {
  const out = new Map<string, number>();
  for (const [tid, t] of b) out.set(t.role, (out.get(t.role) ?? 0) + t.seconds - (a.get(tid)?.seconds ?? 0));
  return out;
}

/**
 * The whole machine's CPU time from /proc/stat's first line ("cpu  user nice
 * system idle iowait irq softirq steal ..."), in ticks: busy (all but idle
 * and iowait) and total. Whether a stage is bound by one thread or by the
 * machine shows in the two together: a thread busy for the whole stage on a
 * machine with cores to spare is the limit, not the cores.
 */
export function parseProcStat(text: string): { busy: number; total: number } | undefined {
  const first = text.split('\n', 1)[0] ?? '';
  const fields = first.trim().split(/\s+/);
  if (fields[0] !== 'cpu' || fields.length < 5) return undefined;
  const ticks = fields.slice(1).map(Number);
  if (ticks.some((t) => !Number.isFinite(t))) return undefined;
  // guest and guest_nice (fields 9 and 10) are already counted in user and nice.
  const total = ticks.slice(0, 8).reduce((a, b) => a + b, 0);
  const idle = ticks[3]! + (ticks[4] ?? 0);
  return { busy: total - idle, total };
}

/** This machine's busy and total CPU ticks (all cores) now; undefined where /proc/stat cannot be read. */
export function machineCpu(): { busy: number; total: number } | undefined {
  try {
    return parseProcStat(fs.readFileSync('/proc/stat', 'utf8'));
  } catch {
    return undefined;
  }
}

/** The share (0..1) of all cores that was busy between two readings; NaN when unknown. */
export function machineBusyBetween(a: ReturnType<typeof machineCpu>, b: ReturnType<typeof machineCpu>): number {
  if (!a || !b || b.total <= a.total) return NaN;
  return (b.busy - a.busy) / (b.total - a.total);
}
