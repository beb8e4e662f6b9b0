/** One readable line per kernel event (used by `trace -o text` and the demo). */
import { KernelEvent, Tuple } from '../events/decode';
import { EventKind, NfStage } from '../events/layout';
import { ctStatusNames, NF_HOOK_NAMES, PROTO_NAMES, tcpFlagNames } from '../events/conntrack';

export function formatTuple(t: Tuple): string {
  return `${t.saddr}:${t.sport} -> ${t.daddr}:${t.dport}`;
}

/** What a netfilter observation means: e.g. "before DNAT", "after SNAT". */
export function nfStageLabel(e: KernelEvent): string {
  const hook = NF_HOOK_NAMES[e.nfHook] ?? `hook${e.nfHook}`;
  const nat = hook === 'PRE_ROUTING' || hook === 'LOCAL_OUT' ? 'DNAT' : 'SNAT';
  return `${e.nfStage === NfStage.BEFORE_NAT ? 'before' : 'after'} ${nat}`;
}

export function formatEventText(e: KernelEvent, t0Ns: bigint): string {
  const rel = Number(e.tsNs - t0Ns) / 1e6;
  const proto = PROTO_NAMES[e.pkt.proto] ?? String(e.pkt.proto);
  const flags = e.pkt.proto === 6 ? ` [${tcpFlagNames(e.tcpFlags)}]` : '';
  if (e.kind === EventKind.NF) {
    const hook = (NF_HOOK_NAMES[e.nfHook] ?? '?').padEnd(12);
    return (
      `+${rel.toFixed(3).padStart(9)}ms ${hook} ${String(e.nfPriority).padStart(4)} ${nfStageLabel(e).padEnd(11)} ` +
      `${proto} ${formatTuple(e.pkt)}${flags} ct=${ctStatusNames(e.ctStatus).join(',')} dev=${e.ifname || '-'}`
    );
  }
  return `+${rel.toFixed(3).padStart(9)}ms kind=${e.kind} ${proto} ${formatTuple(e.pkt)}${flags}`;
}
