/** Writers to stdout wait for a slow reader instead of buffering without limit (no root). */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { stdoutRoom } from '../../src/pipeline/lifecycle';

describe('stdoutRoom', () => {
  it('is undefined while the output has room; a promise once 1 MiB waits, resolved when the reader caught up', async () => {
    const out = new PassThrough({ highWaterMark: 64 * 1024 });
    assert.equal(stdoutRoom(out), undefined);
    const line = Buffer.alloc(64 * 1024, 0x78);
    for (let i = 0; i < 20; i++) out.write(line); // 1.25 MiB, nobody reads
    const room = stdoutRoom(out);
    assert.ok(room instanceof Promise, `a writer waits at ${out.writableLength} bytes`);
    let resolved = false;
    void room.then(() => (resolved = true));
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(resolved, false, 'not before the reader read');
    out.resume(); // the reader catches up
    await room;
    assert.equal(out.listenerCount('drain'), 0, 'its listeners are gone');
    assert.equal(out.listenerCount('close'), 0);
    assert.equal(out.writableLength, 0);
    assert.equal(stdoutRoom(out), undefined);
  });

  it('resolves when the output closes under a waiting writer (its reader gone)', async () => {
    const out = new PassThrough({ highWaterMark: 1024 });
    for (let i = 0; i < 20; i++) out.write(Buffer.alloc(64 * 1024));
    const room = stdoutRoom(out)!;
    out.destroy();
    await room;
  });
});
