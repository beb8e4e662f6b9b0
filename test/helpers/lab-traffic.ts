/** Traffic for kernel tests: sequential requests through the lab, checked against what the pods logged. */
import assert from 'node:assert/strict';
import type { Lab, ServedRequest } from '../../src/lab/lab';
import { TIME_SCALE } from './flows';

/**
 * `n` sequential curls to `url` from the node, each of which must succeed;
 * returns what the pods logged for them. Their time limits scale like the
 * tests' waits (TIME_SCALE): an emulated guest running three tracers once
 * took more than curl's 5 s to start one.
 */
export async function curlEach(lab: Lab, url: string, n: number): Promise<ServedRequest[]> {
  const before = lab.served.length;
  for (let i = 0; i < n; i++) {
    const r = await lab.curl(url, 'node', [], 5 * TIME_SCALE);
    assert.ok(r.ok, `curl ${i}: ${r.stderr}`);
  }
  const served = lab.served.slice(before);
  assert.equal(served.length, n, 'every request was served, once');
  return served;
}

/**
 * Waits (ms, times TIME_SCALE) until `ended()` holds, asking the node's
 * conntrack to reap expired entries once a second meanwhile. Conntrack ends
 * an entry whose timeout passed only when something looks at it: a dump
 * (`conntrack -L`) or its GC worker, which on a quiet 6.1 table may not come
 * round for a minute. One dump right after the lab's 2 s TIME_WAIT is not
 * enough on a slow emulated guest, where the last connections reach TIME_WAIT
 * late: a 6.1 kprobe CI run saw them never destroyed.
 */
export async function reapUntil(lab: Lab, ended: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms * TIME_SCALE;
  for (;;) {
    await lab.reapConntrack();
    if (ended()) return true;
    if (Date.now() >= end) return false;
    const next = Date.now() + 1000;
    while (Date.now() < Math.min(next, end)) {
      await new Promise((r) => setTimeout(r, 50));
      if (ended()) return true;
    }
  }
}
