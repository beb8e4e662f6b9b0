/** Strings the flow model keeps for long: flattened, and shared when they repeat. */

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
 * One shared copy of a string that repeats across flows and events: a
 * milestone key (`dev:0:recv:eth0:4026532177`), a rule's table or chain
 * name. A node has few distinct ones; past INTERN_MAX they are not shared.
 */
export function intern(s: string): string {
  const hit = interned.get(s);
  if (hit !== undefined) return hit;
  if (interned.size >= INTERN_MAX) return flat(s);
  interned.set(flat(s), s);
  return s;
}
