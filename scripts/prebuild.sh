#!/usr/bin/env bash
# The prebuilt addon the npm package ships, in node-gyp-build's layout:
#   prebuilds/linux-<arch>/svctrace.napi.glibc.node   (N-API: package.json binary.napi_versions)
#   prebuilds/linux-<arch>/libelf.so.1, libmnl.so.0   (found through RUNPATH $ORIGIN)
# libbpf is linked in (CMakeLists.txt, SVT_PORTABLE); the BPF objects are in
# the addon as skeletons, compiled once from the committed vmlinux.h (CO-RE
# relocates them on each kernel at load). The result is checked here, not
# assumed: no libbpf among the libraries it needs, every other library it
# needs is the C/C++ runtime Node itself needs or is carried beside it.
set -euo pipefail
cd "$(dirname "$0")/.."

case $(uname -m) in x86_64) arch=x64 ;; aarch64) arch=arm64 ;; *) echo "prebuild: unsupported machine $(uname -m)" >&2; exit 2 ;; esac
out=prebuilds/linux-$arch
addon=$out/svctrace.napi.glibc.node

npx cmake-js compile --out build-portable --CDSVT_PORTABLE=ON >build-portable.log 2>&1 || {
  tail -n 40 build-portable.log >&2; echo "prebuild: the portable build failed (build-portable.log)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
cp build-portable/Release/svctrace.node "$addon"
strip --strip-unneeded "$addon"
# The libraries carried: the real files, under the sonames the addon asks for.
# awk reads all of ldconfig's output: leaving early would end ldconfig with
# SIGPIPE when it still had lines to write, which pipefail turns into a
# silent exit of this script (seen once in CI).
for lib in libelf.so.1 libmnl.so.0; do
  path=$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64|AArch64/ && !found { print $NF; found = 1 }')
  [ -n "$path" ] || { echo "prebuild: $lib not found on this machine" >&2; exit 1; }
  cp -L "$path" "$out/$lib"
done

needed=$(readelf -d "$addon" | awk '/\(NEEDED\)/ { gsub(/[\[\]]/, "", $5); print $5 }' | sort | tr '\n' ' ')
runpath=$(readelf -d "$addon" | awk '/\(RUNPATH\)/ { gsub(/[\[\]]/, "", $5); print $5 }')
allowed=" libc.so.6 libdl.so.2 libelf.so.1 libgcc_s.so.1 libm.so.6 libmnl.so.0 libpthread.so.0 libstdc++.so.6 libz.so.1 "
for lib in $needed; do
  case $allowed in *" $lib "*) ;; *) echo "prebuild: $addon needs $lib, which a node may not have" >&2; exit 1 ;; esac
done
[ "$runpath" = '$ORIGIN' ] || { echo "prebuild: RUNPATH is '$runpath', not \$ORIGIN" >&2; exit 1; }
# The newest glibc symbol version any shipped file asks for: the oldest glibc it runs on.
glibc=$(for f in "$out"/*; do objdump -T "$f"; done | grep -o 'GLIBC_[0-9.]*' | sort -t. -k1,1 -k2,2n -k3,3n -V | tail -n1)
echo "prebuild: $addon ($(du -k "$addon" | cut -f1) KiB) + libelf.so.1 libmnl.so.0; needs: $needed; glibc >= ${glibc#GLIBC_}"
