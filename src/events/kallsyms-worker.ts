/**
 * Worker thread of KernelSymbols.loadInWorker: reads and parses the kernel's
 * symbol table off the JS thread and posts its arrays (moved, not copied) on
 * the port it was given, then raises `posted` for a JS thread waiting on it.
 */
import { MessagePort, workerData } from 'node:worker_threads';
import { KernelSymbols } from './kallsyms';

const { file, port, posted } = workerData as { file: string; port: MessagePort; posted: Int32Array };
try {
  const parts = KernelSymbols.load(file).parts();
  // The arrays own their buffers (parse makes each at its size): moved whole.
  port.postMessage(parts, [parts.starts.buffer, parts.nameAt.buffer, parts.moduleOf.buffer] as ArrayBuffer[]);
} finally {
  // Raised whatever happened: a JS thread waiting on it stops waiting (and finds no message if none came).
  Atomics.store(posted, 0, 1);
  Atomics.notify(posted, 0);
  port.close();
}
