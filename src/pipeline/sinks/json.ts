/** JSON lines (`trace -o json`): every event as one proto3-JSON svctrace.v1.Event per line. */
import { eventToJson } from '../../flows/to-proto';
import { isFailureItem } from '../../output/flow-text';
import type { Sink } from '../sink';

/** `dropsOnly`: only the failure events (drops, resets, ICMP errors). */
export function jsonLinesSink(write: (s: string) => void, dropsOnly = false): Sink {
  return {
    name: 'json',
    write: (items) => {
      const shown = dropsOnly ? items.filter(isFailureItem) : items;
      if (shown.length) write(shown.map((i) => eventToJson(i.event)).join('\n') + '\n');
    },
  };
}
