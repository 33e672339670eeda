#!/usr/bin/env bash
# scripts/vm/run.sh COMMAND...: runs COMMAND (a bash command line, from the
# repository's root) in a VM with a pure cgroup v2 hierarchy, prints its
# output and exits with its status. As root on Debian 12.
#
# The VM (qemu, TCG: nested KVM fails on our machines): Debian's kernel
# package unpacked into the cache (scripts/vm/image.sh), the host's `/`
# shared read-only over 9p under a tmpfs overlay (so the host's tools and
# this repository's prebuilt binaries run inside unchanged, and nothing the
# VM writes reaches the host), a writable 9p share for the command, its
# output and status, a virtio disk with a fresh ext4 file system (a sparse
# file on the host, deleted afterwards) that the VM mounts on /tmp, where
# the tests keep their daemons' roots: so page cache there is real file
# cache, as on a node, not tmpfs's shared memory; kernel command line `systemd.unified_cgroup_hierarchy=1
# cgroup_no_v1=all`, scripts/vm/guest.sh as PID 1 (NRI_VM_INIT=systemd:
# the host's systemd as PID 1, running guest.sh as its one service; see
# scripts/vm/initramfs-init).
#
# Environment: NRI_VM_TIMEOUT (seconds for the command, default 2400; the
# VM gets 300 more to boot and power off), NRI_VM_MEM (MiB, default 3072),
# NRI_VM_CPUS (default 2), NRI_VM_CACHE (default target/vm), NRI_VM_DISK_GB
# (the disk's size, default 16; sparse),
# NRI_VM_CONSOLE=1 to print the VM's console as it boots, NRI_VM_INIT
# (`systemd`, or empty for guest.sh as PID 1).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
. scripts/lib/env.sh
[ $# -gt 0 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }
timeout=${NRI_VM_TIMEOUT:-2400}
cache=${NRI_VM_CACHE:-$repo/target/vm}
init_args=""
case ${NRI_VM_INIT:-} in
"") ;;
systemd) init_args=" nri_vm_init=systemd" ;;
*) echo "NRI_VM_INIT=${NRI_VM_INIT}: only systemd (or nothing)" >&2; exit 2 ;;
esac

nri_need_packages busybox-static e2fsprogs
if ! command -v qemu-system-x86_64 >/dev/null; then
    # Without its recommends (the GUI, firmware and tools we do not use).
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
fi
mapfile -t img < <(scripts/vm/image.sh "$cache")

res=$(mktemp -d /tmp/nri-vm.XXXXXX)
disk=$(mktemp "$cache/disk.XXXXXX")
trap 'rm -rf "$res" "$disk"' EXIT
# Sparse; inode tables left uninitialised (zeros on a new sparse file; the
# VM mounts with noinit_itable), so neither mkfs nor the VM writes them.
truncate -s "${NRI_VM_DISK_GB:-16}G" "$disk"
mkfs.ext4 -q -F -m 0 -E lazy_itable_init=1,lazy_journal_init=1 "$disk"
printf '%s\n' "${img[2]}" > "$res/modules"
printf '%s\n' "$*" > "$res/cmd"
echo "$repo" > "$res/cwd"
echo "$timeout" > "$res/timeout"
touch "$res/console.log"
if [ "${NRI_VM_CONSOLE:-0}" = 1 ]; then
    tail -n +1 -f "$res/console.log" &
    tailpid=$!
    trap 'kill $tailpid 2>/dev/null; rm -rf "$res" "$disk"' EXIT
fi

start=$(date +%s)
rc=0
timeout -k 10 $((timeout + 300)) qemu-system-x86_64 \
    -nodefaults -no-user-config -display none -no-reboot \
    -machine pc -accel tcg,thread=multi -cpu max \
    -smp "${NRI_VM_CPUS:-2}" -m "${NRI_VM_MEM:-3072}" \
    -kernel "${img[0]}" -initrd "${img[1]}" \
    -append "console=ttyS0 quiet loglevel=4 panic=-1 no_timer_check rdinit=/init systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all nri_vm_stage2=$repo/scripts/vm/guest.sh$init_args" \
    -serial "file:$res/console.log" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$res,mount_tag=results,security_model=none,multidevs=remap" \
    -drive "file=$disk,format=raw,if=virtio,cache=unsafe" \
    </dev/null || rc=$?
echo "== VM ran for $(($(date +%s) - start)) s (qemu status $rc)" >&2
if [ ! -f "$res/status" ]; then
    echo "== the command did not finish in the VM; its console:" >&2
    tail -n 60 "$res/console.log" >&2
    [ -f "$res/output" ] && { echo "== its output so far:" >&2; cat "$res/output"; }
    exit 1
fi
cat "$res/output"
exit "$(cat "$res/status")"
