/** The text timeline (`trace`, the demo): one line per milestone of each flow. */
import { flowFailed, flowLine, FlowTextPrinter, isFailureItem } from '../../output/flow-text';
import type { FlowTableView } from '../../flows/types';
import type { Sink } from '../sink';

/**
 * `dropsOnly`: only the failures (drops, resets, ICMP errors), each under its
 * flow's header. `rulePathsObserved`: a new flow's first lines wait (100 ms
 * at most) for its rule path, so that it is printed in its place.
 */
export function textTimelineSink(write: (s: string) => void, color: boolean, backendName: (addr: string) => string | undefined, dropsOnly = false, rulePathsObserved: () => boolean = () => false): Sink {
  const printer = new FlowTextPrinter(write, color, { backendName, rulePathComing: dropsOnly ? undefined : rulePathsObserved });
  return { name: 'text', write: (items) => printer.print(dropsOnly ? items.filter(isFailureItem) : items), close: () => printer.flush() };
}

/**
 * `trace -o flows`: one line per flow when it ends (and, at the end of the
 * trace, for those still open), for Services too busy for timelines.
 */
export function flowLinesSink(write: (s: string) => void, flows: FlowTableView, backendName: (addr: string) => string | undefined, dropsOnly = false): Sink {
  const lines = (fs: ReturnType<FlowTableView['flows']>) => {
    const out = fs.filter((f) => !dropsOnly || flowFailed(f)).map((f) => flowLine(f, backendName));
    if (out.length) write(out.join('\n') + '\n');
  };
  return { name: 'flows', write: () => undefined, expired: lines, close: () => lines(flows.flows()) };
}
