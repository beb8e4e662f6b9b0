/** How a long-running command ends: a deadline, a signal, or its own reason. */

/** The signals that end a command: Ctrl-C, `kill`, and a closed terminal. */
const STOP_SIGNALS: NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

/**
 * Resolves after `seconds`, on SIGINT/SIGTERM/SIGHUP, or when `abort` fires,
 * whichever comes first; it always removes its signal handlers.
 */
export function waitForStop(seconds: number | undefined, abort?: AbortSignal): Promise<'timeout' | 'signal' | 'aborted'> {
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout | undefined;
    const onSignal = () => finish('signal');
    const onAbort = () => finish('aborted');
    const finish = (why: 'timeout' | 'signal' | 'aborted') => {
      if (timer) clearTimeout(timer);
      for (const s of STOP_SIGNALS) process.off(s, onSignal);
      abort?.removeEventListener('abort', onAbort);
      resolve(why);
    };
    for (const s of STOP_SIGNALS) process.on(s, onSignal);
    if (abort?.aborted) return finish('aborted');
    abort?.addEventListener('abort', onAbort);
    if (seconds !== undefined) timer = setTimeout(() => finish('timeout'), seconds * 1000);
  });
}
