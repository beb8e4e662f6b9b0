#!/usr/bin/env node
// Bundles the dashboard (src/dashboard) into dist/dashboard: app.js, app.css
// and index.html. Everything the page needs is served by svctrace itself.
'use strict';
const path = require('node:path');
const fs = require('node:fs');
const esbuild = require('esbuild');

const root = path.join(__dirname, '..');
const out = path.join(root, 'dist', 'dashboard');
fs.mkdirSync(out, { recursive: true });
esbuild
  .build({
    entryPoints: { app: path.join(root, 'src', 'dashboard', 'main.ts') },
    bundle: true,
    minify: true,
    sourcemap: true,
    format: 'iife',
    target: ['chrome110', 'firefox110', 'safari16'],
    outdir: out,
    logLevel: 'warning',
  })
  .then(() => fs.copyFileSync(path.join(root, 'src', 'dashboard', 'index.html'), path.join(out, 'index.html')))
  .catch(() => process.exit(1));
