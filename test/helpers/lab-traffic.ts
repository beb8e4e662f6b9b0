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
