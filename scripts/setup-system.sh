#!/usr/bin/env bash
# Installs the system packages svctrace needs to build and run its tests.
# Idempotent: a package already installed is left alone, apt is only touched
# when something is missing. libbpf >= 1.3 (netfilter links) and a bpftool
# that can generate skeletons come from bookworm-backports; stock bookworm
# ships libbpf 1.1.
set -euo pipefail

PLAIN_PKGS=(clang llvm make cmake g++ pkg-config libelf-dev zlib1g-dev libmnl-dev
  iptables nftables conntrack iproute2 curl libcap2-bin util-linux tshark chromium wrk)
BACKPORT_PKGS=(libbpf-dev bpftool)

need_update=0
missing=()
for p in "${PLAIN_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

libbpf_ok() {
  local v
  v=$(dpkg-query -W -f='${Version}' libbpf-dev 2>/dev/null || true)
  [ -n "$v" ] && dpkg --compare-versions "$v" ge "1:1.3" && command -v bpftool >/dev/null
}

if [ ${#missing[@]} -eq 0 ] && libbpf_ok; then
  echo "setup-system: all system packages present"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "setup-system: missing packages (${missing[*]:-} libbpf-dev>=1.3/bpftool); run as root to install them" >&2
  exit 1
fi

. /etc/os-release
codename=${VERSION_CODENAME:-bookworm}
bp_list=/etc/apt/sources.list.d/svctrace-backports.list
if ! grep -rqs "${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "deb http://deb.debian.org/debian ${codename}-backports main" > "$bp_list"
  echo "setup-system: added ${codename}-backports suite ($bp_list)"
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! libbpf_ok; then
  apt-get install -y -qq --no-install-recommends -t "${codename}-backports" "${BACKPORT_PKGS[@]}"
fi
libbpf_ok || { echo "setup-system: libbpf-dev >= 1.3 and bpftool still missing" >&2; exit 1; }
echo "setup-system: done (libbpf-dev $(dpkg-query -W -f='${Version}' libbpf-dev))"
