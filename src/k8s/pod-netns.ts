/**
 * Which pod a network namespace belongs to, on a Kubernetes node: netns
 * inode -> a process in it (/proc/PID/ns/net) -> its cgroup (kubelet puts
 * every pod under a cgroup named after the pod UID) -> the pod UID, which
 * EndpointSlices name in their targetRef. Read-only, from /proc.
 */
import fs from 'node:fs';
import path from 'node:path';

/** The pod UID in a /proc/PID/cgroup text, or undefined (systemd and cgroupfs drivers). */
export function podUidFromCgroup(text: string): string | undefined {
  // systemd: .../kubepods-burstable-pod0b1c...._2d3e.slice/...; cgroupfs: /kubepods/burstable/pod0b1c-...-2d3e/...
  const m = /kubepods[^\n]*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})/.exec(text);
  return m ? m[1]!.replace(/_/g, '-') : undefined;
}

/** netns inode -> pod UID, for every pod namespace with a process in it. */
export function podUidsByNetns(procRoot = '/proc'): Map<number, string> {
  const out = new Map<number, string>();
  let pids: string[];
  try {
    pids = fs.readdirSync(procRoot).filter((p) => /^\d+$/.test(p));
  } catch {
    return out;
  }
  for (const pid of pids) {
    try {
      const link = fs.readlinkSync(path.join(procRoot, pid, 'ns', 'net'));
      const ino = Number(/net:\[(\d+)\]/.exec(link)?.[1]);
      if (!ino || out.has(ino)) continue;
      const uid = podUidFromCgroup(fs.readFileSync(path.join(procRoot, pid, 'cgroup'), 'utf8'));
      if (uid) out.set(ino, uid);
    } catch {
      // the process exited meanwhile, or is not ours to read
    }
  }
  return out;
}
