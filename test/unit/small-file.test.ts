/** Key, token and certificate files: read whole when small, refused with one line otherwise (no root). */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { SvctraceError } from '../../src/errors';
import { readSmallFile } from '../../src/small-file';
import { readToken } from '../../src/cli/options';

const refused = (re: RegExp) => (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT' && re.test(e.message) && !e.message.includes('\n');

describe('readSmallFile', () => {
  it('reads a small regular file; refuses a device (--pubkey /dev/zero), a directory, one too big, one missing', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-small-'));
    try {
      const ok = path.join(dir, 'token');
      fs.writeFileSync(ok, 'a-token-of-twenty-chars\nsecond line\n');
      assert.equal(readSmallFile(ok, 'token file').toString(), 'a-token-of-twenty-chars\nsecond line\n');
      assert.equal(readToken({ tokenFile: ok }), 'a-token-of-twenty-chars');
      assert.throws(() => readSmallFile('/dev/zero', 'public key', 4096), refused(/public key \/dev\/zero is larger than 4096 bytes/));
      assert.throws(() => readToken({ tokenFile: '/dev/zero' }), refused(/larger than 1048576 bytes/));
      assert.throws(() => readSmallFile(dir, 'TLS certificate'), refused(/is a directory/));
      const big = path.join(dir, 'big');
      fs.writeFileSync(big, Buffer.alloc(2048));
      assert.throws(() => readSmallFile(big, 'TLS key', 1024), refused(/larger than 1024 bytes/));
      assert.equal(readSmallFile(big, 'TLS key', 2048).length, 2048);
      assert.throws(() => readSmallFile(path.join(dir, 'none'), 'token file'), refused(/cannot read token file .*ENOENT/));
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('reads a pipe (--token-file <(pass show x)) up to the limit', () => {
    const r = spawnSync('bash', ['-c', `node -e "const {readSmallFile}=require(process.argv[1]); process.stdout.write(readSmallFile('/dev/stdin','token file').toString())" ${JSON.stringify(require.resolve('../../src/small-file'))} < <(printf 'from-a-pipe\\n')`], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.equal(r.stdout, 'from-a-pipe\n');
  });
});
