/**
 * The node's state at the start of a recording: the rules (iptables, nft),
 * the conntrack entries of the traced services, routes, links, addresses and
 * IPVS, each taken inside the traced namespace. A command that is missing or
 * fails is recorded as such; it never stops the recording.
 */
import { execFile } from 'node:child_process';
import Long from 'long';
import { svctrace } from '../gen/svctrace';
import { ServiceSpec } from '../net/ipv4';
import { CURRENT_NETNS } from '../tracer/netns';

import pb = svctrace.v1;

function runSection(name: string, netnsPath: string, argv: string[]): Promise<pb.ISnapshotSection> {
  const full = netnsPath === CURRENT_NETNS ? argv : ['nsenter', `--net=${netnsPath}`, '--', ...argv];
  return new Promise((resolve) => {
    execFile(full[0]!, full.slice(1), { encoding: 'utf8', timeout: 20_000, maxBuffer: 256 * 1024 * 1024 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : -1) : 0;
      const missing = err && (err as NodeJS.ErrnoException).code === 'ENOENT';
      resolve({
        name,
        netns: netnsPath,
        command: argv.join(' '),
        output: stdout,
        exitCode: code,
        error: missing ? `${full[0]} not installed` : err ? (stderr.trim() || err.message).slice(0, 2000) : '',
      });
    });
  });
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
  return { sections: await Promise.all(jobs), takenMonoNs: Long.fromString(process.hrtime.bigint().toString(), true) };
}
