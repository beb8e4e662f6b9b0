/**
 * Kernel code addresses to function names, from /proc/kallsyms: where the
 * kernel freed a dropped packet (kfree_skb's caller). Before Linux 5.17 a
 * drop carries no reason, and that place is all it tells: `nf_hook_slow` is
 * a netfilter rule's DROP, `ip_rcv_core` a malformed or foreign packet.
 *
 * The table is read once and kept (3 MB for the ~120k functions of this
 * project's hosts): a kernel's functions do not change while svctrace runs
 * (a module loaded later is named by its hex address). A trace reads it on
 * a worker thread while its programs load (`KernelSymbols.loadInWorker`):
 * read and parsed at the first drop, it took 150-400 ms of the JS thread,
 * at the moment an incident's drops begin, and its 5 MB of text went
 * through the pipeline's capped heap. Parsing and lookup here; the file is
 * read by `KernelSymbols.load`.
 */
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { MessageChannel, receiveMessageOnPort, Worker } from 'node:worker_threads';

/** A table's contents, as a worker posts them (the typed arrays moved, not copied). */
export interface KernelSymbolsParts {
  starts: Float64Array;
  names: string;
  nameAt: Uint32Array;
  moduleOf: Uint16Array;
  modules: string[];
}

/** A table being read on a worker (KernelSymbols.loadInWorker). */
export interface SymbolsAhead {
  /** The table, once the worker posted it; rejects when it ends without one, or is cancelled. */
  readonly result: Promise<KernelSymbols>;
  /** The table now, waiting up to `waitMs` for the worker to finish; undefined when it did not (or was taken already). */
  takeNow(waitMs: number): KernelSymbols | undefined;
  /** Stops the worker; `result` rejects. */
  cancel(): void;
}

/**
 * How long the first drop waits for a read ahead still running. A trace's
 * first drop comes after its programs loaded (300 ms or more after the read
 * began): by then the rest of the read is a few ms (startup benchmark: 24
 * ms in all, against 207 ms reading the table on the spot). Only a drop at
 * the very moment the read begins waits longer than reading it again (281
 * ms: the worker's own start-up). A worker that is not done by then (a
 * machine far slower, or a worker that died without a word) costs this
 * wait on top of the read on the spot.
 */
const AHEAD_WAIT_MS = 500;

/** The worker's own heap limit: the file's text and the arrays built from it, with room to spare. */
const WORKER_HEAP_MB = 64;

/**
 * Kernel addresses are 64-bit, above 2^53: kept as their distance from
 * 0xffff000000000000 (48 bits, exact in a double), which holds every kernel
 * text address on x86_64 and arm64.
 */
const KERNEL_BASE_HIGH = 'ffff';

function offsetOf(hex: string): number | undefined {
  const h = hex.length === 16 ? hex : hex.padStart(16, '0');
  if (h.length !== 16 || h.slice(0, 4) !== KERNEL_BASE_HIGH) return undefined;
  const low = Number.parseInt(h.slice(4), 16);
  return Number.isFinite(low) ? low : undefined;
}

/** Where in the kernel an address is: its function and the offset into it. */
export interface KernelLocation {
  func: string;
  offset: number;
  /** The module the function is in ('' for the kernel itself). */
  module: string;
}

/** "nf_hook_slow+0x8c", "nft_do_chain+0x1f [nf_tables]" */
export function formatLocation(l: KernelLocation): string {
  return `${l.func}+0x${l.offset.toString(16)}${l.module ? ` [${l.module}]` : ''}`;
}

/** Functions further than this past their start are not taken to hold the address (the gap after the last one). */
const MAX_FUNCTION_BYTES = 1 << 20;

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x09 || c === 0x0d;
}

function hexDigit(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  return -1;
}

/** offsetOf for text[from, to) without making the string: the 16 hex digits of a kernel address, or undefined. */
function kernelOffsetAt(text: string, from: number, to: number): number | undefined {
  if (to - from !== 16) return undefined;
  for (let i = 0; i < 4; i++) {
    const c = text.charCodeAt(from + i);
    if (c !== 0x66 && c !== 0x46) return undefined; // the high 16 bits: KERNEL_BASE_HIGH
  }
  let v = 0;
  for (let i = 4; i < 16; i++) {
    const d = hexDigit(text.charCodeAt(from + i));
    if (d < 0) return undefined;
    v = v * 16 + d;
  }
  return v;
}

function grow<T extends Float64Array | Uint32Array | Uint16Array>(from: T, to: T): T {
  to.set(from);
  return to;
}

export class KernelSymbols {
  /**
   * Sorted by address: starts[i] is function i's, its name
   * names.slice(nameAt[i], nameAt[i + 1]) and its module
   * modules[moduleOf[i]] (0: the kernel). One string of all names, not a
   * string each: about 2 MB for 120k functions, not the 8 MB that strings
   * sliced from the file (keeping it alive) took.
   */
  private constructor(
    private readonly starts: Float64Array,
    private readonly names: string,
    private readonly nameAt: Uint32Array,
    private readonly moduleOf: Uint16Array,
    private readonly modules: string[],
  ) {}

  /** Functions in the table (0: the addresses were hidden, kptr_restrict, or nothing parsed). */
  get size(): number {
    return this.starts.length;
  }

  /**
   * Parses /proc/kallsyms text: "ffffffff81f82610 T nf_hook_slow" and
   * "ffffffffc0a01000 t nft_do_chain\t[nf_tables]". Only code symbols
   * (t, T, w, W) are kept; lines that do not parse are skipped. Addresses
   * that read as 0 (hidden from this process) give an empty table.
   */
  static parse(text: string): KernelSymbols {
    // One pass over the text's character codes, into typed arrays: no
    // string or object per line (the file has ~120k; made per line, they
    // took 200 ms of the JS thread, at the first drop of a trace).
    let cap = 1024;
    let starts = new Float64Array(cap);
    let nameFrom = new Uint32Array(cap);
    let nameTo = new Uint32Array(cap);
    let moduleOf = new Uint16Array(cap);
    let n = 0;
    const modules = [''];
    const moduleIds = new Map<string, number>([['', 0]]);
    const len = text.length;
    let from = 0;
    while (from < len) {
      let end = text.indexOf('\n', from);
      if (end < 0) end = len;
      const line = from;
      from = end + 1;
      // "ffffffff81f82610 T nf_hook_slow" or "... t nft_do_chain\t[nf_tables]"
      const sp1 = text.indexOf(' ', line);
      if (sp1 < 0 || sp1 >= end || sp1 === line || text.charCodeAt(sp1 + 2) !== 0x20 || sp1 + 2 >= end) continue;
      const type = text.charCodeAt(sp1 + 1);
      if (type !== 0x74 && type !== 0x54 && type !== 0x77 && type !== 0x57) continue; // t T w W
      const at = kernelOffsetAt(text, line, sp1);
      if (at === undefined || at === 0) continue;
      // Within the line (indexOf would search on to the next module line, megabytes away).
      let tab = sp1 + 3;
      while (tab < end && text.charCodeAt(tab) !== 0x09) tab++;
      let nf = sp1 + 3;
      let nt = tab;
      while (nf < nt && isSpace(text.charCodeAt(nf))) nf++;
      while (nt > nf && isSpace(text.charCodeAt(nt - 1))) nt--;
      if (nf === nt) continue;
      let module = 0;
      if (tab < end) {
        const moduleName = text.slice(tab + 1, end).trim().replace(/^\[|\]$/g, '');
        let id = moduleIds.get(moduleName);
        if (id === undefined && modules.length < 0xffff) {
          id = modules.push(moduleName) - 1;
          moduleIds.set(moduleName, id);
        }
        module = id ?? 0;
      }
      if (n === cap) {
        cap *= 2;
        starts = grow(starts, new Float64Array(cap));
        nameFrom = grow(nameFrom, new Uint32Array(cap));
        nameTo = grow(nameTo, new Uint32Array(cap));
        moduleOf = grow(moduleOf, new Uint16Array(cap));
      }
      starts[n] = at;
      nameFrom[n] = nf;
      nameTo[n] = nt;
      moduleOf[n] = module;
      n++;
    }
    // By address; lines at the same address keep the file's order. The
    // kernel lists its own functions in order, so usually nothing moves.
    const order = Uint32Array.from({ length: n }, (_, i) => i);
    let sorted = true;
    for (let i = 1; i < n && sorted; i++) sorted = starts[i - 1]! <= starts[i]!;
    if (!sorted) order.sort((x, y) => starts[x]! - starts[y]! || x - y);
    const outStarts = new Float64Array(n);
    const outModules = new Uint16Array(n);
    const nameAt = new Uint32Array(n + 1);
    const parts = new Array<string>(n);
    let total = 0;
    for (let i = 0; i < n; i++) {
      const k = order[i]!;
      outStarts[i] = starts[k]!;
      outModules[i] = moduleOf[k]!;
      nameAt[i] = total;
      parts[i] = text.slice(nameFrom[k]!, nameTo[k]!);
      total += nameTo[k]! - nameFrom[k]!;
    }
    nameAt[n] = total;
    // One flat string: slices of the whole file would keep it alive.
    return new KernelSymbols(outStarts, parts.join(''), nameAt, outModules, modules);
  }

  /** Reads the running kernel's table; an empty one when it cannot be read (addresses then show in hex). */
  static load(file = '/proc/kallsyms'): KernelSymbols {
    try {
      return KernelSymbols.parse(readFileSync(file, 'latin1'));
    } catch {
      return KernelSymbols.parse('');
    }
  }

  /**
   * `load` on a worker thread: the JS thread only takes the finished arrays,
   * when `result` resolves, or at once with `takeNow` (waiting for the rest
   * of the worker's read, at most `waitMs`). `result` rejects when the
   * worker cannot run or ends without a table (`cancel` included); an
   * unreadable file is an empty table, as with `load`. The worker keeps
   * the process alive until it ends (a few hundred ms; `cancel` ends it).
   */
  static loadInWorker(file = '/proc/kallsyms'): SymbolsAhead {
    // The worker posts the table on its own port and then raises `posted`:
    // the JS thread can wait for that flag and take the message from the
    // port without returning to the event loop.
    const posted = new Int32Array(new SharedArrayBuffer(4));
    const { port1, port2 } = new MessageChannel();
    let worker: Worker | undefined;
    let settled = false;
    let resolve: (t: KernelSymbols) => void = () => undefined;
    let reject: (e: Error) => void = () => undefined;
    const result = new Promise<KernelSymbols>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    const settle = (parts: KernelSymbolsParts | undefined): KernelSymbols | undefined => {
      if (settled) return undefined;
      settled = true;
      port1.close();
      let table: KernelSymbols | undefined;
      try {
        if (parts) table = KernelSymbols.fromParts(parts);
      } catch {
        // no table: rejected below
      }
      if (table) resolve(table);
      else reject(new Error('kallsyms: the worker ended without a table'));
      return table;
    };
    try {
      const script = path.join(__dirname, 'kallsyms-worker.js');
      // A worker whose script is missing (a damaged install) fails only
      // later, asynchronously: no worker then, and no wait for one.
      if (!existsSync(script)) throw new Error(`${script} is missing`);
      worker = new Worker(script, {
        workerData: { file, port: port2, posted },
        transferList: [port2],
        resourceLimits: { maxOldGenerationSizeMb: WORKER_HEAP_MB },
      });
      port1.once('message', (parts: KernelSymbolsParts) => settle(parts));
      port1.unref(); // after the listener, which refs it: the worker keeps the process up until it ends (and `result` settles)
      worker.once('error', () => undefined); // its exit says it ended without a table
      // A message posted before the end may not have been dispatched yet: taken here.
      worker.once('exit', () => settle((receiveMessageOnPort(port1) as { message: KernelSymbolsParts } | undefined)?.message));
    } catch {
      settle(undefined);
    }
    return {
      result,
      takeNow(waitMs: number): KernelSymbols | undefined {
        if (settled) return undefined;
        Atomics.wait(posted, 0, 0, waitMs);
        const m = receiveMessageOnPort(port1) as { message: KernelSymbolsParts } | undefined;
        return m ? settle(m.message) : undefined;
      },
      cancel(): void {
        if (settled) return;
        void worker?.terminate();
        settle(undefined);
      },
    };
  }

  /** The table's arrays, to post from a worker (see loadInWorker). */
  parts(): KernelSymbolsParts {
    return { starts: this.starts, names: this.names, nameAt: this.nameAt, moduleOf: this.moduleOf, modules: this.modules };
  }

  /** A table from parts(); throws when they do not fit together (no half-right names). */
  static fromParts(p: KernelSymbolsParts): KernelSymbols {
    const n = p.starts?.length;
    const ok =
      p.starts instanceof Float64Array &&
      p.nameAt instanceof Uint32Array &&
      p.moduleOf instanceof Uint16Array &&
      typeof p.names === 'string' &&
      Array.isArray(p.modules) &&
      p.nameAt.length === n + 1 &&
      p.moduleOf.length === n &&
      p.nameAt[n] === p.names.length &&
      p.moduleOf.every((m) => m < p.modules.length);
    if (!ok) throw new Error('kallsyms: parts that do not make a table');
    return new KernelSymbols(p.starts, p.names, p.nameAt, p.moduleOf, p.modules);
  }

  /** The function holding a kernel address (hex, as decoded); undefined when none is known. */
  locate(hexAddr: string): KernelLocation | undefined {
    const at = offsetOf(hexAddr);
    if (at === undefined || this.starts.length === 0) return undefined;
    // The last function starting at or before the address.
    let lo = 0;
    let hi = this.starts.length - 1;
    if (at < this.starts[0]!) return undefined;
    while (lo < hi) {
      const mid = (lo + hi + 1) >>> 1;
      if (this.starts[mid]! <= at) lo = mid;
      else hi = mid - 1;
    }
    const offset = at - this.starts[lo]!;
    if (offset >= MAX_FUNCTION_BYTES) return undefined;
    return { func: this.names.slice(this.nameAt[lo]!, this.nameAt[lo + 1]!), offset, module: this.modules[this.moduleOf[lo]!]! };
  }
}

/**
 * Names drop locations for the flow model: the running kernel's table, and
 * each address's answer kept (a node's drops come from a few dozen places;
 * at most `maxCached` addresses are kept, the rest looked up each time).
 * `prefetch` reads the table ahead, off the JS thread. A name asked for
 * while that read runs waits for the rest of it (at most AHEAD_WAIT_MS);
 * without one, or when it fails, the table is read on the spot (`load`).
 */
export class DropLocations {
  private symbols?: KernelSymbols;
  private readonly cache = new Map<string, KernelLocation | null>();
  private ahead?: SymbolsAhead;

  constructor(
    private readonly load: () => KernelSymbols = () => KernelSymbols.load(),
    private readonly maxCached = 4096,
    private readonly loadAhead: () => SymbolsAhead = () => KernelSymbols.loadInWorker(),
  ) {}

  /** Starts reading the table in the background (once); resolves when it is in, or could not be read ahead. */
  prefetch(): Promise<void> {
    if (this.symbols || this.ahead) return Promise.resolve();
    const ahead = (this.ahead = this.loadAhead());
    return ahead.result.then(
      (s) => {
        this.symbols ??= s;
      },
      () => undefined, // read on the spot at the first drop instead
    );
  }

  /** Stops a read ahead still running (a trace that stops). */
  close(): void {
    this.ahead?.cancel();
  }

  locate(hexAddr: string): KernelLocation | undefined {
    if (!hexAddr || hexAddr === '0') return undefined;
    const cached = this.cache.get(hexAddr);
    if (cached !== undefined) return cached ?? undefined;
    this.symbols ??= this.ahead?.takeNow(AHEAD_WAIT_MS) ?? this.load();
    const l = this.symbols.locate(hexAddr) ?? null;
    if (this.cache.size < this.maxCached) this.cache.set(hexAddr, l);
    return l ?? undefined;
  }
}
