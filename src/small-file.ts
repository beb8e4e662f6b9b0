/** Reading the small files a user names (keys, tokens, certificates): bounded, with one-line errors. */
import fs from 'node:fs';
import { SvctraceError } from './errors';

/** A key, token or certificate file is a few KiB; a chain of certificates at most some hundreds. */
export const SMALL_FILE_MAX = 1 << 20;

/**
 * Reads `path` whole, at most `max` bytes: a regular file, or a pipe
 * (`--token-file <(pass show x)`, /dev/stdin) read up to the limit. A wrong
 * path (`--pubkey /dev/zero`, a recording) gets a clear error instead of a
 * read without end. `what` names the file in the message.
 */
export function readSmallFile(path: string, what: string, max = SMALL_FILE_MAX): Buffer {
  let fd: number | undefined;
  try {
    fd = fs.openSync(path, 'r');
    const st = fs.fstatSync(fd);
    if (st.isDirectory()) throw new SvctraceError('BAD_INPUT', `${what} ${path} is a directory`);
    const tooBig = () => new SvctraceError('BAD_INPUT', `${what} ${path} is larger than ${max} bytes: not a ${what}`);
    if (st.isFile() && st.size > max) throw tooBig();
    // One byte over the limit tells a stream that is too long from one that fits.
    const buf = Buffer.alloc(max + 1);
    let off = 0;
    for (;;) {
      const n = fs.readSync(fd, buf, off, buf.length - off, null);
      if (n === 0) break;
      off += n;
      if (off > max) throw tooBig();
    }
    return Buffer.from(buf.subarray(0, off));
  } catch (e) {
    if (e instanceof SvctraceError) throw e;
    throw new SvctraceError('BAD_INPUT', `cannot read ${what} ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}
