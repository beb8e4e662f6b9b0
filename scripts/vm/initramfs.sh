#!/usr/bin/env bash
# Builds the tiny initramfs that boots a matrix kernel on the host's own root
# filesystem: busybox-static, the kernel's virtio/9p/overlay modules (and their
# dependencies, decompressed: busybox insmod reads plain .ko only) and an
# /init that mounts the host root read-only over 9p, puts a tmpfs overlay on
# it and switch_roots into scripts/vm/guest-init.sh. Debian's own initrd has
# no 9p or overlay modules, so it cannot do this.
#
#   scripts/vm/initramfs.sh <kernel-dir> <release>   -> <kernel-dir>/initramfs.cpio.gz
set -euo pipefail
kdir=$1 release=$2
out=$kdir/initramfs.cpio.gz
busybox=/bin/busybox
[ -x "$busybox" ] && file -L "$busybox" 2>/dev/null | grep -q static || busybox=$(command -v busybox)
if [ "$out" -nt "$0" ] && [ "$out" -nt "$(dirname "$0")/guest-init.sh" ]; then echo "$out"; exit 0; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{bin,modules,proc,sys,dev,lower,upper,newroot}
cp "$busybox" "$work/bin/busybox"

: > "$work/modules.list"
for m in virtio_pci 9pnet_virtio 9p overlay; do
  # modprobe --show-depends prints the insmod order, dependencies first.
  modprobe -d "$kdir" -S "$release" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
done | awk '!seen[$0]++' | while read -r path; do
  name=$(basename "$path"); name=${name%.xz}; name=${name%.zst}
  case $path in
    *.xz) xz -dc "$path" > "$work/modules/$name" ;;
    *.zst) zstd -qdc "$path" > "$work/modules/$name" ;;
    *) cp "$path" "$work/modules/$name" ;;
  esac
  echo "$name" >> "$work/modules.list"
done

cat > "$work/init" <<'INIT'
#!/bin/busybox sh
bb=/bin/busybox
$bb mount -t proc proc /proc
$bb mount -t devtmpfs dev /dev
for m in $($bb cat /modules.list); do $bb insmod /modules/$m || echo "initramfs: insmod $m failed"; done
arg() { $bb sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
# cache=loose: the host root is read-only for the guest's whole life.
$bb mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower || { echo "initramfs: cannot mount the host root over 9p"; $bb poweroff -f; }
$bb mount -t tmpfs -o size=75% tmpfs /upper
$bb mkdir -p /upper/data /upper/work
$bb mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work /newroot || { echo "initramfs: overlay mount failed"; $bb poweroff -f; }
init=$(arg svt.init)
$bb umount /proc /dev
exec $bb switch_root /newroot "$init"
INIT
chmod +x "$work/init"
(cd "$work" && find . | "$busybox" cpio -o -H newc 2>/dev/null | gzip -1) > "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
echo "$out"
