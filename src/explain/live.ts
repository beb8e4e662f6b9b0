/**
 * Diagnoses while tracing: every few seconds, the flows that started in the
 * last window are compared with the rules (the same checks as `explain
 * --watch`); a diagnosis is reported once, then again only if it persists
 * after a minute. The rules-based ones are reported at the start. The
 * distribution over backends is a statistic, not an event: it is judged on
 * the flows of the last minute (a window of a slow or quiet Service holds
 * too few), so the evidence for a skew accumulates across windows.
 *
 * Memory: a flow is held only until it is judged (a sweep every second
 * folds the flows old enough into the window's per-backend counts), and the
 * last minute is kept as per-window counts, never as flows. In a storm,
 * flows held until their window closed, and the last minute's flows, were
 * most of `serve`'s heap: the flow table's cap bounded the table, not them.
 */
import { DiscoveredService } from '../discovery/model';
import type { Flow, Ingested } from '../flows/types';
import { serviceLabel } from '../flows/service-ids';
import { parseServiceSpec } from '../net/ipv4';
import { IPS_SEEN_REPLY } from '../events/conntrack';
import { BackendView, Diagnosis, diagnoseRuleConsistency, diagnoseRules, diagnoseTraffic, mergeObserved, ObservedTraffic, TrafficObserver } from './diagnose';

export interface LiveDiagnosis extends Diagnosis {
  service: string;
}

const REPEAT_AFTER_MS = 60_000;
const UPDATE_AFTER_MS = 15_000;
/** A flow is judged this long after it started: time to be answered, reset or refused. */
const GRACE_NS = 2_000_000_000n;
/**
 * A flow with nothing to show yet (no reply, reset, drop nor ICMP error)
 * waits longer: a neighbour that does not answer is given up, and the
 * packet dropped (NEIGH_FAILED), only after 3 probes 1 s apart (the
 * kernel's defaults). Judged at 2 s, a ghost backend's connections looked
 * like replies lost on the way back.
 */
const UNDECIDED_GRACE_NS = 5_000_000_000n;

/**
 * The flow already shows how it went. Not being DNATed is not enough: in
 * kube-proxy's IPVS mode every connection looks un-DNATed until IPVS has
 * forwarded its first packet (IPVS rewrites conntrack as it sends, after
 * our hooks saw the packet), and its translation is seen with the next
 * packet or the reply. Judged at 2 s on a slow or busy node, refused
 * connections to an IPVS service were called "not DNATed". A connection that
 * really meets no rule shows its end too (no route, an ICMP error, a drop),
 * or is judged after the longer grace.
 */
function decided(f: Flow): boolean {
  return (f.status & IPS_SEEN_REPLY) !== 0 || f.reset || !!f.backendReset || f.drops.length > 0 || f.icmpErrors.length > 0;
}

/**
 * An ICMP error and the drop of the packet it is about are written to the
 * ring one after the other (a neighbour given up, a REJECT: the error is
 * sent, then the packet freed), and a batch can end between the two. Judged
 * in that gap, a neighbour failure's connection had its host-unreachable but
 * not yet its NEIGH_FAILED drop, and was called a broken reply path (seen in
 * the fault catalogue's IPVS column). A flow not answered, reset or refused
 * is judged only once the kernel's events have been delivered this far past
 * its last one.
 */
const SETTLE_NS = 250_000_000n;

function settled(f: Flow, deliveredNs: bigint): boolean {
  return (f.status & IPS_SEEN_REPLY) !== 0 || f.reset || !!f.backendReset || deliveredNs - f.lastTsNs >= SETTLE_NS;
}
/**
 * Flows waiting for their judgement: a few seconds' worth. Past it, new
 * flows are not judged until there is room, and the window's traffic
 * diagnoses say how many were left out (their counts are of the flows judged).
 */
export const MAX_PENDING = 20_000;
/** The flows the distribution over backends is judged on: the last minute's. */
const DISTRIBUTION_HORIZON_NS = 60_000_000_000n;
/** Judged on the horizon's flows, not a window's. */
const DISTRIBUTION_CODES = new Set(['SKEWED_DISTRIBUTION']);
/** How often flows old enough are judged (folded into the window's counts). */
const SWEEP_MS = 1000;

export class LiveDiagnoser {
  private readonly lastSaid = new Map<string, { at: number; summary: string }>();
  private readonly timer: NodeJS.Timeout;
  private readonly sweepTimer: NodeJS.Timeout;
  private pending = new Set<Flow>();
  /** Flows already judged: their later records (counters, a late drop) do not make them count twice. */
  private readonly judged = new WeakSet<Flow>();
  /** Flows left unjudged because MAX_PENDING were waiting (each counted once). */
  private readonly leftOut = new WeakSet<Flow>();
  /** How many of them since the last window closed. */
  private leftOutInWindow = 0;
  /** The flows judged since the last window closed, per service (same order as `services`). */
  private window: TrafficObserver[];
  /** The closed windows of the last DISTRIBUTION_HORIZON_NS, oldest first: per service, what they showed. */
  private horizon: Array<{ atNs: bigint; observed: ObservedTraffic[] }> = [];
  /** The rules' diagnoses (and the node's, like conntrack pressure): in effect for the whole run. */
  private readonly fromRules: LiveDiagnosis[];
  /** The node's routes to backends and who holds their addresses (set once looked up). */
  view?: BackendView;
  /**
   * The view is being looked up for the first time: windows wait for it
   * (their flows stay pending). Judged without it, on a loaded node where
   * the lookup took seconds, a pod whose replies leave by another
   * interface was called filtered, not a broken reply path.
   */
  waitingForView = false;

  constructor(
    private readonly services: DiscoveredService[],
    private readonly report: (d: LiveDiagnosis[]) => void,
    private readonly windowMs = 5000,
    masqueradeRule = true,
    /** Every window: all diagnoses in effect (the rules' and the window's), repeated ones included (metrics). */
    private readonly onActive?: (active: LiveDiagnosis[]) => void,
    /**
     * Kernel time through which the kernel's events have reached us (the
     * pipeline's deliveredThrough: now when nothing is waiting, else the
     * newest delivered record's). Flows are judged by it, not by the wall
     * clock: when the ring is behind, a flow's ending is still on its way.
     */
    private readonly deliveredThrough: () => bigint = () => process.hrtime.bigint(),
  ) {
    const initial = services.flatMap((s) =>
      [...diagnoseRules(s, s.name, masqueradeRule), ...diagnoseRuleConsistency(s)].filter((d) => d.severity !== 'info').map((d) => this.tag(s, d)),
    );
    this.fromRules = initial;
    this.onActive?.(initial);
    this.emit(initial);
    this.window = services.map((svc) => new TrafficObserver(svc));
    this.timer = setInterval(() => this.tick(), windowMs);
    this.timer.unref();
    this.sweepTimer = setInterval(() => this.sweep(this.deliveredThrough()), SWEEP_MS);
    this.sweepTimer.unref();
  }

  private tag(s: DiscoveredService, d: Diagnosis): LiveDiagnosis {
    return { ...d, service: serviceLabel(parseServiceSpec(`${s.clusterIP}:${s.port}/${s.proto}`)) };
  }

  /**
   * Reports what is new: a diagnosis not said before, one whose numbers
   * changed (at most every UPDATE_AFTER_MS: "1 of 1" becomes "8 of 12" as
   * evidence accumulates), and one still true after REPEAT_AFTER_MS.
   */
  private emit(ds: LiveDiagnosis[]): void {
    const now = Date.now();
    const fresh = ds.filter((d) => {
      const key = `${d.service}|${d.code}|${d.summary.replace(/\d+/g, '#')}`;
      const last = this.lastSaid.get(key);
      const changed = last !== undefined && last.summary !== d.summary && now - last.at >= UPDATE_AFTER_MS;
      if (last !== undefined && !changed && now - last.at < REPEAT_AFTER_MS) return false;
      this.lastSaid.set(key, { at: now, summary: d.summary });
      return true;
    });
    if (fresh.length) this.report(fresh);
  }

  /** Diagnoses that hold for the whole run, found after the start (the node's state, traced services missing from the rules). */
  addStanding(ds: LiveDiagnosis[]): void {
    if (!ds.length) return;
    this.fromRules.push(...ds);
    this.onActive?.([...this.fromRules]);
    this.emit(ds);
  }

  /** Flows held until their judgement. */
  get heldFlows(): number {
    return this.pending.size;
  }

  /** Feeds the flows the tracer just saw. */
  observe(items: Ingested[]): void {
    for (const { flow } of items) {
      if (this.judged.has(flow) || this.pending.has(flow)) continue;
      if (this.pending.size < MAX_PENDING) this.pending.add(flow);
      else if (!this.leftOut.has(flow)) {
        this.leftOut.add(flow);
        this.leftOutInWindow++;
      }
    }
  }

  /**
   * Judges the pending flows old enough (nowNs: the delivered kernel time):
   * each is folded into the window's counts, and no longer held.
   */
  sweep(nowNs: bigint, final = false): void {
    for (const f of this.pending) {
      const age = nowNs - f.firstTsNs;
      // The last sweep waits for no more time, only for delivery: what is
      // old enough is judged, if the kernel's events reached us past it (a
      // drain that ran out of time at stop, on a slow node, left a flow's
      // reply in the ring: judged on its SYN alone, it was "unanswered").
      if (final ? age >= GRACE_NS && settled(f, nowNs) : (age >= UNDECIDED_GRACE_NS || (age >= GRACE_NS && decided(f))) && settled(f, nowNs)) {
        this.pending.delete(f);
        this.judged.add(f);
        for (const o of this.window) o.add(f);
      }
    }
  }

  /** One window: the flows judged since the last, per service (nowNs: the delivered kernel time). */
  tick(nowNs = this.deliveredThrough(), final = false): void {
    if (this.waitingForView && !final) return;
    this.sweep(nowNs, final);
    const windowS = this.windowMs / 1000;
    const windows = this.window.map((o) => o.observed(windowS));
    this.window = this.services.map((svc) => new TrafficObserver(svc));
    this.horizon.push({ atNs: nowNs, observed: windows });
    const leftOut = this.leftOutInWindow;
    this.leftOutInWindow = 0;
    // Said with every traffic verdict of the window: its counts are of the flows judged, not of all.
    const tagged = (s: DiscoveredService, d: Diagnosis) => {
      const l = this.tag(s, d);
      if (leftOut) l.evidence = [...l.evidence, `${leftOut} new flows of the traced services were not judged in this window: ${MAX_PENDING} were already waiting (the counts above are of the flows judged)`];
      return l;
    };
    const since = nowNs - DISTRIBUTION_HORIZON_NS;
    while (this.horizon.length && this.horizon[0]!.atNs < since) this.horizon.shift();
    const out: LiveDiagnosis[] = [];
    this.services.forEach((s, i) => {
      const t = windows[i]!;
      if (!t.flows) return;
      out.push(...diagnoseTraffic(s, t, this.view).filter((d) => !DISTRIBUTION_CODES.has(d.code)).map((d) => tagged(s, d)));
      const h = mergeObserved(this.horizon.map((w) => w.observed[i]!), Number(DISTRIBUTION_HORIZON_NS / 1_000_000_000n));
      if (h.flows) out.push(...diagnoseTraffic(s, h, this.view).filter((d) => DISTRIBUTION_CODES.has(d.code)).map((d) => tagged(s, d)));
    });
    this.onActive?.([...this.fromRules, ...out]);
    this.emit(out);
  }

  /** Stops; the flows old enough to judge are judged first (a short trace still gets its diagnoses). */
  stop(): void {
    clearInterval(this.timer);
    clearInterval(this.sweepTimer);
    this.tick(undefined, true);
  }
}
