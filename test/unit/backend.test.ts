/** Which attach backend a tracer uses, from the kernel probes (pure). */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chooseBackend, defaultBackend, parseBackend } from '../../src/tracer/backend';
import { SvctraceError } from '../../src/errors';

const OK = { ok: true };
const NO_LINKS = { ok: false, message: 'load netfilter failed: Invalid argument' };
const NO_FENTRY = { ok: false, message: 'load fentry/nf_nat_ipv4_pre_routing: Operation not permitted' };

describe('attach backend choice', () => {
  test('auto prefers netfilter links where the kernel has them (6.4+)', () => {
    assert.equal(chooseBackend('auto', { netfilterLink: OK, natFentry: OK }).backend, 'netfilter');
    assert.equal(chooseBackend('auto', { netfilterLink: OK, natFentry: NO_FENTRY }).backend, 'netfilter');
  });

  test('auto falls back to fentry, saying why (6.1)', () => {
    const c = chooseBackend('auto', { netfilterLink: NO_LINKS, natFentry: OK });
    assert.equal(c.backend, 'fentry');
    assert.match(c.reason, /^fentry: no netfilter links here \(load netfilter failed: Invalid argument\)/);
  });

  test('auto with neither: KERNEL_UNSUPPORTED naming both probes and what each needs (5.10)', () => {
    assert.throws(
      () => chooseBackend('auto', { netfilterLink: NO_LINKS, natFentry: NO_FENTRY }),
      (e: unknown) =>
        e instanceof SvctraceError &&
        e.code === 'KERNEL_UNSUPPORTED' &&
        /netfilter: load netfilter failed.*6\.4/.test(e.message) &&
        /fentry: load fentry\/nf_nat_ipv4_pre_routing: Operation not permitted.*module BTF/.test(e.message),
    );
  });

  test('an explicit backend is taken unless a probe speaks against it', () => {
    assert.equal(chooseBackend('fentry', {}).backend, 'fentry');
    assert.equal(chooseBackend('netfilter', { netfilterLink: OK }).reason, 'netfilter: asked for with --backend');
    assert.throws(() => chooseBackend('netfilter', { netfilterLink: NO_LINKS }), /backend netfilter does not work on this kernel/);
  });

  test('--backend and $SVCTRACE_BACKEND: the three names, anything else a clear error', () => {
    assert.equal(parseBackend('auto'), 'auto');
    assert.equal(parseBackend('fentry'), 'fentry');
    assert.throws(() => parseBackend('kprobes'), (e: unknown) => e instanceof SvctraceError && e.code === 'BAD_INPUT' && /auto, netfilter, fentry/.test(e.message));
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
