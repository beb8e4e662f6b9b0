import { Command } from 'commander';
import { SvctraceError } from '../../errors';
import { explain, formatExplanation } from '../../explain/explain';
import { parseDuration } from '../options';

export function registerExplain(program: Command): void {
  program
    .command('explain')
    .description("show the kernel's path for a Service on this node (rules, backends with probabilities, routes) and diagnose it")
    .argument('<service>', 'ClusterIP:port[/proto] or namespace/name[:port]')
    .option('--netns <name|path>', "the node's network namespace (default: svctrace's own)")
    .option('--watch <seconds>', 'then trace live traffic this long and compare it with the rules')
    .option('--probe', 'also try a TCP connection to each backend from the node: refused, timed out or unreachable tell the faults apart')
    .option('--kubeconfig <path>', 'compare with the Kubernetes API (default: $KUBECONFIG, ~/.kube/config or in-cluster, if any)')
    .option('-o, --output <format>', 'text or json', 'text')
    .action(async (target: string, opts: { netns?: string; watch?: string; probe?: boolean; output: string; kubeconfig?: string }) => {
      if (opts.output !== 'text' && opts.output !== 'json') throw new SvctraceError('BAD_INPUT', `--output must be text or json, not '${opts.output}'`);
      const watchSeconds = parseDuration(opts.watch);
      if (watchSeconds) process.stderr.write(`svctrace: watching ${target} for ${watchSeconds} s...\n`);
      const exps = await explain({
        target,
        netns: opts.netns,
        watchSeconds,
        probe: opts.probe,
        kubeconfig: opts.kubeconfig,
        onWarning: (w) => process.stderr.write(`svctrace: warning: ${w}\n`),
      });
      if (opts.output === 'json') {
        process.stdout.write(JSON.stringify(exps, (_k, v) => (v instanceof Set ? [...v] : v), 2) + '\n');
      } else {
        process.stdout.write(exps.map(formatExplanation).join('\n\n') + '\n');
      }
      if (exps.some((e) => e.diagnoses.some((d) => d.severity === 'error'))) process.exitCode = 1;
    });
}
