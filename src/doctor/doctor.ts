/**
 * `svctrace doctor`: what this node's kernel and tools let svctrace do. Core
 * checks (required) decide whether tracing can work at all; optional ones
 * are enrichments svctrace uses when present. Kernel features are probed by
 * loading real programs (native/probe.cc), not guessed from versions.
 */
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { addonPath, loadBinding, NativeFeatures, ProbeResult } from '../native/binding';
import { Backend, chooseBackend } from '../tracer/backend';
import { argvInNetns, CURRENT_NETNS, resolveNetns } from '../netns/netns';
import { readKernelConfig } from './kernel-config';

export interface Check {
  id: string;
  name: string;
  ok: boolean;
  /** Needed by the core tracing path; a failed required check means svctrace cannot trace. */
  required: boolean;
  detail: string;
  /** What to do when it is missing. */
  hint?: string;
  /** The backend check only: what --backend auto picks here. */
  backend?: Backend;
}

export interface DoctorReport {
  ready: boolean;
  kernel: string;
  checks: Check[];
}

const CAP = { NET_ADMIN: 12, SYS_ADMIN: 21, PERFMON: 38, BPF: 39 } as const;

function effectiveCaps(): bigint {
  const status = fs.readFileSync('/proc/self/status', 'utf8');
  const m = /^CapEff:\s*([0-9a-f]+)$/m.exec(status);
  return m ? BigInt('0x' + m[1]) : 0n;
}

function hasCap(caps: bigint, bit: number): boolean {
  return (caps & (1n << BigInt(bit))) !== 0n;
}

function capabilityCheck(): Check {
  const caps = effectiveCaps();
  const names = Object.entries(CAP)
    .filter(([, bit]) => hasCap(caps, bit))
    .map(([n]) => `CAP_${n}`);
  const ok =
    hasCap(caps, CAP.SYS_ADMIN) && hasCap(caps, CAP.NET_ADMIN)
      ? true
      : hasCap(caps, CAP.BPF) && hasCap(caps, CAP.NET_ADMIN) && hasCap(caps, CAP.PERFMON);
  return {
    id: 'privileges',
    name: 'root/capabilities',
    ok,
    required: true,
    detail: `uid ${process.getuid?.()}; effective: ${names.join(', ') || 'none of the needed capabilities'}`,
    hint: ok ? undefined : 'run as root or with CAP_BPF+CAP_NET_ADMIN+CAP_PERFMON',
  };
}

function fromProbe(id: string, name: string, r: ProbeResult | undefined, required: boolean, okDetail: string, hint: string): Check {
  if (!r) return { id, name, ok: false, required, detail: 'not probed (no privileges)', hint: 'run as root' };
  return { id, name, ok: r.ok, required, detail: r.ok ? okDetail : `${r.code}: ${r.message}`, hint: r.ok ? undefined : hint };
}

/** The attach backend `trace` would use with --backend auto, and why. */
function backendCheck(features: NativeFeatures | undefined): Check {
  const id = 'backend', name = 'attach backend';
  if (!features) return { id, name, ok: false, required: true, detail: 'not probed (no privileges)', hint: 'run as root' };
  try {
    const c = chooseBackend('auto', features);
    return { id, name, ok: true, required: true, detail: c.reason, backend: c.backend };
  } catch (e) {
    return { id, name, ok: false, required: true, detail: (e as Error).message, hint: 'svctrace needs netfilter links (Linux >= 6.4), fentry with module BTF, or kprobes (CONFIG_KPROBES=y), with nf_nat loaded' };
  }
}

function run(cmd: string, args: string[]): string | null {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 10_000 });
  } catch {
    return null;
  }
}

function inNetns(netnsPath: string | undefined, cmd: string, args: string[]): string | null {
  const [c, ...a] = argvInNetns(netnsPath ?? CURRENT_NETNS, [cmd, ...args]);
  return run(c!, a);
}

function iptablesBackendCheck(): Check {
  const v = run('iptables', ['-V']);
  if (!v) return { id: 'iptables', name: 'iptables backend', ok: false, required: false, detail: 'iptables not found', hint: 'apt-get install iptables' };
  const backend = v.includes('nf_tables') ? 'nft' : v.includes('legacy') ? 'legacy' : 'unknown';
  return { id: 'iptables', name: 'iptables backend', ok: true, required: false, detail: `${backend} (${v.trim()})` };
}

/** kube-proxy's mode, inferred from what is loaded in the namespace. */
export function detectKubeProxyMode(netnsPath?: string): { mode: 'iptables' | 'nftables' | 'ipvs' | 'none'; evidence: string } {
  const nat = inNetns(netnsPath, 'iptables-save', ['-t', 'nat']);
  const ipvsLink = inNetns(netnsPath, 'ip', ['-o', 'link', 'show', 'kube-ipvs0']);
  if (ipvsLink && ipvsLink.includes('kube-ipvs0')) return { mode: 'ipvs', evidence: 'link kube-ipvs0 present' };
  const nft = inNetns(netnsPath, 'nft', ['list', 'table', 'ip', 'kube-proxy']);
  if (nft !== null) return { mode: 'nftables', evidence: "nftables table 'ip kube-proxy' present" };
  if (nat && nat.includes(':KUBE-SERVICES')) {
    const svcs = (nat.match(/^:KUBE-SVC-/gm) ?? []).length;
    return { mode: 'iptables', evidence: `KUBE-SERVICES chain in the nat table, ${svcs} KUBE-SVC chains` };
  }
  return { mode: 'none', evidence: 'no KUBE-SERVICES chain, no kube-proxy nft table, no kube-ipvs0' };
}

/** Runs every check. `netns` names the namespace whose rules are inspected (default: our own). */
export function runDoctor(opts: { netns?: string } = {}): DoctorReport {
  const netnsPath = opts.netns !== undefined ? resolveNetns(opts.netns) : undefined;
  const kernel = fs.readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim();
  const config = readKernelConfig();
  const checks: Check[] = [];
  const priv = capabilityCheck();
  checks.push(priv);

  const btf = fs.existsSync('/sys/kernel/btf/vmlinux');
  checks.push({
    id: 'btf', name: 'kernel BTF', ok: btf, required: true,
    detail: btf ? '/sys/kernel/btf/vmlinux present (CO-RE)' : '/sys/kernel/btf/vmlinux missing',
    hint: btf ? undefined : 'use a kernel built with CONFIG_DEBUG_INFO_BTF=y',
  });

  const mounts = fs.readFileSync('/proc/mounts', 'utf8');
  const bpffs = /^\S+ \/sys\/fs\/bpf bpf /m.test(mounts);
  checks.push({
    id: 'bpffs', name: 'bpffs', ok: bpffs, required: false,
    detail: bpffs ? '/sys/fs/bpf mounted' : '/sys/fs/bpf not mounted (svctrace pins nothing; only bpftool inspection needs it)',
    hint: bpffs ? undefined : 'mount -t bpf bpf /sys/fs/bpf',
  });

  let features;
  if (priv.ok) {
    try {
      features = loadBinding().probeFeatures();
      const file = addonPath();
      const kind = file.includes(`${path.sep}prebuilds${path.sep}`) ? 'prebuilt' : 'local build';
      checks.push({ id: 'addon', name: 'native addon', ok: true, required: true, detail: `${kind}: ${file}` });
    } catch (e) {
      checks.push({ id: 'addon', name: 'native addon', ok: false, required: true, detail: (e as Error).message, hint: "run 'npm run build'" });
    }
  }
  checks.push(fromProbe('ringbuf', 'ring buffer', features?.ringbuf, true, 'BPF_MAP_TYPE_RINGBUF created', 'needs Linux >= 5.8'));
  checks.push(fromProbe('netfilterLink', 'netfilter link', features?.netfilterLink, false,
    'BPF netfilter program attached with a link in a scratch namespace (backend netfilter)', 'needs Linux >= 6.4 with CONFIG_NETFILTER_BPF_LINK=y and libbpf >= 1.3; without it the fentry or kprobe backend is used'));
  checks.push(fromProbe('natFentry', 'fentry on nf_nat', features?.natFentry, false,
    'fentry attached to nf_nat_ipv4_pre_routing (backend fentry)', 'needs BPF trampolines and module BTF (CONFIG_DEBUG_INFO_BTF_MODULES=y), with nf_nat loaded'));
  checks.push(fromProbe('natKprobe', 'kprobe on nf_nat', features?.natKprobe, false,
    'kprobe attached to nf_nat_ipv4_pre_routing (backend kprobe)', 'needs CONFIG_KPROBES=y, with nf_nat loaded'));
  checks.push(backendCheck(features));
  checks.push(fromProbe('tpBtf', 'tp_btf', features?.tpBtf, true, 'tp_btf/kfree_skb loaded and attached (drops)', 'needs BTF-enabled tracepoints (Linux >= 5.5 with CONFIG_DEBUG_INFO_BTF=y)'));
  checks.push(fromProbe('dropReason', 'drop reasons', features?.dropReason, false, "kfree_skb carries the kernel's drop reason",
    "optional: this kernel's kfree_skb has no drop reason (Linux < 5.17): drops show as UNKNOWN, named by the kernel function that freed the packet (UNKNOWN@nf_hook_slow: a netfilter rule's DROP)"));
  checks.push(fromProbe('kprobe', 'kprobes', features?.kprobe, false, 'kprobe attached to a vmlinux function',
    'optional: kprobes unavailable on this kernel (only the kprobe backend needs them)'));
  checks.push(fromProbe('fentry', 'fentry', features?.fentry, false, 'fentry program loaded and attached to a vmlinux function',
    'optional: fentry/fexit unavailable'));

  const ipvsLoaded = fs.existsSync('/proc/net/ip_vs');
  const ipvsConfig = config?.get('CONFIG_IP_VS');
  checks.push({
    id: 'ipvs', name: 'IPVS', ok: ipvsLoaded || ipvsConfig === 'y', required: false,
    detail: ipvsLoaded ? '/proc/net/ip_vs present' : ipvsConfig === 'm' ? 'ip_vs is a module, not loaded' : ipvsConfig === 'y' ? 'built in' : 'not built into this kernel',
    hint: ipvsLoaded || ipvsConfig === 'y' ? undefined : ipvsConfig === 'm' ? 'optional: modprobe ip_vs (only for kube-proxy IPVS mode)' : 'optional: only kube-proxy IPVS mode needs it',
  });

  const ctEvents = fs.existsSync('/proc/sys/net/netfilter/nf_conntrack_events');
  let ctEventsOn = false;
  if (ctEvents) ctEventsOn = fs.readFileSync('/proc/sys/net/netfilter/nf_conntrack_events', 'utf8').trim() !== '0';
  checks.push({
    id: 'conntrackEvents', name: 'conntrack events', ok: ctEvents && ctEventsOn, required: true,
    detail: !ctEvents ? 'net.netfilter.nf_conntrack_events missing (CONFIG_NF_CONNTRACK_EVENTS off or conntrack not loaded)' : ctEventsOn ? 'enabled (flow destruction seen via netlink)' : 'disabled by sysctl',
    hint: !ctEvents ? 'needs CONFIG_NF_CONNTRACK_EVENTS=y and nf_conntrack loaded' : ctEventsOn ? undefined : 'sysctl -w net.netfilter.nf_conntrack_events=1',
  });

  checks.push(iptablesBackendCheck());
  const kp = detectKubeProxyMode(netnsPath);
  checks.push({ id: 'kubeProxy', name: 'kube-proxy mode', ok: kp.mode !== 'none', required: false, detail: `${kp.mode}: ${kp.evidence}`,
    hint: kp.mode === 'none' ? 'no kube-proxy rules here; use --netns to inspect another namespace' : undefined });

  return { ready: checks.every((c) => c.ok || !c.required), kernel, checks };
}

/** One line per check: status, name, detail, and what to do. */
export function formatDoctor(r: DoctorReport): string {
  const lines = [`svctrace doctor — kernel ${r.kernel}`];
  for (const c of r.checks) {
    const status = c.ok ? 'OK     ' : 'MISSING';
    const tag = c.required ? '' : ' (optional)';
    lines.push(`${status}  ${c.name.padEnd(18)} ${c.detail}${tag}${c.hint && !c.ok ? ` — ${c.hint}` : ''}`);
  }
  lines.push(r.ready ? 'ready: the core tracing path works on this node' : 'NOT READY: a required check failed (see above)');
  return lines.join('\n');
}
