/** Kernel records as the decoder yields them, for unit tests of the flow model (no root, no addon). */
import type { KernelEvent, Tuple } from '../../src/events/decode';
import { Dir, EventKind, NfStage } from '../../src/events/layout';
import { IPS_DST_NAT } from '../../src/events/conntrack';

/** A client on the node calling the ClusterIP, and the backend's reply tuple after DNAT. */
export const orig: Tuple = { saddr: '10.244.1.1', daddr: '10.96.0.100', sport: 40000, dport: 80, proto: 6 };
export const reply: Tuple = { saddr: '10.244.1.12', daddr: '10.244.1.1', sport: 8080, dport: 40000, proto: 6 };

/** The reply tuple of an entry not (yet) DNATed: the original, reversed. */
export const unNatted: Tuple = { saddr: orig.daddr, daddr: orig.saddr, sport: orig.dport, dport: orig.sport, proto: orig.proto };

/**
 * A netfilter event of that flow (first packet, before DNAT on LOCAL_OUT),
 * with overrides. As in the kernel, the entry's reply tuple names the
 * backend once it is DNATed (ctStatus has DST_NAT), else the service.
 */
export function ev(over: Partial<KernelEvent>): KernelEvent {
  return {
    kind: EventKind.NF, cpu: 0, tsNs: 1000n, ctId: 'ffff1', ctKey: ctKeyOf(over.ctId ?? 'ffff1'), pkt: orig, ctOrig: orig,
    ctReply: (over.ctStatus ?? 0) & IPS_DST_NAT ? reply : unNatted,
    ctStatus: 0, ctMark: 0, ctTimeoutMs: 0, netnsIno: 111, ifindex: 2, nfPriority: -101, reason: 0, pktLen: 60,
    ctZone: 0, nfHook: 3, ctinfo: 2, tcpFlags: 2, ctTcpState: 1, nfStage: NfStage.BEFORE_NAT, dir: Dir.ORIGINAL,
    serviceId: 1, gateway: '', ifname: 'cni0', linkKind: 'bridge', icmpType: 0, icmpCode: 0, ctBirth: 0, dropLocation: '', ...over,
  };
}

/** The decoder's numeric key for a hex nf_conn address ('' -> 0): its bits 0-52, as decode's ctKeyAt keeps them. */
export function ctKeyOf(ctId: string): number {
  return ctId ? Number(BigInt(`0x${ctId}`) & ((1n << 53n) - 1n)) : 0;
}
