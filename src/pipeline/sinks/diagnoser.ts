/** The live diagnoser (`trace`, `serve`): classic failures found while tracing, compared with the rules. */
import { DiscoveredService, Discovery, findByAddress } from '../../discovery/model';
import { LiveDiagnoser, LiveDiagnosis } from '../../explain/live';
import type { ServiceSpec } from '../../net/ipv4';
import type { Sink } from '../sink';

/** The traced services the node's rules know (the diagnoser needs their rules); NodePort-only specs have none. */
export function tracedServicesInRules(services: readonly ServiceSpec[], d: Discovery): DiscoveredService[] {
  return services.map((s) => (s.address ? findByAddress(d, s.address, s.port, s.proto) : undefined)).filter((x): x is DiscoveredService => !!x);
}

/** Starts diagnosing at once (the rules-based diagnoses are reported now); stops when the trace ends. */
export function liveDiagnoserSink(
  services: DiscoveredService[],
  masqueradeRule: boolean,
  report: (d: LiveDiagnosis[]) => void,
  opts: { windowMs?: number; onActive?: (active: LiveDiagnosis[]) => void } = {},
): Sink {
  const live = new LiveDiagnoser(services, report, opts.windowMs ?? 5000, masqueradeRule, opts.onActive);
  return { name: 'diagnoser', write: (items) => live.observe(items), close: () => live.stop() };
}
