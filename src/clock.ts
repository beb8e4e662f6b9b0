/**
 * The one clock. Every timestamp svctrace reports comes from the kernel's
 * CLOCK_MONOTONIC: bpf_ktime_get_ns() in the BPF programs, the same clock in
 * the addon's netlink listeners (conntrack destroy, nftables trace), and
 * process.hrtime() here. The flow model works in that clock; what leaves the
 * process (events, flows) carries wall-clock time, converted with ONE offset
 * taken when this module loads, so differences between any two reported
 * times are exact and never mix clocks.
 */

/** Now, on the kernel's monotonic clock (ns). */
export function monoNowNs(): bigint {
  return process.hrtime.bigint();
}

// Wall-clock minus monotonic, in ns, measured once.
const OFFSET_NS = BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6)) - monoNowNs();

/** A kernel monotonic timestamp as wall-clock Unix-epoch nanoseconds. */
export function wallNs(monoNs: bigint): bigint {
  return monoNs + OFFSET_NS;
}

/** A kernel monotonic timestamp as a Date (ms precision). */
export function wallDate(monoNs: bigint): Date {
  return new Date(Number(wallNs(monoNs) / 1_000_000n));
}
