/** Which attach backend a tracer uses, from the kernel probes (pure). */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chooseBackend, defaultBackend, parseBackend } from '../../src/tracer/backend';
import { SvctraceError } from '../../src/errors';

const OK = { ok: true };
const NO_LINKS = { ok: false, message: 'load netfilter failed: Invalid argument' };
const NO_FENTRY = { ok: false, message: 'load fentry/nf_nat_ipv4_pre_routing: Operation not permitted' };
const NO_KPROBE = { ok: false, message: 'attach kprobe/nf_nat_ipv4_pre_routing: No such file or directory' };

describe('attach backend choice', () => {
  test('auto prefers netfilter links where the kernel has them (6.4+)', () => {
    assert.equal(chooseBackend('auto', { netfilterLink: OK, natFentry: OK }).backend, 'netfilter');
    assert.equal(chooseBackend('auto', { netfilterLink: OK, natFentry: NO_FENTRY }).backend, 'netfilter');
  });

  test('auto falls back to fentry, saying why (6.1)', () => {
    const c = chooseBackend('auto', { netfilterLink: NO_LINKS, natFentry: OK, natKprobe: OK });
    assert.equal(c.backend, 'fentry');
    assert.match(c.reason, /^fentry: netfilter \(load netfilter failed: Invalid argument\) does not work here; fentry\/fexit on nf_nat's hook functions work$/);
  });

  test('auto falls back to kprobe where neither links nor module BTF exist (5.10)', () => {
    const c = chooseBackend('auto', { netfilterLink: NO_LINKS, natFentry: NO_FENTRY, natKprobe: OK });
    assert.equal(c.backend, 'kprobe');
    assert.match(c.reason, /^kprobe: netfilter \(load netfilter failed.*\) and fentry \(load fentry\/nf_nat_ipv4_pre_routing: Operation not permitted\) do not work here; kprobe\/kretprobe/);
  });

  test('auto with none: KERNEL_UNSUPPORTED naming every probe and what each needs', () => {
    assert.throws(
      () => chooseBackend('auto', { netfilterLink: NO_LINKS, natFentry: NO_FENTRY, natKprobe: NO_KPROBE }),
      (e: unknown) =>
        e instanceof SvctraceError &&
        e.code === 'KERNEL_UNSUPPORTED' &&
        /netfilter: load netfilter failed.*6\.4/.test(e.message) &&
        /fentry: load fentry\/nf_nat_ipv4_pre_routing: Operation not permitted.*module BTF/.test(e.message) &&
        /kprobe: attach kprobe\/nf_nat_ipv4_pre_routing: No such file or directory.*CONFIG_KPROBES/.test(e.message),
    );
  });

  test('an explicit backend is taken unless a probe speaks against it', () => {
    assert.equal(chooseBackend('fentry', {}).backend, 'fentry');
    assert.equal(chooseBackend('kprobe', { natKprobe: OK }).backend, 'kprobe');
    assert.throws(() => chooseBackend('kprobe', { natKprobe: NO_KPROBE }), /backend kprobe does not work on this kernel: attach kprobe.*CONFIG_KPROBES/);
    assert.equal(chooseBackend('netfilter', { netfilterLink: OK }).reason, 'netfilter: asked for with --backend');
    assert.throws(() => chooseBackend('netfilter', { netfilterLink: NO_LINKS }), /backend netfilter does not work on this kernel/);
  });

  test('--backend and $SVCTRACE_BACKEND: the four names, anything else a clear error', () => {
    assert.equal(parseBackend('auto'), 'auto');
    assert.equal(parseBackend('fentry'), 'fentry');
    assert.equal(parseBackend('kprobe'), 'kprobe');
    assert.throws(() => parseBackend('kprobes'), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT' && /auto, netfilter, fentry, kprobe \(got 'kprobes'\)/.test(e.message));
    const saved = process.env.SVCTRACE_BACKEND;
    try {
      delete process.env.SVCTRACE_BACKEND;
      assert.equal(defaultBackend(), 'auto');
      process.env.SVCTRACE_BACKEND = 'fentry';
      assert.equal(defaultBackend(), 'fentry');
      process.env.SVCTRACE_BACKEND = 'bogus';
      assert.throws(() => defaultBackend(), /SVCTRACE_BACKEND must be one of/);
    } finally {
      if (saved === undefined) delete process.env.SVCTRACE_BACKEND;
      else process.env.SVCTRACE_BACKEND = saved;
    }
  });
});
