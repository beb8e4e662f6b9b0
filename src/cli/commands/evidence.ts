/** record, verify, replay, export, inspect: the evidence commands. */
import { Command } from 'commander';
import { SvctraceError } from '../../errors';
import { stdoutClosed, stdoutRoom, waitForStop } from '../../pipeline/lifecycle';
import { record } from '../../record/recorder';
import { chainHeadSignatureOk, keyId, readSigningKey, readVerifyKey } from '../../record/signing';
import { readRecording, Recording } from '../../record/reader';
import { parseSpeed, replay, type Speed } from '../../record/replay';
import { exportJson, exportPcapng, openOutput, writeAll } from '../../record/export';
import { inspect } from '../../record/inspect';
import { openRecordingInput } from '../../record/spool';
import { eventToJson } from '../../flows/to-proto';
import { eventLine } from '../../output/event-line';
import { DEFAULT_LISTEN, StreamServer } from '../../stream/server';
import { dashboardHandler } from '../../stream/static';
import { MAX_SNAPLEN } from '../../events/layout';
import { addSelectionOptions, collect, parseDuration, parseSnaplen, readToken, SelectionOptions, selectionOf, servicesFrom } from '../options';
import fs from 'node:fs';
import path from 'node:path';
import { terminalSafe, terminalSafeLine } from '../../output/terminal-safe';
import { parseDecimal } from '../../decimal';

/**
 * The recording `file` names, for the readers: a regular file as it is, a
 * stream (`/dev/stdin` from a pipe, a FIFO) copied to a temporary file
 * first. `use` gets the file to read; the copy is removed after.
 */
async function withRecording<T>(file: string, use: (readable: string) => T | Promise<T>): Promise<T> {
  const input = openRecordingInput(file);
  if (input.spooledBytes !== undefined) process.stderr.write(`svctrace: ${file} is a stream: read in full first (${humanBytes(input.spooledBytes)}, into an unnamed temporary file)\n`);
  try {
    return await use(input.file);
  } finally {
    input.done();
  }
}

function humanBytes(n: number): string {
  return n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`;
}

/**
 * Where a damaged recording stopped being readable, for replay/export/inspect.
 * Damage makes the command exit 1 (after delivering what was readable), as
 * verify and inspect do, so a script sees it; a recording only cut short (no
 * trailer: the recorder was killed) is not damage.
 */
function reportProblems(rec: Recording): void {
  for (const p of rec.problems) process.stderr.write(`svctrace: ${p.corrupt ? 'damaged' : 'note'}: ${p.message}\n`);
  if (rec.problems.some((p) => p.kind !== 'missing-trailer')) {
    process.stderr.write(`svctrace: stopped at offset ${rec.validBytes} of ${rec.size}; ${rec.eventCount} events in ${rec.eventChunks} complete chunks were delivered\n`);
  }
  if (rec.problems.some((p) => p.corrupt)) process.exitCode = 1;
}

export function registerEvidence(program: Command): void {
  addSelectionOptions(program.command('record').description('record evidence: node snapshot + live events (+ packet bytes) into a verifiable file'))
    .requiredOption('-o, --output <file>', 'recording to write (.svtr)')
    .option('--duration <seconds>', 'stop after this many seconds')
    .option('--max-size <MB>', 'stop when the file reaches this size')
    .option('--snaplen <bytes>', `packet bytes to capture per event (0-${MAX_SNAPLEN})`, String(MAX_SNAPLEN))
    .option('--force', 'overwrite an existing file')
    .option('--sign-key <file>', 'Ed25519 private key (PEM): sign the recording, so verify --pubkey can prove who wrote it')
    .action(async (opts: SelectionOptions & { output: string; duration?: string; maxSize?: string; snaplen: string; force?: boolean; signKey?: string }) => {
      const services = await servicesFrom(opts);
      // Checked here too (the pipeline would refuse) so nothing says "recording" before the refusal.
      if (!services.length) throw new SvctraceError('BAD_INPUT', 'give at least one --service IP:port or --nodeport PORT');
      const durationS = parseDuration(opts.duration);
      let maxBytes: number | undefined;
      if (opts.maxSize !== undefined) {
        const mb = parseDecimal(opts.maxSize);
        if (!Number.isFinite(mb) || mb <= 0) throw new SvctraceError('BAD_INPUT', `--max-size '${opts.maxSize}' must be a number of MB > 0`);
        maxBytes = mb * 1024 * 1024;
      }
      const tty = !!process.stderr.isTTY;
      const signingKey = opts.signKey ? readSigningKey(opts.signKey) : undefined;
      const trailer = await record({
        signingKey,
        onStarted: () => process.stderr.write(`svctrace: recording ${services.map((s) => s.text).join(', ')} to ${opts.output}; Ctrl-C to stop\n`),
        ...selectionOf(opts, services),
        path: opts.output,
        snaplen: parseSnaplen(opts.snaplen),
        durationS,
        maxBytes,
        overwrite: !!opts.force,
        command: process.argv.slice(2).join(' '),
        onProgress: tty ? (p) => process.stderr.write(`\r  ${p.events} events, ${humanBytes(p.bytes)}, ${p.elapsedS.toFixed(0)} s   `) : undefined,
      });
      if (tty) process.stderr.write('\n');
      process.stderr.write(
        `svctrace: ${opts.output}: ${String(trailer.events)} events, ${String(trailer.flows)} flows, ${String(trailer.kernelLost)} lost (${trailer.reason})${trailer.keyId ? `, signed with key ${trailer.keyId}` : ''}\n`,
      );
    });

  program
    .command('verify')
    .description('check a recording: structure and SHA-256 chain; says where it is damaged (exit 1) or cut short')
    .argument('<file>')
    .option('--strict', 'also fail (exit 1) when the recording was cut short')
    .option('--pubkey <file>', 'Ed25519 public key (PEM) the recording must be signed with (record --sign-key): exit 1 unless it is')
    .action(async (file: string, opts: { strict?: boolean; pubkey?: string }) => {
      const key = opts.pubkey ? readVerifyKey(opts.pubkey) : undefined;
      const rec = await withRecording(file, readRecording);
      const corrupt = rec.problems.filter((p) => p.corrupt);
      const cut = rec.problems.filter((p) => !p.corrupt);
      const lines = [`${file}: ${rec.chunks} chunks, ${rec.eventCount} events, ${rec.validBytes} of ${rec.size} bytes intact`];
      for (const p of rec.problems) lines.push(`  ${p.corrupt ? 'DAMAGED' : 'INCOMPLETE'}: ${p.message}`);
      if (!rec.problems.length) lines.push('  OK: complete, the hash chain is intact');
      else if (!corrupt.length) lines.push(`  OK up to offset ${rec.validBytes}: the hash chain is intact up to there`);
      // The chain shows the file was not cut or spliced by accident; only a
      // signature shows who wrote it (anyone can recompute the hashes).
      const sig = rec.trailer?.signature?.length && rec.signedHead ? rec.trailer : undefined;
      let authentic = false;
      if (key) {
        if (!sig) lines.push('  NOT AUTHENTIC: the recording is not signed (record --sign-key), so --pubkey cannot vouch for it');
        else if (!chainHeadSignatureOk(rec.signedHead!, sig.signature!, key)) lines.push(`  NOT AUTHENTIC: the signature (key ${sig.keyId || '?'}) does not verify with --pubkey (key ${keyId(key)}): altered, or signed with another key`);
        else {
          authentic = true;
          lines.push(`  AUTHENTIC: signed with key ${keyId(key)} (--pubkey); the signature covers every chunk before the trailer`);
        }
      } else if (sig) {
        lines.push(`  signed with key ${sig.keyId || '?'}: check the signature with --pubkey KEY.pub; until then the file is consistent, not proven authentic`);
      } else if (!corrupt.length) {
        lines.push('  consistent, not authenticated: unsigned, so whoever can edit the file could also recompute its hashes (sign with record --sign-key, check with verify --pubkey)');
      }
      process.stdout.write(terminalSafe(lines.join('\n')) + '\n');
      if (corrupt.length || (opts.strict && cut.length) || (key && !authentic)) process.exitCode = 1;
    });

  program
    .command('replay')
    .description('play a recording back, to the terminal or as a WebSocket stream')
    .argument('<file>')
    .option('-o, --output <format>', 'text or json', 'text')
    .option('--speed <n|max>', 'playback speed: 1 (as recorded), 10, ... or max', '1')
    .option('--serve', 'stream it over WebSocket instead (like serve), starting when the first client connects')
    .option('--listen <host:port>', 'with --serve', DEFAULT_LISTEN)
    .option('--token <token>', 'with --serve: bearer token')
    .option('--token-file <path>', 'with --serve: token file')
    .option('--allow-host <name>', 'with --serve: Host name accepted besides addresses and localhost (repeatable)', collect, [])
    .action(async (file: string, opts: { output: string; speed: string; serve?: boolean; listen: string; token?: string; tokenFile?: string; allowHost: string[] }) => {
      if (opts.output !== 'text' && opts.output !== 'json') throw new SvctraceError('BAD_INPUT', `--output must be text or json, not '${opts.output}'`);
      const speed = parseSpeed(opts.speed);
      await withRecording(file, (readable) => replayFile(file, readable, speed, opts));
    });

  program
    .command('export')
    .description('export a recording: --pcapng OUT (packets for Wireshark/tshark) or --json (JSON lines on stdout or to OUT)')
    .argument('<file>')
    .option('--pcapng <out>', 'write captured packets as pcapng, one interface per namespace and device/hook, with comments')
    .option('--json [out]', 'write header, snapshot, events and trailer as JSON lines')
    .option('--force', 'overwrite the output')
    .action(async (file: string, opts: ExportOptions) => {
      if (!opts.pcapng && !opts.json) throw new SvctraceError('BAD_INPUT', 'give --pcapng OUT or --json [OUT]');
      const outs = [opts.pcapng, typeof opts.json === 'string' ? opts.json : undefined].filter((o): o is string => !!o);
      for (const out of outs) {
        // Never the evidence itself, whatever --force says (also through links).
        if (sameFile(out, file)) throw new SvctraceError('BAD_INPUT', `${out} is the recording itself: choose another output`);
        if (fs.existsSync(out) && !opts.force) throw new SvctraceError('BAD_INPUT', `${out} exists (use --force to overwrite)`);
      }
      if (outs.length === 2 && sameFile(outs[0]!, outs[1]!)) throw new SvctraceError('BAD_INPUT', '--pcapng and --json name the same file');
      await withRecording(file, (readable) => exportFile(file, readable, opts));
    });

  program
    .command('inspect')
    .description('summarize a recording: services, flows, backends, drops, and the rules snapshot for each ClusterIP')
    .argument('<file>')
    .action(async (file: string) => {
      const { text, recording } = await withRecording(file, (readable) => inspect(readable, file));
      process.stdout.write(terminalSafe(text) + '\n');
      // The answer is no (README's exit codes): not a recording, or damaged.
      if (!recording.header || recording.problems.some((p) => p.corrupt)) process.exitCode = 1;
    });
}

/** Two paths name one file: the same inode (through links), or the same path when neither exists yet. */
function sameFile(a: string, b: string): boolean {
  try {
    const sa = fs.statSync(a);
    const sb = fs.statSync(b);
    return sa.dev === sb.dev && sa.ino === sb.ino;
  } catch {
    return path.resolve(a) === path.resolve(b);
  }
}

interface ReplayOptions {
  output: string;
  serve?: boolean;
  listen: string;
  token?: string;
  tokenFile?: string;
  allowHost: string[];
}

/** replay's work: `readable` is the file to read, `file` the name the user gave. */
async function replayFile(file: string, readable: string, speed: Speed, opts: ReplayOptions): Promise<void> {
  const head = readRecording(readable);
  if (!head.header) throw new SvctraceError('BAD_INPUT', `${file}: ${head.problems[0]?.message ?? 'not a recording'}`);
  if (!opts.serve) {
    const rec = await replay(
      readable,
      speed,
      (events) => {
        if (stdoutClosed()) return undefined;
        process.stdout.write(events.map((e) => (opts.output === 'json' ? eventToJson(e) : terminalSafeLine(eventLine(e)))).join('\n') + '\n');
        return stdoutRoom();
      },
      stdoutClosed,
    );
    reportProblems(rec);
    return;
  }
  const server = await StreamServer.start(
    { services: head.header.services, replay: true, kernelLost: () => Number(head.trailer?.kernelLost ?? 0), activeFlows: () => 0, dropsByReason: () => ({}) },
    { listen: opts.listen, token: readToken(opts), allowHosts: opts.allowHost, staticHandler: dashboardHandler() },
  );
  process.stderr.write(`svctrace: replaying ${file} at ${server.url()} when a client connects (Ctrl-C to stop)\n`);
  let stop = false;
  const stopped = waitForStop(undefined).then(() => (stop = true));
  while (!stop && server.hub.clientCount === 0) await new Promise((r) => setTimeout(r, 100));
  if (!stop) {
    const rec = await replay(readable, speed, (events) => server.publish(events), () => stop);
    reportProblems(rec);
    process.stderr.write('svctrace: replay done; still serving (Ctrl-C to stop)\n');
    await stopped;
  }
  await server.close();
}

interface ExportOptions {
  pcapng?: string;
  json?: string | boolean;
  force?: boolean;
}

/** export's work, once the outputs are checked: `readable` is the file to read, `file` the name the user gave. */
async function exportFile(file: string, readable: string, opts: ExportOptions): Promise<void> {
  if (opts.pcapng) {
    const r = exportPcapng(readable, opts.pcapng, file);
    reportProblems(r.recording);
    process.stderr.write(`svctrace: ${opts.pcapng}: ${r.packets} packets on ${r.interfaces} interfaces\n`);
  }
  if (opts.json) {
    const out = typeof opts.json === 'string' ? opts.json : undefined;
    const fd = out ? openOutput(out) : undefined;
    let rec;
    try {
      rec = await exportJson(
        readable,
        (line) => (fd !== undefined ? writeAll(fd, out!, Buffer.from(line + '\n')) : stdoutClosed() || process.stdout.write(line + '\n')),
        () => (fd === undefined ? stdoutRoom() : undefined),
        () => fd === undefined && stdoutClosed(),
      );
    } finally {
      if (fd !== undefined) fs.closeSync(fd);
    }
    if (!rec.header) throw new SvctraceError('BAD_INPUT', `${file}: ${rec.problems[0]?.message ?? 'not a recording'}`);
    reportProblems(rec);
  }
}
