/** Names events from the Kubernetes API: the Service's namespace/name:port and the backend pod. */
import type { Cluster } from '../k8s/cluster';
import type { Flow } from '../flows/types';
import { PROTO_NAMES } from '../events/conntrack';

export class ApiNames {
  /** Per flow, looked up once (not per event): the lookups walk every Service and slice. */
  private readonly byFlow = new WeakMap<Flow, { service?: string; pod?: string; podLooked: boolean }>();

  constructor(private readonly cluster: Cluster) {}

  /** The Service's and the backend pod's names for the events of flow `f`, when the API knows them. */
  names(f: Flow): { service?: string; pod?: string } {
    let n = this.byFlow.get(f);
    if (!n) {
      const at = this.cluster.serviceAt(f.orig.daddr, f.orig.dport, PROTO_NAMES[f.proto] ?? '');
      n = { service: at ? `${at.service.namespace}/${at.service.name}:${at.portName}` : undefined, podLooked: false };
      this.byFlow.set(f, n);
    }
    // The backend is known once the flow is DNATed.
    if (f.dnat && !n.podLooked) {
      n.pod = this.cluster.podAt(f.reply.saddr);
      n.podLooked = true;
    }
    return n;
  }
}
