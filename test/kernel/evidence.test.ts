/**
 * Evidence in the lab: record while curling, verify, replay -o json (must
 * equal the events in the file, decoded independently from the .proto),
 * export pcapng and read it with Debian's tshark, and kill -9 mid-record.
 */
import { after, before, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import protobuf from 'protobufjs';
import { kernelTest, IS_ROOT, natStagePriority, sleep } from '../helpers/kernel';
import { waitFor } from '../helpers/flows';
import { Lab } from '../../src/lab/lab';
import { ended } from '../helpers/child';

const ROOT = path.resolve(__dirname, '..', '..', '..');
const CLI = path.join(ROOT, 'bin', 'svctrace.js');
const PROTO = path.join(ROOT, 'src', 'proto', 'svctrace', 'v1', 'svctrace.proto');

/** An independent reader: walks chunks per docs/recording-format.md, decodes with protobufjs reflection. */
async function eventsInFile(file: string): Promise<{ events: object[]; trailer: { events?: string } | null }> {
  const root = await protobuf.load(PROTO);
  const Event = root.lookupType('svctrace.v1.Event');
  const Trailer = root.lookupType('svctrace.v1.RecordingTrailer');
  const buf = fs.readFileSync(file);
  let off = 8;
  const events: object[] = [];
  let trailer: { events?: string } | null = null;
  while (off + 8 <= buf.length) {
    const type = buf[off]!;
    const len = buf.readUInt32LE(off + 4);
    const payload = buf.subarray(off + 8, off + 8 + len);
    if (type === 3) {
      const r = protobuf.Reader.create(payload);
      while (r.pos < r.len) events.push(Event.toObject(Event.decodeDelimited(r), { longs: String, enums: String, bytes: String, json: true }));
    }
    if (type === 4) trailer = Trailer.toObject(Trailer.decode(payload), { longs: String }) as { events?: string };
    off += 8 + len + 32;
  }
  return { events, trailer };
}

describe('evidence: record, verify, replay, export (kernel)', () => {
  let lab: Lab;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-evidence-'));
  before(async () => {
    if (IS_ROOT) lab = await Lab.up();
  });
  after(async () => {
    await lab?.down();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  kernelTest('record while curling; verify; replay -o json equals the file; tshark reads the pcapng export', async () => {
    const web = lab.service('web');
    const file = path.join(dir, 'incident.svtr');
    // Signed with a key made for the test: verify --pubkey proves who wrote it.
    const keys = crypto.generateKeyPairSync('ed25519');
    const keyFile = path.join(dir, 'sign.pem');
    const pubFile = path.join(dir, 'sign.pub');
    fs.writeFileSync(keyFile, keys.privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 });
    fs.writeFileSync(pubFile, keys.publicKey.export({ type: 'spki', format: 'pem' }));
    const rec = spawn(process.execPath, [CLI, 'record', '--netns', lab.nodeNetns, '-s', `${web.clusterIP}:80`, '-o', file, '--duration', '4', '--sign-key', keyFile], { stdio: ['ignore', 'ignore', 'pipe'] });
    const recEnded = ended(rec); // at 'close': its stderr read to the end
    let err = '';
    rec.stderr!.on('data', (d) => (err += d));
    assert.ok(await waitFor(() => err.includes('Ctrl-C to stop'), 10_000), err);
    await sleep(500); // the snapshot is taken before tracing starts
    const ports: number[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await lab.curl(`http://${web.clusterIP}/`);
      assert.ok(r.ok, r.stderr);
      ports.push(Number(/client=[\d.]+:(\d+)/.exec(r.body)![1]));
    }
    assert.equal(await recEnded, 0, err);

    const v = spawnSync(process.execPath, [CLI, 'verify', file, '--pubkey', pubFile], { encoding: 'utf8' });
    assert.equal(v.status, 0, v.stdout + v.stderr);
    assert.match(v.stdout, /OK: complete, the hash chain is intact/);
    assert.match(v.stdout, /AUTHENTIC: signed with key [0-9a-f]{16}/);
    assert.match(err, /signed with key [0-9a-f]{16}/);

    const inFile = await eventsInFile(file);
    assert.ok(inFile.events.length > 50);
    assert.equal(Number(inFile.trailer?.events), inFile.events.length);
    const replayed = spawnSync(process.execPath, [CLI, 'replay', file, '-o', 'json', '--speed', 'max'], { encoding: 'utf8', maxBuffer: 64 << 20 });
    assert.equal(replayed.status, 0, replayed.stderr);
    // The file holds the numbers; replay renders the account of each event
    // (summary, conntrack status names) at the edge, as `trace -o json` does.
    const lines = replayed.stdout.trim().split('\n').map((l) => JSON.parse(l) as { kind?: string; summary?: string; conntrack?: { statusNames?: string[] } });
    assert.ok(lines.every((l) => l.summary), 'every replayed event has its summary');
    assert.ok(lines.some((l) => l.conntrack?.statusNames?.includes('ASSURED')), 'status names rendered');
    const numbersOnly = lines.map(({ summary, ...l }) => {
      if (l.conntrack) delete l.conntrack.statusNames;
      return l.kind === 'EVENT_KIND_RULE_TRACE' ? { ...l, summary } : l;
    });
    assert.deepEqual(numbersOnly, inFile.events);

    const inspect = spawnSync(process.execPath, [CLI, 'inspect', file], { encoding: 'utf8' });
    assert.match(inspect.stdout, /service 10\.96\.0\.100:80\/tcp: 3 flows/);
    assert.match(inspect.stdout, /-A KUBE-SERVICES -d 10\.96\.0\.100\/32 .* -j KUBE-SVC-/);
    assert.match(inspect.stdout, /DNAT --to-destination 10\.244\.1\.1\d:8080/);

    const pcap = path.join(dir, 'incident.pcapng');
    const ex = spawnSync(process.execPath, [CLI, 'export', file, '--pcapng', pcap], { encoding: 'utf8' });
    assert.equal(ex.status, 0, ex.stderr);
    const fields = execFileSync('tshark', ['-r', pcap, '-T', 'fields', '-E', 'separator=|', '-e', 'ip.dst', '-e', 'tcp.srcport', '-e', 'tcp.dstport', '-e', 'frame.comment'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    const rows = fields.trim().split('\n').map((l) => l.split('|'));
    for (const port of ports) {
      const mine = rows.filter((r) => r[1] === String(port));
      const served = lab.served.find((s) => s.client.endsWith(`:${port}`))!;
      const pod = lab.pods.find((p) => p.name === served.pod)!;
      assert.ok(mine.some((r) => r[0] === web.clusterIP && r[2] === '80' && new RegExp(`matches 10\\.96\\.0\\.100:80/tcp @ LOCAL_OUT ${natStagePriority(-100, 'before')}`).test(r[3]!)), `ClusterIP packet of client port ${port}`);
      assert.ok(
        mine.some((r) => r[0] === pod.ip && r[2] === '8080' && new RegExp(`DNAT @ LOCAL_OUT ${natStagePriority(-100, 'after')}: 10\\.96\\.0\\.100:80 -> backend ${pod.ip.replace(/\./g, '\\.')}:8080`).test(r[3]!)),
        `DNATed packet of client port ${port} to ${pod.ip}`,
      );
    }
  });

  kernelTest('kill -9 while recording leaves a file verify accepts up to its last complete chunk', async () => {
    const web = lab.service('web');
    const file = path.join(dir, 'killed.svtr');
    const rec = spawn(process.execPath, [CLI, 'record', '--netns', lab.nodeNetns, '-s', `${web.clusterIP}:80`, '-o', file], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    rec.stderr!.on('data', (d) => (err += d));
    assert.ok(await waitFor(() => err.includes('Ctrl-C to stop'), 10_000), err);
    await sleep(500);
    for (let i = 0; i < 3; i++) assert.ok((await lab.curl(`http://${web.clusterIP}/`)).ok);
    await sleep(1500); // events are flushed in chunks every 500 ms
    rec.kill('SIGKILL');
    await new Promise((r) => rec.once('exit', r));
    const v = spawnSync(process.execPath, [CLI, 'verify', file], { encoding: 'utf8' });
    assert.equal(v.status, 0, v.stdout);
    assert.match(v.stdout, /INCOMPLETE: no trailer/);
    assert.match(v.stdout, /OK up to offset \d+/);
    const events = Number(/(\d+) events/.exec(v.stdout)![1]);
    assert.ok(events > 20, `${events} events survived`);
    const replayed = spawnSync(process.execPath, [CLI, 'replay', file, '-o', 'json', '--speed', 'max'], { encoding: 'utf8', maxBuffer: 64 << 20 });
    assert.equal(replayed.stdout.trim().split('\n').length, events);
  });

  kernelTest('the disk fills up while recording: record stops with exit 10 and one line saying what the file holds; the file verifies, cut short, never damaged', async () => {
    const web = lab.service('web');
    // A 4 MiB tmpfs in a mount namespace of the recorder's own: nothing outside it is touched.
    const mnt = path.join(dir, 'small-disk');
    const kept = path.join(dir, 'full-disk-copy.svtr');
    fs.mkdirSync(mnt);
    const script = 'mount -t tmpfs -o size=4m svt-test "$1" && "$2" "$3" record --netns "$4" -s "$5" -o "$1/incident.svtr"; rc=$?; cp "$1/incident.svtr" "$6"; exit $rc';
    const rec = spawn('unshare', ['--mount', '--propagation', 'private', 'sh', '-c', script, 'sh', mnt, process.execPath, CLI, lab.nodeNetns, `${web.clusterIP}:80`, kept], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    rec.stderr!.on('data', (d) => (err += d));
    const exited = ended(rec);
    assert.ok(await waitFor(() => err.includes('Ctrl-C to stop'), 10_000), err);
    for (let i = 0; i < 3; i++) assert.ok((await lab.curl(`http://${web.clusterIP}/`)).ok);
    await sleep(1500); // these events are in the file (chunks every 500 ms)
    // Fill the rest of the recorder's disk, reached through its mount namespace.
    // (unshare execs the shell; the recorder is the shell's one child.)
    const recorder = Number(fs.readFileSync(`/proc/${rec.pid}/task/${rec.pid}/children`, 'utf8').trim().split(' ')[0]);
    const filler = fs.openSync(`/proc/${recorder}/root${mnt}/filler`, 'w');
    try {
      const block = Buffer.alloc(64 * 1024);
      for (;;) fs.writeSync(filler, block);
    } catch (e) {
      assert.equal((e as NodeJS.ErrnoException).code, 'ENOSPC');
    } finally {
      fs.closeSync(filler);
    }
    const deadline = Date.now() + 20_000;
    let status: number | null | undefined;
    void exited.then((c) => (status = c));
    while (status === undefined && Date.now() < deadline) {
      await lab.curl(`http://${web.clusterIP}/`);
      await sleep(200);
    }
    if (status === undefined) process.kill(recorder, 'SIGINT'); // the recorder itself (rec is the shell, which would not pass it on)
    assert.equal(await exited, 10, err);
    const lines = err.trim().split('\n').filter((l) => !l.includes('Ctrl-C to stop'));
    assert.equal(lines.length, 1, err);
    assert.match(lines[0]!, /cannot write .*incident\.svtr: ENOSPC \(no space left on the device\); the recording holds the first (\d+) events, (\d+) were not recorded/);
    const [, held, notRecorded] = /holds the first (\d+) events, (\d+) were not recorded/.exec(lines[0]!)!;
    assert.ok(Number(held) > 20, `${held} events kept`);
    assert.ok(Number(notRecorded) > 0);
    const v = spawnSync(process.execPath, [CLI, 'verify', kept], { encoding: 'utf8' });
    assert.equal(v.status, 0, v.stdout);
    assert.equal(Number(/(\d+) events/.exec(v.stdout)![1]), Number(held), v.stdout);
    // The trailer is still tried: it fits when the file's last page has room (tmpfs), and then says why and what it missed.
    const { trailer } = await eventsInFile(kept);
    if (trailer) {
      assert.match(v.stdout, /OK: complete/);
      assert.match(lines[0]!, /its trailer says so/);
      const t = trailer as { reason?: string; events?: string; lostByStage?: Record<string, string> };
      assert.equal(t.reason, 'write-error');
      assert.equal(Number(t.events), Number(held));
      assert.equal(Number(t.lostByStage?.recording), Number(notRecorded));
    } else {
      assert.match(v.stdout, /INCOMPLETE: no trailer/);
      assert.match(lines[0]!, /cut short there/);
    }
  });

  kernelTest('SIGHUP (a closed terminal) ends record like Ctrl-C: a complete recording, the marker table removed', async () => {
    const web = lab.service('web');
    const file = path.join(dir, 'hup.svtr');
    const rec = spawn(process.execPath, [CLI, 'record', '--netns', lab.nodeNetns, '-s', `${web.clusterIP}:80`, '-o', file], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    rec.stderr!.on('data', (d) => (err += d));
    assert.ok(await waitFor(() => err.includes('Ctrl-C to stop'), 10_000), err);
    const tables = () => execFileSync('ip', ['netns', 'exec', lab.nodeNetns, 'nft', 'list', 'tables'], { encoding: 'utf8' });
    assert.match(tables(), new RegExp(`svctrace_${rec.pid}\\b`));
    assert.ok((await lab.curl(`http://${web.clusterIP}/`)).ok);
    rec.kill('SIGHUP');
    assert.equal(await ended(rec), 0, err);
    assert.match(err, /\(signal\)/);
    assert.doesNotMatch(tables(), new RegExp(`svctrace_${rec.pid}\\b`), 'marker table removed');
    const v = spawnSync(process.execPath, [CLI, 'verify', file, '--strict'], { encoding: 'utf8' });
    assert.equal(v.status, 0, v.stdout);
    assert.match(v.stdout, /OK: complete/);
  });
});
