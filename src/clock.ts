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

const TWO_32 = 4294967296;
const OFFSET_HI = Number(OFFSET_NS / BigInt(TWO_32));
const OFFSET_LO = Number(OFFSET_NS % BigInt(TWO_32));
const EXACT_AS_NUMBER = 2n ** 53n;

/**
 * wallNs(monoNs) as its low and high 32 bits (out[0], out[1]), for encoders:
 * the same value, without the bigint arithmetic (which allocates) in the
 * usual case of a monotonic time under 2^53 ns (104 days of uptime).
 */
export function wallNsWords(monoNs: bigint, out: Uint32Array): void {
  if (monoNs >= 0n && monoNs < EXACT_AS_NUMBER && OFFSET_LO >= 0 && OFFSET_HI >= 0) {
    const m = Number(monoNs);
    const mHi = Math.floor(m / TWO_32);
    let lo = m - mHi * TWO_32 + OFFSET_LO;
    let hi = mHi + OFFSET_HI;
    if (lo >= TWO_32) {
      lo -= TWO_32;
      hi++;
    }
    out[0] = lo;
    out[1] = hi;
    return;
  }
  const w = wallNs(monoNs);
  out[0] = Number(w & 0xffffffffn);
  out[1] = Number((w >> 32n) & 0xffffffffn);
}

/** A kernel monotonic timestamp as wall-clock Unix-epoch nanoseconds. */
export function wallNs(monoNs: bigint): bigint {
  return monoNs + OFFSET_NS;
}

/** A kernel monotonic timestamp as a Date (ms precision). */
export function wallDate(monoNs: bigint): Date {
  return new Date(Number(wallNs(monoNs) / 1_000_000n));
}
