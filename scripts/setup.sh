#!/usr/bin/env bash
# Everything a fresh machine needs before svctrace runs: Debian packages
# (incl. bookworm-backports for libbpf >= 1.3 and bpftool), npm dependencies
# from the lockfile, then the BPF objects, the native addon and the TypeScript.
# Safe to run again: each step is skipped or incremental when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-system.sh
bash scripts/fetch-prometheus.sh

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund
fi

echo "setup: building BPF objects, native addon and TypeScript"
npm run --silent build
