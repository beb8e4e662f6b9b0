#!/usr/bin/env bash
# Fetches the Debian kernels of the VM matrix into .cache/vm/<kernel>/ without
# installing them: a private apt state (its own sources list and lists dir, the
# host's apt config untouched) resolves each suite's linux-image-amd64 to its
# concrete package, `apt-get download` fetches it, `dpkg-deb -x` unpacks it
# (installing it would drag in initramfs-tools, udev and systemd) and
# `depmod -b` indexes its modules for the guest's modprobe.
#
#   scripts/vm/kernels.sh [suite ...]      default: bookworm bookworm-backports bullseye-security
# Prints one line per kernel: "<suite> <kernel-release> <dir>".
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD/.cache/vm
apt_root=$root/apt
mkdir -p "$apt_root"/{lists/partial,archives/partial,etc} "$root/debs"

suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(bookworm bookworm-backports bullseye-security)

# The mirror the host already uses (deb822 .sources or one-line list); the
# matrix only ever reads Debian's own archive.
mirror=$(awk '/^URIs:/ { u = $2 } /^Suites:/ && u != "" { print u; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian
security_mirror=${mirror%/debian}/debian-security
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

{
  for s in "${suites[@]}"; do
    case $s in
      *-security) echo "deb [signed-by=$keyring] $security_mirror $s main" ;;
      *) echo "deb [signed-by=$keyring] $mirror $s main" ;;
    esac
  done
} > "$apt_root/etc/sources.list.new"
if ! cmp -s "$apt_root/etc/sources.list.new" "$apt_root/etc/sources.list" 2>/dev/null; then
  mv "$apt_root/etc/sources.list.new" "$apt_root/etc/sources.list"
  rm -f "$apt_root/lists/"*_Packages* 2>/dev/null || true
else
  rm -f "$apt_root/etc/sources.list.new"
fi

apt_opts=(-o Dir::Etc::SourceList="$apt_root/etc/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$apt_root/lists" -o Dir::Cache="$apt_root" -o Dir::Cache::archives="$apt_root/archives"
  -o Debug::NoLocking=1 -o APT::Sandbox::User=root)

# Lists older than a day are refreshed: a suite's kernel moves on with its ABI.
if [ -z "$(find "$apt_root/lists" -maxdepth 1 -name '*_Packages' -mmin -1440 2>/dev/null | head -n1)" ]; then
  echo "vm-kernels: reading the package lists of ${suites[*]}" >&2
  apt-get "${apt_opts[@]}" update -qq >&2
fi

for s in "${suites[@]}"; do
  # linux-image-amd64 of that suite depends on exactly one concrete image.
  pkg=$(apt-cache "${apt_opts[@]}" show "linux-image-amd64/$s" 2>/dev/null \
    | awk -F': ' '/^Depends:/ { split($2, d, " "); print d[1]; exit }')
  if [ -z "$pkg" ]; then
    echo "vm-kernels: suite $s has no linux-image-amd64 in $mirror" >&2
    exit 1
  fi
  release=${pkg#linux-image-}
  dir=$root/kernels/$release
  if [ ! -f "$dir/.complete" ]; then
    echo "vm-kernels: fetching $pkg ($s)" >&2
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$root/debs" && apt-get "${apt_opts[@]}" download -qq "$pkg" >&2)
    deb=$(ls -t "$root/debs/${pkg}_"*.deb | head -n1)
    dpkg-deb -x "$deb" "$dir"
    depmod -b "$dir" "$release"
    rm -f "$deb"
    touch "$dir/.complete"
  fi
  echo "$s $release $dir"
done
