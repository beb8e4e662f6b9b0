/**
 * Start-up: from launching `svctrace trace` to its hooks being attached (it
 * says so on stderr); and the one pause a trace takes later, at its first
 * drop: reading the kernel's symbol table to name where the packet was freed.
 */
import { execFileSync, spawn } from 'node:child_process';
import path from 'node:path';
import { Lab } from '../src/lab/lab';
import { Tracer } from '../src/tracer/tracer';
import { parseServiceSpec } from '../src/net/ipv4';
import { median, table, writeResult } from './common';

const CLI = path.resolve(__dirname, '..', '..', 'bin', 'svctrace.js');

function cliStartup(netns: string): Promise<number> {
  const t0 = process.hrtime.bigint();
  const child = spawn(process.execPath, [CLI, 'trace', '--netns', netns, '--service', '10.96.0.100:80'], { stdio: ['ignore', 'ignore', 'pipe'] });
  return new Promise((resolve, reject) => {
    let err = '';
    child.stderr!.on('data', (d) => {
      err += d;
      if (err.includes('Ctrl-C to stop')) {
        const ms = Number(process.hrtime.bigint() - t0) / 1e6;
        child.kill('SIGINT');
        child.once('exit', () => resolve(ms));
      }
    });
    child.once('close', (c) => (c !== 0 && !err.includes('Ctrl-C') ? reject(new Error(err)) : undefined));
  });
}

const KALLSYMS = path.resolve(__dirname, '..', 'src', 'events', 'kallsyms.js');

/**
 * The JS thread's pause at a trace's first drop, in a fresh process as in a
 * trace (nothing compiled yet), in ms, two ways side by side:
 * - on the spot: /proc/kallsyms read (the kernel writes the file as it is
 *   read) and parsed on the JS thread, as every trace did before the read
 *   ahead, and as one still does when its worker cannot run;
 * - read ahead (DropLocations.prefetch, started where a trace starts it,
 *   before its programs load), with `loadMs` of the JS thread busy loading
 *   programs in between (a sleep here), then the first drop: what it waits
 *   for the worker, and takes its table.
 */
function firstDropPause(loadMs: number): { readMs: number; parseMs: number; aheadMs: number } {
  const script = `
    const fs = require('node:fs');
    const { DropLocations, KernelSymbols } = require(${JSON.stringify(KALLSYMS)});
    const t0 = process.hrtime.bigint();
    const text = fs.readFileSync('/proc/kallsyms', 'latin1');
    const t1 = process.hrtime.bigint();
    const n = KernelSymbols.parse(text).size;
    const t2 = process.hrtime.bigint();
    if (!n) throw new Error('no kernel symbols read (kptr_restrict?)');
    let onTheSpot = 0;
    const d = new DropLocations(() => { onTheSpot++; return KernelSymbols.load(); });
    void d.prefetch();
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ${loadMs});
    const t3 = process.hrtime.bigint();
    d.locate('ffffffff81000000');
    const t4 = process.hrtime.bigint();
    if (onTheSpot) throw new Error('the read ahead did not serve the first drop');
    process.stdout.write(JSON.stringify({ readMs: Number(t1 - t0) / 1e6, parseMs: Number(t2 - t1) / 1e6, aheadMs: Number(t4 - t3) / 1e6 }));
    d.close();`;
  return JSON.parse(execFileSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60_000 })) as { readMs: number; parseMs: number; aheadMs: number };
}

export async function benchStartup(opts: { quick: boolean }): Promise<object> {
  const n = opts.quick ? 3 : 7;
  const lab = await Lab.up({ pods: 1 });
  const cli: number[] = [];
  const load: number[] = [];
  const attach: number[] = [];
  const symbolsRead: number[] = [];
  const symbolsParse: number[] = [];
  const aheadAtOnce: number[] = [];
  const aheadAfterLoad: number[] = [];
  try {
    for (let i = 0; i < n; i++) {
      cli.push(await cliStartup(lab.nodeNetns));
      const t0 = process.hrtime.bigint();
      const t = Tracer.open();
      const t1 = process.hrtime.bigint();
      t.setServices([parseServiceSpec('10.96.0.100:80')]);
      t.attachNetns(lab.nodeNetns);
      const t2 = process.hrtime.bigint();
      t.close();
      load.push(Number(t1 - t0) / 1e6);
      attach.push(Number(t2 - t1) / 1e6);
      const pause = firstDropPause(0);
      symbolsRead.push(pause.readMs);
      symbolsParse.push(pause.parseMs);
      aheadAtOnce.push(pause.aheadMs);
      aheadAfterLoad.push(firstDropPause(Math.round(Number(t1 - t0) / 1e6)).aheadMs);
    }
  } finally {
    await lab.down();
  }
  console.log(`\nStart-up (median of ${n})`);
  console.log(
    table(
      ['what', 'ms'],
      [
        ['svctrace trace: launch -> hooks attached', median(cli).toFixed(0)],
        ['  of which: open + load + verify BPF, attach tracepoints', median(load).toFixed(1)],
        ['  of which: select services + attach 8 netfilter links in the netns', median(attach).toFixed(1)],
        ['first drop named, /proc/kallsyms read on the spot: JS thread paused', median(symbolsRead.map((r, i) => r + symbolsParse[i]!)).toFixed(1)],
        ['  of which: reading it (the kernel writes it as it is read)', median(symbolsRead).toFixed(1)],
        ['  of which: parsing it', median(symbolsParse).toFixed(1)],
        ['first drop named, read ahead on a worker (as a trace does): JS thread paused,', ''],
        ['  the drop at once after the read began (waits for the worker)', median(aheadAtOnce).toFixed(1)],
        ['  the drop after the programs loaded (the time measured above)', median(aheadAfterLoad).toFixed(1)],
      ],
    ),
  );
  const result = { runs: n, cliMs: cli, loadMs: load, attachMs: attach, kallsymsReadMs: symbolsRead, kallsymsParseMs: symbolsParse, kallsymsAheadAtOnceMs: aheadAtOnce, kallsymsAheadAfterLoadMs: aheadAfterLoad };
  console.log(`-> ${writeResult('startup', result)}`);
  return result;
}
