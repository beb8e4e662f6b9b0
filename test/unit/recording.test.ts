/**
 * The .svtr container: a recording built with the real writer, then damaged
 * the ways files get damaged. verify must say exactly where; replay must
 * deliver every intact chunk and stop there.
 */
import { after, describe, it, before } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import protobuf from 'protobufjs/minimal';
import Long from 'long';
import { ChunkType, ChunkWriter, CHUNK_HEADER_BYTES, HASH_BYTES, MAGIC } from '../../src/record/format';
import { readRecording } from '../../src/record/reader';
import { O_TMPFILE, openRecordingInput } from '../../src/record/spool';
import { replay } from '../../src/record/replay';
import { exportJson, exportPcapng, MAX_INTERFACES } from '../../src/record/export';
import { keyId, signChainHead } from '../../src/record/signing';
import { svctrace } from '../../src/gen/svctrace';
import { makeEvent } from '../helpers/stream';
import { inspect } from '../../src/record/inspect';
import { RecordingSink } from '../../src/pipeline/sinks/recording';
import { SinkSet } from '../../src/pipeline/sink';
import type { Ingested } from '../../src/flows/types';
import type { SvctraceError } from '../../src/errors';

import pb = svctrace.v1;

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-rec-'));

/** header, snapshot, 3 chunks of 10 events, trailer; returns the chunk offsets. */
function makeRecording(file: string, withTrailer = true): number[] {
  const w = new ChunkWriter(file, true);
  const offsets: number[] = [];
  const put = (t: ChunkType, b: Uint8Array) => {
    offsets.push(w.bytes);
    w.write(t, b);
  };
  put(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-11-29T00:00:00.000Z', services: ['10.96.0.100:80/tcp'] }).finish());
  put(ChunkType.SNAPSHOT, pb.NodeSnapshot.encode({ sections: [{ name: 'iptables', output: '-A KUBE-SERVICES -d 10.96.0.100/32 -j KUBE-SVC-X\n' }] }).finish());
  for (let c = 0; c < 3; c++) {
    const wr = protobuf.Writer.create();
    for (let i = 0; i < 10; i++) wr.bytes(pb.Event.encode(makeEvent(c * 10 + i, { tsNs: c * 10 + i })).finish());
    put(ChunkType.EVENTS, wr.finish());
  }
  if (withTrailer) put(ChunkType.TRAILER, pb.RecordingTrailer.encode({ events: 30, reason: 'duration' }).finish());
  w.close();
  return offsets;
}

function verifyCli(file: string): { status: number | null; out: string } {
  const r = spawnSync(process.execPath, [CLI, 'verify', file], { encoding: 'utf8' });
  return { status: r.status, out: r.stdout + r.stderr };
}

describe('recordings', () => {
  const good = path.join(dir, 'good.svtr');
  after(() => fs.rmSync(dir, { recursive: true, force: true }));
  let offsets: number[] = [];
  before(() => {
    offsets = makeRecording(good);
  });

  it('the file is closed however reading ends: a callback that throws, a replay stopped early, an export whose reader left', async () => {
    const fds = () => fs.readdirSync('/proc/self/fd').length;
    const before = fds();
    assert.throws(() => readRecording(good, () => {
      throw new Error('disk full');
    }), /disk full/);
    assert.equal(fds(), before, 'readRecording: a throwing callback leaves no file open');
    let delivered = 0;
    await replay(good, 'max', (e) => void (delivered += e.length), () => delivered > 0);
    assert.equal(delivered, 10, 'replay stopped after the first slice');
    assert.equal(fds(), before, 'replay stopped early leaves no file open');
    const lines: string[] = [];
    let waited = 0;
    const rec = await exportJson(good, (l) => void lines.push(l), () => (waited++, Promise.resolve()), () => lines.length > 5);
    assert.equal(waited, 1, 'the output was waited for after the first slice');
    assert.equal(lines.length, 12, 'header, snapshot and one slice of 10, then stopped');
    assert.ok(rec.header, 'what was read so far is returned');
    assert.equal(fds(), before, 'export stopped early leaves no file open');
  });

  it('an event whose encoding fails mid-way leaves nothing of itself: the batch\'s others are recorded, the file reads', () => {
    const file = path.join(dir, 'half.svtr');
    const w = new ChunkWriter(file, true);
    w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-12-01T00:00:00.000Z', services: [] }).finish());
    const sink = new RecordingSink(w, { trailer: () => ({ reason: 'test' }) });
    const item = (i: number) => ({ event: makeEvent(i, { tsNs: i }) }) as unknown as Ingested;
    // Written up to its conntrack, then the encoder meets a value it cannot write.
    const bad = { event: { ...makeEvent(99, { tsNs: 99 }), conntrack: { id: 'c', status: Symbol('not a number') } } } as unknown as Ingested;
    // Through the pipeline's sink set: reported, and counted once, in the
    // recording's own stage (not again in internal_error).
    const warnings: string[] = [];
    const set = new SinkSet([sink], (m) => warnings.push(m));
    set.write([item(1), bad, item(2)]);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0]!, /^recording output failed \(write\): /);
    assert.equal(set.lostEvents, 0, 'counted by the recording, not a second time');
    sink.close();
    assert.equal(sink.events, 2);
    assert.equal(sink.lost, 1);
    assert.equal(Number(sink.trailer?.lostByStage?.recording), 1);
    const seen: number[] = [];
    const rec = readRecording(file, (events) => seen.push(...events.map((e) => Number(e.tsNs))));
    assert.deepEqual(seen.length, 2, `events read: ${JSON.stringify(seen)} (${JSON.stringify(rec.problems ?? [])})`);
  });

  for (const roomAgain of [false, true]) {
    it(`a write that fails (disk full) stops the recording, never the process: whole chunks kept, every event not written counted${roomAgain ? '; the trailer says so when the device has room again' : ''}`, async () => {
      const file = path.join(dir, `full-${roomAgain}.svtr`);
      const w = new ChunkWriter(file, true);
      w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-12-05T00:00:00.000Z', services: [] }).finish());
      const failures: Error[] = [];
      const sink = new RecordingSink(w, { trailer: () => ({ reason: 'write-error', kernelLost: 3, lostByStage: { ring_buffer: 3 } }), onWriteError: (e) => failures.push(e) });
      const item = (i: number) => ({ event: makeEvent(i, { tsNs: i }) }) as unknown as Ingested;
      const batch = (from: number, n: number) => Array.from({ length: n }, (_, i) => item(from + i));
      sink.write(batch(0, 50));
      await new Promise((r) => setTimeout(r, 800)); // the flush timer writes them
      assert.equal(sink.events, 50);
      const goodBytes = w.bytes;
      // The device fills up: the next write gets 20 bytes in, then ENOSPC (as write(2) does).
      const realWrite = fs.writeSync;
      let room = 20;
      (fs as { writeSync: unknown }).writeSync = (fd: number, buf: Uint8Array, off: number, len: number, pos: number) => {
        if (room <= 0) throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' });
        const n = realWrite(fd, buf, off, Math.min(len, room), pos);
        room -= n;
        return n;
      };
      try {
        sink.write(batch(50, 30));
        await new Promise((r) => setTimeout(r, 800)); // the timer's flush fails: it must not throw (an uncaught error ends this test run)
        assert.equal(failures.length, 1);
        assert.match(failures[0]!.message, /cannot write .*full-.*ENOSPC \(no space left on the device\)/);
        assert.equal((failures[0] as SvctraceError).code, 'WRITE_FAILED');
        assert.equal(fs.statSync(file).size, goodBytes, 'the half-written chunk is cut back');
        sink.write(batch(80, 5)); // after the failure: counted, not written
        assert.equal(sink.lost, 35);
        if (roomAgain) (fs as { writeSync: unknown }).writeSync = realWrite;
        sink.close(); // the trailer is tried, and must not throw either way
      } finally {
        (fs as { writeSync: unknown }).writeSync = realWrite;
      }
      assert.equal(failures.length, 1, 'told once');
      assert.equal(sink.events, 50);
      const seen: number[] = [];
      const rec = readRecording(file, (events) => seen.push(...events.map((e) => Number(e.tsNs))));
      assert.deepEqual(seen, Array.from({ length: 50 }, (_, i) => i));
      assert.deepEqual(rec.problems.filter((p) => p.corrupt), [], 'cut short at most, never damaged');
      if (roomAgain) {
        // The file has no gap: the trailer follows the last whole chunk.
        assert.equal(rec.problems.length, 0, JSON.stringify(rec.problems));
        assert.equal(Number(sink.trailer?.lostByStage?.recording), 35);
        assert.equal(Number(sink.trailer?.lostByStage?.ring_buffer), 3);
        assert.equal(Number(sink.trailer?.kernelLost), 38);
        assert.equal(Number(sink.trailer?.events), 50);
      } else {
        assert.equal(sink.trailer, undefined);
        assert.deepEqual(rec.problems.map((p) => p.kind), ['missing-trailer']);
      }
    });
  }

  it('-o a pipe or a device: written in sequence, byte for byte the same recording (no positional write, no fsync)', async () => {
    const fifo = path.join(dir, 'pipe');
    const out = path.join(dir, 'from-pipe.svtr');
    assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
    const { spawn } = await import('node:child_process');
    const cat = spawn('sh', ['-c', 'exec cat "$1" > "$2"', 'sh', fifo, out], { stdio: 'ignore' });
    const done = new Promise<number | null>((resolve) => cat.on('exit', resolve));
    makeRecording(fifo); // blocks in open until cat opens the FIFO's other end
    assert.equal(await done, 0);
    assert.deepEqual(fs.readFileSync(out), fs.readFileSync(good));
    assert.doesNotThrow(() => makeRecording('/dev/null'));
  });

  it('read from a pipe or a FIFO: copied to a temporary file first, read as the file would be, the copy removed after', async () => {
    // A pipe: what `record -o /dev/stdout | svctrace verify /dev/stdin` gives.
    const v = spawnSync(process.execPath, [CLI, 'verify', '/dev/stdin'], { input: fs.readFileSync(good), encoding: 'utf8' });
    assert.equal(v.status, 0, v.stdout + v.stderr);
    assert.match(v.stdout, /^\/dev\/stdin: \d+ chunks, 30 events/);
    assert.match(v.stdout, /OK: complete, the hash chain is intact/);
    assert.match(v.stderr, /\/dev\/stdin is a stream: read in full first \([\d.]+ KiB, into an unnamed temporary file\)/);
    // '-' is stdin too; stdin redirected from a file is read where it is, not copied.
    const dash = spawnSync(process.execPath, [CLI, 'verify', '-'], { input: fs.readFileSync(good), encoding: 'utf8' });
    assert.equal(dash.status, 0, dash.stdout + dash.stderr);
    const fd = fs.openSync(good, 'r');
    const redirected = spawnSync(process.execPath, [CLI, 'verify', '/dev/stdin'], { stdio: [fd, 'pipe', 'pipe'], encoding: 'utf8' });
    fs.closeSync(fd);
    assert.equal(redirected.status, 0, redirected.stdout + redirected.stderr);
    assert.doesNotMatch(redirected.stderr, /is a stream/);
    const i = spawnSync(process.execPath, [CLI, 'inspect', '/dev/stdin'], { input: fs.readFileSync(good), encoding: 'utf8' });
    assert.equal(i.status, 0, i.stderr);
    assert.match(i.stdout, /^recording \/dev\/stdin$/m);
    // A FIFO, through the module: its bytes, and nothing left in the temporary directory.
    const fifo = path.join(dir, 'in-pipe');
    const tmp = fs.mkdtempSync(path.join(dir, 'tmp-'));
    assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
    const { spawn } = await import('node:child_process');
    const cat = spawn('sh', ['-c', 'exec cat "$1" > "$2"', 'sh', good, fifo], { stdio: 'ignore' });
    const input = openRecordingInput(fifo, tmp); // blocks in open until cat opens the other end
    assert.equal(input.spooledBytes, fs.statSync(good).size);
    assert.notEqual(input.file, fifo);
    assert.deepEqual(fs.readFileSync(input.file), fs.readFileSync(good));
    assert.deepEqual(readRecording(input.file).problems, []);
    // Where the file system makes nameless files (O_TMPFILE: ext4, tmpfs, xfs, btrfs),
    // the copy never had a name: the kernel calls it "#<inode>" in the directory itself.
    let nameless = false;
    try {
      if (O_TMPFILE !== undefined) fs.closeSync(fs.openSync(tmp, O_TMPFILE | fs.constants.O_RDWR, 0o600));
      nameless = O_TMPFILE !== undefined;
    } catch {
      // not on this file system: the named copy, unlinked at once, is used
    }
    if (nameless) {
      const target = fs.readlinkSync(input.file);
      const real = fs.realpathSync(tmp); // the link names the resolved directory
      assert.ok(target.startsWith(`${real}/`), target);
      assert.match(target.slice(real.length + 1), /^#\d+ \(deleted\)$/);
    }
    input.done();
    input.done();
    assert.deepEqual(fs.readdirSync(tmp), []);
    await new Promise((r) => cat.on('exit', r));
    // A regular file is read where it is; a directory is refused.
    const plain = openRecordingInput(good, tmp);
    assert.equal(plain.file, good);
    assert.equal(plain.spooledBytes, undefined);
    assert.throws(() => openRecordingInput(dir, tmp), /is not a file/);
    assert.throws(() => openRecordingInput(path.join(dir, 'missing.svtr'), tmp), /cannot read .*missing\.svtr: ENOENT/);
  });

  it('a file system without nameless files (ENOTSUP): the copy is named, unlinked at once, and nothing is left', async (t) => {
    const tmpfile = O_TMPFILE;
    if (tmpfile === undefined) return t.skip('no O_TMPFILE on this platform: the named copy is the only path (tested above)');
    const fifo = path.join(dir, 'in-pipe-enotsup');
    const tmp = fs.mkdtempSync(path.join(dir, 'tmp-'));
    assert.equal(spawnSync('mkfifo', [fifo]).status, 0);
    // What NFS, FUSE or an older overlayfs answer: errno 95, ENOTSUP to Node.
    const open = fs.openSync;
    let refused = 0;
    t.mock.method(fs, 'openSync', (p: fs.PathLike, flags: fs.OpenMode, mode?: fs.Mode) => {
      if (typeof flags === 'number' && (flags & tmpfile) === tmpfile) {
        refused++;
        throw Object.assign(new Error('ENOTSUP: operation not supported'), { code: 'ENOTSUP', errno: -95 });
      }
      return open(p, flags, mode);
    });
    const { spawn } = await import('node:child_process');
    const cat = spawn('sh', ['-c', 'exec cat "$1" > "$2"', 'sh', good, fifo], { stdio: 'ignore' });
    const input = openRecordingInput(fifo, tmp);
    t.mock.restoreAll();
    assert.equal(refused, 1, 'O_TMPFILE was tried first');
    assert.deepEqual(fs.readFileSync(input.file), fs.readFileSync(good));
    assert.match(fs.readlinkSync(input.file), /svctrace-recording-[^/]+\/recording\.svtr \(deleted\)$/);
    assert.deepEqual(fs.readdirSync(tmp), [], 'named, then unlinked and its directory removed before the copy');
    input.done();
    await new Promise((r) => cat.on('exit', r));
  });

  it('an intact recording verifies and replays every event', async () => {
    const rec = readRecording(good);
    assert.deepEqual(rec.problems, []);
    assert.equal(rec.eventCount, 30);
    assert.equal(rec.trailer?.reason, 'duration');
    const got: pb.Event[] = [];
    await replay(good, 'max', (e) => void got.push(...e));
    assert.deepEqual(got.map((e) => Number(e.flowId)), Array.from({ length: 30 }, (_, i) => i));
    const v = verifyCli(good);
    assert.equal(v.status, 0);
    assert.match(v.out, /OK: complete, the hash chain is intact/);
  });

  it('one flipped byte: verify names the chunk and its offset, exit 1', () => {
    const file = path.join(dir, 'flipped.svtr');
    const buf = fs.readFileSync(good);
    const target = offsets[3]! + CHUNK_HEADER_BYTES + 20; // inside the second events chunk's payload
    buf[target] = buf[target]! ^ 0x01;
    fs.writeFileSync(file, buf);
    const rec = readRecording(file);
    assert.equal(rec.problems.length, 1);
    assert.equal(rec.problems[0]!.kind, 'hash-mismatch');
    assert.equal(rec.problems[0]!.chunk, 3);
    assert.equal(rec.problems[0]!.offset, offsets[3]);
    assert.equal(rec.eventCount, 10, 'only the chunk before the damage is trusted');
    const v = verifyCli(file);
    assert.equal(v.status, 1);
    assert.match(v.out, new RegExp(`DAMAGED: chunk 3 \\(events\\) at offset ${offsets[3]}\\.\\.\\d+: SHA-256 mismatch`));
  });

  it('a damaged recording: inspect says so and answers no (exit 1)', () => {
    const file = path.join(dir, 'flipped-inspect.svtr');
    const buf = fs.readFileSync(good);
    const target = offsets[3]! + CHUNK_HEADER_BYTES + 20;
    buf[target] = buf[target]! ^ 0x01;
    fs.writeFileSync(file, buf);
    const i = spawnSync(process.execPath, [CLI, 'inspect', file], { encoding: 'utf8' });
    assert.match(i.stdout, /DAMAGED: .*SHA-256 mismatch/);
    assert.equal(i.status, 1, i.stdout + i.stderr);
    assert.equal(spawnSync(process.execPath, [CLI, 'inspect', good], { encoding: 'utf8' }).status, 0);
  });

  it('chunks out of the format\'s order are damage, named with their offset (verify exit 1)', () => {
    const header = pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-12-06T00:00:00.000Z', services: [] }).finish();
    const snapshot = pb.NodeSnapshot.encode({ sections: [{ name: 'iptables', output: '' }] }).finish();
    const events = (() => {
      const w = protobuf.Writer.create();
      w.bytes(pb.Event.encode(makeEvent(1, { tsNs: 1 })).finish());
      return w.finish();
    })();
    const cases: Array<[string, Array<[ChunkType, Uint8Array]>, RegExp]> = [
      ['snapshot after events', [[ChunkType.HEADER, header], [ChunkType.EVENTS, events], [ChunkType.SNAPSHOT, snapshot]], /chunk 2 \(snapshot\) at offset \d+ is out of order: a snapshot after events/],
      ['two snapshots', [[ChunkType.HEADER, header], [ChunkType.SNAPSHOT, snapshot], [ChunkType.SNAPSHOT, snapshot]], /chunk 2 \(snapshot\) .* out of order: a second snapshot/],
      ['events first', [[ChunkType.EVENTS, events], [ChunkType.HEADER, header]], /chunk 0 \(events\) .* out of order: the first chunk is not the header/],
      ['two headers', [[ChunkType.HEADER, header], [ChunkType.HEADER, header]], /chunk 1 \(header\) .* out of order: a second header/],
    ];
    for (const [what, chunks, re] of cases) {
      const file = path.join(dir, `order-${what.replace(/ /g, '-')}.svtr`);
      const w = new ChunkWriter(file, true);
      for (const [type, payload] of chunks) w.write(type, payload);
      w.write(ChunkType.TRAILER, pb.RecordingTrailer.encode({ reason: 'duration' }).finish());
      w.close();
      const rec = readRecording(file);
      assert.equal(rec.problems[0]?.kind, 'order', `${what}: ${JSON.stringify(rec.problems)}`);
      const v = verifyCli(file);
      assert.equal(v.status, 1, `${what}: ${v.out}`);
      assert.match(v.out, re, what);
    }
    // No snapshot at all is a recording still (it may have had none to take).
    const file = path.join(dir, 'order-no-snapshot.svtr');
    const w = new ChunkWriter(file, true);
    w.write(ChunkType.HEADER, header);
    w.write(ChunkType.EVENTS, events);
    w.write(ChunkType.TRAILER, pb.RecordingTrailer.encode({ reason: 'duration' }).finish());
    w.close();
    assert.deepEqual(readRecording(file).problems, []);
  });

  it('a failed export leaves an output that is not a regular file alone (--force to a device)', () => {
    // Through a link, so that a regression removes the link, not the device.
    const link = path.join(dir, 'null-link');
    fs.symlinkSync('/dev/null', link);
    const e = spawnSync(process.execPath, [CLI, 'export', good, '--pcapng', link, '--force'], { encoding: 'utf8' });
    assert.equal(e.status, 2, e.stderr);
    assert.match(e.stderr, /holds no packet data/);
    assert.ok(fs.lstatSync(link, { throwIfNoEntry: false })?.isSymbolicLink(), 'the output named is still there');
    // A regular file it wrote is removed: no half-written pcapng left behind.
    const out = path.join(dir, 'nothing.pcapng');
    assert.equal(spawnSync(process.execPath, [CLI, 'export', good, '--pcapng', out], { encoding: 'utf8' }).status, 2);
    assert.equal(fs.existsSync(out), false);
  });

  it('a stream that is not a recording is copied no further than its first read', () => {
    // 3 MiB of zeros on stdin: before, all of it was copied first (from
    // /dev/zero, until the disk was full); now the magic bytes stop it.
    const script = `const { openRecordingInput } = require(${JSON.stringify(path.resolve(__dirname, '..', '..', 'src', 'record', 'spool.js'))});
const i = openRecordingInput('/dev/stdin', ${JSON.stringify(dir)}); process.stdout.write(String(i.spooledBytes)); i.done();`;
    const r = spawnSync(process.execPath, ['-e', script], { input: Buffer.alloc(3 << 20), encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 0, r.stderr);
    assert.ok(Number(r.stdout) > 0 && Number(r.stdout) <= 1 << 20, `copied ${r.stdout} bytes`);
    const v = spawnSync(process.execPath, [CLI, 'verify', '/dev/stdin'], { input: Buffer.alloc(3 << 20), encoding: 'utf8', timeout: 60_000 });
    assert.equal(v.status, 1);
    assert.match(v.stdout, /not a svctrace recording \(bad magic bytes at offset 0\)/);
  });

  it('an endless stream being copied: nothing of the copy is ever named in the temporary directory, and Ctrl-C ends it', { timeout: 120_000 }, async () => {
    const tmp = fs.mkdtempSync(path.join(dir, 'endless-'));
    const { spawn } = await import('node:child_process');
    const v = spawn(process.execPath, [CLI, 'verify', '/dev/stdin'], { stdio: ['pipe', 'ignore', 'pipe'], env: { ...process.env, TMPDIR: tmp } });
    let err = '';
    v.stderr!.on('data', (d) => (err += d));
    const closed = new Promise<[number | null, NodeJS.Signals | null]>((resolve) => v.on('close', (code, signal) => resolve([code, signal])));
    v.stdin!.on('error', () => undefined); // EPIPE once it is gone
    // A recording's start, then bytes forever (1 MiB at a time, as read).
    const head = fs.readFileSync(good).subarray(0, 64);
    const more = Buffer.alloc(1 << 20);
    let sent = 0;
    const feed = (): void => {
      if (v.exitCode !== null || v.signalCode !== null) return;
      sent += more.length;
      if (v.stdin!.write(more)) setImmediate(feed);
      else v.stdin!.once('drain', feed);
    };
    try {
      v.stdin!.write(head);
      feed();
      const alive = () => v.exitCode === null && v.signalCode === null;
      const deadline = Date.now() + 60_000;
      while (sent < 32 << 20 && alive() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      assert.ok(alive() && sent >= 32 << 20, `verify still copying after ${sent} bytes (${v.exitCode ?? v.signalCode ?? 'running'}): ${err}`);
      assert.deepEqual(fs.readdirSync(tmp), [], 'the copy has no name while it is written');
      v.kill('SIGINT');
      const [code, signal] = await closed;
      assert.ok(signal === 'SIGINT' || code === 130, `ended by Ctrl-C: ${code} ${signal} ${err}`);
      assert.deepEqual(fs.readdirSync(tmp), [], 'nothing left behind');
    } finally {
      if (v.exitCode === null && v.signalCode === null) v.kill('SIGKILL');
    }
  });

  it('a flipped byte in a chunk header is caught too', () => {
    const file = path.join(dir, 'badheader.svtr');
    const buf = fs.readFileSync(good);
    buf[offsets[2]! + 7] = 0xff; // length's high byte
    fs.writeFileSync(file, buf);
    const rec = readRecording(file);
    assert.equal(rec.problems[0]!.kind, 'bad-header');
    assert.equal(rec.problems[0]!.offset, offsets[2]);
  });

  it('truncated in the middle of a chunk: replay delivers every complete chunk and says where it stopped', async () => {
    const file = path.join(dir, 'truncated.svtr');
    const buf = fs.readFileSync(good);
    const cut = offsets[4]! + 30;
    fs.writeFileSync(file, buf.subarray(0, cut));
    const got: pb.Event[] = [];
    const rec = await replay(file, 'max', (e) => void got.push(...e));
    assert.equal(got.length, 20);
    const p = rec.problems.find((x) => x.kind === 'truncated');
    assert.ok(p);
    assert.equal(p.chunk, 4);
    assert.equal(p.offset, offsets[4]);
    assert.equal(p.corrupt, false);
    assert.equal(rec.validBytes, offsets[4]);
    const v = verifyCli(file);
    assert.equal(v.status, 0, 'a cut-short file is accepted up to its last complete chunk');
    assert.match(v.out, new RegExp(`INCOMPLETE: cut short inside chunk 4 \\(events\\) at offset ${offsets[4]}`));
    const r = spawnSync(process.execPath, [CLI, 'replay', file, '--speed', 'max', '-o', 'json'], { encoding: 'utf8' });
    assert.equal(r.status, 0);
    assert.equal(r.stdout.trim().split('\n').length, 20);
    assert.match(r.stderr, new RegExp(`stopped at offset ${offsets[4]} of ${cut}; 20 events in 2 complete chunks`));
  });

  it('garbage appended after the trailer', () => {
    const file = path.join(dir, 'garbage.svtr');
    const size = fs.statSync(good).size;
    fs.writeFileSync(file, Buffer.concat([fs.readFileSync(good), Buffer.from('garbage!garbage!garbage!')]));
    const rec = readRecording(file);
    assert.equal(rec.eventCount, 30);
    assert.equal(rec.problems[0]!.kind, 'garbage-after-trailer');
    assert.equal(rec.problems[0]!.offset, size);
    assert.equal(verifyCli(file).status, 1);
  });

  it('no trailer (killed while recording): accepted, and said so', () => {
    const file = path.join(dir, 'killed.svtr');
    makeRecording(file, false);
    const rec = readRecording(file);
    assert.equal(rec.eventCount, 30);
    assert.deepEqual(rec.problems.map((p) => p.kind), ['missing-trailer']);
    const v = verifyCli(file);
    assert.equal(v.status, 0);
    assert.match(v.out, /INCOMPLETE: no trailer/);
    assert.equal(spawnSync(process.execPath, [CLI, 'verify', '--strict', file]).status, 1);
  });

  it('export never overwrites the recording itself, not even with --force or through a link', () => {
    const rec = path.join(dir, 'keep.svtr');
    makeRecording(rec);
    const before = fs.readFileSync(rec);
    const link = path.join(dir, 'keep-link.svtr');
    fs.symlinkSync(rec, link);
    for (const args of [['--pcapng', rec, '--force'], ['--pcapng', link, '--force'], ['--json', rec, '--force']]) {
      const r = spawnSync(process.execPath, [CLI, 'export', rec, ...args], { encoding: 'utf8' });
      assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /is the recording itself/);
    }
    assert.deepEqual(fs.readFileSync(rec), before, 'the recording is untouched');
  });

  it('signing: --pubkey proves who wrote it; a rewritten recording with every hash recomputed is consistent but not authentic', () => {
    const keys = crypto.generateKeyPairSync('ed25519');
    const other = crypto.generateKeyPairSync('ed25519');
    const pub = path.join(dir, 'ok.pub');
    const otherPub = path.join(dir, 'other.pub');
    fs.writeFileSync(pub, keys.publicKey.export({ type: 'spki', format: 'pem' }));
    fs.writeFileSync(otherPub, other.publicKey.export({ type: 'spki', format: 'pem' }));
    /** header + one events chunk (the given backend) + a trailer signed with `key`. */
    const write = (file: string, backend: string, key?: crypto.KeyObject, signedHead?: Buffer) => {
      const w = new ChunkWriter(file, true);
      w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-11-29T00:00:00.000Z', services: ['10.96.0.100:80/tcp'] }).finish());
      const wr = protobuf.Writer.create();
      wr.bytes(pb.Event.encode(makeEvent(1, { tsNs: 1, backend })).finish());
      w.write(ChunkType.EVENTS, wr.finish());
      const head = w.chainHead;
      const trailer: pb.IRecordingTrailer = { events: 1, reason: 'duration' };
      if (key) {
        trailer.signature = signChainHead(signedHead ?? head, key);
        trailer.keyId = keyId(key);
      }
      w.write(ChunkType.TRAILER, pb.RecordingTrailer.encode(trailer).finish());
      w.close();
      return head;
    };
    const signed = path.join(dir, 'signed.svtr');
    const head = write(signed, '10.244.1.12:8080', keys.privateKey);
    const verify = (file: string, ...args: string[]) => spawnSync(process.execPath, [CLI, 'verify', file, ...args], { encoding: 'utf8' });
    let v = verify(signed, '--pubkey', pub);
    assert.equal(v.status, 0, v.stdout + v.stderr);
    assert.match(v.stdout, new RegExp(`AUTHENTIC: signed with key ${keyId(keys.publicKey)}`));
    v = verify(signed, '--pubkey', otherPub);
    assert.equal(v.status, 1);
    assert.match(v.stdout, /NOT AUTHENTIC: the signature .* does not verify with --pubkey/);
    v = verify(signed);
    assert.equal(v.status, 0);
    assert.match(v.stdout, /signed with key \w+: check the signature with --pubkey/);
    // The backend rewritten and every hash recomputed, the old signature kept: the chain is fine, the signature is not.
    const forged = path.join(dir, 'forged.svtr');
    write(forged, '10.244.1.99:8080', keys.privateKey, head);
    v = verify(forged);
    assert.equal(v.status, 0, 'the chain alone cannot tell');
    assert.match(v.stdout, /not proven authentic/);
    v = verify(forged, '--pubkey', pub);
    assert.equal(v.status, 1);
    assert.match(v.stdout, /NOT AUTHENTIC/);
    // Unsigned: said plainly; with --pubkey it fails.
    const plain = path.join(dir, 'plain.svtr');
    write(plain, '10.244.1.12:8080');
    v = verify(plain);
    assert.equal(v.status, 0);
    assert.match(v.stdout, /consistent, not authenticated/);
    assert.equal(verify(plain, '--pubkey', pub).status, 1);
    // A key file that is not one: bad input.
    v = verify(plain, '--pubkey', plain);
    assert.equal(v.status, 2);
    assert.match(v.stderr, /is not a PEM public key/);
  });

  it('export: crafted but valid fields, damage and unwritable outputs get one-line answers, never an internal error', () => {
    const craftedFile = path.join(dir, 'crafted.svtr');
    const w = new ChunkWriter(craftedFile, true);
    w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-11-29T00:00:00.000Z', startedMonoNs: 5_000_000_000, services: ['10.96.0.100:80/tcp'], snaplen: 128 }).finish());
    const pkt = Uint8Array.from({ length: 40 }, (_, i) => (i === 0 ? 0x45 : 0));
    const wr = protobuf.Writer.create();
    const huge = 'x'.repeat(70_000);
    for (const ev of [
      makeEvent(1, { tsNs: 1, packetData: pkt, summary: huge, kind: pb.EventKind.EVENT_KIND_RULE_TRACE }), // before the start
      makeEvent(2, { tsNs: Long.MAX_UNSIGNED_VALUE, packetData: pkt }), // 2^64-1
      makeEvent(3, { tsNs: 6_000_000_000, packetData: pkt, kind: pb.EventKind.EVENT_KIND_DEV_RECV, device: { name: 'eth0', netns: huge } }),
    ]) wr.bytes(pb.Event.encode(ev).finish());
    w.write(ChunkType.EVENTS, wr.finish());
    w.write(ChunkType.TRAILER, pb.RecordingTrailer.encode({ events: 3, reason: 'duration' }).finish());
    w.close();
    const out = path.join(dir, 'crafted.pcapng');
    let r = spawnSync(process.execPath, [CLI, 'export', craftedFile, '--pcapng', out, '--force'], { encoding: 'utf8' });
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stderr, /3 packets/);
    assert.equal(fs.readFileSync(out).readUInt32LE(0), 0x0a0d0d0a, 'a pcapng section header');

    // Damage before the first packet: named, not blamed on --snaplen; no output left behind.
    const damaged = path.join(dir, 'damaged-capture.svtr');
    const buf = fs.readFileSync(craftedFile);
    const firstEvents = buf.indexOf(Buffer.from([ChunkType.EVENTS, 0, 0, 0]), MAGIC.length + CHUNK_HEADER_BYTES);
    buf[firstEvents + CHUNK_HEADER_BYTES + 5]! ^= 0xff;
    fs.writeFileSync(damaged, buf);
    const out2 = path.join(dir, 'damaged.pcapng');
    r = spawnSync(process.execPath, [CLI, 'export', damaged, '--pcapng', out2], { encoding: 'utf8' });
    assert.equal(r.status, 1, r.stderr); // damaged: the answer is no, as replay's
    assert.match(r.stderr, /is damaged before any packet data: .*SHA-256 mismatch/);
    assert.doesNotMatch(r.stderr, /snaplen/);
    assert.equal(fs.existsSync(out2), false);

    // Outputs that cannot be written.
    for (const args of [['--pcapng', '/nonexistent-dir/x.pcapng'], ['--json', '/nonexistent-dir/x.jsonl'], ['--pcapng', dir, '--force']]) {
      r = spawnSync(process.execPath, [CLI, 'export', craftedFile, ...args], { encoding: 'utf8' });
      assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /^svctrace: cannot write \S+: (no such directory|it is a directory)\n$/);
    }
  });

  it('a length field altered to run past the end of the file is altered, not a crash (the file still ends with its trailer)', () => {
    const file = path.join(dir, 'longer.svtr');
    const buf = fs.readFileSync(good);
    // Chunk 3 (events) now claims to run 1 KiB past the end of the file; still under the chunk size limit.
    buf.writeUInt32LE(buf.length - offsets[3]! + 1024, offsets[3]! + 4);
    fs.writeFileSync(file, buf);
    const rec = readRecording(file);
    assert.equal(rec.problems.length, 1);
    assert.equal(rec.problems[0]!.kind, 'bad-header');
    assert.equal(rec.problems[0]!.corrupt, true);
    assert.match(rec.problems[0]!.message, /its length was altered/);
    const v = verifyCli(file);
    assert.equal(v.status, 1, v.out);
    assert.doesNotMatch(v.out, /crash|INCOMPLETE/);
  });

  it('evidence commands stay within a small heap on hash-valid chunks built to blow it up', () => {
    /** A recording whose chain is valid around a crafted events payload (anyone can recompute the hashes). */
    const crafted = (name: string, payload: Buffer) => {
      const f = path.join(dir, name);
      const w = new ChunkWriter(f, true);
      w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-11-29T00:00:00.000Z', services: ['10.96.0.100:80/tcp'] }).finish());
      w.write(ChunkType.EVENTS, payload);
      w.write(ChunkType.TRAILER, pb.RecordingTrailer.encode({ events: 1, reason: 'duration' }).finish());
      w.close();
      return f;
    };
    // 60 MB of zero bytes: 60 million empty events if taken at face value.
    const zeros = crafted('zeros.svtr', Buffer.alloc(60 * 1024 * 1024));
    // 24 MB of small, valid events (about 600,000): decoded a slice at a time.
    const one = Buffer.from(pb.Event.encode({ tsNs: 1_700_000_000_000_000_000, kind: pb.EventKind.EVENT_KIND_NETFILTER, flowId: 7, service: '10.96.0.100:80/tcp' }).finish());
    const w = protobuf.Writer.create();
    for (let n = 0; n * (one.length + 1) < 24 * 1024 * 1024; n++) w.bytes(one);
    const many = crafted('many.svtr', Buffer.from(w.finish()));
    const run = (args: string[]) => spawnSync(process.execPath, ['--max-old-space-size=64', CLI, ...args], { encoding: 'utf8', timeout: 120_000, maxBuffer: 1 << 20 });
    const z = run(['verify', zeros]);
    assert.equal(z.status, 1, z.stderr);
    assert.match(z.stdout + z.stderr, /does not decode: an event of 0 bytes/);
    for (const args of [['verify', many], ['replay', many, '--speed', 'max', '-o', 'json'], ['export', many, '--json', path.join(dir, 'many.jsonl'), '--force'], ['inspect', many]]) {
      const r = spawnSync('sh', ['-c', `"${process.execPath}" --max-old-space-size=64 "${CLI}" ${args.map((a) => `'${a}'`).join(' ')} > /dev/null`], { encoding: 'utf8', timeout: 180_000 });
      assert.equal(r.status, 0, `${args[0]}: ${r.stderr.slice(-500)}`);
      assert.doesNotMatch(r.stderr, /heap out of memory/);
    }
    fs.rmSync(path.join(dir, 'many.jsonl'), { force: true });
  });

  it('replay -o json | head -1: ends quietly with exit 0 when its reader is gone (EPIPE)', () => {
    const big = path.join(dir, 'big.svtr');
    const w = new ChunkWriter(big, true);
    w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-11-29T00:00:00.000Z', services: ['10.96.0.100:80/tcp'] }).finish());
    // About 8 MB of JSON lines: far more than a pipe holds, so writing after head exits must fail.
    for (let c = 0; c < 200; c++) {
      const wr = protobuf.Writer.create();
      for (let i = 0; i < 100; i++) wr.bytes(pb.Event.encode(makeEvent(c * 100 + i, { tsNs: c * 100 + i })).finish());
      w.write(ChunkType.EVENTS, wr.finish());
    }
    w.write(ChunkType.TRAILER, pb.RecordingTrailer.encode({ events: 20000, reason: 'duration' }).finish());
    w.close();
    const r = spawnSync('bash', ['-c', `"${process.execPath}" "${CLI}" replay "${big}" --speed max -o json | head -1 >/dev/null; echo "exit=\${PIPESTATUS[0]}" >&2`], { encoding: 'utf8', timeout: 60_000 });
    assert.match(r.stderr, /exit=0\n$/, r.stderr);
    assert.doesNotMatch(r.stderr, /EPIPE|Error|at /, 'no error, no stack trace');
  });

  it('not a recording, an empty file, a directory, a missing file: clear errors, no crash', () => {
    const junk = path.join(dir, 'junk.svtr');
    fs.writeFileSync(junk, 'hello');
    assert.match(verifyCli(junk).out, /not a svctrace recording \(bad magic bytes at offset 0\)/);
    const empty = path.join(dir, 'empty.svtr');
    fs.writeFileSync(empty, '');
    assert.equal(verifyCli(empty).status, 1);
    for (const cmd of [['verify', dir], ['replay', path.join(dir, 'nope.svtr')], ['inspect', junk], ['export', junk, '--json']]) {
      const r = spawnSync(process.execPath, [CLI, ...cmd], { encoding: 'utf8' });
      assert.notEqual(r.status, 0, cmd.join(' '));
      assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
    }
    assert.equal(MAGIC.length + CHUNK_HEADER_BYTES + HASH_BYTES, 48);
  });
});

describe('inspect keeps a bounded number of flows', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-inspect-'));
  after(() => fs.rmSync(tmp, { recursive: true, force: true }));

  /** Flows 0..n-1, each with `per` events in a row (backend on its second); `again` flows' one more event at the end. */
  function flowsRecording(file: string, n: number, per: number, again: number[] = []): void {
    const w = new ChunkWriter(file, true);
    w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-11-29T00:00:00.000Z', services: ['10.96.0.100:80/tcp'] }).finish());
    let wr = protobuf.Writer.create();
    let inChunk = 0;
    const put = (e: pb.IEvent) => {
      wr.bytes(pb.Event.encode(e).finish());
      if (++inChunk === 500) {
        w.write(ChunkType.EVENTS, wr.finish());
        wr = protobuf.Writer.create();
        inChunk = 0;
      }
    };
    for (let i = 0; i < n; i++) {
      for (let k = 0; k < per; k++) {
        put(makeEvent(i, {
          backend: k === 0 ? '' : `10.244.1.${10 + (i % 3)}:8080`,
          kind: k === per - 1 && i % 7 === 0 ? pb.EventKind.EVENT_KIND_DROP : pb.EventKind.EVENT_KIND_NETFILTER,
          dropReasonName: k === per - 1 && i % 7 === 0 ? 'NETFILTER_DROP' : '',
        }));
      }
    }
    for (const i of again) put(makeEvent(i, { backend: '' }));
    if (inChunk) w.write(ChunkType.EVENTS, wr.finish());
    w.close();
  }

  it('past the bound, the oldest flows are summarized: the same counts per service, backend and drop as with no bound', () => {
    const file = path.join(tmp, 'many.svtr');
    flowsRecording(file, 3000, 3);
    const bounded = inspect(file, 'x', 50).text;
    const unbounded = inspect(file, 'x', 1e9).text;
    assert.equal(bounded, unbounded);
    assert.match(bounded, /service 10\.96\.0\.100:80\/tcp: 1500 flows/);
    assert.match(bounded, /drops: NETFILTER_DROP=\d+/);
    assert.doesNotMatch(bounded, /note: flows are followed/);
  });

  it('a flow with events again after the bound is counted once per part, and the text says so', () => {
    const file = path.join(tmp, 'again.svtr');
    flowsRecording(file, 200, 2, [0, 2]);
    const bounded = inspect(file, 'x', 50).text;
    assert.match(bounded, /service 10\.96\.0\.100:80\/tcp: 102 flows/, bounded);
    assert.match(bounded, /note: flows are followed 50 at a time: 2 had events again after that many newer flows, each counted once per part$/m);
    assert.match(inspect(file, 'x', 1e9).text, /service 10\.96\.0\.100:80\/tcp: 100 flows/);
  });

  it('export --pcapng: past 4096 capture points (a crafted recording), the rest share one interface', () => {
    const file = path.join(tmp, 'ifaces.svtr');
    const w = new ChunkWriter(file, true);
    w.write(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'test', node: 'n1', startedAt: '2026-11-29T00:00:00.000Z', services: ['10.96.0.100:80/tcp'], snaplen: 64 }).finish());
    const wr = protobuf.Writer.create();
    for (let i = 0; i < 5000; i++) {
      wr.bytes(pb.Event.encode(makeEvent(i, { kind: pb.EventKind.EVENT_KIND_DEV_XMIT, device: { name: `veth${i}` }, packetData: new Uint8Array(20) })).finish());
    }
    w.write(ChunkType.EVENTS, wr.finish());
    w.close();
    const out = path.join(tmp, 'ifaces.pcapng');
    const r = exportPcapng(file, out);
    assert.equal(r.packets, 5000);
    assert.equal(r.interfaces, MAX_INTERFACES);
  });
});

