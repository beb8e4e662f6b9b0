#!/usr/bin/env bash
# Prometheus and promtool for the metrics tests (test/kernel/prometheus.test.ts)
# and for checking deploy/prometheus: unpacked from Debian's prometheus package
# into .cache/prometheus, not installed. Installing the package would enable
# and start a Prometheus server on this machine, scraping whatever its default
# configuration names; the tests start their own, on loopback, and stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="$PWD/.cache/prometheus"
if [ -x "$dest/usr/bin/promtool" ] && [ -x "$dest/usr/bin/prometheus" ]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
if ! apt-get download prometheus >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "fetch-prometheus: cannot download Debian's prometheus package (run as root to refresh apt's lists)" >&2
    exit 1
  fi
  apt-get update -qq
  apt-get download prometheus >/dev/null 2>&1 || { echo "fetch-prometheus: apt-get download prometheus failed" >&2; exit 1; }
fi
rm -rf "$dest"
mkdir -p "$dest"
dpkg-deb -x prometheus_*.deb "$dest"
echo "setup: Prometheus $("$dest/usr/bin/prometheus" --version 2>&1 | head -n1 | awk '{print $3}') unpacked in .cache/prometheus"
