/**
 * Events lost on the way, one counter per stage, named the same in every
 * output (trace's summary, Status.lost_by_stage, /metrics, recordings'
 * trailers). Nothing is dropped anywhere without being counted here.
 */
import type { NativeStats } from '../native/binding';
import type { DecodedBatch } from '../events/decode';

export interface StageLosses {
  /** Records the kernel could not write: the ring buffer was full (user space behind). */
  ring_buffer: number;
  /**
   * Flows the kernel could not keep counters for (its flow-state map was
   * full). Such a flow's first packet is still reported, but it has no
   * counters and its wire tuples are not registered (the registry holds the
   * flows the state map does), so drops of it inside a pod's namespace,
   * found through the registry, go unreported.
   */
  flow_state: number;
  /**
   * Flows none of whose records fit the ring buffer, final counters
   * included, so no output shows them. A count of flows, whose events are
   * already in ring_buffer: not added to the total of events lost.
   */
  flows_unseen: number;
  /** kprobe backend: packets whose after-NAT view was lost (a NAT hook's return not matched with its entry). */
  nat_exit_unmatched: number;
  /**
   * Packets conntrack counted that the counting hook never saw (a kprobe
   * program the kernel skipped while the CPU ran another BPF program or
   * syscall; a packet dropped between conntrack and NAT), found at their
   * entry's destroy where conntrack accounting is on: the flow's final
   * counters are conntrack's.
   * A count of packets, not of events: not added to the total.
   */
  hooks_missed_packets: number;
  /**
   * Runs of svctrace's programs the kernel skipped, as the kernel itself
   * counts them (recursion_misses): a trampoline's program (fentry, tp_btf)
   * already running on the CPU, or for a kprobe another BPF program or a
   * BPF syscall (counted since Linux 6.7). Each may have lost a packet's
   * count or a transition; where conntrack accounting is on, the destroy
   * corrects the counters (hooks_missed_packets). A count of program runs,
   * not of events: not added to the total.
   */
  hook_runs_skipped: number;
  /** Conntrack destroy messages the netlink socket could not queue (ENOBUFS). */
  conntrack_netlink: number;
  /** nftables trace messages the netlink socket could not queue. */
  rule_trace_netlink: number;
  /**
   * Records user space could not read: one of a size the BPF object never
   * writes (the addon's reader), or a batch that failed to decode (its
   * records). The object and the addon disagree: a bug, counted, never a crash.
   */
  undecodable: number;
  /**
   * Events a bug in svctrace lost, counted, never a crash: the records of a
   * batch the pipeline failed on (the flow model threw), and the events an
   * output failed on (once per output that failed). The first failure of
   * each is reported on stderr.
   */
  internal_error: number;
  /** Records read but not handed to JavaScript when the tracer stopped. */
  shutdown: number;
  /** Flows removed from the flow table to stay under its cap, counter records and events that came after their flow had left it, and rule traces with no room to wait for their flow (see flowTableLost). */
  flow_table: number;
  /**
   * Events a streaming client missed: dropped from its queue because it read
   * too slowly, or still queued when it left or was disconnected (all
   * clients, those gone included).
   */
  client_queues: number;
  /**
   * Flow updates (FlowUpdate, for clients that asked for flows) that never
   * went out: more flows changed between two updates than one may carry
   * (MAX_CHANGED_FLOWS). A count of flow changes, not of events.
   */
  flow_updates: number;
  /** `record`: events not in the recording (a write error, --max-size reached before the trace stopped, an event that failed to encode). */
  recording: number;
}

/** The kernel source's losses (the stages the addon and the kernel count). */
export function kernelLosses(
  s: NativeStats & { undecodedRecords?: number; unhandledRecords?: number },
): Pick<StageLosses, 'ring_buffer' | 'flows_unseen' | 'flow_state' | 'nat_exit_unmatched' | 'hooks_missed_packets' | 'hook_runs_skipped' | 'conntrack_netlink' | 'rule_trace_netlink' | 'undecodable' | 'internal_error' | 'shutdown'> {
  return {
    ring_buffer: s.ringbufLost,
    flows_unseen: s.flowsUnseen ?? 0,
    flow_state: s.flowStateFull,
    nat_exit_unmatched: s.natExitUnmatched ?? 0,
    hooks_missed_packets: s.packetsMissedByHooks ?? 0,
    hook_runs_skipped: s.hookRunsSkipped ?? 0,
    conntrack_netlink: s.ctOverruns,
    rule_trace_netlink: s.ruleTraceOverruns,
    undecodable: (s.malformed ?? 0) + (s.undecodedRecords ?? 0),
    internal_error: s.unhandledRecords ?? 0,
    shutdown: s.readerLostAtClose + s.listenerLostAtClose,
  };
}

/** Stages that count flows, packets or program runs, not events: shown, and left out of the total of events lost. */
const NOT_EVENTS = new Set(['flows_unseen', 'hooks_missed_packets', 'hook_runs_skipped', 'flow_updates']);

export function totalLost(l: Partial<StageLosses>): number {
  return Object.entries(l).reduce((n: number, [k, v]) => (NOT_EVENTS.has(k) ? n : n + (v ?? 0)), 0);
}

/** "ring_buffer=3 flow_table=1" for the stages that lost something; '' when none did. */
export function formatLosses(l: Partial<StageLosses>): string {
  return Object.entries(l)
    .filter(([, v]) => v)
    .map(([k, v]) => `${k}=${v}`)
    .join(' ');
}

/**
 * The batch handler as the tracer calls it: it never throws. A batch it
 * failed on is a bug in svctrace: reported (the first failure in full, later
 * ones counted), and all of the batch's records counted lost (some may have
 * reached an output before the failure; none is known to have reached all).
 */
export function guardBatchHandler(onBatch: (b: DecodedBatch) => void, report: (e: unknown) => void, lost: (records: number) => void): (b: DecodedBatch) => void {
  let failures = 0;
  return (b) => {
    try {
      onBatch(b);
    } catch (e) {
      lost(b.events.length + b.stats.length);
      if (++failures === 1) report(e);
    }
  };
}
