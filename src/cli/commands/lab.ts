import { Command } from 'commander';
import { Lab, PROXY_MODES, ProxyMode } from '../../lab/lab';
import { SvctraceError } from '../../errors';
import { svcPortName } from '../../lab/kube-rules';
import { waitForStop } from '../../pipeline/lifecycle';
import { parseDuration } from '../options';
import { parseDecimal } from '../../decimal';

export function registerLab(program: Command): void {
  program
    .command('lab')
    .description('stand up the built-in lab (network namespaces only) and keep it until Ctrl-C, to trace it by hand')
    .option('--pods <n>', 'pods behind the web service', '3')
    .option('--duration <seconds>', 'tear down after this many seconds')
    .option('--proxy-mode <mode>', 'kube-proxy mode of the rules: iptables, nftables, iptables-legacy or ipvs (ipvs needs a kernel with IPVS)', 'iptables')
    .action(async (opts: { pods: string; duration?: string; proxyMode: string }) => {
      const duration = parseDuration(opts.duration);
      if (!(PROXY_MODES as readonly string[]).includes(opts.proxyMode)) {
        throw new SvctraceError('BAD_INPUT', `--proxy-mode must be one of ${PROXY_MODES.join(', ')} (got '${opts.proxyMode}')`);
      }
      const lab = await Lab.up({ pods: parseDecimal(opts.pods), remoteNode: true, proxyMode: opts.proxyMode as ProxyMode });
      try {
        const lines = [
          `lab up: node namespace ${lab.nodeNetns} (kube-proxy ${lab.proxyMode} mode)`,
          `  pods: ${[...lab.pods, ...(lab.remotePod ? [lab.remotePod] : [])].map((p) => `${p.netns}=${p.ip}`).join(' ')}`,
          `  client namespace ${lab.clientNetns} (10.250.0.2), node address 10.250.0.1`,
          '  services:',
          ...lab.services.map((s) => `    ${svcPortName(s).padEnd(26)} ${s.clusterIP}:${s.port}/${s.proto}${s.nodePort ? ` NodePort ${s.nodePort}` : ''} -> ${s.endpoints.map((e) => `${e.ip}:${e.port}`).join(' ') || 'no endpoints'}`),
          'try, in another terminal:',
          `  svctrace trace --netns ${lab.nodeNetns} --service 10.96.0.100:80 --nodeport 30080`,
          `  ip netns exec ${lab.nodeNetns} curl -s http://10.96.0.100/`,
          `  ip netns exec ${lab.clientNetns} curl -s http://10.250.0.1:30080/`,
          'Ctrl-C tears the lab down.',
        ];
        process.stdout.write(lines.join('\n') + '\n');
        await waitForStop(duration);
      } finally {
        await lab.down();
        process.stderr.write(`lab torn down\n`);
      }
    });
}
