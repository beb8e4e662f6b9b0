/**
 * A protobuf writer for the generated encoders (`pb.Event.encode(ev,
 * writer)`) that writes straight into one growing buffer. protobufjs's own
 * Writer queues an operation object per field and copies at finish, which
 * was most of the cost of streaming events. The wire format still comes from
 * the generated code alone: this only implements the writer calls it makes,
 * byte for byte as protobufjs writes them (test/unit/event-writer.test.ts
 * compares the two on every kind of event).
 */
import type { Writer } from 'protobufjs/minimal';

interface LongLike {
  low: number;
  high: number;
}

const TWO_32 = 4294967296;

/** What a writer holds after takeFrom gave its buffer away. */
const EMPTY = Buffer.alloc(0);

export class EventWriter {
  private buf: Buffer;
  /** The same bytes, for copies four at a time (rawRange, copyTail). */
  private view: DataView;
  /** Bytes written so far. */
  len = 0;
  /** Where each open sub-message's length slot is, and how many bytes it kept for it. */
  private readonly forks: number[] = [];
  private readonly reserved: number[] = [];

  constructor(initialBytes = 64 * 1024) {
    this.buf = Buffer.allocUnsafe(initialBytes);
    this.view = new DataView(this.buf.buffer, this.buf.byteOffset, this.buf.byteLength);
  }

  /** For the generated encoders, which are typed against protobufjs's Writer. */
  asWriter(): Writer {
    return this as unknown as Writer;
  }

  /** Starts again from empty (the buffer is kept). */
  reset(): void {
    this.len = 0;
    this.forks.length = 0;
    this.reserved.length = 0;
  }

  /** Where the writer is: cutBack(mark) forgets everything written after it, open sub-messages included. */
  mark(): number {
    return this.len;
  }

  /** Back to `mark` (from mark(), taken with no sub-message open): what an encode that threw left half-written goes. */
  cutBack(mark: number): void {
    this.len = mark;
    this.forks.length = 0;
    this.reserved.length = 0;
  }

  /** Leaves n bytes to be filled later (put). */
  skip(n: number): this {
    this.room(n);
    this.len += n;
    return this;
  }

  /** Writes `bytes` at `at`, over what is there (room kept by skip). */
  put(bytes: Uint8Array, at: number): void {
    if (at < 0 || at + bytes.length > this.len) throw new RangeError(`EventWriter.put: ${bytes.length} bytes at ${at} of ${this.len}`);
    this.buf.set(bytes, at);
  }

  /** A copy of what was written from `start` on (not zero-filled first, as slice was: every byte is copied over). */
  finishFrom(start: number): Uint8Array {
    const copy = Buffer.allocUnsafe(this.len - start);
    this.buf.copy(copy, 0, start, this.len);
    return copy;
  }

  /**
   * Starts again from empty in a buffer of its own of `bytes` (never a slice
   * of Node's shared pool), for output whose size is known closely
   * beforehand and handed over whole by takeFrom.
   */
  resetOwned(bytes: number): void {
    this.buf = Buffer.allocUnsafeSlow(Math.max(64, bytes));
    this.view = new DataView(this.buf.buffer, this.buf.byteOffset, this.buf.byteLength);
    this.reset();
  }

  /**
   * What was written from `start` on, without a copy: the buffer goes with
   * it, and the writer starts over from an empty one (a write grows it).
   * The bytes handed over keep the whole buffer alive (their
   * `buffer.byteLength`).
   */
  takeFrom(start: number): Uint8Array {
    const taken = this.buf.subarray(start, this.len);
    this.buf = EMPTY;
    this.view = new DataView(EMPTY.buffer, EMPTY.byteOffset, 0);
    this.reset();
    return taken;
  }

  /** A copy of what was written (the buffer is reused). */
  finish(): Uint8Array {
    return Uint8Array.prototype.slice.call(this.buf, 0, this.len);
  }

  /** What was written, without a copy: valid until the next write. */
  written(): Uint8Array {
    return this.buf.subarray(0, this.len);
  }

  /** Copies bytes [start, this.len) into `target` at `at` (no view made: the hot path keeps runs this way); `targetView`, a DataView of target, copies four at a time. */
  copyTail(start: number, target: Uint8Array, at: number, targetView?: DataView): void {
    copyBytes(this.buf, this.view, start, target, targetView, at, this.len - start);
  }

  private room(n: number): void {
    if (this.len + n <= this.buf.length) return;
    let size = Math.max(64, this.buf.length * 2);
    while (size < this.len + n) size *= 2;
    const next = Buffer.allocUnsafe(size);
    this.buf.copy(next, 0, 0, this.len);
    this.buf = next;
    this.view = new DataView(next.buffer, next.byteOffset, next.byteLength);
  }

  uint32(value: number): this {
    let v = value >>> 0;
    this.room(5);
    const b = this.buf;
    while (v > 127) {
      b[this.len++] = (v & 127) | 128;
      v >>>= 7;
    }
    b[this.len++] = v;
    return this;
  }

  int32(value: number): this {
    // Negative int32 values are sign-extended to 64 bits: ten bytes.
    return value < 0 ? this.varint64(value | 0, -1) : this.uint32(value);
  }

  sint32(value: number): this {
    return this.uint32(((value << 1) ^ (value >> 31)) >>> 0);
  }

  uint64(value: number | LongLike): this {
    if (typeof value === 'number') {
      if (value >= 0 && value < TWO_32) return this.uint32(value);
      // protobufjs's LongBits.fromNumber: a negative number is its two's complement.
      const neg = value < 0;
      const v = neg ? -value : value;
      let lo = v >>> 0;
      let hi = ((v - lo) / TWO_32) >>> 0;
      if (neg) {
        hi = ~hi >>> 0;
        lo = ~lo >>> 0;
        if (++lo > 4294967295) {
          lo = 0;
          if (++hi > 4294967295) hi = 0;
        }
      }
      return this.varint64(lo, hi);
    }
    return this.varint64(value.low, value.high);
  }

  /** A uint64 given as its low and high 32 bits, as uint64() writes it. */
  uint64Words(low: number, high: number): this {
    return this.varint64(low, high);
  }

  private varint64(low: number, high: number): this {
    let lo = low >>> 0;
    let hi = high >>> 0;
    this.room(10);
    const b = this.buf;
    while (hi) {
      b[this.len++] = (lo & 127) | 128;
      lo = ((lo >>> 7) | (hi << 25)) >>> 0;
      hi >>>= 7;
    }
    while (lo > 127) {
      b[this.len++] = (lo & 127) | 128;
      lo >>>= 7;
    }
    b[this.len++] = lo;
    return this;
  }

  bool(value: boolean): this {
    this.room(1);
    this.buf[this.len++] = value ? 1 : 0;
    return this;
  }

  double(value: number): this {
    this.room(8);
    this.buf.writeDoubleLE(value, this.len);
    this.len += 8;
    return this;
  }

  /**
   * Short ASCII strings (addresses, names, states: nearly all of them) are
   * copied a character at a time, their length known without measuring;
   * anything else goes through Buffer's UTF-8 encoder.
   */
  string(value: string): this {
    const n = value.length;
    if (n < 128) {
      this.room(n + 1);
      const b = this.buf;
      const start = this.len;
      b[start] = n;
      let i = 0;
      for (; i < n; i++) {
        const c = value.charCodeAt(i);
        if (c > 127) break;
        b[start + 1 + i] = c;
      }
      if (i === n) {
        this.len = start + 1 + n;
        return this;
      }
    }
    const bytes = Buffer.byteLength(value);
    this.uint32(bytes);
    this.room(bytes);
    this.len += this.buf.write(value, this.len, bytes, 'utf8');
    return this;
  }

  bytes(data: Uint8Array | string): this {
    // protobufjs takes base64 text for bytes fields too.
    const value = typeof data === 'string' ? Buffer.from(data, 'base64') : data;
    this.uint32(value.length);
    this.room(value.length);
    this.buf.set(value, this.len);
    this.len += value.length;
    return this;
  }

  /** Bytes as they are (fields a decoder kept from a newer schema, sub-messages encoded before). */
  raw(data: Uint8Array): this {
    const n = data.length;
    this.room(n);
    if (n < 64) {
      // A short copy costs less as a loop than as a call to TypedArray.set.
      const b = this.buf;
      const o = this.len;
      for (let i = 0; i < n; i++) b[o + i] = data[i]!;
    } else {
      this.buf.set(data, this.len);
    }
    this.len += n;
    return this;
  }

  /** Bytes [at, at + n) of `src`, as they are; `srcView`, a DataView of src, copies four at a time. */
  rawRange(src: Uint8Array, at: number, n: number, srcView?: DataView): this {
    this.room(n);
    copyBytes(src, srcView, at, this.buf, this.view, this.len, n);
    this.len += n;
    return this;
  }

  /**
   * Opens a length-delimited sub-message, keeping `lengthBytes` for its
   * length: 1 suits most nested messages (shorter than 128 bytes); a whole
   * event is usually 128 bytes to 16 KiB, 2. A length that turns out to need
   * another size moves the message (protobufjs's own minimal varint, always).
   */
  fork(lengthBytes = 1): this {
    this.room(lengthBytes);
    this.forks.push(this.len);
    this.reserved.push(lengthBytes);
    this.len += lengthBytes;
    return this;
  }

  /** Closes the last sub-message: writes its length, moving the message if the length needs other than the bytes kept. */
  ldelim(): this {
    const slot = this.forks.pop();
    const kept = this.reserved.pop();
    if (slot === undefined || kept === undefined) throw new Error('EventWriter.ldelim() without fork()');
    const size = this.len - slot - kept;
    if (size < 128 && kept === 1) {
      this.buf[slot] = size;
      return this;
    }
    let need = 1;
    for (let v = size >>> 7; v > 0; v >>>= 7) need++;
    if (need !== kept) {
      if (need > kept) this.room(need - kept);
      this.buf.copyWithin(slot + need, slot + kept, this.len);
      this.len += need - kept;
    }
    let v = size;
    let at = slot;
    while (v > 127) {
      this.buf[at++] = (v & 127) | 128;
      v >>>= 7;
    }
    this.buf[at] = v;
    return this;
  }
}

/**
 * Copies n bytes. The copies of the hot path are 10 to 120 bytes: a loop of
 * 4-byte DataView reads and writes when both views are given (about twice
 * as fast as a byte loop), a native copy from 128 bytes on (a view costs
 * less than the loop there).
 */
function copyBytes(src: Uint8Array, srcView: DataView | undefined, from: number, dst: Uint8Array, dstView: DataView | undefined, to: number, n: number): void {
  if (n >= 128) {
    dst.set(src.subarray(from, from + n), to);
    return;
  }
  let i = 0;
  if (srcView && dstView) for (; i + 4 <= n; i += 4) dstView.setUint32(to + i, srcView.getUint32(from + i, true), true);
  for (; i < n; i++) dst[to + i] = src[from + i]!;
}
