/**
 * The .svtr container: an 8-byte magic, then chunks
 *
 *   type u8 | flags u8 | reserved u16 (0) | length u32 LE | payload | sha256 (32)
 *
 * where sha256 = SHA-256(previous chunk's sha256 || the 8 header bytes ||
 * payload), and the first chunk's "previous" is SHA-256(magic). The chain
 * makes any change, insertion or removal detectable from the first altered
 * chunk on; a file cut short (a crash, kill -9, power loss) is still readable
 * up to its last complete chunk, because every chunk is written whole.
 * docs/recording-format.md describes it for other readers.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import { SvctraceError } from '../errors';

export const MAGIC = Buffer.from([0x53, 0x56, 0x54, 0x52, 0x01, 0x0d, 0x0a, 0x1a]); // "SVTR" v1 \r\n ^Z
export const CHUNK_HEADER_BYTES = 8;
export const HASH_BYTES = 32;
/** A chunk longer than this is taken for a damaged header. */
export const MAX_CHUNK_PAYLOAD = 64 * 1024 * 1024;

export enum ChunkType {
  HEADER = 1,
  SNAPSHOT = 2,
  EVENTS = 3,
  TRAILER = 4,
}

export const CHUNK_NAMES: Record<number, string> = {
  [ChunkType.HEADER]: 'header',
  [ChunkType.SNAPSHOT]: 'snapshot',
  [ChunkType.EVENTS]: 'events',
  [ChunkType.TRAILER]: 'trailer',
};

export function initialHash(): Buffer {
  return crypto.createHash('sha256').update(MAGIC).digest();
}

export function chunkHash(prev: Buffer, header: Buffer, payload: Uint8Array): Buffer {
  return crypto.createHash('sha256').update(prev).update(header).update(payload).digest();
}

export function chunkHeader(type: ChunkType, length: number): Buffer {
  const h = Buffer.alloc(CHUNK_HEADER_BYTES);
  h.writeUInt8(type, 0);
  h.writeUInt32LE(length, 4);
  return h;
}

/**
 * Appends hash-chained chunks to a file, each with one write. A write that
 * fails (disk full, I/O error) is cut back to the end of the last whole
 * chunk, so the file stays a readable recording that is only cut short; the
 * error is thrown as WRITE_FAILED, and the first one is kept (`failure`).
 * A later write is still tried (a trailer, once the device has room again).
 *
 * A pipe, FIFO or device (`-o /dev/stdout | ...`) cannot be cut back or
 * synced: it is written in sequence, and after a write that failed half way
 * nothing more is written (what follows a half chunk would be unreadable).
 */
export class ChunkWriter {
  private prev = initialHash();
  private fd: number;
  /** A regular file: positional writes, cut-back and fsync work on it. */
  private readonly seekable: boolean;
  /** A half chunk went to a stream that cannot be cut back: nothing more can be written. */
  private torn = false;
  /** The file's length: the end of its last whole chunk (every write is at this offset). */
  bytes = 0;
  /** The first write error. */
  failure: SvctraceError | undefined;

  /** Creates `path`; refuses to overwrite an existing file unless `overwrite`. */
  constructor(
    readonly path: string,
    overwrite = false,
  ) {
    this.fd = fs.openSync(path, overwrite ? 'w' : 'wx', 0o640);
    try {
      this.seekable = fs.fstatSync(this.fd).isFile();
      this.append(MAGIC);
    } catch (e) {
      fs.closeSync(this.fd);
      // Only a file this writer created is removed ('wx'): an existing path given with --force may be a device.
      if (!overwrite) fs.rmSync(path, { force: true });
      throw e;
    }
  }

  write(type: ChunkType, payload: Uint8Array): void {
    const header = chunkHeader(type, payload.byteLength);
    const hash = chunkHash(this.prev, header, payload);
    this.append(Buffer.concat([header, payload, hash]));
    this.prev = hash;
  }

  private append(buf: Buffer): void {
    if (this.torn) throw this.failure!;
    let off = 0;
    try {
      // Positional writes: after a cut-back the next chunk starts where the last whole one ended.
      while (off < buf.length) off += fs.writeSync(this.fd, buf, off, buf.length - off, this.seekable ? this.bytes + off : null);
    } catch (e) {
      if (off && !this.seekable) this.torn = true;
      else if (off) {
        try {
          fs.ftruncateSync(this.fd, this.bytes);
        } catch {
          // The reader stops at the half chunk anyway (reported as cut short there).
        }
      }
      const err = e as NodeJS.ErrnoException;
      const failure = new SvctraceError('WRITE_FAILED', `cannot write ${this.path}: ${err.code ?? err.message}${err.code === 'ENOSPC' ? ' (no space left on the device)' : ''}`, {
        errno: typeof err.errno === 'number' ? -err.errno : undefined,
        op: 'write',
        cause: e,
      });
      this.failure ??= failure;
      throw failure;
    }
    this.bytes += buf.length;
  }

  /** The chain hash so far: what the next chunk's hash builds on (what a signature covers). */
  get chainHead(): Buffer {
    return this.prev;
  }

  sync(): void {
    if (this.seekable) fs.fsyncSync(this.fd);
  }

  /** Syncs and closes; a sync that fails after a write error is not news (the error was thrown already). */
  close(): void {
    try {
      // A pipe or device has nothing to sync (fsync would fail with EINVAL).
      if (this.seekable) fs.fsyncSync(this.fd);
    } catch (e) {
      if (!this.failure) {
        fs.closeSync(this.fd);
        this.failure = new SvctraceError('WRITE_FAILED', `cannot write ${this.path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, { op: 'fsync', cause: e });
        throw this.failure;
      }
    }
    fs.closeSync(this.fd);
  }
}

export interface Chunk {
  index: number;
  offset: number;
  type: number;
  payload: Buffer;
  /** The chain hash before this chunk (for a trailer: what its signature covers). */
  prevHash: Buffer;
}

export type ProblemKind = 'bad-magic' | 'bad-header' | 'hash-mismatch' | 'truncated' | 'garbage-after-trailer' | 'missing-trailer' | 'bad-payload' | 'order';

export interface Problem {
  kind: ProblemKind;
  offset: number;
  chunk?: number;
  message: string;
  /** true: the content was altered or is not a recording; false: only cut short. */
  corrupt: boolean;
}

export interface WalkResult {
  problems: Problem[];
  validBytes: number;
  chunks: number;
  size: number;
}

/** Walks the chunks of a recording with a callback; see iterChunks. */
export function walkChunks(path: string, onChunk: (c: Chunk) => void): WalkResult {
  const it = iterChunks(path);
  for (;;) {
    const r = it.next();
    if (r.done) return r.value;
    onChunk(r.value);
  }
}

/**
 * Yields the chunks of a recording, verifying the chain as it goes; returns
 * the problems found. Stops at the first problem (nothing after an altered
 * chunk can be trusted) and reports it with its offset. Only verified chunks
 * are yielded. Reads chunk by chunk: memory stays at one chunk.
 */
export function* iterChunks(path: string): Generator<Chunk, WalkResult, void> {
  const fd = fs.openSync(path, 'r');
  try {
    const size = fs.fstatSync(fd).size;
    const problems: Problem[] = [];
    const magic = Buffer.alloc(MAGIC.length);
    const got = fs.readSync(fd, magic, 0, MAGIC.length, 0);
    if (got < MAGIC.length || !magic.equals(MAGIC)) {
      problems.push({ kind: 'bad-magic', offset: 0, message: 'not a svctrace recording (bad magic bytes at offset 0)', corrupt: true });
      return { problems, validBytes: 0, chunks: 0, size };
    }
    let prev = initialHash();
    let off = MAGIC.length;
    let index = 0;
    let sawTrailer = false;
    const header = Buffer.alloc(CHUNK_HEADER_BYTES);
    while (off < size) {
      if (sawTrailer) {
        problems.push({ kind: 'garbage-after-trailer', offset: off, message: `${size - off} bytes of garbage after the trailer, at offset ${off}`, corrupt: true });
        break;
      }
      if (size - off < CHUNK_HEADER_BYTES) {
        problems.push({ kind: 'truncated', offset: off, chunk: index, message: `cut short inside the header of chunk ${index} at offset ${off} (${size - off} of ${CHUNK_HEADER_BYTES} bytes)`, corrupt: false });
        break;
      }
      fs.readSync(fd, header, 0, CHUNK_HEADER_BYTES, off);
      const type = header.readUInt8(0);
      const length = header.readUInt32LE(4);
      if (!(type in CHUNK_NAMES) || header.readUInt8(1) !== 0 || header.readUInt16LE(2) !== 0 || length > MAX_CHUNK_PAYLOAD) {
        problems.push({
          kind: 'bad-header',
          offset: off,
          chunk: index,
          message: `chunk ${index} at offset ${off} has an invalid header (type ${type}, length ${length}): altered or not part of the recording`,
          corrupt: true,
        });
        break;
      }
      const need = CHUNK_HEADER_BYTES + length + HASH_BYTES;
      const trailerAt = size - off < need ? trailerAtEnd(fd, size, off + CHUNK_HEADER_BYTES) : undefined;
      if (size - off < need && completeWithOtherLength(fd, size, off, header, prev)) {
        // The rest of the file is this very chunk, whole and hash-valid,
        // under a different length: the length field was altered (a crash
        // cannot leave a chunk whose hash matches another length).
        problems.push({
          kind: 'bad-header',
          offset: off,
          chunk: index,
          message: `chunk ${index} (${CHUNK_NAMES[type]}) at offset ${off} declares ${length} bytes, but it is complete, hash included, with ${size - off - CHUNK_HEADER_BYTES - HASH_BYTES}: its length was altered`,
          corrupt: true,
        });
        break;
      }
      if (trailerAt !== undefined) {
        // A crash cuts the file inside its last chunk; it cannot leave a
        // whole trailer after it. A length running past the end of a file
        // that ends with one was altered.
        problems.push({
          kind: 'bad-header',
          offset: off,
          chunk: index,
          message: `chunk ${index} at offset ${off} declares ${length} bytes, past the end of the file, yet a complete trailer ends the file at offset ${trailerAt}: its length was altered`,
          corrupt: true,
        });
        break;
      }
      if (size - off < need) {
        problems.push({
          kind: 'truncated',
          offset: off,
          chunk: index,
          message: `cut short inside chunk ${index} (${CHUNK_NAMES[type]}) at offset ${off}: it needs ${need} bytes, the file has ${size - off}`,
          corrupt: false,
        });
        break;
      }
      const payload = Buffer.alloc(length);
      fs.readSync(fd, payload, 0, length, off + CHUNK_HEADER_BYTES);
      const stored = Buffer.alloc(HASH_BYTES);
      fs.readSync(fd, stored, 0, HASH_BYTES, off + CHUNK_HEADER_BYTES + length);
      const want = chunkHash(prev, header, payload);
      if (!want.equals(stored)) {
        problems.push({
          kind: 'hash-mismatch',
          offset: off,
          chunk: index,
          message: `chunk ${index} (${CHUNK_NAMES[type]}) at offset ${off}..${off + need - 1}: SHA-256 mismatch: its content (or an earlier chunk's) was altered`,
          corrupt: true,
        });
        break;
      }
      yield { index, offset: off, type, payload, prevHash: prev };
      prev = stored;
      off += need;
      index++;
      if (type === ChunkType.TRAILER) sawTrailer = true;
    }
    if (!sawTrailer && !problems.some((p) => p.corrupt)) {
      problems.push({
        kind: 'missing-trailer',
        offset: off,
        message: `no trailer: the recording did not end cleanly (crash, kill or power loss); ${index} complete chunks, intact up to offset ${off}`,
        corrupt: false,
      });
    }
    return { problems, validBytes: off, chunks: index, size };
  } finally {
    fs.closeSync(fd);
  }
}

/** The largest trailer looked for at the end of a file (svctrace's are well under 1 KiB). */
const MAX_TRAILER_PAYLOAD = 64 * 1024;

/**
 * Where a structurally complete trailer chunk (header, payload, hash) ends
 * the file exactly, starting at or after `from`; undefined if none does.
 */
function trailerAtEnd(fd: number, size: number, from: number): number | undefined {
  const span = Math.min(size - from, CHUNK_HEADER_BYTES + MAX_TRAILER_PAYLOAD + HASH_BYTES);
  if (span < CHUNK_HEADER_BYTES + HASH_BYTES) return undefined;
  const tail = Buffer.alloc(span);
  fs.readSync(fd, tail, 0, span, size - span);
  for (let len = 0; len + CHUNK_HEADER_BYTES + HASH_BYTES <= span; len++) {
    const at = span - HASH_BYTES - len - CHUNK_HEADER_BYTES;
    if (tail.readUInt8(at) === ChunkType.TRAILER && tail.readUInt8(at + 1) === 0 && tail.readUInt16LE(at + 2) === 0 && tail.readUInt32LE(at + 4) === len) {
      return size - span + at;
    }
  }
  return undefined;
}

/** Whether the rest of the file, from `off`, is one whole chunk with the same type and a length other than its header says. */
function completeWithOtherLength(fd: number, size: number, off: number, header: Buffer, prev: Buffer): boolean {
  const len = size - off - CHUNK_HEADER_BYTES - HASH_BYTES;
  if (len < 0 || len > MAX_CHUNK_PAYLOAD) return false;
  const payload = Buffer.alloc(len);
  fs.readSync(fd, payload, 0, len, off + CHUNK_HEADER_BYTES);
  const stored = Buffer.alloc(HASH_BYTES);
  fs.readSync(fd, stored, 0, HASH_BYTES, off + CHUNK_HEADER_BYTES + len);
  const fixed = Buffer.from(header);
  fixed.writeUInt32LE(len, 4);
  return chunkHash(prev, fixed, payload).equals(stored);
}
