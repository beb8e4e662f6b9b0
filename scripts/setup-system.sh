#!/usr/bin/env bash
# Installs the system packages svctrace needs to build and run its tests.
# Idempotent: a package already installed is left alone, apt is only touched
# when something is missing. libbpf >= 1.3 (netfilter links) and a bpftool
# that can generate skeletons come from bookworm-backports; stock bookworm
# ships libbpf 1.1.
set -euo pipefail

# mmdebstrap: the minimal Debian roots the npm package is installed into
# (test/kernel/package-install.test.ts) and the image is made of (npm run
# image); podman with runc runs that image (crun rejects these machines'
# hybrid cgroups).
PLAIN_PKGS=(clang llvm make cmake g++ pkg-config libelf-dev zlib1g-dev libmnl-dev
  iptables nftables conntrack iproute2 curl libcap2-bin util-linux tshark chromium wrk
  mmdebstrap podman runc)
# `setup-system.sh vm`: also what the kernel matrix (scripts/vm/) boots
# Debian's kernels with: qemu, busybox for the initramfs, kmod (depmod on the
# host, modprobe in the guest), xz for compressed modules, and ipvsadm and
# ipset for the lab's kube-proxy IPVS mode (IPVS is in those kernels).
if [ "${1:-}" = vm ]; then
  PLAIN_PKGS+=(qemu-system-x86 busybox-static kmod xz-utils ipvsadm ipset)
fi
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
bp_file=/etc/apt/sources.list.d/svctrace-backports.sources
if ! grep -rqs -- "${codename}-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  # Reuse the mirror this machine already uses for ${codename} itself, from
  # its deb822 .sources files or a one-line sources.list entry.
  uris=$(awk -v s="$codename" '
    /^URIs:/ { u = substr($0, 7) }
    /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s && u != "") { print u; exit } }
    /^$/ { u = "" }' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  if [ -z "$uris" ]; then
    uris=$(awk -v s="$codename" '$1 == "deb" && $3 == s { print $2; exit }' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1)
  fi
  if [ -z "$uris" ]; then
    echo "setup-system: cannot find this machine's Debian mirror to add ${codename}-backports" >&2
    exit 1
  fi
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  {
    echo "Types: deb"
    echo "URIs: ${uris# }"
    echo "Suites: ${codename}-backports"
    echo "Components: main"
    [ -f "$keyring" ] && echo "Signed-By: $keyring"
  } > "$bp_file"
  echo "setup-system: added ${codename}-backports suite ($bp_file)"
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
