import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { loadBinding } from '../../src/native/binding';

// The pipeline gives glibc's free pages back once a second, on libuv's
// thread pool: the JS thread that models every event must not wait for it.
describe('releaseFreeMemory (addon)', () => {
  it('runs malloc_trim off the JS thread and calls back with whether it released anything', async () => {
    const binding = loadBinding();
    let calledBack = false;
    const released = await new Promise<unknown>((resolve) => {
      const ret = binding.releaseFreeMemory((r) => {
        calledBack = true;
        resolve(r);
      });
      assert.equal(ret, undefined, 'with a callback it returns at once');
      assert.equal(calledBack, false, 'the callback came before the call returned: it ran on this thread');
    });
    assert.equal(typeof released, 'boolean');
  });

  it('still runs in place without a callback, and rejects an argument that is not a function', () => {
    const binding = loadBinding();
    assert.equal(typeof binding.releaseFreeMemory(), 'boolean');
    assert.throws(() => (binding.releaseFreeMemory as (x: unknown) => unknown)(42), { name: 'TypeError', message: /must be a function/ });
  });
});
