/** `svctrace inspect`: a person's summary of a recording. */
import { svctrace } from '../gen/svctrace';
import { Recording, readRecording } from './reader';
import { dropName } from '../events/drop-name';

import pb = svctrace.v1;

interface FlowSeen {
  service: string;
  backend: string;
  backendNetns: string;
  client: string;
  drops: Set<string>;
  reset: boolean;
  closed: boolean;
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

/** Summarizes the recording at `path`; `name` is what the text calls it (default: path). */
export function inspect(path: string, name = path): { text: string; recording: Recording } {
  const flows = new Map<string, FlowSeen>();
  const rec = readRecording(path, (events) => {
    for (const e of events) {
      const id = String(e.flowId);
      let f = flows.get(id);
      if (!f) {
        f = { service: e.service ?? '', backend: '', backendNetns: '', client: '', drops: new Set(), reset: false, closed: false };
        flows.set(id, f);
      }
      if (e.backend) f.backend = e.backend;
      if (e.backendNetns) f.backendNetns = e.backendNetns;
      if (!f.client && e.conntrack?.original?.src) f.client = `${e.conntrack.original.src}:${e.conntrack.original.srcPort}`;
      if (e.kind === pb.EventKind.EVENT_KIND_DROP && !e.benignDrop && e.dropReasonName) f.drops.add(dropName(e.dropReasonName, e.dropLocation));
      if (e.tcpFlags?.includes('RST')) f.reset = true;
      if (e.kind === pb.EventKind.EVENT_KIND_CT_DESTROY) f.closed = true;
    }
  });
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

  const byService = new Map<string, FlowSeen[]>();
  for (const f of flows.values()) {
    let list = byService.get(f.service);
    if (!list) byService.set(f.service, (list = []));
    list.push(f);
  }
  for (const [svc, list] of byService) {
    out.push('', `service ${svc}: ${list.length} flows`);
    const perBackend = new Map<string, number>();
    for (const f of list) {
      const k = f.backend ? `${f.backend}${f.backendNetns ? ` (${f.backendNetns})` : ''}` : 'not DNATed';
      perBackend.set(k, (perBackend.get(k) ?? 0) + 1);
    }
    for (const [b, n] of [...perBackend].sort((a, b2) => b2[1] - a[1])) out.push(`  backend ${b.padEnd(40)} ${n}`);
    const drops = new Map<string, number>();
    for (const f of list) for (const d of f.drops) drops.set(d, (drops.get(d) ?? 0) + 1);
    const resets = list.filter((f) => f.reset).length;
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
