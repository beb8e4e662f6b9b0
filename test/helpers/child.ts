/** Waiting for a spawned process whose output a test reads. */
import type { ChildProcess } from 'node:child_process';

/**
 * The child's exit code (null: a signal ended it), once its output pipes are
 * read to the end. Node's 'exit' can come before the pipes' last data (a
 * guard holder's one line was missing at its 'exit' on a 6.12 CI run);
 * 'close' comes after it. A grandchild that keeps a pipe open cannot hold
 * this up more than `graceMs` after the exit.
 */
export function ended(child: ChildProcess, graceMs = 5000): Promise<number | null> {
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout | undefined;
    child.once('close', (code: number | null) => {
      clearTimeout(timer);
      resolve(code);
    });
    const afterExit = () => {
      timer = setTimeout(() => resolve(child.exitCode), graceMs);
    };
    if (child.exitCode !== null || child.signalCode !== null) afterExit();
    else child.once('exit', afterExit);
  });
}
