/**
 * Worker thread of KernelSymbols.loadInWorker: reads and parses the kernel's
 * symbol table off the JS thread and posts its arrays, moved, not copied.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { KernelSymbols } from './kallsyms';

const { file } = workerData as { file: string };
const parts = KernelSymbols.load(file).parts();
// The arrays own their buffers (parse makes each at its size): moved whole.
parentPort?.postMessage(parts, [parts.starts.buffer, parts.nameAt.buffer, parts.moduleOf.buffer] as ArrayBuffer[]);
