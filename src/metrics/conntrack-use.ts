/**
 * Conntrack table use in a network namespace: nf_conntrack_count is per
 * namespace, nf_conntrack_max is the node's table size. Read with `cat`
 * inside the namespace (/proc/sys/net follows the reader's namespace), every
 * few seconds in the background, so a scrape never waits on it.
 */
import path from 'node:path';
import { CURRENT_NETNS, NETNS_RUN_DIR, runInNetns } from '../netns/netns';

/** The netns label of a traced namespace: its name under /run/netns, "node" for svctrace's own (a DaemonSet runs in the node's). */
export function netnsLabel(nsPath: string): string {
  if (nsPath === CURRENT_NETNS) return 'node';
  return nsPath.startsWith(`${NETNS_RUN_DIR}/`) ? nsPath.slice(NETNS_RUN_DIR.length + 1) : path.basename(nsPath);
}

const COUNT = '/proc/sys/net/netfilter/nf_conntrack_count';
const MAX = '/proc/sys/net/netfilter/nf_conntrack_max';

/** "123\n262144\n" -> { entries, limit }; undefined for anything else. */
export function parseConntrackUse(text: string): { entries: number; limit: number } | undefined {
  const m = /^(\d+)\n(\d+)\n?$/.exec(text);
  return m ? { entries: Number(m[1]), limit: Number(m[2]) } : undefined;
}

export async function readConntrackUse(netns: string): Promise<{ entries: number; limit: number } | undefined> {
  const r = await runInNetns(netns, ['cat', COUNT, MAX]);
  return r.code === 0 ? parseConntrackUse(r.stdout) : undefined;
}

/** Polls each namespace every `everyMs` until stopped; a namespace that cannot be read is skipped (and reported once). */
export function pollConntrackUse(
  namespaces: ReadonlyArray<{ path: string; name: string }>,
  onUse: (name: string, entries: number, limit: number) => void,
  onWarning: (message: string) => void,
  everyMs = 5000,
): { stop(): void } {
  const warned = new Set<string>();
  let stopped = false;
  const once = async () => {
    for (const ns of namespaces) {
      if (stopped) return;
      const use = await readConntrackUse(ns.path);
      if (use) onUse(ns.name, use.entries, use.limit);
      else if (!warned.has(ns.path)) {
        warned.add(ns.path);
        onWarning(`cannot read conntrack use in ${ns.name} (nf_conntrack not loaded there?): svctrace_conntrack_entries will not have it`);
      }
    }
  };
  void once();
  const timer = setInterval(() => void once(), everyMs);
  timer.unref();
  return {
    stop() {
      stopped = true;
      clearInterval(timer);
    },
  };
}
