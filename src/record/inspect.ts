/** `svctrace inspect`: a person's summary of a recording. */
import { svctrace } from '../gen/svctrace';
import { Recording, readRecording } from './reader';
import { dropName } from '../events/drop-name';

import pb = svctrace.v1;

interface FlowSeen {
  service: string;
  backend: string;
  backendNetns: string;
  /** The kinds of drop it had (none: undefined, the common case, no allocation). */
  drops?: string[];
  reset: boolean;
}

/** The kube-proxy rules of a ClusterIP in an iptables-save dump: the rules naming it, then the chains they jump to. */
export function rulesFor(iptablesSave: string, address: string): string[] {
  const lines = iptablesSave.split('\n');
  // Each chain's rules, in order, found once (a filter per chain visited was quadratic in a large dump).
  const byChain = new Map<string, string[]>();
  for (const l of lines) {
    if (!l.startsWith('-A ')) continue;
    const end = l.indexOf(' ', 3);
    if (end < 0) continue;
    const chain = l.slice(3, end);
    let list = byChain.get(chain);
    if (!list) byChain.set(chain, (list = []));
    list.push(l);
  }
  const rulesOf = (chain: string) => byChain.get(chain) ?? [];
  const out: string[] = [];
  const seen = new Set<string>();
  const queue: string[] = [];
  for (const l of lines) {
    if (l.startsWith('-A ') && l.includes(` ${address}/32 `)) {
      out.push(l);
      const m = / -j (KUBE-(?:SVC|SEP|EXT|FW|XLB)-\w+)/.exec(l);
      if (m) queue.push(m[1]!);
    }
  }
  for (let next = 0; next < queue.length; next++) {
    const chain = queue[next]!;
    if (seen.has(chain)) continue;
    seen.add(chain);
    for (const l of rulesOf(chain)) {
      out.push(l);
      const m = / -j (KUBE-(?:SVC|SEP|EXT|FW|XLB)-\w+)/.exec(l);
      if (m) queue.push(m[1]!);
    }
  }
  return out;
}

/**
 * Flows followed one by one at once; past it the oldest is summarized (its
 * events come together in time: a flow is usually done when it is oldest).
 * Memory stays bounded whatever the recording holds (about 300 bytes a flow).
 */
export const INSPECT_MAX_OPEN_FLOWS = 100_000;

/** A FIFO of ids in an array: push, shift in O(1) amortized. */
class IdQueue {
  private items: string[] = [];
  private head = 0;

  get length(): number {
    return this.items.length - this.head;
  }

  push(id: string): void {
    this.items.push(id);
  }

  shift(): string | undefined {
    if (this.head >= this.items.length) return undefined;
    const id = this.items[this.head++];
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return id;
  }

  clear(): void {
    this.items = [];
    this.head = 0;
  }
}

/** Ids of summarized flows remembered (a flow seen again is told as such), per flow followed: ids are small. */
const SUMMARIZED_IDS_PER_OPEN_FLOW = 4;

/** Services, and backends (of all services), listed one by one; the rest share a line. */
const MAX_LINES = 4096;
/** Kinds of drop listed (all services'); the rest share one. */
const MAX_DROP_KINDS = 1024;

/** What inspect says of one Service: flows per backend, drops by kind (flows with one), resets. */
interface ServiceSeen {
  flows: number;
  perBackend: Map<string, number>;
  drops: Map<string, number>;
  resets: number;
}

/** Summarizes the recording at `path`; `name` is what the text calls it (default: path). */
export function inspect(path: string, name = path, maxOpenFlows = INSPECT_MAX_OPEN_FLOWS): { text: string; recording: Recording } {
  const flows = new Map<string, FlowSeen>();
  // The flows' ids, oldest first. (Not the Map's own order: taking its
  // first entry again and again walks the holes deletions leave, quadratic.)
  const flowOrder = new IdQueue();
  const byService = new Map<string, ServiceSeen>();
  // Flows summarized (the oldest past the bound): a later event of one starts it again, counted as such.
  const summarized = new Set<string>();
  const summarizedOrder = new IdQueue();
  let summarizedEvicted = 0;
  let backendLines = 0; // all services'
  let dropLines = 0; // all services'
  let seenAgain = 0;
  const summarize = (id: string, f: FlowSeen, remember = true) => {
    flows.delete(id);
    // (A crafted recording may name any number of services and backends: past the bound, one line for the rest.)
    const service = byService.has(f.service) || byService.size < MAX_LINES ? f.service : '(other services)';
    let svc = byService.get(service);
    if (!svc) byService.set(service, (svc = { flows: 0, perBackend: new Map(), drops: new Map(), resets: 0 }));
    svc.flows++;
    let k = f.backend ? `${f.backend}${f.backendNetns ? ` (${f.backendNetns})` : ''}` : 'not DNATed';
    if (!svc.perBackend.has(k)) {
      if (backendLines >= MAX_LINES) k = '(other backends)';
      else backendLines++;
    }
    svc.perBackend.set(k, (svc.perBackend.get(k) ?? 0) + 1);
    for (let d of f.drops ?? []) {
      if (!svc.drops.has(d)) {
        if (dropLines >= MAX_DROP_KINDS) d = '(other drops)';
        else dropLines++;
      }
      svc.drops.set(d, (svc.drops.get(d) ?? 0) + 1);
    }
    if (f.reset) svc.resets++;
    // Its id, to tell a flow seen again from a new one; the ids are bounded too (the oldest forgotten).
    // (The queue bounds them: an id seen again and summarized again is in it
    // twice, and forgotten at the first, a little early.)
    if (!remember) return;
    summarized.add(id);
    summarizedOrder.push(id);
    if (summarizedOrder.length > SUMMARIZED_IDS_PER_OPEN_FLOW * maxOpenFlows) {
      summarized.delete(summarizedOrder.shift()!);
      summarizedEvicted++;
    }
  };
  const rec = readRecording(path, (events) => {
    for (const e of events) {
      const id = String(e.flowId);
      let f = flows.get(id);
      if (!f) {
        // (Its id stays in summarizedOrder until it comes round: deleting it there would cost a search.)
        if (summarized.delete(id)) seenAgain++;
        f = { service: e.service ?? '', backend: '', backendNetns: '', reset: false };
        flows.set(id, f);
        flowOrder.push(id);
        if (flows.size > maxOpenFlows) {
          const oldId = flowOrder.shift()!;
          summarize(oldId, flows.get(oldId)!);
        }
      }
      if (e.backend) f.backend = e.backend;
      if (e.backendNetns) f.backendNetns = e.backendNetns;
      if (e.kind === pb.EventKind.EVENT_KIND_DROP && !e.benignDrop && e.dropReasonName) {
        const d = dropName(e.dropReasonName, e.dropLocation).slice(0, 200); // a crafted name may be any length
        f.drops ??= [];
        if (!f.drops.includes(d) && f.drops.length < 16) f.drops.push(d);
      }
      if (e.tcpFlags?.includes('RST')) f.reset = true;
    }
  });
  for (const [id, f] of [...flows]) summarize(id, f, false); // the end: no event comes after
  flowOrder.clear();
  const out: string[] = [];
  const h = rec.header;
  out.push(`recording ${name}`);
  if (h) {
    out.push(`  recorded by svctrace ${h.toolVersion} on ${h.node} (kernel ${h.kernel}) at ${h.startedAt}`);
    if (h.attachBackend) out.push(`  attach backend ${h.attachBackend}`);
    out.push(`  services: ${h.services.join(', ')}; namespaces: ${h.netns.join(', ')}; snaplen ${h.snaplen}`);
  }
  const t = rec.trailer;
  if (h) out.push(t ? `  ended at ${t.endedAt} (${t.reason}): ${String(t.events)} events, ${String(t.flows)} flows, ${String(t.kernelLost)} lost` : '  no trailer: the recording was cut short');
  for (const p of rec.problems) out.push(`  ${p.corrupt ? 'DAMAGED' : 'note'}: ${p.message}`);

  if (seenAgain) {
    out.push(`  note: flows are followed ${maxOpenFlows} at a time: ${seenAgain} had events again after that many newer flows, each counted once per part${summarizedEvicted ? ` (flows summarized before the last ${SUMMARIZED_IDS_PER_OPEN_FLOW * maxOpenFlows} are not recognized again)` : ''}`);
  }
  for (const [svc, seen] of byService) {
    out.push('', `service ${svc}: ${seen.flows} flows`);
    for (const [b, n] of [...seen.perBackend].sort((a, b2) => b2[1] - a[1])) out.push(`  backend ${b.padEnd(40)} ${n}`);
    const { drops, resets } = seen;
    if (drops.size || resets) out.push(`  drops: ${[...drops].map(([d, n]) => `${d}=${n}`).join(' ') || 'none'}; resets: ${resets}`);
    const address = svc.split(':')[0] ?? '';
    const ipt = rec.snapshot?.sections.find((s) => s.name === 'iptables');
    if (ipt?.output && address !== '*') {
      const rules = rulesFor(ipt.output, address);
      out.push(`  kube-proxy rules for ${address} in the snapshot (${ipt.netns}):`);
      for (const r of rules.length ? rules : ['(none: no rule matches this ClusterIP)']) out.push(`    ${r}`);
    }
  }
  return { text: out.join('\n'), recording: rec };
}
