/** Traffic for kernel tests: sequential requests through the lab, checked against what the pods logged. */
import assert from 'node:assert/strict';
import type { Lab, ServedRequest } from '../../src/lab/lab';

/** `n` sequential curls to `url` from the node, each of which must succeed; returns what the pods logged for them. */
export async function curlEach(lab: Lab, url: string, n: number): Promise<ServedRequest[]> {
  const before = lab.served.length;
  for (let i = 0; i < n; i++) {
    const r = await lab.curl(url);
    assert.ok(r.ok, `curl ${i}: ${r.stderr}`);
  }
  const served = lab.served.slice(before);
  assert.equal(served.length, n, 'every request was served, once');
  return served;
}
