#!/usr/bin/env bash
# Boots one matrix kernel under qemu on the host's root filesystem and runs a
# command in it from the project directory; exits with the command's code.
# KVM when the CPU exposes vmx/svm and /dev/kvm opens, else TCG. The guest has
# no network device (-nic none): its only networks are the lab namespaces the
# tests make inside it.
#
#   scripts/vm/boot.sh <kernel-release> [--timeout SECONDS] [--mem MB] -- command [args...]
# Environment variables named CI, SVT_* or SVCTRACE_* are passed into the guest.
set -euo pipefail
cd "$(dirname "$0")/../.."
project=$PWD
release=$1; shift
timeout=1800 mem=3072
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) timeout=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "vm-boot: unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "vm-boot: no command given" >&2; exit 2; }
kdir=$project/.cache/vm/kernels/$release
[ -f "$kdir/.complete" ] || { echo "vm-boot: kernel $release is not fetched (scripts/vm/kernels.sh)" >&2; exit 2; }
command -v qemu-system-x86_64 >/dev/null || { echo "vm-boot: qemu-system-x86_64 is missing (bash scripts/setup-system.sh vm)" >&2; exit 2; }
initrd=$(bash scripts/vm/initramfs.sh "$kdir" "$release")

share=$(mktemp -d /tmp/svt-vm.XXXXXX)
qemu_pid=
cleanup() { [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null; rm -rf "$share"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
accel=tcg,thread=multi cpu=max
if grep -qE '\b(vmx|svm)\b' /proc/cpuinfo && [ -r /dev/kvm ] && [ -w /dev/kvm ] && [ -z "${SVT_VM_TCG:-}" ]; then
  accel=kvm cpu=host
fi
{
  echo "set -o pipefail"
  # An emulated CPU is several times slower: the tests' readiness waits stretch.
  [ "$accel" = kvm ] || echo "export SVT_TEST_TIME_SCALE=\${SVT_TEST_TIME_SCALE:-6}"
  env | grep -E '^(CI|SVT_[A-Z0-9_]+|SVCTRACE_[A-Z0-9_]+)=' | sed "s/'/'\\\\''/g; s/^\([^=]*\)=\(.*\)$/export \1='\2'/" || true
  printf '%q ' "$@"; echo
} > "$share/cmd.sh"
# A guest that hangs is killed (timeout): the matrix must end.
boot() {
  timeout -k 10 "$timeout" qemu-system-x86_64 -accel "$1" -cpu "$2" -smp 2 -m "$mem" -nodefaults -no-reboot \
    -display none -serial stdio -monitor none -nic none \
    -kernel "$kdir/boot/vmlinuz-$release" -initrd "$initrd" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init svt.init=$project/scripts/vm/guest-init.sh svt.kdir=$kdir svt.cwd=$project" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs local,path="$share",mount_tag=svtout,security_model=none,multidevs=remap \
    < /dev/null &
  qemu_pid=$!
  qemu_rc=0
  wait "$qemu_pid" || qemu_rc=$?
  qemu_pid=
}
started=$(date +%s)
boot "$accel" "$cpu"
if [ "$accel" = kvm ] && [ ! -s "$share/rc" ] && [ $(( $(date +%s) - started )) -lt 30 ]; then
  # A /dev/kvm that a paravirtualised host exposes but cannot run guests on.
  echo "vm-boot: KVM failed (qemu exit $qemu_rc); booting again under TCG" >&2
  sed -i '2i export SVT_TEST_TIME_SCALE=${SVT_TEST_TIME_SCALE:-6}' "$share/cmd.sh"
  boot tcg,thread=multi max
fi
if [ "$qemu_rc" = 124 ]; then
  echo "vm-boot: $release timed out after ${timeout}s" >&2
  exit 124
fi
if [ ! -s "$share/rc" ]; then
  echo "vm-boot: $release ended without the command's exit code" >&2
  exit 124
fi
exit "$(cat "$share/rc")"
