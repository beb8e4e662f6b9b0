/**
 * Kernel code addresses to function names, from /proc/kallsyms: where the
 * kernel freed a dropped packet (kfree_skb's caller). Before Linux 5.17 a
 * drop carries no reason, and that place is all it tells: `nf_hook_slow` is
 * a netfilter rule's DROP, `ip_rcv_core` a malformed or foreign packet.
 *
 * The table is read once, when the first drop needs a name (about 150 ms of
 * the JS thread, and 3 MB kept, for the ~120k functions of this project's
 * hosts), and kept: a
 * kernel's functions do not change while svctrace runs (a module loaded
 * later is named by its hex address). Pure parsing and lookup here; the file
 * is read by `KernelSymbols.load`.
 */
import { readFileSync } from 'node:fs';

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
    const rows: { at: number; name: string; module: number }[] = [];
    const modules = [''];
    const moduleIds = new Map<string, number>([['', 0]]);
    let from = 0;
    while (from < text.length) {
      let end = text.indexOf('\n', from);
      if (end < 0) end = text.length;
      const line = text.slice(from, end);
      from = end + 1;
      const sp1 = line.indexOf(' ');
      const sp2 = line.indexOf(' ', sp1 + 1);
      if (sp1 <= 0 || sp2 !== sp1 + 2) continue;
      const type = line[sp1 + 1];
      if (type !== 't' && type !== 'T' && type !== 'w' && type !== 'W') continue;
      const at = offsetOf(line.slice(0, sp1));
      if (at === undefined || at === 0) continue;
      const rest = line.slice(sp2 + 1);
      const tab = rest.indexOf('\t');
      const name = (tab < 0 ? rest : rest.slice(0, tab)).trim();
      if (!name) continue;
      const moduleName = tab < 0 ? '' : rest.slice(tab + 1).trim().replace(/^\[|\]$/g, '');
      let module = moduleIds.get(moduleName);
      if (module === undefined && modules.length < 0xffff) {
        module = modules.push(moduleName) - 1;
        moduleIds.set(moduleName, module);
      }
      rows.push({ at, name, module: module ?? 0 });
    }
    rows.sort((a, b) => a.at - b.at);
    const nameAt = new Uint32Array(rows.length + 1);
    let total = 0;
    rows.forEach((r, i) => {
      nameAt[i] = total;
      total += r.name.length;
    });
    nameAt[rows.length] = total;
    // One flat string: the rows' names (slices of the whole file, keeping it alive) go with them.
    const names = rows.map((r) => r.name).join('');
    return new KernelSymbols(Float64Array.from(rows, (r) => r.at), names, nameAt, Uint16Array.from(rows, (r) => r.module), modules);
  }

  /** Reads the running kernel's table; an empty one when it cannot be read (addresses then show in hex). */
  static load(path = '/proc/kallsyms'): KernelSymbols {
    try {
      return KernelSymbols.parse(readFileSync(path, 'latin1'));
    } catch {
      return KernelSymbols.parse('');
    }
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
 * Names drop locations for the flow model: the running kernel's table,
 * read at the first name asked for, and each address's answer kept (a
 * node's drops come from a few dozen places; at most `maxCached`
 * addresses are kept, the rest looked up each time).
 */
export class DropLocations {
  private symbols?: KernelSymbols;
  private readonly cache = new Map<string, KernelLocation | null>();

  constructor(
    private readonly load: () => KernelSymbols = () => KernelSymbols.load(),
    private readonly maxCached = 4096,
  ) {}

  locate(hexAddr: string): KernelLocation | undefined {
    if (!hexAddr || hexAddr === '0') return undefined;
    const cached = this.cache.get(hexAddr);
    if (cached !== undefined) return cached ?? undefined;
    this.symbols ??= this.load();
    const l = this.symbols.locate(hexAddr) ?? null;
    if (this.cache.size < this.maxCached) this.cache.set(hexAddr, l);
    return l ?? undefined;
  }
}
