/**
 * A recording to read, from a regular file or from a stream (a pipe, a
 * FIFO, a terminal or socket: `svctrace record -o /dev/stdout | svctrace
 * verify /dev/stdin`). The reader checks a recording against its size and
 * reads its chunks by offset, which a stream cannot give: a stream is first
 * copied to a temporary file (disk, not memory: a recording may be larger
 * than svctrace's heap), unnamed from the start, read through its
 * descriptor and freed when it is closed (or the process ends, however).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { SvctraceError } from '../errors';
import { MAGIC } from './format';

export interface RecordingInput {
  /** The file the readers open: the path given, or the stream's copy. */
  file: string;
  /** Bytes copied from a stream (undefined: a regular file, read where it is). */
  spooledBytes?: number;
  /** Frees the copy (closes its descriptor; nothing for a regular file). Idempotent. */
  done(): void;
}

const COPY_BYTES = 1 << 20;

function cannotRead(p: string, e: unknown): SvctraceError {
  const code = (e as NodeJS.ErrnoException).code;
  if (code === 'EACCES' || code === 'EPERM') return new SvctraceError('NOT_PERMITTED', `cannot read ${p}: permission denied`);
  return new SvctraceError('BAD_INPUT', `cannot read ${p}: ${code ?? (e as Error).message}`);
}

/**
 * Opens `p` for the recording readers. A directory or anything else that
 * is neither a file nor a stream is refused (BAD_INPUT); unreadable is
 * NOT_PERMITTED, not "damaged" (verify's exit 1). `tmpDir`: where a stream's
 * copy goes (default: the system's).
 */
export function openRecordingInput(p: string, tmpDir = os.tmpdir()): RecordingInput {
  // One of this process's own descriptors ('-' and /dev/stdin: 0) is read
  // as it is: opened again by path, a socket (what a parent process often
  // hands as stdin) fails with ENXIO.
  const ownFd = ownDescriptor(p);
  let st: fs.Stats;
  try {
    st = ownFd === undefined ? fs.statSync(p) : fs.fstatSync(ownFd);
  } catch (e) {
    throw cannotRead(p, e);
  }
  const stream = st.isFIFO() || st.isCharacterDevice() || st.isSocket();
  if (!st.isFile() && !stream) throw new SvctraceError('BAD_INPUT', `${p} is not a file`);
  if (!stream) {
    // A regular file (stdin redirected from one too) is read where it is.
    const file = ownFd === undefined ? p : `/proc/self/fd/${ownFd}`;
    try {
      fs.accessSync(file, fs.constants.R_OK);
    } catch (e) {
      throw cannotRead(p, e);
    }
    return { file, done: () => undefined };
  }
  let fd: number;
  try {
    fd = ownFd ?? fs.openSync(p, 'r');
  } catch (e) {
    throw cannotRead(p, e);
  }
  let copyFd: number | undefined;
  try {
    copyFd = unlinkedFile(tmpDir);
    const total = copyStream(fd, p, copyFd);
    const copy = copyFd;
    let closed = false;
    const done = (): void => {
      if (closed) return;
      closed = true;
      fs.closeSync(copy);
    };
    // The readers open the copy by its descriptor's /proc path.
    return { file: `/proc/self/fd/${copy}`, spooledBytes: total, done };
  } catch (e) {
    if (copyFd !== undefined) fs.closeSync(copyFd);
    if (e instanceof SvctraceError) throw e;
    throw new SvctraceError('BAD_INPUT', `cannot copy ${p} to a temporary file to read it (${tmpDir}): ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  } finally {
    if (ownFd === undefined) fs.closeSync(fd);
  }
}

/**
 * A new file in `tmpDir`, open for reading and writing, whose name is gone
 * before anything is written to it: the copy of an endless stream is
 * stopped with Ctrl-C (the copy is synchronous, so the signal ends the
 * process), and however the process ends, closing the descriptor frees it
 * and nothing is left in `tmpDir`.
 */
function unlinkedFile(tmpDir: string): number {
  // Linux's O_TMPFILE makes a file that never had a name: no moment where
  // a signal could leave one behind. A file system without it (EOPNOTSUPP,
  // or EISDIR from a kernel that does not know the flag) gets a named file,
  // unlinked at once, in a directory of its own.
  if (O_TMPFILE !== undefined) {
    try {
      return fs.openSync(tmpDir, O_TMPFILE | fs.constants.O_RDWR, 0o600);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      // errno 95 is ENOTSUP to Node (EOPNOTSUPP is the same number on Linux).
      if (code !== 'ENOTSUP' && code !== 'EOPNOTSUPP' && code !== 'EISDIR' && code !== 'EINVAL') throw e;
    }
  }
  const dir = fs.mkdtempSync(path.join(tmpDir, 'svctrace-recording-'));
  const file = path.join(dir, 'recording.svtr');
  let fd: number | undefined;
  try {
    fd = fs.openSync(file, 'wx+', 0o600);
    fs.unlinkSync(file);
  } catch (e) {
    if (fd !== undefined) fs.closeSync(fd);
    fs.rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  try {
    fs.rmdirSync(dir);
  } catch {
    // A file system that keeps an open file's name (NFS: .nfsXXXX) until
    // it is closed: the directory stays, empty once the copy is freed.
  }
  return fd;
}

/**
 * open(2)'s O_TMPFILE: __O_TMPFILE | O_DIRECTORY. Node exports only the
 * second; __O_TMPFILE is the generic 020000000 on x86 and Arm (O_DIRECTORY
 * itself differs between them). Other architectures take the named path.
 */
export const O_TMPFILE = process.platform === 'linux' && ['x64', 'arm64', 'ia32', 'arm'].includes(process.arch) ? 0o20000000 | fs.constants.O_DIRECTORY : undefined;

/** The descriptor `p` names among this process's own ('-', /dev/stdin, /dev/fd/N, /proc/self/fd/N), if it does. */
function ownDescriptor(p: string): number | undefined {
  if (p === '-' || p === '/dev/stdin') return 0;
  const m = /^\/(?:dev|proc\/self)\/fd\/(\d+)$/.exec(p);
  return m ? Number(m[1]) : undefined;
}

/**
 * Copies the stream `fd` (named `p`) to a new file; returns the bytes copied.
 * A stream that does not start with a recording's magic bytes is copied no
 * further than its first read (the readers then say what it is not):
 * `verify /dev/zero` copied zeros until the disk was full.
 */
function copyStream(fd: number, p: string, out: number): number {
  const buf = Buffer.allocUnsafe(COPY_BYTES);
  let total = 0;
  const head = Buffer.alloc(MAGIC.length);
  for (;;) {
    const seen = Math.min(total, MAGIC.length);
    if (seen > 0 && !head.subarray(0, seen).equals(MAGIC.subarray(0, seen))) return total;
    let n: number;
    try {
      n = fs.readSync(fd, buf, 0, buf.length, null);
    } catch (e) {
      // A non-blocking stream (a terminal, a pipe a shell made so) says so instead of waiting.
      if ((e as NodeJS.ErrnoException).code === 'EAGAIN') {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
        continue;
      }
      throw cannotRead(p, e);
    }
    if (n === 0) return total;
    if (total < MAGIC.length) buf.copy(head, total, 0, Math.min(n, MAGIC.length - total));
    for (let at = 0; at < n; ) at += fs.writeSync(out, buf, at, n - at);
    total += n;
  }
}
