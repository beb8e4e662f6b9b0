/** Resolving the --netns argument: a name under /run/netns or a path. */
import fs from 'node:fs';
import path from 'node:path';
import { SvctraceError } from '../errors';

export const NETNS_RUN_DIR = '/run/netns';

/** The namespace svctrace's own process is in (the node itself, on a real node). */
export const CURRENT_NETNS = '/proc/self/ns/net';

/**
 * Returns the path of a network namespace given as a name (`ip netns` style)
 * or a path (/proc/PID/ns/net, /var/run/netns/X). Throws NETNS_NOT_FOUND.
 */
export function resolveNetns(nameOrPath: string): string {
  if (nameOrPath === '') throw new SvctraceError('BAD_INPUT', 'network namespace name is empty');
  let p: string;
  if (nameOrPath.includes('/')) {
    p = path.resolve(nameOrPath);
  } else {
    if (!/^[A-Za-z0-9_.-]+$/.test(nameOrPath) || nameOrPath === '.' || nameOrPath === '..') {
      throw new SvctraceError('BAD_INPUT', `'${nameOrPath}' is not a valid network namespace name`);
    }
    p = path.join(NETNS_RUN_DIR, nameOrPath);
  }
  if (!fs.existsSync(p)) {
    throw new SvctraceError('NETNS_NOT_FOUND', `network namespace '${nameOrPath}' not found (${p}); see 'ip netns list'`);
  }
  return p;
}
