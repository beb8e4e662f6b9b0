/**
 * The node's state at the start of a recording: the rules (iptables, nft),
 * the conntrack entries of the traced services, routes, links, addresses and
 * IPVS, each taken inside the traced namespace. A command that is missing or
 * fails is recorded as such; it never stops the recording.
 */
import { longFromBigint } from '../flows/to-proto';
import { svctrace } from '../gen/svctrace';
import { ServiceSpec } from '../net/ipv4';
import { runInNetns } from '../netns/netns';

import pb = svctrace.v1;

async function runSection(name: string, netnsPath: string, argv: string[]): Promise<pb.ISnapshotSection> {
  const r = await runInNetns(netnsPath, argv);
  return {
    name,
    netns: netnsPath,
    command: argv.join(' '),
    output: r.stdout,
    exitCode: r.code,
    error: r.code === 0 ? '' : (r.stderr.trim() || `exit ${r.code}`).slice(0, 2000),
  };
}

function conntrackArgs(s: ServiceSpec): string[] {
  const args = ['conntrack', '-L', '-p', s.proto, '--orig-port-dst', String(s.port)];
  if (s.address) args.push('--orig-dst', s.address);
  return args;
}

export async function takeSnapshot(netnsPaths: string[], services: ServiceSpec[]): Promise<pb.INodeSnapshot> {
  const jobs: Array<Promise<pb.ISnapshotSection>> = [];
  for (const ns of netnsPaths) {
    jobs.push(
      runSection('iptables', ns, ['iptables-save']),
      runSection('nftables', ns, ['nft', 'list', 'ruleset']),
      runSection('routes', ns, ['ip', '-d', 'route', 'show', 'table', 'all']),
      runSection('links', ns, ['ip', '-d', 'link', 'show']),
      runSection('addresses', ns, ['ip', 'addr', 'show']),
      runSection('ipvs', ns, ['ipvsadm', '-Ln']),
    );
    for (const s of services) jobs.push(runSection(`conntrack ${s.text}`, ns, conntrackArgs(s)));
  }
  return { sections: await Promise.all(jobs), takenMonoNs: longFromBigint(process.hrtime.bigint()) };
}
