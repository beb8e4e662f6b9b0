/**
 * `svctrace relay`: one endpoint for a whole cluster. It connects to every
 * node server's stream (AgentLink), and serves the same protocol and
 * dashboard (the StreamServer of `serve`): events, flows and diagnoses name
 * their node, Hello and Status list the nodes as they stand, and what its
 * clients subscribe to is asked of the node servers (upstream.ts). It is a
 * HubSource like a live tracer: the hub's per-client filters, bounded queues
 * and loss counters apply unchanged.
 */
import { svctrace } from '../gen/svctrace';
import type { HubSource } from '../stream/hub';
import { ServeOptions, StreamServer } from '../stream/server';
import { AgentLink, AgentLinkOptions } from './agent-link';
import { upstreamRequest } from './upstream';

import pb = svctrace.v1;

/** Flows changed since the last FlowUpdate, at most this many (the oldest changes give way, counted). */
const MAX_CHANGED_FLOWS = 20_000;
/** Node servers no longer listed whose counters are kept per URL (see Relay.goneLinks). */
const GONE_LINKS_MAX = 1024;

export interface RelayOptions {
  agents: Array<Omit<AgentLinkOptions, 'token' | 'ca'>>;
  /** The relay's token towards the node servers. */
  agentToken?: string;
  agentCa?: Buffer;
  serve: ServeOptions;
  /** Node state changes, as they happen (connected, down, ...). */
  onNodeChange?: (state: pb.INodeState) => void;
}

export class Relay implements HubSource {
  links: AgentLink[] = [];
  private server?: StreamServer;
  private changedFlows = new Map<string, pb.IFlow>();
  private flowsDropped = 0;
  /** What the relay's clients want of the node servers now (a new link starts with it). */
  private request = upstreamRequest([]);
  /**
   * Links of node servers no longer listed, stopped, by URL: their counters
   * stay in the totals, and a server listed again (a node back in the
   * EndpointSlice, the same run) carries them on instead of counting its
   * run twice. At most GONE_LINKS_MAX (nodes come and go in an autoscaled
   * cluster); older ones are folded into lostByGone.
   */
  private readonly goneLinks = new Map<string, AgentLink>();
  private lostByGone = { kernel: 0, relay: 0, stages: {} as Record<string, number> };

  private constructor(private readonly opts: RelayOptions) {}

  static async start(opts: RelayOptions): Promise<Relay> {
    const relay = new Relay(opts);
    relay.server = await StreamServer.start(relay, opts.serve);
    relay.server.hub.onSubscriptions = (subs) => {
      relay.request = upstreamRequest(subs);
      for (const l of relay.links) l.apply(relay.request);
    };
    relay.setAgents(opts.agents);
    return relay;
  }

  /**
   * The node servers to merge (from --agent, or the agents' EndpointSlices
   * as nodes come and go): new ones are connected, gone ones let go.
   */
  setAgents(agents: RelayOptions['agents']): void {
    const wanted = new Map(agents.map((a) => [a.url, a]));
    for (const l of this.links) {
      if (wanted.has(l.url)) continue;
      l.stop();
      this.goneLinks.delete(l.url);
      if (this.goneLinks.size >= GONE_LINKS_MAX) this.foldGone(this.goneLinks.keys().next().value!);
      this.goneLinks.set(l.url, l);
      this.opts.onNodeChange?.({ ...l.nodeState(), state: 'removed' });
    }
    const kept = this.links.filter((l) => wanted.has(l.url));
    const have = new Set(kept.map((l) => l.url));
    for (const a of wanted.values()) {
      if (have.has(a.url)) continue;
      const link = new AgentLink(
        { ...a, token: this.opts.agentToken, ca: this.opts.agentCa },
        {
          events: (events) => this.server?.publish(events),
          flows: (flows) => this.takeFlows(flows),
          diagnosis: (d) => this.server?.hub.broadcastDiagnoses([d]),
          changed: (l) => this.opts.onNodeChange?.(l.nodeState()),
        },
      );
      const before = this.goneLinks.get(a.url);
      if (before) {
        link.carryOn(before);
        this.goneLinks.delete(a.url);
      }
      link.apply(this.request);
      link.start();
      kept.push(link);
    }
    this.links = kept;
  }

  /** A gone link's counters into the totals, the link let go. */
  private foldGone(url: string): void {
    const l = this.goneLinks.get(url)!;
    this.goneLinks.delete(url);
    this.lostByGone.kernel += l.kernelLost();
    this.lostByGone.relay += l.droppedForRelay();
    for (const [stage, n] of Object.entries(l.lostByStage())) this.lostByGone.stages[stage] = (this.lostByGone.stages[stage] ?? 0) + n;
  }

  /** The links whose counters make the totals: listed, and gone but remembered. */
  private countedLinks(): AgentLink[] {
    return this.goneLinks.size ? [...this.links, ...this.goneLinks.values()] : this.links;
  }

  url(): string {
    return this.server!.url();
  }

  // ---- HubSource: the node servers' view, merged ----

  get services(): string[] {
    return [...new Set(this.links.flatMap((l) => l.servicesSeen))];
  }

  get rules(): pb.IServiceRules[] {
    const bySvc = new Map<string, pb.IServiceRules>();
    for (const l of this.links) for (const r of l.rules) if (r.service && !bySvc.has(r.service)) bySvc.set(r.service, r);
    return [...bySvc.values()];
  }

  kernelLost(): number {
    return this.countedLinks().reduce((n, l) => n + l.kernelLost(), this.lostByGone.kernel);
  }

  lostByStage(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const losses of [this.lostByGone.stages, ...this.countedLinks().map((l) => l.lostByStage())]) {
      for (const [stage, n] of Object.entries(losses)) {
        // The node server's loss to its own clients (the relay among them) is counted as relay_upstream below.
        if (stage !== 'client_queues') out[stage] = (out[stage] ?? 0) + n;
      }
    }
    out.relay_upstream = this.countedLinks().reduce((n, l) => n + l.droppedForRelay(), this.lostByGone.relay);
    out.relay_flows = this.flowsDropped;
    return out;
  }

  activeFlows(): number {
    return this.links.reduce((n, l) => n + Number(l.status?.flowsActive ?? 0), 0);
  }

  dropsByReason(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const l of this.links) for (const [r, n] of Object.entries(l.status?.dropsByReason ?? {})) out[r] = (out[r] ?? 0) + Number(n);
    return out;
  }

  packetsDropped(): number {
    return this.links.reduce((n, l) => n + Number(l.status?.packetsDropped ?? 0), 0);
  }

  nodes(): pb.INodeState[] {
    return this.links.map((l) => l.nodeState());
  }

  private takeFlows(flows: pb.IFlow[]): void {
    for (const f of flows) {
      const key = `${f.node}/${String(f.id)}`;
      this.changedFlows.delete(key); // re-inserted last: the Map stays oldest-change first
      this.changedFlows.set(key, f);
    }
    while (this.changedFlows.size > MAX_CHANGED_FLOWS) {
      this.changedFlows.delete(this.changedFlows.keys().next().value!);
      this.flowsDropped++;
    }
  }

  takeChangedFlows(wanted: boolean): pb.IFlow[] {
    const out = wanted ? [...this.changedFlows.values()] : [];
    this.changedFlows.clear();
    return out;
  }

  async stop(): Promise<void> {
    for (const l of this.links) l.stop();
    await this.server?.close();
  }
}
