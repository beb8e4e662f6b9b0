/**
 * Names for the kernel's conntrack, netfilter and ICMP numbers carried in
 * events: enum ip_conntrack_status, ip_conntrack_info, tcp_conntrack,
 * nf_inet_hooks and ICMP unreachable codes (include/uapi/linux/netfilter/nf_conntrack_common.h,
 * nf_conntrack_tcp.h, netfilter.h). These are stable kernel UAPI values.
 */

/** enum ip_conntrack_status bit -> name, in bit order. */
export const CT_STATUS_BITS: readonly string[] = [
  'EXPECTED',
  'SEEN_REPLY',
  'ASSURED',
  'CONFIRMED',
  'SRC_NAT',
  'DST_NAT',
  'SEQ_ADJUST',
  'SRC_NAT_DONE',
  'DST_NAT_DONE',
  'DYING',
  'FIXED_TIMEOUT',
  'TEMPLATE',
  'NAT_CLASH',
  'HELPER',
  'OFFLOAD',
  'HW_OFFLOAD',
];

export const IPS_SEEN_REPLY = 1 << 1;
export const IPS_ASSURED = 1 << 2;
export const IPS_CONFIRMED = 1 << 3;
export const IPS_SRC_NAT = 1 << 4;
export const IPS_DST_NAT = 1 << 5;
export const IPS_DYING = 1 << 9;

/**
 * The entry's destination was translated: netfilter DNAT (IPS_DST_NAT), or
 * IPVS, which with net.ipv4.vs.conntrack=1 (kube-proxy's IPVS mode) points
 * the entry's reply tuple at the real server without setting that bit. The
 * reply then comes from somewhere other than where the client sent.
 */
export function destTranslated(status: number, orig: { daddr: string; dport: number }, reply: { saddr: string; sport: number }): boolean {
  return (status & IPS_DST_NAT) !== 0 || (!!reply.saddr && (reply.saddr !== orig.daddr || reply.sport !== orig.dport));
}

const statusNameCache = new Map<number, readonly string[]>();

/**
 * Decodes status bits to names; an unconfirmed entry is reported as NEW.
 * The arrays are shared per status value: treat them as read-only.
 */
export function ctStatusNames(status: number): string[] {
  let names = statusNameCache.get(status);
  if (!names) {
    const list: string[] = [];
    if (!(status & IPS_CONFIRMED)) list.push('NEW');
    CT_STATUS_BITS.forEach((name, bit) => {
      if (status & (1 << bit)) list.push(name);
    });
    names = Object.freeze(list);
    if (statusNameCache.size < 4096) statusNameCache.set(status, names);
  }
  return names as string[];
}

/** enum ip_conntrack_info */
export const CTINFO_NAMES: readonly string[] = ['ESTABLISHED', 'RELATED', 'NEW', 'ESTABLISHED_REPLY', 'RELATED_REPLY'];
/** ctinfo >= IP_CT_IS_REPLY (3) means the packet goes in the reply direction. */
export const IP_CT_IS_REPLY = 3;

/** enum tcp_conntrack */
export const TCP_CT_STATES: readonly string[] = [
  'NONE',
  'SYN_SENT',
  'SYN_RECV',
  'ESTABLISHED',
  'FIN_WAIT',
  'CLOSE_WAIT',
  'LAST_ACK',
  'TIME_WAIT',
  'CLOSE',
  'SYN_SENT2',
];

/** enum nf_inet_hooks */
export const NF_HOOK_NAMES: readonly string[] = ['PRE_ROUTING', 'LOCAL_IN', 'FORWARD', 'LOCAL_OUT', 'POST_ROUTING'];

export const PROTO_NAMES: Readonly<Record<number, string>> = { 1: 'icmp', 6: 'tcp', 17: 'udp', 132: 'sctp' };

function flagNames(flags: number): string {
  const n: string[] = [];
  if (flags & 0x02) n.push('SYN');
  if (flags & 0x10) n.push('ACK');
  if (flags & 0x01) n.push('FIN');
  if (flags & 0x04) n.push('RST');
  if (flags & 0x08) n.push('PSH');
  return n.join('|');
}

/** Every flags byte's text, made once: it is asked for every TCP event. */
const TCP_FLAG_NAMES: readonly string[] = Array.from({ length: 256 }, (_, f) => flagNames(f));

/** TCP header flag bits as in the header's 14th byte. */
export function tcpFlagNames(flags: number): string {
  return TCP_FLAG_NAMES[flags & 0xff]!;
}

/** ICMP destination-unreachable codes (RFC 792/1122), as REJECT sends them. */
const ICMP_UNREACH: Readonly<Record<number, string>> = {
  0: 'net unreachable',
  1: 'host unreachable',
  3: 'port unreachable',
  9: 'net prohibited',
  10: 'host prohibited',
  13: 'administratively prohibited',
};

export function icmpUnreachName(code: number): string {
  return ICMP_UNREACH[code] ?? `code ${code}`;
}

