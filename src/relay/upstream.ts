/**
 * What a relay asks every node server for, given what its own clients
 * subscribed to. Filtering stays close to the kernel when it can: when all
 * clients want the same events, the node servers filter for them; when they
 * differ, the node servers send everything and the relay's hub filters per
 * client (it always does). With no client at all the node servers are
 * paused: nothing crosses the network that nobody reads.
 */
import { svctrace } from '../gen/svctrace';

import pb = svctrace.v1;

export interface Subscription {
  /** null: everything. */
  filter: pb.IFilter | null;
  flows: boolean;
}

export interface UpstreamRequest {
  paused: boolean;
  filter: pb.IFilter | null;
  flows: boolean;
}

/** A filter's meaning, independent of list order and of empty lists. */
function canonical(f: pb.IFilter | null): string {
  if (!f) return '';
  const list = (xs: Array<string | number> | null | undefined) => [...(xs ?? [])].map(String).sort();
  const parts = {
    services: list(f.services),
    backends: list(f.backends),
    namespaces: list(f.namespaces),
    kinds: list(f.kinds as number[] | null | undefined),
    nodes: list(f.nodes),
    dropsOnly: !!f.dropsOnly,
  };
  const empty = Object.values(parts).every((v) => (Array.isArray(v) ? v.length === 0 : !v));
  return empty ? '' : JSON.stringify(parts);
}

export function upstreamRequest(subs: readonly Subscription[]): UpstreamRequest {
  if (!subs.length) return { paused: true, filter: null, flows: false };
  const flows = subs.some((s) => s.flows);
  const first = canonical(subs[0]!.filter);
  const same = first !== '' && subs.every((s) => canonical(s.filter) === first);
  return { paused: false, filter: same ? subs[0]!.filter : null, flows };
}
