/** The text timeline (`trace`, the demo): one line per milestone of each flow. */
import { FlowTextPrinter } from '../../output/flow-text';
import type { Sink } from '../sink';

export function textTimelineSink(write: (s: string) => void, color: boolean, backendName: (addr: string) => string | undefined): Sink {
  const printer = new FlowTextPrinter(write, color, backendName);
  return { name: 'text', write: (items) => printer.print(items) };
}
