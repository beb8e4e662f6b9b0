/** Start-up: from launching `svctrace trace` to its hooks being attached (it says so on stderr). */
import { spawn } from 'node:child_process';
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
    child.once('exit', (c) => (c !== 0 && !err.includes('Ctrl-C') ? reject(new Error(err)) : undefined));
  });
}

export async function benchStartup(opts: { quick: boolean }): Promise<object> {
  const n = opts.quick ? 3 : 7;
  const lab = await Lab.up({ pods: 1 });
  const cli: number[] = [];
  const load: number[] = [];
  const attach: number[] = [];
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
      ],
    ),
  );
  const result = { runs: n, cliMs: cli, loadMs: load, attachMs: attach };
  console.log(`-> ${writeResult('startup', result)}`);
  return result;
}
