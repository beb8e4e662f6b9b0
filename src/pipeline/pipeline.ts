/**
 * The one owner of a trace: kernel source (Tracer) -> flow model
 * (FlowTable) -> sinks. Every tracing command (trace, serve, record, demo,
 * explain --watch) composes it the same way:
 *
 *   const p = await Pipeline.start(selection, (ctx) => [sinks...]);
 *   await waitForStop(...);
 *   const { summary, stats } = await p.stop();
 *
 * start: the node's kube-proxy rules (discovery) and the optional Kubernetes
 * API first, the BPF programs loaded, then the sinks are made (they may need
 * the rules, the API, or the stream's view of the flows), and only then are
 * the hooks attached and events delivered. stop: the kernel source stops,
 * in-flight batches land, the sinks close in order, the API watch stops.
 */
import { deferStopSignals } from './lifecycle';
import fs from 'node:fs';
import { SvctraceError } from '../errors';
import { loadBinding, type LoadedProgram } from '../native/binding';
import { discover } from '../discovery/discover';
import { Discovery, readersMissingText } from '../discovery/model';
import { Cluster } from '../k8s/cluster';
import { podUidsByNetns } from '../k8s/pod-netns';
import { CURRENT_NETNS, NETNS_RUN_DIR, resolveNetns } from '../netns/netns';
import type { ServiceSpec } from '../net/ipv4';
import type { DecodedBatch } from '../events/decode';
import { DropLocations } from '../events/kallsyms';
import { FlowTable } from '../flows/flow-table';
import { NetnsNames } from '../flows/netns-names';
import { flowToProto } from '../flows/to-proto';
import { serviceLabel } from '../flows/service-ids';
import type { Flow, FlowSummary, FlowTableView, Ingested } from '../flows/types';
import { nameItem } from '../flows/ingested';
import type { HubSource } from '../stream/hub';
import type { svctrace } from '../gen/svctrace';
import { Tracer, TracerStats } from '../tracer/tracer';
import { DEFAULT_DETAIL_RATE } from '../events/layout';
import type { BackendChoice, BackendRequest } from '../tracer/backend';
import { kernelLosses, StageLosses, totalLost } from '../tracer/losses';
import { ApiNames } from './api-names';
import { RulePaths } from './rule-paths';
import { Sink, SinkSet } from './sink';

/** Backend addresses whose pod namespace is remembered, at most (a node runs a few hundred pods). */
const BACKEND_NETNS_MAX = 4096;

export interface PipelineOptions {
  /**
   * A command's pipeline: a Ctrl-C while it starts stops it once started
   * (see deferStopSignals), for the command's waitForStop to answer. Not
   * for a pipeline used as a library (tests, benches): their process's
   * signals are theirs.
   */
  holdSignalsWhileStarting?: boolean;
  /** The services to trace (at least one); an event's service id is its index here plus one (flows/service-ids). */
  services: ServiceSpec[];
  /** Namespaces (names or paths) to attach in; default: svctrace's own. The first is the node's: its rules are discovered. */
  netns?: string[];
  /** Kubeconfig for naming services and pods; undefined: $KUBECONFIG, ~/.kube/config or in-cluster, if any; false: never ask an API (the lab has none). */
  kubeconfig?: string | false;
  /** How the kernel side attaches (default auto: the best this kernel offers). */
  attachBackend?: BackendRequest;
  /** Every packet at every hook instead of the transitions. */
  allPackets?: boolean;
  /** Packet bytes to capture per event (0 = off, the default). */
  snaplen?: number;
  /** Size of the kernel ring buffer in bytes (a power of two; default 16 MiB): the one buffer while user space is behind. */
  ringBufferBytes?: number;
  /** How often an active flow's counters are reported (default 1000 ms). */
  statsIntervalMs?: number;
  /**
   * New flows per second whose transitions are reported (default
   * DEFAULT_DETAIL_RATE; 0: every flow). The rest are counted only:
   * packets, bytes, TCP flags, backend and drops, no hooks or devices.
   * Ignored with allPackets (every flow in detail).
   */
  detailRate?: number;
  /** Show the kube-proxy rule path of each new connection (default true; nftables tracing needs nft). */
  ruleTrace?: boolean;
  /** How long a closed flow stays in the table, by delivered kernel time (default 2 s: FlowTableOptions.closeGraceMs). */
  closeGraceMs?: number;
  /** At most this many flows are kept (default 20k). */
  maxFlows?: number;
  /** Things the user should know that do not stop the trace (no nft, API unreachable, a failing output). */
  onWarning?: (message: string) => void;
  /** The node's kube-proxy rules, when the caller already discovered them. */
  discovery?: Discovery;
}

/** What sinks are made from. */
export interface SinkContext {
  readonly services: readonly ServiceSpec[];
  /** The attached namespaces' paths (the node's first). */
  readonly netns: readonly string[];
  /** The node's kube-proxy rules. */
  readonly discovery: Discovery;
  /** The attach backend in use, and why. */
  readonly attachBackend: BackendChoice;
  /** The Kubernetes API, when one answered. */
  readonly cluster: Cluster | null;
  /** The flow table, read-only. */
  readonly flows: FlowTableView;
  /** The pod namespace a backend address was seen in, if any. */
  backendName(addr: string): string | undefined;
  /** The streaming hub's view of this trace (flow updates are tracked from the first call on). */
  hubSource(): HubSource;
  /** The kernel source's counters (the last ones once it stopped). */
  stats(): TracerStats;
  /** Events lost so far, per stage. */
  losses(): Partial<StageLosses>;
  /** Kernel time through which the kernel's events have reached the sinks: now when none is waiting (Tracer.deliveredThrough). */
  deliveredThrough(): bigint;
  /** Rule paths are observed through nftables tracing: each new connection's comes as its own message, a few ms after its first events. */
  rulePathsObserved(): boolean;
}

export type MakeSinks = (ctx: SinkContext) => Sink[] | Promise<Sink[]>;

export interface PipelineResult {
  summary: FlowSummary;
  stats: TracerStats;
  /** Events lost, per stage, at the end (what losses() says). */
  losses: Partial<StageLosses>;
}

const EXPIRE_EVERY_MS = 1000;
/** At stop, everything the kernel produced so far reaches the sinks first, within this bound (a stalled sink must not keep the process alive). */
const DRAIN_MS = 2000;
/** Flows changed since the last flow update, at most (the relay's bound too): see deliver(). */
const MAX_CHANGED_FLOWS = 20_000;
/** Kernel flow state with no packet for this long is expired (its end was never reported), checked this often. */
const FLOW_STATE_IDLE_MS = 30 * 60_000;
const FLOW_STATE_SWEEP_MS = 30_000;
/** How often the traced namespaces are checked for deletion. */
const NETNS_CHECK_EVERY_MS = 1000;
/** How often freed native memory is given back to the system (see Pipeline.start). */
const RELEASE_FREE_MEMORY_EVERY_MS = 1000;

export class Pipeline {
  private sinks = new SinkSet([], () => undefined);
  private rulePaths: RulePaths | undefined;
  private expiryTimer: NodeJS.Timeout | undefined;
  private sweepTimer: NodeJS.Timeout | undefined;
  private memoryTimer: NodeJS.Timeout | undefined;
  private netnsTimer: NodeJS.Timeout | undefined;
  private readonly netnsGoneCtl = new AbortController();
  /** Traced namespaces deleted while tracing (their paths). */
  readonly goneNetns: string[] = [];
  /** False once the kernel source stopped: nothing reaches the sinks after that. */
  private delivering = true;
  private stopped: Promise<PipelineResult> | undefined;
  /**
   * Backend address -> the pod namespace it was seen in (outlives expired
   * flows). At most BACKEND_NETNS_MAX, the oldest dropped first: pods come
   * and go over a long trace, each with a new address. Ordered by when an
   * address was last given a namespace (not by every flow: this is per item,
   * and reordering a Map costs a delete and an insert).
   */
  private readonly backendNetns = new Map<string, string>();
  /** Flows changed since the stream last took them; only kept once a hub asked. */
  private changed: Map<number, Flow> | undefined;
  /** Flow changes that gave way in `changed` before the stream took them (stage flow_updates). */
  private flowUpdatesDropped = 0;
  /** Lets go of the signals held while it started (see deferStopSignals). */
  private releaseSignals: () => void = () => undefined;
  private flowsWanted = false;
  private readonly apiNames: ApiNames | undefined;
  /** Names where the kernel dropped packets; its table is read ahead at start. */
  private dropLocations: DropLocations | undefined;

  private constructor(
    private readonly tracer: Tracer,
    private readonly table: FlowTable,
    private readonly names: NetnsNames,
    readonly services: readonly ServiceSpec[],
    readonly netns: readonly string[],
    readonly discovery: Discovery,
    readonly cluster: Cluster | null,
    private readonly onWarning: (message: string) => void,
  ) {
    this.apiNames = cluster ? new ApiNames(cluster) : undefined;
  }

  static async start(opts: PipelineOptions, makeSinks: MakeSinks = () => []): Promise<Pipeline> {
    if (opts.services.length === 0) throw new SvctraceError('BAD_INPUT', 'give at least one --service IP:port or --nodeport PORT');
    // Ctrl-C while starting stops the command once it has started, cleanly:
    // its default action killed the process with a marker table left in the
    // node's namespace and a recording holding only its header. The
    // command's waitForStop takes the signal over (stop() lets go otherwise).
    const releaseSignals = opts.holdSignalsWhileStarting ? deferStopSignals('stopping once tracing has started, so that it ends cleanly') : () => undefined;
    try {
      const p = await Pipeline.startNow(opts, makeSinks);
      p.releaseSignals = releaseSignals;
      return p;
    } catch (e) {
      releaseSignals();
      throw e;
    }
  }

  private static async startNow(opts: PipelineOptions, makeSinks: MakeSinks): Promise<Pipeline> {
    const warn = opts.onWarning ?? (() => undefined);
    const netns = (opts.netns?.length ? opts.netns : [CURRENT_NETNS]).map(resolveNetns);
    const discovery = opts.discovery ?? (await discover(netns[0]));
    if (discovery.readersMissing) warn(`${readersMissingText(discovery.readersMissing)}: the diagnoses that compare traffic with the rules are off; tracing goes on`);
    const cluster = opts.kubeconfig === false ? null : await Cluster.start({ kubeconfig: opts.kubeconfig, onWarning: warn });
    let tracer: Tracer | undefined;
    let p: Pipeline | undefined;
    // The kernel's symbol table, read on a worker while the programs load,
    // not on the JS thread at the first drop (see events/kallsyms.ts).
    const dropLocations = new DropLocations();
    void dropLocations.prefetch();
    try {
      // Loading first: permission and verifier errors come before any output starts.
      tracer = Tracer.open({ backend: opts.attachBackend, snaplen: opts.snaplen, allPackets: opts.allPackets, ringBufferBytes: opts.ringBufferBytes, statsIntervalMs: opts.statsIntervalMs, detailRate: opts.allPackets ? 0 : (opts.detailRate ?? DEFAULT_DETAIL_RATE) });
      tracer.setServices(opts.services);
      const names = new NetnsNames();
      if (cluster) {
        // On a node: a pod's namespace is named after the pod, via its cgroup's pod UID.
        names.fallback = (ino) => {
          const uid = podUidsByNetns().get(ino);
          const pod = uid ? cluster.podByUid(uid) : undefined;
          return pod ? `pod ${pod}` : undefined;
        };
      }
      const table = new FlowTable({
        services: opts.services,
        dropReasons: tracer.dropReasons(),
        dropLocations,
        netnsName: (ino) => names.name(ino),
        closeGraceMs: opts.closeGraceMs,
        maxFlows: opts.maxFlows,
        deliveredThrough: () => tracer!.deliveredThrough(),
        // The first namespace is the node's (RulePaths marks the Services there, the backends elsewhere).
        nodeNetnsIno: () => tracer!.attached[0]?.netnsIno,
      });
      p = new Pipeline(tracer, table, names, opts.services, netns, discovery, cluster, warn);
      p.detailRate = opts.allPackets ? 0 : (opts.detailRate ?? DEFAULT_DETAIL_RATE);
      p.sinks = new SinkSet(await makeSinks(p.context()), warn);
      p.rulePaths = RulePaths.plan({ enabled: opts.ruleTrace !== false, discovery, table });
      p.dropLocations = dropLocations;
      p.deliverFromKernel();
      p.expiryTimer = setInterval(() => p!.expireNow(), EXPIRE_EVERY_MS);
      p.expiryTimer.unref();
      const t = tracer;
      p.sweepTimer = setInterval(() => t.expireIdleFlows(FLOW_STATE_IDLE_MS), FLOW_STATE_SWEEP_MS);
      p.sweepTimer.unref();
      // Batches and frames of a few hundred KB are freed all the time, and
      // glibc keeps what it freed between long-lived allocations: resident
      // for nothing. Given back once a second, RSS follows what is in use:
      // off the JS thread (a few ms a call), one call at a time.
      const binding = loadBinding();
      let trimming = false;
      p.memoryTimer = setInterval(() => {
        if (trimming) return;
        trimming = true;
        binding.releaseFreeMemory(() => {
          trimming = false;
        });
      }, RELEASE_FREE_MEMORY_EVERY_MS);
      p.memoryTimer.unref();
      p.netnsTimer = setInterval(() => p!.checkNamespaces(), NETNS_CHECK_EVERY_MS);
      p.netnsTimer.unref();
      return p;
    } catch (e) {
      dropLocations.close();
      if (p) await p.stop().catch(() => undefined);
      else {
        tracer?.close();
        await cluster?.stop();
      }
      throw e;
    }
  }

  /** Attaches in every namespace and starts the events flowing, then the rule-path observers. */
  private deliverFromKernel(): void {
    for (const ns of this.netns) {
      const a = this.tracer.attachNetns(ns);
      this.names.remember(a.netnsIno, a.path.startsWith(`${NETNS_RUN_DIR}/`) ? a.path.slice(NETNS_RUN_DIR.length + 1) : a.path);
    }
    this.tracer.start((batch) => this.onKernelBatch(batch));
    this.rulePaths!.observe(this.tracer, this.tracer.attached, [...this.services], (items) => this.deliver(items), this.onWarning);
  }

  private onKernelBatch(batch: DecodedBatch): void {
    if (!this.delivering) return;
    const items = this.table.ingest(batch.events, batch.stats);
    items.push(...this.rulePaths!.inferred(items));
    this.deliver(items);
    // Flows whose conntrack address a new connection took: ended, after their events.
    const retired = this.table.takeRetired();
    if (retired.length) this.sinks.expired(retired);
  }

  private deliver(items: Ingested[]): void {
    if (!this.delivering || !items.length) return;
    for (const item of items) {
      const flow = item.flow;
      if (flow.backendNetns && flow.dnat) this.rememberBackendNetns(flow.reply.saddr, flow.backendNetns);
      const changed = this.changed;
      if (changed) {
        changed.set(flow.id, flow);
        // At most MAX_CHANGED_FLOWS wait for the next flow update (a storm
        // changes thousands a second): the first changed gives way, counted.
        if (changed.size > MAX_CHANGED_FLOWS) {
          changed.delete(changed.keys().next().value!);
          // A loss only for a client that asked for flows (the stream's last update said whether one did).
          if (this.flowsWanted) this.flowUpdatesDropped++;
        }
      }
      if (this.apiNames) nameItem(item, this.apiNames.names(flow));
    }
    this.sinks.write(items);
  }

  private context(): SinkContext {
    return {
      services: this.services,
      netns: this.netns,
      discovery: this.discovery,
      attachBackend: this.tracer.attachBackend,
      cluster: this.cluster,
      flows: this.flows,
      backendName: this.backendName,
      hubSource: () => this.hubSource(),
      stats: () => this.stats(),
      losses: () => this.losses(),
      deliveredThrough: () => this.tracer.deliveredThrough(),
      rulePathsObserved: () => this.rulePaths?.observing ?? false,
    };
  }

  /** The attach backend in use, and why. */
  get attachBackend(): BackendChoice {
    return this.tracer.attachBackend;
  }

  /** The flow table, read-only. */
  get flows(): FlowTableView {
    return this.table;
  }

  /** The pod namespace a backend address was seen in, if any. */
  readonly backendName = (addr: string): string | undefined => this.backendNetns.get(addr);

  private rememberBackendNetns(addr: string, netns: string): void {
    if (this.backendNetns.get(addr) === netns) return;
    this.backendNetns.delete(addr); // anew, at the end
    if (this.backendNetns.size >= BACKEND_NETNS_MAX) this.backendNetns.delete(this.backendNetns.keys().next().value!);
    this.backendNetns.set(addr, netns);
  }

  /** The streaming server's view of this trace. */
  hubSource(): HubSource {
    const changed = (this.changed ??= new Map());
    return {
      services: this.services.map(serviceLabel),
      attachBackend: this.tracer.attachBackend.reason,
      kernelLost: () => totalLost(this.losses()),
      lostByStage: () => this.losses(),
      activeFlows: () => this.table.size,
      flowsCountedOnly: () => this.tracer.stats().flowsCountedOnly,
      dropsByReason: () => this.table.dropsByReason(),
      packetsDropped: () => this.table.packetsDropped,
      takeChangedFlows: (wanted) => {
        this.flowsWanted = wanted;
        // Thousands of flows change per second in a storm: their messages are built only for a client that asked.
        const out: svctrace.v1.IFlow[] = wanted ? [...changed.values()].map(flowToProto) : [];
        changed.clear();
        return out;
      },
    };
  }

  /** Expires flows closed past the grace period or idle, and tells the sinks. */
  /** Fires once every traced namespace was deleted: nothing more can come. */
  get allNetnsGone(): AbortSignal {
    return this.netnsGoneCtl.signal;
  }

  /**
   * A namespace is gone when its path no longer names the namespace we
   * attached in (`ip netns del`, a pod deleted): its links and listeners
   * see nothing more. Said once per namespace; the others go on.
   */
  checkNamespaces(): void {
    const attached = this.tracer.attached;
    for (const a of attached) {
      if (a.path === CURRENT_NETNS || this.goneNetns.includes(a.path)) continue;
      let ino: number | undefined;
      try {
        ino = fs.statSync(a.path).ino;
      } catch {
        ino = undefined;
      }
      if (ino === a.netnsIno) continue;
      this.goneNetns.push(a.path);
      const left = attached.length - this.goneNetns.length;
      this.onWarning(`network namespace ${a.path} was deleted: nothing more can be seen there${left ? ` (${left} still traced)` : ''}`);
    }
    if (attached.length && this.goneNetns.length === attached.length) this.netnsGoneCtl.abort();
  }

  /** After stop: the trace ended because its namespaces were deleted (NETNS_GONE, exit 8). */
  throwIfNetnsGone(): void {
    if (!this.netnsGoneCtl.signal.aborted) return;
    throw new SvctraceError('NETNS_GONE', `the traced network namespace${this.goneNetns.length > 1 ? 's' : ''} ${this.goneNetns.join(', ')} ${this.goneNetns.length > 1 ? 'were' : 'was'} deleted: tracing stopped`);
  }

  expireNow(): Flow[] {
    const gone = this.table.expire(this.tracer.deliveredThrough());
    if (gone.length) this.sinks.expired(gone);
    this.warnDetailBudget();
    return gone;
  }

  private detailBudgetWarned = false;
  /** New flows per second reported in detail (0: all). */
  private detailRate = 0;

  /** Says once, when it first happens, that new flows are past the detail budget (it is no loss, but the user sees fewer paths). */
  private warnDetailBudget(): void {
    if (this.detailBudgetWarned || !this.tracer.stats().flowsCountedOnly) return;
    this.detailBudgetWarned = true;
    this.onWarning(
      `more than ${this.detailRate} new flows per second: the flows past that are counted only (packets, bytes, backend, drops; no hook or device events). --detail-rate all shows every flow's path, at a cost to the traced traffic`,
    );
  }

  stats(): TracerStats {
    return this.tracer.stats();
  }

  /** The kernel's numbers for each of the tracer's programs (bpftool prog show). */
  programs(): LoadedProgram[] {
    return this.tracer.programs();
  }

  /**
   * Brings every flow's counters up to date now (the kernel reports them
   * every statsIntervalMs while a flow is active, and at its end): for a
   * judgement or a summary that cannot wait.
   */
  refreshCounters(): void {
    if (this.delivering) this.tracer.refreshCounters();
  }

  /** Events lost so far, per stage: the kernel's and the addon's counters, the flow table's evictions, and what the outputs failed on. */
  losses(): Partial<StageLosses> {
    const kernel = kernelLosses(this.stats());
    return { ...kernel, internal_error: kernel.internal_error + this.sinks.lostEvents, flow_table: this.table.lost, flow_updates: this.flowUpdatesDropped };
  }

  /** Stops the kernel source, lets in-flight batches land, closes the sinks in order. Idempotent. */
  stop(): Promise<PipelineResult> {
    this.stopped ??= this.stopNow();
    return this.stopped;
  }

  private async stopNow(): Promise<PipelineResult> {
    this.releaseSignals(); // stopped without a waitForStop (tests, a bench): signals are not held
    clearInterval(this.expiryTimer);
    clearInterval(this.sweepTimer);
    clearInterval(this.memoryTimer);
    clearInterval(this.netnsTimer);
    this.rulePaths?.stop();
    await this.tracer.drain(DRAIN_MS);
    // After the drain: a drop in it may still take the table read ahead.
    this.dropLocations?.close();
    this.refreshCounters(); // the summary counts every packet so far
    this.tracer.close();
    this.delivering = false;
    // The close flushed what the reader and listeners still held to JS: those
    // batches come on the loop's next poll phase and are counted lost at
    // shutdown there. Two immediates (a stop begun in the poll phase itself
    // reaches its check phase first) are a whole poll phase, before the stats
    // are read and the sinks (a recording's trailer) closed.
    for (let i = 0; i < 2; i++) await new Promise((r) => setImmediate(r));
    const stats = this.tracer.stats();
    await this.sinks.close();
    await this.cluster?.stop();
    return { summary: this.table.summary(), stats, losses: this.losses() };
  }
}
