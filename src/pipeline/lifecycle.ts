/** How a long-running command ends: a deadline, a signal, or its own reason. */
import os from 'node:os';

/** The signals that end a command: Ctrl-C, `kill`, and a closed terminal. */
const STOP_SIGNALS: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

const stdoutGone = new AbortController();
let watchingStdout = false;

/**
 * Watches stdout for its reader going away (`trace -o json | head -1`):
 * EPIPE then ends the command like Ctrl-C — cleanly, exit 0, no stack
 * trace — instead of an uncaught error. Installed once, by the CLI's entry.
 */
export function watchStdout(out: NodeJS.WriteStream = process.stdout): void {
  if (watchingStdout) return;
  watchingStdout = true;
  out.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code === 'EPIPE' || e.code === 'ERR_STREAM_DESTROYED') {
      stdoutGone.abort();
      return;
    }
    process.stderr.write(`svctrace: cannot write to stdout: ${e.message}\n`);
    process.exitCode = 1;
    stdoutGone.abort();
  });
}

/** True once stdout can no longer be written (its reader closed it). */
export function stdoutClosed(): boolean {
  return stdoutGone.signal.aborted;
}

/**
 * Bytes stdout may hold for a slow reader (`| less`, a busy `jq`) before a
 * writer that can wait does: Node buffers a pipe's writes without limit.
 */
const STDOUT_HIGH_WATER = 1 << 20;

/**
 * A promise to await before writing more when stdout's reader is behind
 * (it resolves once stdout drained, or its reader is gone); undefined when
 * there is room. Memory stays bounded and nothing is dropped.
 */
export function stdoutRoom(out: NodeJS.WritableStream & { writableLength: number } = process.stdout): Promise<void> | undefined {
  if (out.writableLength < STDOUT_HIGH_WATER || stdoutClosed()) return undefined;
  return new Promise((resolve) => {
    const done = () => {
      out.off('drain', done);
      out.off('close', done);
      stdoutGone.signal.removeEventListener('abort', done);
      resolve();
    };
    out.on('drain', done);
    out.on('close', done);
    stdoutGone.signal.addEventListener('abort', done);
  });
}

let stopping = false;

/**
 * After the signal that stops a command, the next one (an impatient second
 * Ctrl-C) is answered, not obeyed: its default action would kill the
 * process while it writes what it still holds (the last events, a
 * recording's trailer with its loss counters). A third one quits at once,
 * its 'exit' hooks run (the lab's teardown: the default action skipped them).
 */
function stoppingOnSignal(alreadyAnswered = false): void {
  if (stopping) return;
  stopping = true;
  let answered = alreadyAnswered;
  const again = (signal: NodeJS.Signals) => {
    if (answered) exitOnSignal(signal);
    answered = true;
    process.stderr.write('svctrace: stopping: writing what is left (the last events, a recording\'s trailer, the lab\'s teardown); Ctrl-C again quits at once and loses them\n');
  };
  for (const s of STOP_SIGNALS) process.on(s, again);
  removeStopping = () => {
    for (const s of STOP_SIGNALS) process.off(s, again);
    stopping = false;
  };
}

let removeStopping: (() => void) | undefined;

/** Tests only: forgets that a command is stopping (its handler for the next signals removed). */
export function resetStoppingForTests(): void {
  removeStopping?.();
  removeStopping = undefined;
}

/** A stop signal came while deferStopSignals held them: the next waitForStop returns at once. */
let stopAskedEarly = false;
/** waitForStop calls waiting now: they answer signals themselves. */
let waiting = 0;
/** deferStopSignals' handlers while installed: how many startups hold them, and their removal. */
let deferral: { holders: number; off: () => void } | undefined;

/**
 * Holds the stop signals while a command starts (discovery, a recording's
 * snapshot, attaching): the first is answered with `message` and the next
 * waitForStop returns at once, so what startup opened ends the usual way (a
 * recording gets its trailer) where the signal's default action killed the
 * process and left a file with only its header. Another signal quits at
 * once (a startup stuck on an unanswering API must stay stoppable).
 * waitForStop takes over from it. The returned release lets go otherwise
 * (startup failed, or the command stopped without waiting); the handlers
 * go, and what they noted, when the last startup holding them lets go.
 * Nothing while a waitForStop is waiting: it answers signals already.
 */
export function deferStopSignals(message: string): () => void {
  if (waiting > 0) return () => undefined;
  if (!deferral) {
    const onSignal = (signal: NodeJS.Signals) => {
      if (!stopAskedEarly) {
        stopAskedEarly = true;
        process.stderr.write(`svctrace: ${message}; ${signal === 'SIGINT' ? 'Ctrl-C' : signal} again quits at once\n`);
        return;
      }
      exitOnSignal(signal);
    };
    for (const s of STOP_SIGNALS) process.on(s, onSignal);
    deferral = { holders: 0, off: () => STOP_SIGNALS.forEach((s) => process.off(s, onSignal)) };
  }
  const held = deferral;
  held.holders++;
  let released = false;
  return () => {
    if (released) return;
    released = true;
    if (deferral !== held || --held.holders > 0) return; // taken over by waitForStop, or still held by another
    held.off();
    deferral = undefined;
    stopAskedEarly = false;
  };
}

/** Quits now, as the signal's default action would, but with the process's 'exit' hooks run (the lab's teardown). */
function exitOnSignal(signal: NodeJS.Signals): never {
  process.exit(128 + (os.constants.signals[signal] ?? 2));
}

/**
 * Resolves after `seconds`, on SIGINT/SIGTERM/SIGHUP (also one that came
 * while deferStopSignals held them), when stdout's reader
 * is gone (see watchStdout), or when `abort` fires,
 * whichever comes first; it always removes its signal handlers.
 */
export function waitForStop(seconds: number | undefined, abort?: AbortSignal): Promise<'timeout' | 'signal' | 'aborted'> {
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout | undefined;
    const onSignal = () => {
      stoppingOnSignal(); // a signal, not stdout's reader gone: the next one is answered
      finish('signal');
    };
    const onAbort = () => finish('aborted');
    const onStdoutGone = () => finish('signal');
    const finish = (why: 'timeout' | 'signal' | 'aborted') => {
      waiting--;
      if (timer) clearTimeout(timer);
      for (const s of STOP_SIGNALS) process.off(s, onSignal);
      abort?.removeEventListener('abort', onAbort);
      stdoutGone.signal.removeEventListener('abort', onStdoutGone);
      resolve(why);
    };
    for (const s of STOP_SIGNALS) process.on(s, onSignal);
    waiting++;
    if (deferral) {
      // This one answers signals now (and takes what the deferral noted, below).
      deferral.off();
      deferral = undefined;
    }
    if (stopAskedEarly) {
      // The deferral answered that signal already, and said the next one quits.
      stopAskedEarly = false;
      stoppingOnSignal(true);
      return finish('signal');
    }
    if (abort?.aborted) return finish('aborted');
    if (stdoutGone.signal.aborted) return finish('signal');
    abort?.addEventListener('abort', onAbort);
    stdoutGone.signal.addEventListener('abort', onStdoutGone);
    if (seconds !== undefined) timer = setTimeout(() => finish('timeout'), seconds * 1000);
  });
}
