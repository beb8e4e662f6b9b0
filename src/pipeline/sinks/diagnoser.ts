/** The live diagnoser (`trace`, `serve`): classic failures found while tracing, compared with the rules. */
import { DiscoveredService, Discovery, findByAnyAddress } from '../../discovery/model';
import { diagnoseConntrack, diagnoseRules } from '../../explain/diagnose';
import { LiveDiagnoser, LiveDiagnosis } from '../../explain/live';
import { backendView, conntrackPressure } from '../../explain/node-state';
import type { ServiceSpec } from '../../net/ipv4';
import type { Sink } from '../sink';

/** The traced services the node's rules know (the diagnoser needs their rules); NodePort-only specs have none. */
export function tracedServicesInRules(services: readonly ServiceSpec[], d: Discovery): DiscoveredService[] {
  const found = services.map((s) => (s.address ? findByAnyAddress(d, s.address, s.port, s.proto) : undefined)).filter((x): x is DiscoveredService => !!x);
  return [...new Set(found)];
}

/** Routes to backends and pod addresses change: looked up again this often. */
const VIEW_REFRESH_MS = 30_000;
/** At stop, the first lookup of the node's view is waited for at most this long. */
const FIRST_VIEW_WAIT_MS = 5_000;

/**
 * Starts diagnosing at once: the rules-based diagnoses are reported now
 * (a traced ClusterIP the rules do not know is RULES_MISSING), the node's
 * (conntrack pressure) as soon as read; stops when the trace ends.
 */
export function liveDiagnoserSink(
  traced: readonly ServiceSpec[],
  discovery: Discovery,
  netns: string,
  report: (d: LiveDiagnosis[]) => void,
  opts: { windowMs?: number; onActive?: (active: LiveDiagnosis[]) => void; deliveredThrough?: () => bigint } = {},
): Sink {
  const services = tracedServicesInRules(traced, discovery);
  const live = new LiveDiagnoser(services, report, opts.windowMs ?? 5000, discovery.masqueradeRule, opts.onActive, opts.deliveredThrough);
  // An externalIP or LoadBalancer IP of a Service traced by name is in the rules too.
  // Rules that could not be read are not missing rules.
  const missing = discovery.readersMissing ? [] : traced.filter((s) => s.address && !findByAnyAddress(discovery, s.address, s.port, s.proto));
  live.addStanding(missing.flatMap((s) => diagnoseRules(undefined, s.text, discovery.masqueradeRule).map((d) => ({ ...d, service: s.text }))));
  // The node's state is extra evidence: without it, the traffic is still judged.
  const endpoints = services.flatMap((s) => s.endpoints.map((e) => ({ ip: e.ip, port: e.port, proto: s.proto })));
  const look = () => backendView(netns, endpoints, live.view).then((v) => void (live.view = v), () => undefined);
  live.waitingForView = true;
  const first = look().finally(() => (live.waitingForView = false));
  // A lookup that hangs (each command may take up to 20 s) holds no verdict for long.
  setTimeout(() => (live.waitingForView = false), 3 * FIRST_VIEW_WAIT_MS).unref();
  const refresh = setInterval(() => void look(), VIEW_REFRESH_MS);
  refresh.unref();
  void conntrackPressure(netns).then((p) => live.addStanding(diagnoseConntrack(p).map((d) => ({ ...d, service: 'node' }))), () => undefined);
  return {
    name: 'diagnoser',
    write: (items) => live.observe(items),
    close: async () => {
      clearInterval(refresh);
      // The last judgement with the view, if it comes in reasonable time.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([first, new Promise((r) => (timer = setTimeout(r, FIRST_VIEW_WAIT_MS)))]);
      clearTimeout(timer);
      live.stop();
    },
  };
}
