/**
 * Fuzzing the evidence commands: a few hundred damaged variants of one
 * recording (flipped bytes, cuts, garbage, chunks dropped, repeated, swapped
 * or with an altered length), each read by verify, replay, export (JSON and
 * pcapng) and inspect. Nothing may throw but a one-line SvctraceError, the
 * verdict must be right (altered: damaged; cut: incomplete, never damaged),
 * and memory stays bounded. A sample also goes through the CLI, each run
 * with a time limit and a small heap.
 */
import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import protobuf from 'protobufjs/minimal';
import { ChunkType, ChunkWriter, CHUNK_HEADER_BYTES, HASH_BYTES, MAGIC } from '../../src/record/format';
import { readRecording } from '../../src/record/reader';
import { replay } from '../../src/record/replay';
import { exportJson, exportPcapng } from '../../src/record/export';
import { inspect } from '../../src/record/inspect';
import { SvctraceError } from '../../src/errors';
import { svctrace } from '../../src/gen/svctrace';
import { makeEvent } from '../helpers/stream';

import pb = svctrace.v1;

const CLI = path.resolve(__dirname, '..', '..', '..', 'bin', 'svctrace.js');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-fuzz-'));

/** A small deterministic PRNG (mulberry32): the same variants on every run. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** header, snapshot, 4 events chunks (with packet bytes), trailer; returns the bytes and each chunk's [start, end). */
function baseRecording(): { bytes: Buffer; chunks: Array<[number, number]> } {
  const file = path.join(dir, 'base.svtr');
  const w = new ChunkWriter(file, true);
  const chunks: Array<[number, number]> = [];
  const put = (t: ChunkType, b: Uint8Array) => {
    const start = w.bytes;
    w.write(t, b);
    chunks.push([start, w.bytes]);
  };
  put(ChunkType.HEADER, pb.RecordingHeader.encode({ toolVersion: 'fuzz', node: 'n1', startedAt: '2026-11-30T00:00:00.000Z', startedMonoNs: 1000, services: ['10.96.0.100:80/tcp'], snaplen: 64 }).finish());
  put(ChunkType.SNAPSHOT, pb.NodeSnapshot.encode({ sections: [{ name: 'iptables', output: '-A KUBE-SERVICES -d 10.96.0.100/32 -j KUBE-SVC-X\n' }] }).finish());
  const pkt = Uint8Array.from({ length: 40 }, (_, i) => (i === 0 ? 0x45 : i));
  for (let c = 0; c < 4; c++) {
    const wr = protobuf.Writer.create();
    for (let i = 0; i < 12; i++) wr.bytes(pb.Event.encode(makeEvent(c * 12 + i, { tsNs: 2000 + c * 12 + i, packetData: pkt, length: 60 })).finish());
    put(ChunkType.EVENTS, wr.finish());
  }
  put(ChunkType.TRAILER, pb.RecordingTrailer.encode({ events: 48, reason: 'duration' }).finish());
  w.close();
  return { bytes: fs.readFileSync(file), chunks };
}

type Verdict = 'damaged' | 'incomplete';
interface Variant {
  kind: string;
  what: string;
  bytes: Buffer;
  expect: Verdict;
}

function variants(n: number): Variant[] {
  const { bytes, chunks } = baseRecording();
  const rnd = prng(20261130);
  const int = (lo: number, hi: number) => lo + Math.floor(rnd() * (hi - lo));
  const out: Variant[] = [];
  const trailer = chunks.length - 1;
  while (out.length < n) {
    const kind = int(0, 7);
    if (kind === 0) {
      const b = Buffer.from(bytes);
      const k = int(1, 4);
      const at: number[] = [];
      for (let i = 0; i < k; i++) {
        const o = int(MAGIC.length, b.length);
        b[o] = b[o]! ^ (1 + int(0, 255));
        at.push(o);
      }
      out.push({ kind: 'flip', what: `flip at ${at.join(',')}`, bytes: b, expect: 'damaged' });
    } else if (kind === 1) {
      const len = int(MAGIC.length, bytes.length);
      out.push({ kind: 'cut', what: `cut to ${len}`, bytes: bytes.subarray(0, len), expect: 'incomplete' });
    } else if (kind === 2) {
      const extra = Buffer.from(Array.from({ length: int(1, 200) }, () => int(0, 256)));
      out.push({ kind: 'append', what: `${extra.length} bytes appended`, bytes: Buffer.concat([bytes, extra]), expect: 'damaged' });
    } else if (kind === 3) {
      const c = int(0, chunks.length);
      const [s, e] = chunks[c]!;
      // Without its trailer a recording reads as cut at a chunk boundary: a crash, by what the file says.
      out.push({ kind: 'remove', what: `chunk ${c} removed`, bytes: Buffer.concat([bytes.subarray(0, s), bytes.subarray(e)]), expect: c === trailer ? 'incomplete' : 'damaged' });
    } else if (kind === 4) {
      const c = int(0, chunks.length);
      const [s, e] = chunks[c]!;
      out.push({ kind: 'repeat', what: `chunk ${c} repeated`, bytes: Buffer.concat([bytes.subarray(0, e), bytes.subarray(s, e), bytes.subarray(e)]), expect: 'damaged' });
    } else if (kind === 5) {
      const c = int(0, chunks.length);
      const b = Buffer.from(bytes);
      const [s, e] = chunks[c]!;
      const len = e - s - CHUNK_HEADER_BYTES - HASH_BYTES;
      let next = int(0, 3 * (len + 64));
      if (next === len) next++;
      b.writeUInt32LE(next, s + 4);
      out.push({ kind: 'length', what: `chunk ${c} length ${len} -> ${next}`, bytes: b, expect: 'damaged' });
    } else {
      const c = int(1, trailer - 1);
      const [s1, e1] = chunks[c]!;
      const [s2, e2] = chunks[c + 1]!;
      out.push({ kind: 'swap', what: `chunks ${c} and ${c + 1} swapped`, bytes: Buffer.concat([bytes.subarray(0, s1), bytes.subarray(s2, e2), bytes.subarray(s1, e1), bytes.subarray(e2)]), expect: 'damaged' });
    }
  }
  return out;
}

/** Runs one evidence operation; only SvctraceError may escape it, as a one-line message. */
async function survives(what: string, op: () => unknown): Promise<void> {
  try {
    await op();
  } catch (e) {
    assert.ok(e instanceof SvctraceError, `${what}: ${e instanceof Error ? e.stack : String(e)}`);
    assert.doesNotMatch(e.message, /\n/, `${what}: one line`);
  }
}

describe('evidence commands on damaged recordings (fuzz)', () => {
  after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const cases = variants(300);

  it('verify, replay, export and inspect: no crash, the right verdict, bounded memory', async () => {
    const file = path.join(dir, 'variant.svtr');
    const pcap = path.join(dir, 'variant.pcapng');
    let heapPeak = 0;
    for (const v of cases) {
      fs.writeFileSync(file, v.bytes);
      const rec = readRecording(file);
      const damaged = rec.problems.some((p) => p.corrupt);
      assert.equal(damaged ? 'damaged' : 'incomplete', v.expect, `${v.what}: ${rec.problems.map((p) => p.message).join('; ') || 'no problem found'}`);
      let lines = 0;
      await survives(`${v.what}: export --json`, () => exportJson(file, () => lines++));
      await survives(`${v.what}: export --pcapng`, () => exportPcapng(file, pcap));
      await survives(`${v.what}: inspect`, () => inspect(file));
      let replayed = 0;
      await survives(`${v.what}: replay`, () => replay(file, 'max', (evs) => void (replayed += evs.length)));
      assert.ok(replayed <= 48 && rec.eventCount <= 48, `${v.what}: more events than were written`);
      heapPeak = Math.max(heapPeak, process.memoryUsage().heapUsed);
    }
    const kinds = new Map<string, number>();
    for (const v of cases) kinds.set(v.kind, (kinds.get(v.kind) ?? 0) + 1);
    process.stdout.write(`${cases.length} variants (${[...kinds].map(([k, n]) => `${k} ${n}`).join(', ')}), heap peak ${(heapPeak / 2 ** 20).toFixed(0)} MiB\n`);
    assert.ok(heapPeak < 256 * 2 ** 20, `heap peak ${heapPeak}`);
  });

  it('through the CLI (a sample, each with a time limit and a 64 MiB heap): exit 1 when damaged (2 when no header is left), 0 when cut, never a crash', () => {
    for (const [i, v] of cases.filter((_, i) => i % 12 === 0).entries()) {
      const file = path.join(dir, `cli-${i}.svtr`);
      fs.writeFileSync(file, v.bytes);
      const verify = spawnSync(process.execPath, ['--max-old-space-size=64', CLI, 'verify', file], { encoding: 'utf8', timeout: 20_000 });
      assert.equal(verify.status, v.expect === 'damaged' ? 1 : 0, `${v.what}: ${verify.stdout}${verify.stderr}`);
      assert.doesNotMatch(verify.stderr, /internal error|heap out of memory/, v.what);
      for (const args of [['replay', file, '--speed', 'max', '-o', 'json'], ['export', file, '--json', path.join(dir, `cli-${i}.jsonl`)], ['inspect', file]]) {
        const r = spawnSync(process.execPath, ['--max-old-space-size=64', CLI, ...args], { encoding: 'utf8', timeout: 20_000, maxBuffer: 16 << 20 });
        // Cut inside the header chunk: not a recording to read (bad input, or inspect's "no").
        const expected = v.expect === 'damaged' || !readRecording(file).header ? [1, 2] : [0];
        assert.ok(expected.includes(r.status!), `${v.what}: ${args[0]} exited ${r.status} (${r.signal ?? ''}), expected ${expected.join(' or ')}: ${r.stderr.slice(-300)}`);
        assert.doesNotMatch(r.stderr, /internal error|heap out of memory|at .*\.js:\d+/, `${v.what}: ${args[0]}`);
      }
    }
  });
});
