import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { DropLocations, formatLocation, KernelSymbols } from '../../src/events/kallsyms';

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
