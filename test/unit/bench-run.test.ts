import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { launcherV8Flags } from '../../bench/run';

describe('benchmark runner', () => {
  it("runs the live pipeline's benchmarks with the V8 flags of svctrace's launcher", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svt-bench-'));
    try {
      const launcher = path.join(dir, 'svctrace.js');
      fs.writeFileSync(launcher, "#!/usr/bin/env -S node --max-old-space-size=64 --heap-growing-percent=30\n'use strict';\n");
      assert.deepEqual(launcherV8Flags(launcher), ['--max-old-space-size=64', '--heap-growing-percent=30']);
      fs.writeFileSync(launcher, "'use strict'; // --not-a-flag\n");
      assert.deepEqual(launcherV8Flags(launcher), [], 'no #! line, no flags');
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    // The real launcher's line gives some (what a trace runs with), and nothing but flags.
    const real = launcherV8Flags();
    assert.ok(real.length > 0 && real.every((f) => f.startsWith('--')), real.join(' '));
  });

  it('the two-checkout datapath comparison says how to call it, before building any lab, when its arguments are wrong', () => {
    const script = path.join(__dirname, '..', '..', 'bench', 'datapath-compare.js');
    for (const args of [[], ['../other', 'many']]) {
      const r = spawnSync(process.execPath, [script, ...args], { encoding: 'utf8', timeout: 30_000 });
      assert.equal(r.status, 2, r.stderr);
      assert.match(r.stderr, /usage: node dist\/bench\/datapath-compare\.js OTHER_CHECKOUT/);
    }
  });
});
