/**
 * A bound on the label sets of each metric family: labels come only from
 * the traced Services and their backends, but a Service with thousands of
 * endpoints (or churning pods) must not grow /metrics and its scraper
 * without limit. Past the cap, new series are refused and counted.
 */
export class SeriesCap {
  private readonly seen = new Map<string, Set<string>>();
  private readonly refusedBy = new Map<string, number>();

  constructor(readonly maxPerFamily: number) {}

  /** Whether this family may have (or already has) this label set. */
  allow(family: string, labels: readonly string[]): boolean {
    const key = labels.join('\u0000');
    let set = this.seen.get(family);
    if (!set) this.seen.set(family, (set = new Set()));
    if (set.has(key)) return true;
    if (set.size >= this.maxPerFamily) {
      this.refusedBy.set(family, (this.refusedBy.get(family) ?? 0) + 1);
      return false;
    }
    set.add(key);
    return true;
  }

  /** Observations refused so far, per family. */
  refused(): ReadonlyMap<string, number> {
    return this.refusedBy;
  }
}
