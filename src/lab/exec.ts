/** Running the lab's system commands (ip, iptables-restore, curl) with clear errors. */
import { execFile, ExecFileException } from 'node:child_process';
import { SvctraceError } from '../errors';
import { argvInNetns } from '../netns/netns';

export interface RunResult {
  stdout: string;
  stderr: string;
}

/** Runs argv[0] with the rest as arguments; rejects with a LAB error naming the command. */
export function run(argv: string[], opts: { input?: string; timeoutMs?: number; allowFail?: boolean } = {}): Promise<RunResult> {
  const [cmd, ...args] = argv;
  if (!cmd) throw new SvctraceError('INTERNAL', 'run: empty command');
  return new Promise((resolve, reject) => {
    const child = execFile(
      cmd,
      args,
      { timeout: opts.timeoutMs ?? 30_000, maxBuffer: 64 * 1024 * 1024, encoding: 'utf8' },
      (err: ExecFileException | null, stdout: string, stderr: string) => {
        if (err && !opts.allowFail) {
          const why = err.code === 'ENOENT' ? `${cmd} is not installed` : stderr.trim() || err.message;
          reject(new SvctraceError('LAB', `'${argv.join(' ')}' failed: ${why}`, { cause: err }));
          return;
        }
        // A command the time limit ended says nothing itself: say it here.
        const killed = err?.killed ? `${cmd} did not finish within ${opts.timeoutMs ?? 30_000} ms and was ended (${err.signal ?? 'killed'})` : '';
        resolve({ stdout, stderr: killed ? `${stderr}${stderr && !stderr.endsWith('\n') ? '\n' : ''}${killed}` : stderr });
      },
    );
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
}

/** Runs a command inside a network namespace (a name under /run/netns or a path), the way every svctrace command enters one. */
export function runIn(netns: string, argv: string[], opts: { input?: string; timeoutMs?: number; allowFail?: boolean } = {}): Promise<RunResult> {
  return run(argvInNetns(netns, argv), opts);
}
