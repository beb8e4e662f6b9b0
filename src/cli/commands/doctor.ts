import { Command } from 'commander';
import { formatDoctor, runDoctor } from '../../doctor/doctor';

export function registerDoctor(program: Command): void {
  program
    .command('doctor')
    .description('check what this kernel and node let svctrace do (exit 1 if the core path cannot work)')
    .option('--json', 'print the report as JSON')
    .option('--netns <name|path>', 'inspect kube-proxy rules in this network namespace')
    .action((opts: { json?: boolean; netns?: string }) => {
      const report = runDoctor({ netns: opts.netns });
      process.stdout.write(opts.json ? JSON.stringify(report, null, 2) + '\n' : formatDoctor(report) + '\n');
      if (!report.ready) process.exitCode = 1;
    });
}
