/**
 * Names network namespaces by inode, as events carry them: the names under
 * /run/netns (ip netns, CNI plugins) first; on a miss, at most once a second,
 * a rescan. Unknown namespaces stay unnamed ("netns:<inode>").
 */
import fs from 'node:fs';
import path from 'node:path';
import { NETNS_RUN_DIR } from '../netns/netns';

export class NetnsNames {
  private byInode = new Map<number, string>();
  /** Names a namespace /run/netns does not know (e.g. a pod's, from the API); tried on a miss. */
  fallback?: (inode: number) => string | undefined;
  private lastScan = 0;
  private readonly minRescanMs: number;
  private readonly dirs: string[];

  constructor(opts: { dirs?: string[]; minRescanMs?: number } = {}) {
    this.dirs = opts.dirs ?? [NETNS_RUN_DIR];
    this.minRescanMs = opts.minRescanMs ?? 1000;
    this.scan();
  }

  private scan(): void {
    this.lastScan = Date.now();
    const next = new Map<number, string>();
    for (const dir of this.dirs) {
      let names: string[];
      try {
        names = fs.readdirSync(dir);
      } catch {
        continue;
      }
      for (const name of names) {
        try {
          next.set(fs.statSync(path.join(dir, name)).ino, name);
        } catch {
          // deleted meanwhile
        }
      }
    }
    try {
      next.set(fs.statSync('/proc/self/ns/net').ino, next.get(fs.statSync('/proc/self/ns/net').ino) ?? 'host');
    } catch {
      // no procfs
    }
    this.byInode = next;
  }

  /** Name of the namespace with this inode, or undefined. */
  name(inode: number): string | undefined {
    if (inode === 0) return undefined;
    const hit = this.byInode.get(inode);
    if (hit !== undefined) return hit;
    if (Date.now() - this.lastScan >= this.minRescanMs) {
      this.scan();
      const again = this.byInode.get(inode);
      if (again !== undefined) return again;
      const fb = this.fallback?.(inode);
      if (fb) this.byInode.set(inode, fb);
      return fb;
    }
    return undefined;
  }

  /** A label: the name, or netns:<inode>. */
  label(inode: number): string {
    return this.name(inode) ?? `netns:${inode}`;
  }

  /** Records a name the caller knows (e.g. a path it attached to). */
  remember(inode: number, name: string): void {
    this.byInode.set(inode, name);
  }
}
