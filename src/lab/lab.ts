/**
 * The built-in lab: a simulated Kubernetes node made only of network
 * namespaces this process creates. A "node" namespace holds the bridge cni0,
 * kube-proxy-shaped iptables rules and svctrace's hooks; pod namespaces hang
 * off the bridge by veth and run src/lab/pod-server; a client namespace
 * reaches the node over its own veth. Nothing is added to the root namespace,
 * no namespace has a default route, and every object carries a per-run name
 * so a crashed run's leftovers can be found and removed by the next run.
 */
import { ChildProcess, execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { SvctraceError } from '../errors';
import { run, runIn } from './exec';
import { argvInNetns } from '../netns/netns';
import { KubeService, renderFilterTable, renderNatTable, renderNftKubeProxy } from './kube-rules';
import { IPVS_DEVICE, renderIpvs } from './kube-ipvs';

/** Every lab namespace name starts with this, then `<pid>-<random>-`. */
export const LAB_PREFIX = 'svt-';
const LAB_NAME_RE = /^svt-(\d+)-([0-9a-f]+)-/;

export const LAB_ADDR = {
  podCIDR: '10.244.0.0/16',
  bridgeIP: '10.244.1.1',
  podSubnetPrefix: '10.244.1.',
  podHostBase: 10,
  serviceCIDR: '10.96.0.0/12',
  nodeIP: '10.250.0.1',
  clientIP: '10.250.0.2',
  clientSubnet: '10.250.0.0/24',
  // second node (VXLAN)
  underlayNode: '10.250.1.1',
  underlayNode2: '10.250.1.2',
  tunnelNode: '10.244.100.1',
  tunnelNode2: '10.244.100.2',
  remoteBridgeIP: '10.244.2.1',
  remotePodSubnet: '10.244.2.0/24',
  remotePodIP: '10.244.2.10',
} as const;

export interface LabPod {
  name: string;
  netns: string;
  ip: string;
  /** Interface name of the pod's veth end in the node namespace. */
  hostVeth: string;
  pid?: number;
}

export interface ServedRequest {
  pod: string;
  proto: string;
  client: string;
  path?: string;
}

export interface LabOptions {
  /** Number of pods (default 3). */
  pods?: number;
  /** Add kube-proxy's MASQUERADE rule (default true). */
  masquerade?: boolean;
  /** Services to render; default: labServices(pods, remotePod). */
  services?: KubeService[];
  /** Add a second node joined by VXLAN, with one pod behind it (default false). */
  remoteNode?: boolean;
  /** kube-proxy mode the rules are written in (default iptables, via iptables-nft; iptables-legacy for old nodes; ipvs needs a kernel with IPVS, ipvsadm and ipset). */
  proxyMode?: ProxyMode;
  /**
   * Pods log each request they serve, read into `served` (default true): the
   * ground truth tests compare flows with. Benchmarks that do not read it
   * turn it off: the lines are parsed in the process that also runs the
   * pipeline under test (about 10 µs of its main thread per request), and
   * `served` grows with every request.
   */
  requestLog?: boolean;
}

export const PROXY_MODES = ['iptables', 'nftables', 'iptables-legacy', 'ipvs'] as const;
export type ProxyMode = (typeof PROXY_MODES)[number];

export const POD_HTTP_PORT = 8080;
export const POD_UDP_PORT = 5353;
/** How long a pod server may take to say it listens before the lab gives up on it. */
const POD_START_S = 30;

/** A port nothing in the lab listens on: a backend that answers with RST. */
export const POD_CLOSED_PORT = 9999;

/**
 * The lab's default Services: web (all pods, NodePort), kube-dns (UDP), empty
 * (no endpoints: REJECT), other (an untraced neighbour), closed (a backend
 * not listening), and remote (a pod on the second node, over VXLAN).
 */
export function labServices(pods: LabPod[], remotePod?: LabPod): KubeService[] {
  const http = pods.map((p) => ({ ip: p.ip, port: POD_HTTP_PORT }));
  const udp = pods.map((p) => ({ ip: p.ip, port: POD_UDP_PORT }));
  const extra: KubeService[] = [];
  if (remotePod) {
    extra.push({ namespace: 'default', name: 'remote', portName: 'http', clusterIP: '10.96.0.50', port: 80, proto: 'tcp', endpoints: [{ ip: remotePod.ip, port: POD_HTTP_PORT }] });
  }
  return [
    ...extra,
    { namespace: 'default', name: 'closed', portName: 'http', clusterIP: '10.96.0.160', port: 80, proto: 'tcp', endpoints: [{ ip: pods[0]!.ip, port: POD_CLOSED_PORT }] },
    { namespace: 'default', name: 'web', portName: 'http', clusterIP: '10.96.0.100', port: 80, proto: 'tcp', nodePort: 30080, endpoints: http },
    { namespace: 'kube-system', name: 'kube-dns', portName: 'dns', clusterIP: '10.96.0.10', port: 53, proto: 'udp', endpoints: udp },
    { namespace: 'default', name: 'empty', portName: 'http', clusterIP: '10.96.0.200', port: 80, proto: 'tcp', endpoints: [] },
    { namespace: 'default', name: 'other', portName: 'http', clusterIP: '10.96.0.150', port: 80, proto: 'tcp', endpoints: http.slice(0, 1) },
  ];
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function listNetns(): string[] {
  try {
    return execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })
      .split('\n')
      .map((l) => l.split(' ')[0] ?? '')
      .filter(Boolean);
  } catch {
    return [];
  }
}

/** Kills the processes left in a netns (our own crashed run's pod servers), then deletes it. */
function deleteNetnsSync(name: string): void {
  try {
    const pids = execFileSync('ip', ['netns', 'pids', name], { encoding: 'utf8' }).split('\n').filter(Boolean);
    for (const p of pids) {
      try {
        process.kill(Number(p), 'SIGKILL');
      } catch {
        // already gone
      }
    }
  } catch {
    // namespace vanished meanwhile
  }
  try {
    execFileSync('ip', ['netns', 'del', name], { stdio: 'ignore' });
  } catch {
    // already gone
  }
}

/** Removes lab namespaces whose creating process is dead. Returns their names. */
export function cleanupStaleLabs(): string[] {
  const removed: string[] = [];
  for (const ns of listNetns()) {
    const m = LAB_NAME_RE.exec(ns);
    if (!m) continue;
    if (pidAlive(Number(m[1]))) continue;
    deleteNetnsSync(ns);
    removed.push(ns);
  }
  return removed;
}

const openLabs = new Set<Lab>();
let exitHookInstalled = false;

export class Lab {
  readonly id: string;
  readonly nodeNetns: string;
  readonly clientNetns: string;
  readonly pods: LabPod[];
  /** The second node's namespace and pod, when the lab has one. */
  readonly node2Netns: string;
  remotePod?: LabPod;
  services: KubeService[] = [];
  /** Requests the pods served, from their logs (empty when the lab was made with requestLog: false). */
  readonly served: ServedRequest[] = [];
  private readonly servers = new Map<string, ChildProcess>();
  private readonly created: string[] = [];
  private torn = false;

  private constructor(
    podCount: number,
    private readonly requestLog: boolean,
  ) {
    this.id = `${process.pid}-${crypto.randomBytes(3).toString('hex')}`;
    this.nodeNetns = `${LAB_PREFIX}${this.id}-node`;
    this.clientNetns = `${LAB_PREFIX}${this.id}-client`;
    this.node2Netns = `${LAB_PREFIX}${this.id}-node2`;
    this.pods = Array.from({ length: podCount }, (_, i) => ({
      name: `pod${i}`,
      netns: `${LAB_PREFIX}${this.id}-pod${i}`,
      ip: `${LAB_ADDR.podSubnetPrefix}${LAB_ADDR.podHostBase + i}`,
      hostVeth: `veth${i}`,
    }));
  }

  /** Stands the lab up; on any failure tears down what it made and rethrows. */
  static async up(opts: LabOptions = {}): Promise<Lab> {
    if (process.getuid?.() !== 0) throw new SvctraceError('NOT_PERMITTED', 'the lab needs root (it creates network namespaces)');
    const podCount = opts.pods ?? 3;
    if (!Number.isInteger(podCount) || podCount < 1 || podCount > 50) {
      throw new SvctraceError('BAD_INPUT', 'lab pods must be 1..50');
    }
    cleanupStaleLabs();
    const lab = new Lab(podCount, opts.requestLog ?? true);
    openLabs.add(lab);
    if (!exitHookInstalled) {
      exitHookInstalled = true;
      process.once('exit', () => {
        for (const l of openLabs) l.downSync();
      });
    }
    try {
      await lab.build(opts);
    } catch (e) {
      lab.downSync();
      throw e;
    }
    return lab;
  }

  private async addNetns(name: string): Promise<void> {
    await run(['ip', 'netns', 'add', name]);
    this.created.push(name);
    await run(['ip', '-n', name, 'link', 'set', 'lo', 'up']);
  }

  private async build(opts: LabOptions): Promise<void> {
    const node = this.nodeNetns;
    const ipn = (...args: string[]) => run(['ip', '-n', node, ...args]);
    await this.addNetns(node);
    await runIn(node, ['sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    // Short conntrack timeouts so closed flows are destroyed quickly (lab
    // only). The sysctls exist once conntrack is loaded: on a fresh machine
    // (a VM of the kernel matrix) nothing has loaded it yet.
    if (!fs.existsSync('/proc/sys/net/netfilter/nf_conntrack_max')) await run(['modprobe', 'nf_conntrack'], { allowFail: true });
    await runIn(node, ['sysctl', '-qw', 'net.netfilter.nf_conntrack_tcp_timeout_time_wait=2'], { allowFail: true });
    await runIn(node, ['sysctl', '-qw', 'net.netfilter.nf_conntrack_tcp_timeout_close=2'], { allowFail: true });
    await ipn('link', 'add', 'cni0', 'type', 'bridge');
    await ipn('addr', 'add', `${LAB_ADDR.bridgeIP}/24`, 'dev', 'cni0');
    await ipn('link', 'set', 'cni0', 'up');
    // kube-proxy relies on a route existing for the service range; the lab's
    // node has no default route, so it gets this one instead.
    await ipn('route', 'add', LAB_ADDR.serviceCIDR, 'dev', 'cni0');

    for (const pod of this.pods) {
      await this.addNetns(pod.netns);
      // Both veth ends are created inside the node namespace; the peer moves
      // straight into the pod's: neither ever exists in the root namespace.
      await ipn('link', 'add', pod.hostVeth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.netns);
      await ipn('link', 'set', pod.hostVeth, 'master', 'cni0', 'up');
      const ipp = (...args: string[]) => run(['ip', '-n', pod.netns, ...args]);
      await ipp('addr', 'add', `${pod.ip}/24`, 'dev', 'eth0');
      await ipp('link', 'set', 'eth0', 'up');
      await ipp('route', 'add', LAB_ADDR.clientSubnet, 'via', LAB_ADDR.bridgeIP);
      await ipp('route', 'add', LAB_ADDR.serviceCIDR, 'via', LAB_ADDR.bridgeIP);
    }

    await this.addNetns(this.clientNetns);
    await ipn('link', 'add', 'vclient', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.clientNetns);
    await ipn('addr', 'add', `${LAB_ADDR.nodeIP}/24`, 'dev', 'vclient');
    await ipn('link', 'set', 'vclient', 'up');
    const ipc = (...args: string[]) => run(['ip', '-n', this.clientNetns, ...args]);
    await ipc('addr', 'add', `${LAB_ADDR.clientIP}/24`, 'dev', 'eth0');
    await ipc('link', 'set', 'eth0', 'up');
    await ipc('route', 'add', LAB_ADDR.serviceCIDR, 'via', LAB_ADDR.nodeIP);

    if (opts.remoteNode) await this.buildRemoteNode();

    this.services = opts.services ?? labServices(this.pods, this.remotePod);
    this.builtServices = structuredClone(this.services);
    this.proxyMode = opts.proxyMode ?? 'iptables';
    await this.loadRules({ masquerade: opts.masquerade !== false });
    const all = this.remotePod ? [...this.pods, this.remotePod] : this.pods;
    await Promise.all(all.map((p) => this.startServer(p)));
  }

  /**
   * A second node joined by a VXLAN tunnel (flannel-style, point to point over
   * an underlay veth), with its own bridge and one pod (10.244.2.10).
   */
  private async buildRemoteNode(): Promise<void> {
    const node = this.nodeNetns;
    const node2 = this.node2Netns;
    const ipn = (...args: string[]) => run(['ip', '-n', node, ...args]);
    const ip2 = (...args: string[]) => run(['ip', '-n', node2, ...args]);
    await this.addNetns(node2);
    await runIn(node2, ['sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    await ipn('link', 'add', 'underlay', 'type', 'veth', 'peer', 'name', 'underlay', 'netns', node2);
    await ipn('addr', 'add', `${LAB_ADDR.underlayNode}/24`, 'dev', 'underlay');
    await ipn('link', 'set', 'underlay', 'up');
    await ip2('addr', 'add', `${LAB_ADDR.underlayNode2}/24`, 'dev', 'underlay');
    await ip2('link', 'set', 'underlay', 'up');
    const vx = (local: string, remote: string) =>
      ['link', 'add', 'flannel.1', 'type', 'vxlan', 'id', '1', 'local', local, 'remote', remote, 'dstport', '8472', 'dev', 'underlay'];
    await ipn(...vx(LAB_ADDR.underlayNode, LAB_ADDR.underlayNode2));
    await ip2(...vx(LAB_ADDR.underlayNode2, LAB_ADDR.underlayNode));
    await ipn('addr', 'add', `${LAB_ADDR.tunnelNode}/24`, 'dev', 'flannel.1');
    await ip2('addr', 'add', `${LAB_ADDR.tunnelNode2}/24`, 'dev', 'flannel.1');
    await ipn('link', 'set', 'flannel.1', 'up');
    await ip2('link', 'set', 'flannel.1', 'up');
    await ipn('route', 'add', LAB_ADDR.remotePodSubnet, 'via', LAB_ADDR.tunnelNode2, 'dev', 'flannel.1');
    await ip2('route', 'add', '10.244.1.0/24', 'via', LAB_ADDR.tunnelNode, 'dev', 'flannel.1');
    await ip2('route', 'add', LAB_ADDR.clientSubnet, 'via', LAB_ADDR.tunnelNode, 'dev', 'flannel.1');
    await ip2('link', 'add', 'cni0', 'type', 'bridge');
    await ip2('addr', 'add', `${LAB_ADDR.remoteBridgeIP}/24`, 'dev', 'cni0');
    await ip2('link', 'set', 'cni0', 'up');

    const pod: LabPod = { name: 'rpod0', netns: `${LAB_PREFIX}${this.id}-rpod0`, ip: LAB_ADDR.remotePodIP, hostVeth: 'veth0' };
    await this.addNetns(pod.netns);
    await ip2('link', 'add', pod.hostVeth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod.netns);
    await ip2('link', 'set', pod.hostVeth, 'master', 'cni0', 'up');
    const ipp = (...args: string[]) => run(['ip', '-n', pod.netns, ...args]);
    await ipp('addr', 'add', `${pod.ip}/24`, 'dev', 'eth0');
    await ipp('link', 'set', 'eth0', 'up');
    for (const dst of ['10.244.1.0/24', LAB_ADDR.clientSubnet, `${LAB_ADDR.tunnelNode}/32`]) {
      await ipp('route', 'add', dst, 'via', LAB_ADDR.remoteBridgeIP);
    }
    this.remotePod = pod;
  }

  proxyMode: ProxyMode = 'iptables';
  /** Whether the loaded rules have kube-proxy's MASQUERADE rule. */
  masquerade = true;
  /** The services the lab was built with (resetRules). */
  private builtServices: KubeService[] = [];

  /** (Re)loads the kube-proxy rules into the node namespace, in the lab's proxy mode. */
  async loadRules(opts: { masquerade: boolean }): Promise<void> {
    this.masquerade = opts.masquerade;
    if (this.proxyMode === 'ipvs') return this.loadIpvs(opts);
    if (this.proxyMode === 'nftables') {
      const script = renderNftKubeProxy(this.services, { clusterCIDR: LAB_ADDR.podCIDR, masquerade: opts.masquerade });
      await runIn(this.nodeNetns, ['nft', '-f', '-'], { input: script });
      return;
    }
    const text =
      renderNatTable(this.services, { clusterCIDR: LAB_ADDR.podCIDR, masquerade: opts.masquerade }) +
      renderFilterTable(this.services);
    await runIn(this.nodeNetns, [this.proxyMode === 'iptables-legacy' ? 'iptables-legacy-restore' : 'iptables-restore'], { input: text });
  }

  /**
   * kube-proxy's IPVS mode (kube-ipvs.ts). The ip_vs modules are loaded by
   * the kernel on the first ipvsadm command; IPVS state itself is per
   * namespace, like the dummy device, the ipsets and the rules.
   */
  private async loadIpvs(opts: { masquerade: boolean }): Promise<void> {
    if (!fs.existsSync('/proc/net/ip_vs')) await run(['modprobe', 'ip_vs'], { allowFail: true });
    if (!fs.existsSync('/proc/net/ip_vs')) {
      throw new SvctraceError('LAB', 'kube-proxy IPVS mode needs IPVS in the kernel (CONFIG_IP_VS), which this kernel lacks; the VM matrix (npm run test:kernels) has it');
    }
    await run(['modprobe', 'ip_vs_rr'], { allowFail: true });
    const r = renderIpvs(this.services, { clusterCIDR: LAB_ADDR.podCIDR, nodeIPs: [LAB_ADDR.nodeIP], masquerade: opts.masquerade });
    const ns = this.nodeNetns;
    await runIn(ns, ['ip', 'link', 'add', IPVS_DEVICE, 'type', 'dummy'], { allowFail: true });
    await runIn(ns, ['ip', 'addr', 'flush', 'dev', IPVS_DEVICE]);
    for (const a of r.addresses) await runIn(ns, ['ip', 'addr', 'add', `${a}/32`, 'dev', IPVS_DEVICE]);
    // The reply tuple then names the real server, and masquerade works.
    await runIn(ns, ['sysctl', '-qw', 'net.ipv4.vs.conntrack=1']);
    await runIn(ns, ['ipset', 'restore'], { input: r.ipset });
    await runIn(ns, ['iptables-restore'], { input: r.iptables });
    await runIn(ns, ['ipvsadm', '-C']);
    await runIn(ns, ['ipvsadm', '-R'], { input: r.ipvsadm });
  }

  private startServer(pod: LabPod): Promise<void> {
    const script = path.join(__dirname, 'pod-server.js');
    const [cmd, ...args] = argvInNetns(pod.netns, [process.execPath, script, '--name', pod.name, '--port', String(POD_HTTP_PORT), '--udp-port', String(POD_UDP_PORT), ...(this.requestLog ? [] : ['--no-request-log'])]);
    const child = spawn(cmd!, args, { stdio: ['pipe', 'pipe', 'inherit'] });
    this.servers.set(pod.name, child);
    pod.pid = child.pid;
    return new Promise((resolve, reject) => {
      // A guard against a server that hangs, not a deadline: the pods' Node
      // processes start at once, and an emulated guest's two vCPUs have taken
      // a few seconds for one.
      const timer = setTimeout(() => reject(new SvctraceError('LAB', `pod server ${pod.name} did not start within ${POD_START_S} s`)), POD_START_S * 1000);
      child.once('error', (e) => reject(new SvctraceError('LAB', `pod server ${pod.name}: ${e.message}`)));
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new SvctraceError('LAB', `pod server ${pod.name} exited (${code})`));
      });
      readline.createInterface({ input: child.stdout! }).on('line', (line) => {
        let msg: { event?: string } & ServedRequest;
        try {
          msg = JSON.parse(line);
        } catch {
          return;
        }
        if (msg.event === 'ready') {
          clearTimeout(timer);
          resolve();
        } else if (msg.event === 'request') {
          this.served.push({ pod: msg.pod, proto: msg.proto, client: msg.client, path: msg.path });
        }
      });
    });
  }

  /** The node's address as the client namespace reaches it (NodePort target). */
  nodeIPForClient(): string {
    return LAB_ADDR.nodeIP;
  }

  /**
   * Makes conntrack destroy the node's expired entries now. The kernel reaps
   * them lazily (its GC may wait up to a minute); a table dump reaps the
   * expired entries it walks over, which emits their DESTROY events.
   */
  async reapConntrack(): Promise<void> {
    await runIn(this.nodeNetns, ['conntrack', '-L'], { allowFail: true });
  }

  /**
   * How many of the node's conntrack entries are TCP connections to `address`
   * (a ClusterIP) that the rules sent to `backend`: the picks among a
   * Service's pods are random, and a test about one pod needs some of them.
   */
  async connectionsTo(address: string, backend: string): Promise<number> {
    const r = await runIn(this.nodeNetns, ['conntrack', '-L', '-p', 'tcp', '--orig-dst', address, '--reply-src', backend], { allowFail: true });
    return r.stdout.split('\n').filter((l) => l.includes(`src=${backend}`)).length;
  }

  podByIP(ip: string): LabPod | undefined {
    return [...this.pods, ...(this.remotePod ? [this.remotePod] : [])].find((p) => p.ip === ip);
  }

  /**
   * A pod disappears without its endpoint leaving the rules (a "ghost"
   * endpoint): its server is stopped and its namespace, veth included, deleted.
   */
  async removePod(name: string): Promise<LabPod> {
    const pod = this.pods.find((p) => p.name === name);
    if (!pod) throw new SvctraceError('INTERNAL', `lab has no pod ${name}`);
    const child = this.servers.get(name);
    if (child?.pid && child.exitCode === null) {
      child.removeAllListeners('exit');
      process.kill(child.pid, 'SIGKILL');
    }
    this.servers.delete(name);
    deleteNetnsSync(pod.netns);
    const i = this.created.indexOf(pod.netns);
    if (i >= 0) this.created.splice(i, 1);
    return pod;
  }

  /** The pod receives but never answers: its replies are dropped inside it. */
  async blockReplies(name: string): Promise<void> {
    const pod = this.pods.find((p) => p.name === name);
    if (!pod) throw new SvctraceError('INTERNAL', `lab has no pod ${name}`);
    await runIn(pod.netns, ['iptables', '-A', 'OUTPUT', '-j', 'DROP']);
  }

  /**
   * The pod's own firewall drops or rejects new connections to a port: a
   * filtered backend. REJECT answers with a TCP reset (as if nothing
   * listened), REJECT-ICMP with a port-unreachable (iptables' default).
   */
  async filterPort(name: string, port: number, verdict: 'DROP' | 'REJECT' | 'REJECT-ICMP' = 'DROP'): Promise<void> {
    const pod = this.pod(name);
    const target = verdict === 'DROP' ? ['DROP'] : verdict === 'REJECT' ? ['REJECT', '--reject-with', 'tcp-reset'] : ['REJECT', '--reject-with', 'icmp-port-unreachable'];
    await runIn(pod.netns, ['iptables', '-A', 'INPUT', '-p', 'tcp', '--dport', String(port), '-j', ...target]);
  }

  /**
   * Makes the bridge forget every MAC at once (ageing time 0), so that it
   * floods every frame to every pod, as a node's bridge does to a pod that
   * only received for five minutes (its entry aged out); `false` restores
   * the default ageing (300 s).
   */
  async floodBridge(on: boolean): Promise<void> {
    // iproute2 takes the ageing time in centiseconds.
    await runIn(this.nodeNetns, ['ip', 'link', 'set', 'cni0', 'type', 'bridge', 'ageing_time', on ? '0' : '30000']);
  }

  /** Removes what filterPort and blockReplies added. */
  async unfilter(name: string): Promise<void> {
    const pod = this.pod(name);
    await runIn(pod.netns, ['iptables', '-F', 'INPUT']);
    await runIn(pod.netns, ['iptables', '-F', 'OUTPUT']);
  }

  pod(name: string): LabPod {
    const pod = [...this.pods, ...(this.remotePod ? [this.remotePod] : [])].find((p) => p.name === name);
    if (!pod) throw new SvctraceError('INTERNAL', `lab has no pod ${name}`);
    return pod;
  }

  /** The pod's server stops (the pod stays): nothing listens on its port. */
  async stopServer(name: string): Promise<void> {
    const child = this.servers.get(name);
    if (!child) return;
    this.servers.delete(name);
    child.removeAllListeners('exit');
    const gone = new Promise((resolve) => child.once('exit', resolve));
    if (child.exitCode === null && child.pid) process.kill(child.pid, 'SIGKILL');
    await gone;
  }

  /** Starts the pod's server again (after stopServer). */
  async restartServer(name: string): Promise<void> {
    if (!this.servers.has(name)) await this.startServer(this.pod(name));
  }

  /**
   * A stale rule (iptables mode): the DNAT of the endpoint chain written for
   * `podName` is rewritten to send connections to `to`, an address with no
   * pod; the chain's hairpin rule still names the pod. Returns the chain.
   */
  async staleRule(podName: string, to: string): Promise<string> {
    const pod = this.pod(podName);
    if (this.proxyMode === 'nftables') return this.staleNftRule(pod, to);
    const rules = (await runIn(this.nodeNetns, ['iptables-save', '-t', 'nat'])).stdout.split('\n');
    const dnat = rules.find((l) => /^-A KUBE-SEP-\S+ .*-j DNAT --to-destination /.test(l) && l.includes(`--to-destination ${pod.ip}:${POD_HTTP_PORT}`));
    if (!dnat) throw new SvctraceError('INTERNAL', `no DNAT rule to ${pod.ip}:${POD_HTTP_PORT}`);
    const chain = dnat.split(' ')[1]!;
    const index = rules.filter((l) => l.startsWith(`-A ${chain} `)).indexOf(dnat) + 1;
    const spec = dnat.split(' ').slice(2).join(' ').replace(`--to-destination ${pod.ip}:`, `--to-destination ${to}:`);
    await runIn(this.nodeNetns, ['sh', '-c', `iptables -t nat -R ${chain} ${index} ${spec}`]);
    return chain;
  }

  /** staleRule in nftables mode: the endpoint chain's dnat rule is replaced; its name and hairpin rule still name the pod. */
  private async staleNftRule(pod: LabPod, to: string): Promise<string> {
    const out = JSON.parse((await runIn(this.nodeNetns, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy'])).stdout) as { nftables: Array<Record<string, { chain?: string; handle?: number; expr?: unknown[] }>> };
    for (const item of out.nftables) {
      const rule = item.rule;
      if (!rule?.chain?.startsWith('endpoint-') || !rule.chain.endsWith(`__${pod.ip}/${POD_HTTP_PORT}`)) continue;
      if (!JSON.stringify(rule.expr).includes('"dnat"')) continue;
      await runIn(this.nodeNetns, ['nft', 'replace', 'rule', 'ip', 'kube-proxy', rule.chain, 'handle', String(rule.handle), 'meta', 'l4proto', 'tcp', 'dnat', 'to', `${to}:${POD_HTTP_PORT}`]);
      return rule.chain;
    }
    throw new SvctraceError('INTERNAL', `no nftables dnat rule to ${pod.ip}:${POD_HTTP_PORT}`);
  }

  /** Re-renders the rules with a service's endpoints. */
  async setEndpoints(service: string, endpoints: KubeService['endpoints']): Promise<void> {
    this.service(service).endpoints = endpoints;
    await this.loadRules({ masquerade: this.masquerade });
  }

  /** Re-renders the rules without a service (kube-proxy not synced, or the Service missing from the rules). */
  async dropService(service: string): Promise<void> {
    this.service(service);
    this.services = this.services.filter((s) => s.name !== service);
    await this.loadRules({ masquerade: this.masquerade });
  }

  /** The lab's rules as built: every service with its endpoints, masquerade on, no affinity. */
  async resetRules(): Promise<void> {
    this.services = structuredClone(this.builtServices);
    await this.loadRules({ masquerade: true });
  }

  /**
   * Fills the node namespace's conntrack table to `fraction` of
   * nf_conntrack_max with entries for addresses nothing uses, in one batch
   * (conntrack -R). nf_conntrack_max is global (read-only in a namespace) but
   * the count is per namespace: nothing outside the lab is touched.
   */
  async fillConntrack(fraction: number): Promise<void> {
    const max = Number((await runIn(this.nodeNetns, ['cat', '/proc/sys/net/netfilter/nf_conntrack_max'])).stdout);
    const count = Number((await runIn(this.nodeNetns, ['cat', '/proc/sys/net/netfilter/nf_conntrack_count'])).stdout);
    const n = Math.ceil(max * fraction) - count;
    if (!(n > 0 && n < 5_000_000)) throw new SvctraceError('LAB', `cannot fill conntrack to ${fraction} of ${max}`);
    const lines: string[] = [];
    for (let i = 0; i < n; i++) {
      lines.push(`-I -s 10.199.${(i >> 16) & 255}.${(i >> 8) & 255} -d 10.198.0.${i & 255} -p tcp --sport ${1024 + (i % 60000)} --dport 9 --state ESTABLISHED -t 600`);
    }
    const file = path.join(os.tmpdir(), `svt-ct-${this.id}.txt`);
    fs.writeFileSync(file, lines.join('\n') + '\n');
    try {
      await runIn(this.nodeNetns, ['conntrack', '-R', file], { timeoutMs: 120_000, allowFail: true });
    } finally {
      fs.rmSync(file, { force: true });
    }
  }

  /** Forgets the node's conntrack entries and neighbours: the next fault starts from a clean node. */
  async flushNodeState(): Promise<void> {
    await runIn(this.nodeNetns, ['conntrack', '-F'], { allowFail: true });
    await runIn(this.nodeNetns, ['ip', 'neigh', 'flush', 'all'], { allowFail: true });
  }

  /** Re-renders the rules with a service's externalTrafficPolicy. */
  async setExternalTrafficPolicy(service: string, policy: 'Cluster' | 'Local'): Promise<void> {
    this.service(service).externalTrafficPolicy = policy;
    await this.loadRules({ masquerade: this.masquerade });
  }

  /** Re-renders the rules with sessionAffinity: ClientIP for a service. */
  async setAffinity(service: string, seconds: number | undefined): Promise<void> {
    this.service(service).affinitySeconds = seconds;
    await this.loadRules({ masquerade: this.masquerade });
  }

  /** Loads the rules again with or without kube-proxy's MASQUERADE (for the NodePort client-IP experiment). */
  async setMasquerade(on: boolean): Promise<void> {
    // iptables-restore replaces the nat and filter tables whole.
    await this.loadRules({ masquerade: on });
  }

  service(name: string): KubeService {
    const s = this.services.find((x) => x.name === name);
    if (!s) throw new SvctraceError('INTERNAL', `lab has no service ${name}`);
    return s;
  }

  /** HTTP GET with curl from the node (like curl on a node) or from the client namespace. */
  async curl(url: string, from: 'node' | 'client' = 'node', extra: string[] = [], maxTimeS = 5): Promise<{ ok: boolean; body: string; stderr: string }> {
    const ns = from === 'node' ? this.nodeNetns : this.clientNetns;
    // curl's own limit covers the transfer; the process limit adds time for
    // starting it, which a busy emulated guest has taken more than 5 s for.
    const r = await runIn(ns, ['curl', '-sS', '--max-time', String(maxTimeS), ...extra, url], { allowFail: true, timeoutMs: maxTimeS * 2000 + 10_000 });
    return { ok: r.stdout.startsWith('pod='), body: r.stdout, stderr: r.stderr };
  }

  /** Number of network namespaces of this lab that still exist. */
  leftovers(): string[] {
    const mine = `${LAB_PREFIX}${this.id}-`;
    return listNetns().filter((n) => n.startsWith(mine));
  }

  /** Tears everything down: pod servers (by PID), then every namespace. */
  async down(): Promise<void> {
    this.downSync();
  }

  downSync(): void {
    if (this.torn) return;
    this.torn = true;
    for (const child of this.servers.values()) {
      child.removeAllListeners('exit');
      child.stdin?.destroy();
      if (child.exitCode === null && child.pid) {
        try {
          process.kill(child.pid, 'SIGKILL');
        } catch {
          // already exited
        }
      }
    }
    for (const ns of [...this.created].reverse()) deleteNetnsSync(ns);
    openLabs.delete(this);
  }
}

/** Exposed for tests: is a lab namespace name one of ours. */
export function isLabNetns(name: string): boolean {
  return LAB_NAME_RE.test(name);
}

/** True when the lab can run here (root and the tools it calls). */
export function labPrerequisites(): string[] {
  const missing: string[] = [];
  if (process.getuid?.() !== 0) missing.push('root');
  for (const tool of ['ip', 'iptables-restore', 'curl']) {
    const found = (process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin')
      .split(':')
      .concat(['/usr/sbin', '/sbin'])
      .some((d) => fs.existsSync(path.join(d, tool)));
    if (!found) missing.push(tool);
  }
  return missing;
}
