#!/bin/sh
# Stage 2 of the VM's boot, PID 1 on the overlay of the host's `/` (see
# scripts/vm/initramfs-init): a pure cgroup v2 system without systemd.
# Mounts proc, sys, cgroup2 (every controller enabled for the children),
# devtmpfs, devpts, tmpfs on /run and /dev/shm, and the VM's ext4 disk
# (/dev/vda) on /tmp. With the argument `systemd` it is instead the one
# service of systemd as PID 1, which has mounted all of that but /tmp: it
# mounts only /tmp. Either way it links the VM kernel's module tree (its
# path in /vm-results/modules) as /lib/modules/VERSION, so the kernel's
# module requests (through the host's modprobe) find them. Runs the command in
# /vm-results/cmd (a shell script, from the directory in /vm-results/cwd,
# within /vm-results/timeout seconds) writing its output to
# /vm-results/output and its exit status to /vm-results/status; powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
R=/vm-results
say() { echo "guest: $*" > /dev/console 2>&1 || true; }
mode=${1:-init}
if [ "$mode" != systemd ]; then
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
    mkdir -p /dev/pts /dev/shm
    mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
fi
# The checkout may live under a directory the tmpfs mounts below hide (a
# clone in /tmp): hold it aside and put it back on top.
cwd=$(cat $R/cwd)
keep=/vm-keep
case "$cwd/" in
/tmp/* | /run/* | /dev/shm/*) mkdir -p $keep && mount --bind "$cwd" $keep ;;
esac
fatal() { # the command cannot run: say why as its output, status 125
    say "$*"
    echo "guest: $*" > $R/output
    echo 125 > $R/status
    sync
    /bin/busybox poweroff -f
}
mkdir -p /lib/modules
ln -sfn "$(cat $R/modules)" "/lib/modules/$(uname -r)" || fatal "cannot link the module tree"
modprobe virtio_blk && modprobe ext4 || fatal "cannot load virtio_blk and ext4"
i=0
until [ -b /dev/vda ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || fatal "no disk /dev/vda"
    sleep 0.1
done
mount -t ext4 -o noinit_itable /dev/vda /tmp || fatal "cannot mount /dev/vda on /tmp"
chmod 1777 /tmp
if [ "$mode" != systemd ]; then
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    mount -t tmpfs -o mode=0755 tmpfs /run
fi
if mountpoint -q $keep 2>/dev/null; then
    mkdir -p "$cwd" && mount --move $keep "$cwd" || say "cannot put $cwd back"
fi
if [ "$mode" != systemd ]; then
    mount -t cgroup2 cgroup2 /sys/fs/cgroup
    for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
        echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control || say "cannot enable controller $c"
    done
fi
ip link set lo up 2>/dev/null || /bin/busybox ip link set lo up
hostname nri-vm
say "PID 1 $(cat /proc/1/comm); cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.subtree_control); kernel $(uname -r)"
(
    cd "$cwd" || exit 125
    exec timeout -k 10 "$(cat $R/timeout)" /bin/bash $R/cmd
) > $R/output 2>&1 < /dev/null
echo $? > $R/status.tmp
mv $R/status.tmp $R/status
say "command exited with status $(cat $R/status)"
sync
/bin/busybox poweroff -f
