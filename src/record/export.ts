/** `svctrace export`: a recording to pcapng (for Wireshark/tshark) or JSON lines. */
import fs from 'node:fs';
import { svctrace } from '../gen/svctrace';
import { SvctraceError } from '../errors';
import { eventToJson } from '../flows/to-proto';
import { VERSION } from '../version';
import { enhancedPacket, interfaceDescription, sectionHeader } from './pcapng';
import { readRecording, Recording } from './reader';
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

/** Writes the captured packets of a recording as pcapng; a recording without captures is an error. */
export function exportPcapng(input: string, output: string): PcapExport {
  const ifaces = new Map<string, number>();
  const blocks: Buffer[] = [];
  let packets = 0;
  const rec = readRecording(input, (events, _chunk, sofar) => {
    for (const e of events) {
      if (!e.packetData?.length) continue;
      const cp = capturePoint(e);
      let id = ifaces.get(cp.name);
      if (id === undefined) {
        id = ifaces.size;
        ifaces.set(cp.name, id);
        blocks.push(interfaceDescription(cp.name, cp.description, 65535));
      }
      blocks.push(enhancedPacket(id, wallClockNs(sofar.header, e.tsNs), e.packetData, e.length ?? e.packetData.length, `flow ${String(e.flowId)}: ${eventSummary(e)}`));
      packets++;
    }
  });
  if (!rec.header) throw new SvctraceError('BAD_INPUT', `${input}: ${rec.problems[0]?.message ?? 'no header'}`);
  if (!packets) {
    throw new SvctraceError('BAD_INPUT', `${input} holds no packet data (recorded with snaplen ${rec.header.snaplen}); record with --snaplen > 0`);
  }
  fs.writeFileSync(output, Buffer.concat([sectionHeader(`svctrace ${VERSION}`), ...blocks]));
  return { packets, interfaces: ifaces.size, recording: rec };
}

function toJson(type: { toObject(m: never, o: object): object }, m: unknown): object {
  return type.toObject(m as never, { longs: String, enums: String, bytes: String, json: true });
}

/** JSON lines: {"header":...}, {"snapshot":...}, one Event per line, then {"trailer":...} if present. */
export function exportJson(input: string, write: (line: string) => void): Recording {
  let head = false;
  const writeHead = (r: Recording) => {
    if (head) return;
    head = true;
    if (r.header) write(JSON.stringify({ header: toJson(pb.RecordingHeader, r.header) }));
    if (r.snapshot) write(JSON.stringify({ snapshot: toJson(pb.NodeSnapshot, r.snapshot) }));
  };
  const rec = readRecording(input, (events, _c, sofar) => {
    writeHead(sofar);
    for (const e of events) write(eventToJson(e));
  });
  writeHead(rec);
  if (rec.trailer) write(JSON.stringify({ trailer: toJson(pb.RecordingTrailer, rec.trailer) }));
  return rec;
}
