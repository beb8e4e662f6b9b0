#!/usr/bin/env node
'use strict';
// Thin launcher: the CLI lives in src/cli (compiled to dist/).
const path = require('node:path');
const fs = require('node:fs');
const entry = path.join(__dirname, '..', 'dist', 'src', 'cli', 'run.js');
if (!fs.existsSync(entry)) {
  process.stderr.write("svctrace: not built: run 'npm run build' first\n");
  process.exit(5);
}
require(entry).main();
