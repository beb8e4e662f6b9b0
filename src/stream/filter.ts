/** A client's subscription filter, compiled once into a predicate over events. */
import { isIPv4 } from 'node:net';
import { svctrace } from '../gen/svctrace';
import { SvctraceError } from '../errors';
import { nodeName } from '../node-name';

import pb = svctrace.v1;

export type EventPredicate = (e: pb.IEvent) => boolean;

/** The predicate of no filter: clients holding it take whole batches, unlooked at. */
export const ACCEPT_ALL: EventPredicate = () => true;

const DROP_LIKE = new Set<number>([pb.Stage.STAGE_DROP]);

/**
 * Throws BAD_INPUT when a list is longer than `maxEntries` or holds junk.
 * An event without a node (a node's own server leaves it unset) is `localNode`'s.
 */
export function compileFilter(f: pb.IFilter | null | undefined, maxEntries: number, localNode = nodeName()): EventPredicate {
  if (!f) return ACCEPT_ALL;
  const lists: Array<[string, unknown[] | null | undefined]> = [
    ['services', f.services],
    ['backends', f.backends],
    ['namespaces', f.namespaces],
    ['kinds', f.kinds],
    ['nodes', f.nodes],
  ];
  for (const [name, list] of lists) {
    if (list && list.length > maxEntries) throw new SvctraceError('BAD_INPUT', `filter.${name} has ${list.length} entries (at most ${maxEntries})`);
  }
  // Junk is refused, not compiled into a filter that silently matches nothing
  // (or, for an empty namespace, every event that has none).
  const KNOWN_KINDS = new Set<number>(Object.values(pb.EventKind).filter((v): v is number => typeof v === 'number' && v !== 0));
  for (const k of f.kinds ?? []) {
    if (!KNOWN_KINDS.has(Number(k))) throw new SvctraceError('BAD_INPUT', `filter.kinds: ${String(k)} is not an event kind`);
  }
  for (const [name, list] of [['services', f.services], ['namespaces', f.namespaces], ['nodes', f.nodes]] as const) {
    if ((list ?? []).some((x) => typeof x !== 'string' || !x.trim())) throw new SvctraceError('BAD_INPUT', `filter.${name}: an empty entry`);
  }
  for (const b of f.backends ?? []) {
    const m = /^([^:]+)(?::(\d{1,5}))?$/.exec(b);
    if (!m || !isIPv4(m[1]!) || (m[2] !== undefined && (Number(m[2]) < 1 || Number(m[2]) > 65535)))
      throw new SvctraceError('BAD_INPUT', `filter.backends: '${b.slice(0, 64)}' is not IP or IP:port`);
  }
  const services = new Set(f.services ?? []);
  const backends = new Set(f.backends ?? []);
  const namespaces = new Set(f.namespaces ?? []);
  const kinds = new Set((f.kinds ?? []).map(Number));
  const nodes = new Set(f.nodes ?? []);
  const dropsOnly = !!f.dropsOnly;
  if (!dropsOnly && !services.size && !backends.size && !namespaces.size && !kinds.size && !nodes.size) return ACCEPT_ALL;
  return (e) => {
    if (dropsOnly && (!DROP_LIKE.has(e.stage ?? 0) || e.benignDrop)) return false;
    if (services.size && !services.has(e.service ?? '')) return false;
    if (kinds.size && !kinds.has(e.kind ?? 0)) return false;
    if (nodes.size && !nodes.has(e.node || localNode)) return false;
    if (backends.size) {
      const b = e.backend ?? '';
      if (!backends.has(b) && !backends.has(b.split(':')[0] ?? '')) return false;
    }
    if (namespaces.size && !namespaces.has(e.device?.netns ?? '') && !namespaces.has(e.backendNetns ?? '')) return false;
    return true;
  };
}
