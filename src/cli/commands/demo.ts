import { Command } from 'commander';
import { runDemo } from '../../demo';
import { parseDecimal } from '../../decimal';

export function registerDemo(program: Command): void {
  program
    .command('demo')
    .description('build the built-in lab (network namespaces only), trace curls to its ClusterIP, tear it down')
    .option('--requests <n>', 'number of curls to the ClusterIP', '5')
    .action(async (opts: { requests: string }) => {
      await runDemo({ requests: parseDecimal(opts.requests) });
    });
}
