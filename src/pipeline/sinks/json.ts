/** JSON lines (`trace -o json`): every event as one proto3-JSON svctrace.v1.Event per line. */
import { eventToJson } from '../../flows/to-proto';
import type { Sink } from '../sink';

export function jsonLinesSink(write: (s: string) => void): Sink {
  return {
    name: 'json',
    write: (items) => {
      if (items.length) write(items.map((i) => eventToJson(i.event)).join('\n') + '\n');
    },
  };
}
