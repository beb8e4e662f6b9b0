import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
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
});
