/**
 * Diagnoses while tracing: every few seconds, the flows that started in the
 * last window are compared with the rules (the same checks as `explain
 * --watch`); a diagnosis is reported once, then again only if it persists
 * after a minute. The rules-based ones are reported at the start.
 */
import { DiscoveredService } from '../discovery/model';
import type { Flow, Ingested } from '../flows/types';
import { serviceLabel } from '../flows/service-ids';
import { parseServiceSpec } from '../net/ipv4';
import { BackendView, Diagnosis, diagnoseRuleConsistency, diagnoseRules, diagnoseTraffic, observeFlows } from './diagnose';

export interface LiveDiagnosis extends Diagnosis {
  service: string;
}

const REPEAT_AFTER_MS = 60_000;
const UPDATE_AFTER_MS = 15_000;
/** A flow is judged this long after it started: time to be answered, reset or refused. */
const GRACE_NS = 2_000_000_000n;
const MAX_PENDING = 20_000;

export class LiveDiagnoser {
  private readonly lastSaid = new Map<string, { at: number; summary: string }>();
  private readonly timer: NodeJS.Timeout;
  private pending = new Set<Flow>();
  /** The rules' diagnoses (and the node's, like conntrack pressure): in effect for the whole run. */
  private readonly fromRules: LiveDiagnosis[];
  /** The node's routes to backends and who holds their addresses (set once looked up). */
  view?: BackendView;

  constructor(
    private readonly services: DiscoveredService[],
    private readonly report: (d: LiveDiagnosis[]) => void,
    private readonly windowMs = 5000,
    masqueradeRule = true,
    /** Every window: all diagnoses in effect (the rules' and the window's), repeated ones included (metrics). */
    private readonly onActive?: (active: LiveDiagnosis[]) => void,
  ) {
    const initial = services.flatMap((s) =>
      [...diagnoseRules(s, s.name, masqueradeRule), ...diagnoseRuleConsistency(s)].filter((d) => d.severity !== 'info').map((d) => this.tag(s, d)),
    );
    this.fromRules = initial;
    this.onActive?.(initial);
    this.emit(initial);
    this.timer = setInterval(() => this.tick(), windowMs);
    this.timer.unref();
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

  /** Feeds the flows the tracer just saw. */
  observe(items: Ingested[]): void {
    for (const { flow } of items) if (this.pending.size < MAX_PENDING) this.pending.add(flow);
  }

  /** One window: the flows old enough to judge, per service. */
  tick(nowNs = process.hrtime.bigint()): void {
    const flows: Flow[] = [];
    for (const f of this.pending) {
      if (nowNs - f.firstTsNs >= GRACE_NS) {
        flows.push(f);
        this.pending.delete(f);
      }
    }
    const out: LiveDiagnosis[] = [];
    for (const s of this.services) {
      const t = observeFlows(s, flows, this.windowMs / 1000);
      if (t.flows) out.push(...diagnoseTraffic(s, t, this.view).map((d) => this.tag(s, d)));
    }
    this.onActive?.([...this.fromRules, ...out]);
    this.emit(out);
  }

  /** Stops; the flows old enough to judge are judged first (a short trace still gets its diagnoses). */
  stop(): void {
    clearInterval(this.timer);
    this.tick();
  }
}
