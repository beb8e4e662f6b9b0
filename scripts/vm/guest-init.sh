#!/bin/bash
# PID 1 of a matrix VM, on the host's root filesystem (read-only 9p under a
# tmpfs overlay). Mounts what a node has, makes the guest kernel's modules
# visible at /lib/modules, runs the command the host wrote to the svtout share
# and hands its exit code back there, then powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
arg() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs shm /dev/shm
# A tmpfs /run, or the host's /run/netns (and its lock files) would show through.
mount -t tmpfs run /run && mkdir -p /run/netns /run/lock
# /tmp stays the host's, read-only under the overlay's tmpfs: the project
# may live there (a CI clone), and writes go to the overlay anyway.
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
echo 1 > /proc/sys/kernel/sysrq

out=/mnt/svtout
mkdir -p $out && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 svtout $out
off() { sync; echo o > /proc/sysrq-trigger; sleep 10; }

release=$(uname -r)
kdir=$(arg svt.kdir)
mkdir -p /lib/modules/$release && mount --bind "$kdir/lib/modules/$release" /lib/modules/$release
mkdir -p /boot && cp "$kdir/boot/config-$release" /boot/ 2>/dev/null
ip link set lo up
hostname "svt-vm-$(echo "${release%%-*}" | tr -c "0-9a-z\n" -)"
ulimit -n 65536

echo "guest: Linux $release up in $(cut -d' ' -f1 /proc/uptime) s"
cd "$(arg svt.cwd)" || { echo 125 > $out/rc; off; }
bash $out/cmd.sh < /dev/null
echo $? > $out/rc
off
