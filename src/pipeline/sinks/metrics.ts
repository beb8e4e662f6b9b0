/** The Prometheus series (`serve`): every ingested event and expired flow feeds ServiceMetrics. */
import type { ServiceMetrics } from '../../metrics/service-metrics';
import type { Sink } from '../sink';

export function metricsSink(metrics: ServiceMetrics): Sink {
  return {
    name: 'metrics',
    write: (items) => metrics.observe(items),
    expired: (flows) => metrics.expired(flows),
  };
}
