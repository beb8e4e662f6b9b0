import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DropLocations, formatLocation, KernelSymbols, type SymbolsAhead } from '../../src/events/kallsyms';

// As /proc/kallsyms lists them: code (t/T, w/W), data (d/D, b/B) that must
// not name code, module symbols after a tab, and not in address order.
const TEXT = [
  'ffffffff81000000 T _stext',
  'ffffffff81f82610 T nf_hook_slow',
  'ffffffff81f82700 T nf_hook_slow_list',
  'ffffffff82055850 t ip_rcv_core',
  'ffffffff82a00000 D some_data',
  'ffffffff81e94f80 W sk_skb_reason_drop',
  'ffffffffc0a01000 t nft_do_chain\t[nf_tables]',
  'not a line',
  '',
].join('\n');

describe('KernelSymbols', () => {
  const s = KernelSymbols.parse(TEXT);

  it('names an address by the code symbol at or before it, with the offset into it', () => {
    assert.equal(s.size, 6);
    assert.deepEqual(s.locate('ffffffff81f8269c'), { func: 'nf_hook_slow', offset: 0x8c, module: '' });
    assert.deepEqual(s.locate('ffffffff81f82610'), { func: 'nf_hook_slow', offset: 0, module: '' });
    assert.equal(formatLocation(s.locate('ffffffff81f82705')!), 'nf_hook_slow_list+0x5');
    assert.equal(formatLocation(s.locate('ffffffff81e94f90')!), 'sk_skb_reason_drop+0x10');
    assert.equal(formatLocation(s.locate('ffffffffc0a0101f')!), 'nft_do_chain+0x1f [nf_tables]');
  });

  it('data symbols name nothing; an address before the first function or far past the last has no name', () => {
    // 0xffffffff82a00010 is 10 MB past ip_rcv_core: no function is that long.
    assert.equal(s.locate('ffffffff82a00010'), undefined);
    assert.equal(s.locate('ffffffff80ffffff'), undefined);
    assert.equal(s.locate('ffff'), undefined, 'not a kernel address');
    assert.equal(s.locate(''), undefined);
  });

  it('module lines between kernel lines, aliases at one address and a file out of order: the last alias in the file names it', () => {
    const t = KernelSymbols.parse(
      [
        'ffffffffc0a02000 t nft_meta_get_eval\t[nf_tables]',
        'ffffffff81000000 T _stext',
        'ffffffff81f82610 T __pfx_nf_hook_slow',
        'ffffffffc0b00000 t ipt_do_table\t[ip_tables]  ',
        'ffffffff81f82610 T nf_hook_slow\r',
        'ffffffff81f8zz10 T not_hex',
        'ffffffff81f82610 X not_code',
        'ffffffff81f82610  T two_spaces',
      ].join('\n'),
    );
    assert.equal(t.size, 5);
    assert.equal(formatLocation(t.locate('ffffffff81f8269c')!), 'nf_hook_slow+0x8c');
    assert.equal(formatLocation(t.locate('ffffffff81000010')!), '_stext+0x10');
    assert.equal(formatLocation(t.locate('ffffffffc0a02010')!), 'nft_meta_get_eval+0x10 [nf_tables]');
    assert.equal(formatLocation(t.locate('ffffffffc0b00001')!), 'ipt_do_table+0x1 [ip_tables]');
  });

  it('addresses hidden from the reader (kptr_restrict: all zero) give an empty table, not wrong names', () => {
    const hidden = KernelSymbols.parse('0000000000000000 T _stext\n0000000000000000 T nf_hook_slow\n');
    assert.equal(hidden.size, 0);
    assert.equal(hidden.locate('ffffffff81f8269c'), undefined);
    assert.equal(KernelSymbols.load('/nonexistent/kallsyms').size, 0, 'an unreadable file is an empty table');
  });
});

describe('DropLocations', () => {
  it('reads the table once, at the first address, and keeps each answer', () => {
    let loads = 0;
    const d = new DropLocations(() => {
      loads++;
      return KernelSymbols.parse(TEXT);
    }, 2);
    assert.equal(loads, 0, 'nothing read before a drop needs a name');
    assert.equal(d.locate('ffffffff81f8269c')?.func, 'nf_hook_slow');
    assert.equal(d.locate('ffffffff82055860')?.func, 'ip_rcv_core');
    assert.equal(d.locate('ffffffff80000000'), undefined);
    assert.equal(d.locate('ffffffff81f8269c')?.func, 'nf_hook_slow');
    assert.equal(d.locate('0'), undefined, 'no address');
    assert.equal(loads, 1);
  });
});

describe('KernelSymbols.loadInWorker', () => {
  const withFile = async (text: string, use: (file: string) => Promise<void>) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-kallsyms-'));
    try {
      const file = path.join(dir, 'kallsyms');
      fs.writeFileSync(file, text, 'latin1');
      await use(file);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  };
  const here = KernelSymbols.parse(TEXT);
  const sameNames = (t: KernelSymbols) => {
    assert.equal(t.size, here.size);
    for (const a of ['ffffffff81f8269c', 'ffffffff81f82705', 'ffffffff81e94f90', 'ffffffffc0a0101f', 'ffffffff82a00010', 'ffffffff80ffffff'])
      assert.deepEqual(t.locate(a), here.locate(a), a);
  };

  it('reads and parses on a worker thread: the same names as parse, from the arrays it moved', async () => {
    await withFile(TEXT, async (file) => {
      sameNames(await KernelSymbols.loadInWorker(file).result);
    });
  });

  it('takeNow waits for the worker on the JS thread and takes its table without the event loop; once', async () => {
    await withFile(TEXT, async (file) => {
      const ahead = KernelSymbols.loadInWorker(file);
      const t = ahead.takeNow(10_000); // no await: the worker has not even started when this begins
      assert.ok(t, 'the table, waited for');
      sameNames(t);
      assert.equal(ahead.takeNow(0), undefined, 'taken already');
      sameNames(await ahead.result);
    });
  });

  it('an unreadable file is an empty table, as with load; a cancelled read rejects and gives nothing', async () => {
    assert.equal((await KernelSymbols.loadInWorker('/nonexistent/kallsyms').result).size, 0);
    const ahead = KernelSymbols.loadInWorker('/nonexistent/kallsyms');
    ahead.cancel();
    await assert.rejects(ahead.result);
    assert.equal(ahead.takeNow(0), undefined);
  });

  it('parts that do not make a table are refused, not half used', () => {
    const good = KernelSymbols.parse(TEXT).parts();
    assert.equal(KernelSymbols.fromParts(good).size, 6);
    assert.throws(() => KernelSymbols.fromParts({ ...good, nameAt: good.nameAt.subarray(1) }));
    assert.throws(() => KernelSymbols.fromParts({ ...good, names: good.names.slice(1) }));
    assert.throws(() => KernelSymbols.fromParts({ ...good, modules: [''] }), 'a module index past the list');
    assert.throws(() => KernelSymbols.fromParts({ ...good, starts: Array.from(good.starts) as unknown as Float64Array }));
    assert.throws(() => KernelSymbols.fromParts(null as unknown as typeof good));
  });
});

describe('DropLocations.prefetch', () => {
  const refuse = (): KernelSymbols => {
    throw new Error('read on the JS thread');
  };
  /** A read ahead that the test finishes (or fails) by hand. */
  const manual = () => {
    let finish: (t: KernelSymbols) => void = () => undefined;
    let fail: (e: Error) => void = () => undefined;
    const result = new Promise<KernelSymbols>((res, rej) => {
      finish = res;
      fail = rej;
    });
    let cancelled = false;
    let waitedFor: KernelSymbols | undefined;
    const ahead: SymbolsAhead = {
      result,
      takeNow: () => waitedFor,
      cancel: () => {
        cancelled = true;
        fail(new Error('cancelled'));
      },
    };
    return { ahead, finish, fail, cancelled: () => cancelled, readyForTake: (t: KernelSymbols) => (waitedFor = t) };
  };

  it('a table read ahead serves the first drop: nothing read on the spot', async () => {
    let aheads = 0;
    const m = manual();
    const d = new DropLocations(refuse, 16, () => {
      aheads++;
      return m.ahead;
    });
    const p = d.prefetch();
    m.finish(KernelSymbols.parse(TEXT));
    await p;
    await d.prefetch();
    assert.equal(aheads, 1, 'read ahead once');
    assert.equal(d.locate('ffffffff81f8269c')?.func, 'nf_hook_slow');
  });

  it('a drop during the read ahead waits for it (takeNow), and does not read the table again', () => {
    const m = manual();
    const d = new DropLocations(refuse, 16, () => m.ahead);
    void d.prefetch();
    m.readyForTake(KernelSymbols.parse(TEXT));
    assert.equal(d.locate('ffffffff82055860')?.func, 'ip_rcv_core');
  });

  it('a read ahead that failed, or did not finish in time, leaves the first drop to read it on the spot', async () => {
    let loads = 0;
    const onTheSpot = (): KernelSymbols => {
      loads++;
      return KernelSymbols.parse(TEXT);
    };
    const failed = manual();
    const a = new DropLocations(onTheSpot, 16, () => failed.ahead);
    const p = a.prefetch();
    failed.fail(new Error('no worker'));
    await p;
    assert.equal(a.locate('ffffffff82055860')?.func, 'ip_rcv_core');
    assert.equal(loads, 1);
    const slow = manual(); // takeNow gives nothing: still running after the wait
    const b = new DropLocations(onTheSpot, 16, () => slow.ahead);
    const q = b.prefetch();
    assert.equal(b.locate('ffffffff82055860')?.func, 'ip_rcv_core');
    assert.equal(loads, 2);
    slow.finish(KernelSymbols.parse(''));
    await q;
    assert.equal(b.locate('ffffffff81f8269c')?.func, 'nf_hook_slow', 'the table read first stays');
  });

  it('close cancels the read ahead', async () => {
    const m = manual();
    const d = new DropLocations(() => KernelSymbols.parse(TEXT), 16, () => m.ahead);
    const p = d.prefetch();
    d.close();
    assert.equal(m.cancelled(), true);
    await p;
    assert.equal(d.locate('ffffffff81f8269c')?.func, 'nf_hook_slow');
  });

  it('in a real worker: a drop right after the read began gets the worker\'s table', () => {
    const d = new DropLocations(refuse, 16, () => KernelSymbols.loadInWorker(process.env.SVT_TEST_KALLSYMS ?? '/nonexistent/kallsyms'));
    void d.prefetch();
    // An unreadable file is an empty table: no name, and nothing read on the spot (refuse would throw).
    assert.equal(d.locate('ffffffff81f8269c'), undefined);
  });
});
