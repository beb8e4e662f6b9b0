/**
 * The CLI's entry: builds the commander program and maps every error to one
 * line on stderr and an exit code. No stack traces unless --verbose.
 */
import { Command, CommanderError } from 'commander';
import { SvctraceError } from '../errors';
import { EXIT_CODES } from './exit-codes';
import { registerDoctor } from './commands/doctor';
import { registerTrace } from './commands/trace';
import { registerDemo } from './commands/demo';
import { registerLab } from './commands/lab';
import { registerServe } from './commands/serve';
import { registerRelay } from './commands/relay';
import { registerWatch } from './commands/watch';
import { registerEvidence } from './commands/evidence';
import { registerExplain } from './commands/explain';
import { VERSION } from '../version';
import { watchStdout } from '../pipeline/lifecycle';

export function buildProgram(): Command {
  const program = new Command();
  program
    .name('svctrace')
    .description('Live packet tracer for Kubernetes Service traffic (DNAT, SNAT, conntrack, routing, veth) with eBPF')
    .version(VERSION)
    .option('--verbose', 'show libbpf/verifier output and stack traces')
    .showHelpAfterError('(run svctrace --help for usage)')
    .exitOverride();
  registerDoctor(program);
  registerTrace(program);
  registerDemo(program);
  registerLab(program);
  registerServe(program);
  registerRelay(program);
  registerWatch(program);
  registerEvidence(program);
  registerExplain(program);
  for (const cmd of program.commands) cmd.exitOverride();
  return program;
}

function verboseRequested(argv: string[]): boolean {
  return argv.includes('--verbose') || !!process.env.SVCTRACE_VERBOSE;
}

/** Prints one line for an error and returns the exit code. */
export function reportError(e: unknown, verbose: boolean): number {
  if (e instanceof CommanderError) {
    // commander already printed its one-line message (unknown option, missing argument, ...)
    return e.exitCode === 0 ? 0 : 2;
  }
  if (e instanceof SvctraceError) {
    process.stderr.write(`svctrace: ${e.message}\n`);
    if (verbose && e.detail) process.stderr.write(`${e.detail}\n`);
    if (verbose && e.stack) process.stderr.write(`${e.stack}\n`);
    return EXIT_CODES[e.code];
  }
  const msg = e instanceof Error ? e.message : String(e);
  process.stderr.write(`svctrace: internal error: ${msg}\n`);
  if (verbose && e instanceof Error && e.stack) process.stderr.write(`${e.stack}\n`);
  return 1;
}

export async function main(argv: string[] = process.argv): Promise<void> {
  const verbose = verboseRequested(argv);
  if (verbose) process.env.SVCTRACE_VERBOSE = '1'; // read by the addon when it loads
  watchStdout();
  try {
    await buildProgram().parseAsync(argv);
  } catch (e) {
    // Commands set process.exitCode themselves for "ran fine, answer is no" (doctor, verify).
    process.exitCode = reportError(e, verbose);
  }
}
