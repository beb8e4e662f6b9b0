/** The text timeline (`trace`, the demo): one line per milestone of each flow. */
import { flowFailed, flowLine, FlowTextPrinter, isFailureItem } from '../../output/flow-text';
import type { FlowTableView } from '../../flows/types';
import type { Sink } from '../sink';

export interface TextTimelineOptions {
  color: boolean;
  backendName: (addr: string) => string | undefined;
  /** The flow table: flows that ended get their end line when the trace ends. */
  flows: FlowTableView;
  /** Only the failures (drops, resets, ICMP errors), each under its flow's header. */
  dropsOnly?: boolean;
  /** Rule paths are observed: a new flow's first lines wait (100 ms at most) for its path, so that it is printed in its place. */
  rulePathsObserved?: () => boolean;
}

export function textTimelineSink(write: (s: string) => void, opts: TextTimelineOptions): Sink {
  const printer = new FlowTextPrinter(write, opts.color, { backendName: opts.backendName, rulePathComing: opts.dropsOnly ? undefined : opts.rulePathsObserved });
  return {
    name: 'text',
    write: (items) => printer.print(opts.dropsOnly ? items.filter(isFailureItem) : items),
    // End lines, with the counters, for the timelines shown (--drops-only shows only the failures).
    expired: opts.dropsOnly ? undefined : (flows) => printer.ended(flows),
    close: () => {
      try {
        printer.flush();
      } finally {
        if (!opts.dropsOnly) printer.ended(opts.flows.flows());
      }
    },
  };
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
