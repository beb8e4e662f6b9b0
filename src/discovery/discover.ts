/**
 * Discovers the Services a node's kube-proxy programmed, from the rules
 * loaded in a network namespace: nftables mode (table ip kube-proxy) when
 * present, else iptables mode (iptables-save), plus IPVS when ipvsadm
 * answers. Missing tools are warnings, never errors.
 */
import { CURRENT_NETNS, runInNetns } from '../netns/netns';
import { parseIptablesSave } from './iptables';
import { parseNftKubeProxy } from './nftables';
import { parseIpvsadm, withIptablesMasquerade, withIpvsNodePorts } from './ipvs';
import { Discovery } from './model';

export async function discover(netnsPath: string = CURRENT_NETNS): Promise<Discovery> {
  const [nft, ipt] = await Promise.all([
    runInNetns(netnsPath, ['nft', '-j', 'list', 'table', 'ip', 'kube-proxy']),
    runInNetns(netnsPath, ['iptables-save']),
  ]);
  const warnings: string[] = [];
  // IPVS mode: the balancing is IPVS's, but kube-proxy's masquerade is still
  // an iptables rule (KUBE-POSTROUTING), read from there.
  const ipvs = await runInNetns(netnsPath, ['ipvsadm', '-Ln']);
  if (ipvs.code === 0) {
    let d = parseIpvsadm(ipvs.stdout);
    if (d.services.length) {
      // Which virtual services are NodePorts, and their traffic policy, are in kube-proxy's ipsets.
      const sets = await runInNetns(netnsPath, ['ipset', 'save']);
      if (sets.code === 0) d = withIpvsNodePorts(d, sets.stdout);
      else d = { ...d, warnings: [...d.warnings, `ipset save: ${sets.stderr.trim() || `exit ${sets.code}`} (NodePorts' traffic policy unknown)`] };
      return ipt.code === 0 ? withIptablesMasquerade(d, ipt.stdout) : d;
    }
  }
  if (nft.code === 0) {
    const d = parseNftKubeProxy(nft.stdout);
    if (d.services.length) return d;
    warnings.push(...d.warnings);
  }
  if (ipt.code === 0) {
    const d = parseIptablesSave(ipt.stdout);
    if (d.mode !== 'none') return { ...d, backend: /nf_tables/.test(ipt.stdout) || !/legacy/.test(ipt.stdout) ? 'nft' : 'legacy', warnings: [...warnings, ...d.warnings] };
  } else {
    warnings.push(`iptables-save: ${ipt.stderr.trim() || `exit ${ipt.code}`}`);
  }
  // Rules kube-proxy wrote with iptables-legacy are invisible to iptables-nft.
  const legacy = await runInNetns(netnsPath, ['iptables-legacy-save']);
  if (legacy.code === 0) {
    const d = parseIptablesSave(legacy.stdout);
    if (d.mode !== 'none') return { ...d, backend: 'legacy', warnings: [...warnings, ...d.warnings] };
  }
  const refused = [nft, ipt].map((r) => r.stderr).find((e) => PERMISSION.test(e));
  if (refused && ipt.code !== 0) return { mode: 'none', services: [], masqueradeRule: false, warnings, unreadable: refused.trim().split('\n')[0]! };
  // No reader at all (a minimal image, a node without iptables): nothing
  // was read, so nothing can be said to be missing from the rules.
  if ([nft, ipt, legacy, ipvs].every(notInstalled)) {
    return { mode: 'none', services: [], masqueradeRule: false, warnings, readersMissing: ['nft', 'iptables-save', 'iptables-legacy-save', 'ipvsadm'] };
  }
  return { mode: 'none', services: [], masqueradeRule: false, warnings };
}

/**
 * The command itself is absent: nsenter could not execute it (127, "failed
 * to execute"), or execFile could not (ENOENT, "not installed"). A command
 * a signal ended (a timeout, a Ctrl-C) reads 128 + the signal, not this.
 */
const notInstalled = (r: { code: number; stderr: string }) => r.code === 127 && /failed to execute|not installed/.test(r.stderr);

/** What nft and iptables say when they may not read the rules (not root, no CAP_NET_ADMIN). */
const PERMISSION = /permission denied|operation not permitted|you must be root|must be run as root/i;
