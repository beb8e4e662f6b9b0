/**
 * Network namespaces, the one place svctrace's TypeScript names them and
 * enters them: resolving the --netns argument (a name under /run/netns or a
 * path), and running a command inside a namespace. Every command run in a
 * namespace (discovery, explain, snapshots, the nftables marker, doctor, the
 * lab) builds its argv with `argvInNetns`.
 */
import os from 'node:os';
import fs from 'node:fs';
import path from 'node:path';
import { execFile, execFileSync } from 'node:child_process';
import { SvctraceError } from '../errors';

export const NETNS_RUN_DIR = '/run/netns';

/** The namespace svctrace's own process is in (the node itself, on a real node). */
export const CURRENT_NETNS = '/proc/self/ns/net';

/** The path of a namespace given as a name or a path, without checking that it exists. */
export function netnsPathOf(nameOrPath: string): string {
  return nameOrPath.includes('/') ? path.resolve(nameOrPath) : path.join(NETNS_RUN_DIR, nameOrPath);
}

/**
 * Returns the path of a network namespace given as a name (`ip netns` style)
 * or a path (/proc/PID/ns/net, /var/run/netns/X). Throws NETNS_NOT_FOUND.
 */
export function resolveNetns(nameOrPath: string): string {
  if (nameOrPath === '') throw new SvctraceError('BAD_INPUT', 'network namespace name is empty');
  if (!nameOrPath.includes('/') && (!/^[A-Za-z0-9_.-]+$/.test(nameOrPath) || nameOrPath === '.' || nameOrPath === '..')) {
    throw new SvctraceError('BAD_INPUT', `'${nameOrPath}' is not a valid network namespace name`);
  }
  const p = netnsPathOf(nameOrPath);
  if (!fs.existsSync(p)) {
    throw new SvctraceError('NETNS_NOT_FOUND', `network namespace '${nameOrPath}' not found (${p}); see 'ip netns list'`);
  }
  if (!isNamespaceFile(p)) {
    throw new SvctraceError('BAD_INPUT', `'${nameOrPath}' is not a network namespace (give a name from 'ip netns list' or a path like /proc/PID/ns/net)`);
  }
  return p;
}

/** nsfs's magic number (linux/magic.h): namespace files, /proc/PID/ns/* and their bind mounts. */
const NSFS_MAGIC = 0x6e736673;

function isNamespaceFile(p: string): boolean {
  if (p === CURRENT_NETNS) return true;
  try {
    if (fs.statfsSync(p).type !== NSFS_MAGIC) return false;
  } catch {
    return true; // cannot tell here: setns will say
  }
  // /proc/PID/ns/<type> names its type; a bind mount (/run/netns/X) is a network one by convention.
  const m = /^\/proc\/(?:\d+|self|thread-self)\/(?:task\/\d+\/)?ns\/([a-z_]+)$/.exec(p);
  return !m || m[1] === 'net';
}

/**
 * The argv that runs `argv` inside a namespace (name or path): `nsenter
 * --net=PATH -- ...`, or `argv` itself for our own namespace. nsenter only
 * switches the network namespace and execs (no fork, so a child's pid is the
 * command's own); /proc/sys/net and netlink follow the caller's namespace, so
 * sysctl, ip, nft, iptables and conntrack behave as under `ip netns exec`
 * without its private mount namespace (/sys remount, /etc/netns/NAME), which
 * nothing here needs.
 */
export function argvInNetns(netns: string, argv: string[]): string[] {
  const p = netns === CURRENT_NETNS ? CURRENT_NETNS : netnsPathOf(netns);
  return p === CURRENT_NETNS ? argv : ['nsenter', `--net=${p}`, '--', ...argv];
}

export interface NetnsRunResult {
  /** Exit code; 127 when the command could not run; 128 + the signal's number when one ended it. */
  code: number;
  stdout: string;
  stderr: string;
}

/** A command that runs longer is killed (a hung tool must not hang svctrace). */
const RUN_TIMEOUT_MS = 20_000;

/** Runs a command inside a namespace; never rejects (a missing tool is exit 127 with a message). */
export function runInNetns(netns: string, argv: string[]): Promise<NetnsRunResult> {
  const full = argvInNetns(netns, argv);
  return new Promise((resolve) => {
    execFile(full[0]!, full.slice(1), { encoding: 'utf8', timeout: RUN_TIMEOUT_MS, maxBuffer: 256 << 20 }, (err, stdout, stderr) => {
      if (!err) return resolve({ code: 0, stdout, stderr });
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return resolve({ code: 127, stdout, stderr: `${full[0]} not installed` });
      if (typeof err.code === 'number') return resolve({ code: err.code, stdout, stderr });
      const signal = (err as { signal?: NodeJS.Signals | null }).signal;
      if (!signal) return resolve({ code: 127, stdout, stderr: stderr || err.message });
      // Said, not left as an empty output: a terminal's Ctrl-C reaches the
      // commands svctrace runs as well as svctrace (a snapshot taken while
      // it started records them as interrupted, not as empty).
      const why = (err as { killed?: boolean }).killed ? `timed out after ${RUN_TIMEOUT_MS / 1000} s` : `interrupted (${signal})`;
      resolve({ code: 128 + (os.constants.signals[signal] ?? 0), stdout, stderr: `${why}${stderr ? `: ${stderr}` : ''}` });
    });
  });
}

/**
 * Runs a command inside a namespace synchronously (for cleanup on process
 * exit, where nothing asynchronous runs any more); throws on failure.
 */
export function runInNetnsSync(netns: string, argv: string[], opts: { input?: string; timeoutMs?: number } = {}): string {
  const full = argvInNetns(netns, argv);
  return execFileSync(full[0]!, full.slice(1), { input: opts.input, encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe'], timeout: opts.timeoutMs ?? 10_000 });
}
