/** Connection tuples as keys and as text. */
import type { Tuple } from '../events/decode';

export function sameTuple(a: Tuple, b: Tuple): boolean {
  return a.sport === b.sport && a.dport === b.dport && a.saddr === b.saddr && a.daddr === b.daddr && a.proto === b.proto;
}

export function tupleKey(t: Tuple): string {
  return `${t.proto}|${t.saddr}:${t.sport}>${t.daddr}:${t.dport}`;
}

export function endpoint(addr: string, port: number): string {
  return `${addr}:${port}`;
}

/**
 * The same string, flattened. V8 keeps a string built by concatenation as a
 * tree of its pieces (about 300 bytes for a tuple key); reading a character
 * makes it one flat string (about 75 bytes) once the GC drops the pieces.
 * For the strings every flow keeps: the flow table's size is what bounds
 * svctrace's memory, so a flow's bytes count.
 */
export function flat(s: string): string {
  s.charCodeAt(0);
  return s;
}

const interned = new Map<string, string>();
const INTERN_MAX = 4096;

/**
 * One shared copy of a milestone key (`dev:0:recv:eth0:4026532177`): a node
 * has few distinct ones, and every flow remembers several.
 */
export function internKey(s: string): string {
  const hit = interned.get(s);
  if (hit !== undefined) return hit;
  if (interned.size >= INTERN_MAX) return flat(s);
  interned.set(flat(s), s);
  return s;
}
