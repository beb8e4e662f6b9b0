/** `svctrace export`: a recording to pcapng (for Wireshark/tshark) or JSON lines. */
import fs from 'node:fs';
import { svctrace } from '../gen/svctrace';
import { SvctraceError } from '../errors';
import { eventToJson } from '../flows/to-proto';
import { VERSION } from '../version';
import { enhancedPacket, interfaceDescription, sectionHeader } from './pcapng';
import { iterRecording, readRecording, Recording } from './reader';
import { eventSummary } from '../output/event-summary';

import pb = svctrace.v1;

function u64(v: unknown): bigint {
  return v === null || v === undefined ? 0n : BigInt(String(v));
}

/** The capture point of an event: one pcapng interface each. */
function capturePoint(e: pb.IEvent): { name: string; description: string } {
  const ns = e.device?.netns || (e.device?.netnsInode ? `netns:${String(e.device.netnsInode)}` : 'node');
  if (e.kind === pb.EventKind.EVENT_KIND_NETFILTER) {
    const hook = (pb.NfHook[e.hook ?? 0] ?? 'NF_HOOK_UNSPECIFIED').replace('NF_HOOK_', '');
    const nat = hook === 'PRE_ROUTING' || hook === 'LOCAL_OUT' ? 'DNAT' : 'SNAT';
    return { name: `${ns}/nf:${hook}:${e.priority ?? 0}`, description: `netfilter ${hook} priority ${e.priority} (${e.afterNat ? 'after' : 'before'} ${nat}) in ${ns}` };
  }
  if (e.kind === pb.EventKind.EVENT_KIND_DROP) return { name: `${ns}/drop`, description: `packets the kernel dropped in ${ns}` };
  const dev = e.device?.name || '?';
  return { name: `${ns}/${dev}`, description: `device ${dev}${e.device?.kind ? ` (${e.device.kind})` : ''} in ${ns}` };
}

/** Kernel (CLOCK_MONOTONIC) time -> wall-clock ns, anchored at the header's start. */
function wallClockNs(h: pb.IRecordingHeader | undefined, tsNs: unknown): bigint {
  const startWall = BigInt(Date.parse(h?.startedAt ?? '') || 0) * 1_000_000n;
  return startWall + (u64(tsNs) - u64(h?.startedMonoNs));
}

export interface PcapExport {
  packets: number;
  interfaces: number;
  recording: Recording;
}

/** The snaplen each pcapng interface declares. */
const PCAP_SNAPLEN = 65535;

/** Opens an output file, or says in one line why it cannot. */
export function openOutput(output: string): number {
  try {
    return fs.openSync(output, 'w', 0o644);
  } catch (e) {
    throw new SvctraceError('BAD_INPUT', `cannot write ${output}: ${describeIoError(e)}`);
  }
}

export function describeIoError(e: unknown): string {
  const code = (e as NodeJS.ErrnoException).code;
  const known: Record<string, string> = {
    ENOENT: 'no such directory',
    EACCES: 'permission denied',
    EPERM: 'not permitted',
    ENOSPC: 'no space left on the device',
    EISDIR: 'it is a directory',
    EROFS: 'read-only file system',
    EDQUOT: 'disk quota exceeded',
  };
  return (code && known[code]) ?? (e instanceof Error ? e.message : String(e));
}

/** Writes everything or fails in one line (a full disk is not an internal error). */
export function writeAll(fd: number, output: string, buf: Buffer): void {
  try {
    let off = 0;
    while (off < buf.length) off += fs.writeSync(fd, buf, off);
  } catch (e) {
    throw new SvctraceError('BAD_INPUT', `cannot write ${output}: ${describeIoError(e)}`);
  }
}

/** Interfaces (capture points) in one pcapng export; the rest share the last. */
export const MAX_INTERFACES = 4096;

/**
 * Writes the captured packets of a recording as pcapng, block by block as
 * they are read (memory stays bounded whatever the recording's size); a
 * recording without captures is an error, and leaves no output behind.
 */
/** `name`: the recording as the user named it, for messages (`input` may be a stream's copy, read through /proc/self/fd). */
export function exportPcapng(input: string, output: string, name = input): PcapExport {
  const ifaces = new Map<string, number>();
  let packets = 0;
  const fd = openOutput(output);
  let ok = false;
  try {
    writeAll(fd, output, sectionHeader(`svctrace ${VERSION}`));
    const rec = readRecording(input, (events, _chunk, sofar) => {
      for (const e of events) {
        if (!e.packetData?.length) continue;
        let cp = capturePoint(e);
        // A node has tens of capture points; a crafted recording may name any
        // number: past the bound they share one interface (memory stays bounded).
        if (!ifaces.has(cp.name) && ifaces.size >= MAX_INTERFACES - 1) cp = { name: 'other', description: `capture points past the first ${MAX_INTERFACES - 1}` };
        let id = ifaces.get(cp.name);
        if (id === undefined) {
          id = ifaces.size;
          ifaces.set(cp.name, id);
          writeAll(fd, output, interfaceDescription(cp.name, cp.description, PCAP_SNAPLEN));
        }
        // No more than the interface's snaplen says (a recording's capture is
        // at most MAX_SNAPLEN; a crafted one may hold more).
        const data = e.packetData.length > PCAP_SNAPLEN ? e.packetData.subarray(0, PCAP_SNAPLEN) : e.packetData;
        // The packet's length on the wire is never less than what was captured of it.
        writeAll(fd, output, enhancedPacket(id, wallClockNs(sofar.header, e.tsNs), data, Math.max(e.length ?? 0, data.length), `flow ${String(e.flowId)}: ${eventSummary(e)}`));
        packets++;
      }
    });
    const damage = rec.problems.find((p) => p.corrupt);
    if (!rec.header) throw new SvctraceError('BAD_INPUT', `${name}: ${rec.problems[0]?.message ?? 'no header'}`);
    if (!packets) {
      // Damaged: the answer is no (exit 1, as a damaged recording's replay); none recorded: the user's --snaplen (exit 2).
      if (damage) throw new SvctraceError('RECORDING_DAMAGED', `${name} is damaged before any packet data: ${damage.message}`);
      throw new SvctraceError('BAD_INPUT', `${name} holds no packet data (recorded with snaplen ${rec.header.snaplen}); record with --snaplen > 0`);
    }
    ok = true;
    return { packets, interfaces: ifaces.size, recording: rec };
  } finally {
    fs.closeSync(fd);
    // Only a regular file: `--pcapng /dev/null --force` must not remove the device.
    if (!ok && fs.statSync(output, { throwIfNoEntry: false })?.isFile()) fs.rmSync(output, { force: true });
  }
}

function toJson(type: { toObject(m: never, o: object): object }, m: unknown): object {
  return type.toObject(m as never, { longs: String, enums: String, bytes: String, json: true });
}

/** JSON lines: {"header":...}, {"snapshot":...}, one Event per line, then {"trailer":...} if present. */
/** `room`: after each slice of events, a promise to await when the output is behind (stdout's reader is slow), so memory stays bounded; `stop`: the output is gone. */
export async function exportJson(input: string, write: (line: string) => void, room: () => Promise<void> | undefined = () => undefined, stop: () => boolean = () => false): Promise<Recording> {
  let head = false;
  const writeHead = (r: Recording) => {
    if (head) return;
    head = true;
    if (r.header) write(JSON.stringify({ header: toJson(pb.RecordingHeader, r.header) }));
    if (r.snapshot) write(JSON.stringify({ snapshot: toJson(pb.NodeSnapshot, r.snapshot) }));
  };
  const it = iterRecording(input);
  let rec: Recording;
  try {
    for (;;) {
      const r = it.next();
      if (r.done) {
        rec = r.value;
        break;
      }
      writeHead(r.value.rec);
      for (const e of r.value.events) write(eventToJson(e));
      await room();
      // The output's reader is gone (`| head`): the rest is not read.
      if (stop()) {
        rec = r.value.rec;
        break;
      }
    }
  } finally {
    it.return({ eventCount: 0, eventChunks: 0, chunks: 0, size: 0, validBytes: 0, problems: [] });
  }
  writeHead(rec);
  if (rec.trailer) write(JSON.stringify({ trailer: toJson(pb.RecordingTrailer, rec.trailer) }));
  return rec;
}
