/** Connection tuples as keys and as text. */
import type { Tuple } from '../events/decode';

export function sameTuple(a: Tuple, b: Tuple): boolean {
  return a === b || (a.sport === b.sport && a.dport === b.dport && a.saddr === b.saddr && a.daddr === b.daddr && a.proto === b.proto);
}

export function tupleKey(t: Tuple): string {
  return `${t.proto}|${t.saddr}:${t.sport}>${t.daddr}:${t.dport}`;
}

export function endpoint(addr: string, port: number): string {
  return `${addr}:${port}`;
}

export { flat, intern as internKey } from '../intern';
