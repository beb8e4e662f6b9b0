#!/usr/bin/env -S node --max-old-space-size=128 --max-semi-space-size=8 --heap-growing-percent=30
'use strict';
// Thin launcher: the CLI lives in src/cli (compiled to dist/).
//
// The flag above: long traces allocate fast, and V8 lets its heap grow
// towards a limit sized from the machine's memory before collecting old
// garbage. On a node svctrace's memory should stay flat instead; the flow
// table and every queue are bounded, so what is live fits well within it.
// (Run through `node bin/svctrace.js` directly, Node's defaults apply.)
const path = require('node:path');
const fs = require('node:fs');
const entry = path.join(__dirname, '..', 'dist', 'src', 'cli', 'run.js');
if (!fs.existsSync(entry)) {
  process.stderr.write("svctrace: not built: run 'npm run build' first\n");
  process.exit(5);
}
require(entry).main();
