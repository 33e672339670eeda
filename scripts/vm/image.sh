#!/usr/bin/env bash
# scripts/vm/image.sh CACHE_DIR: the VM's kernel and initramfs, built from
# Debian's archive and cached in CACHE_DIR. Prints three lines: the kernel
# image, the initramfs, and the kernel's whole module tree (the directory
# the VM links as /lib/modules/VERSION, so that the kernel loads what it
# asks for, e.g. bridge, veth and netfilter for pod networking, with the
# host's kmod). As root on Debian.
#
# The kernel is Debian's `linux-image-*-amd64` package (what the
# `linux-image-amd64` metapackage points at when nothing is cached yet),
# downloaded with `apt-get download` and unpacked with `dpkg -x` into the
# cache: it is never installed as the host's kernel. The initramfs is
# busybox-static, the modules that mount the host's filesystem (virtio PCI,
# 9p over virtio, overlayfs) with what they depend on, and
# scripts/vm/initramfs-init as /init.
set -euo pipefail
cache=$1
here=$(cd "$(dirname "$0")" && pwd)
# Modules /init loads, with their dependencies (from modules.dep).
WANTED="virtio_pci 9pnet_virtio 9p overlay"
# What the cache holds besides: the whole module tree, indexed by kmod.
CACHED="$WANTED; full module tree"

# depmod for the full tree; modprobe in the VM (the host's / is its root).
command -v depmod >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kmod >/dev/null
}

mkdir -p "$cache"
kdir=$(ls -d "$cache"/linux-image-*/ 2>/dev/null | sort | tail -n 1 || true)
kdir=${kdir%/}
if [ -z "$kdir" ] || [ ! -f "$kdir/.ok" ] || [ "$(cat "$kdir/.ok")" != "$CACHED" ]; then
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
    if [ -z "$pkg" ]; then
        apt-get update -qq
        pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
    fi
    [ -n "$pkg" ] || { echo "image.sh: no linux-image-*-amd64 package behind linux-image-amd64" >&2; exit 1; }
    kdir=$cache/$pkg
    rm -rf "$kdir" && mkdir -p "$kdir"
    echo "== VM kernel: downloading $pkg (Debian's package, unpacked into $kdir, not installed)" >&2
    deb=$(ls "$cache"/"$pkg"_*.deb 2>/dev/null | tail -n 1 || true)
    if [ -z "$deb" ]; then
        # apt-get download as root warns that _apt cannot write here; harmless.
        (cd "$cache" && apt-get download -qq "$pkg" 2>&1 | grep -v 'unsandboxed as root' >&2 || true)
        deb=$(ls "$cache"/"$pkg"_*.deb 2>/dev/null | tail -n 1)
        [ -n "$deb" ] || { echo "image.sh: apt-get download $pkg failed" >&2; exit 1; }
    fi
    x=$(mktemp -d "$cache/unpack.XXXXXX")
    dpkg -x "$deb" "$x"
    kver=$(ls "$x/lib/modules")
    cp "$x/boot/vmlinuz-$kver" "$kdir/vmlinuz"
    busybox depmod -b "$x" "$kver"
    # The closure of WANTED over modules.dep ("path.ko: dep.ko dep.ko").
    dep="$x/lib/modules/$kver/modules.dep"
    need=""
    todo=$(for m in $WANTED; do awk -v m="$m" -F: '{n=$1; sub(/.*\//, "", n); sub(/\.ko$/, "", n); gsub(/-/, "_", n)} n == m {print $1}' "$dep"; done)
    while [ -n "$todo" ]; do
        next=""
        for p in $todo; do
            case " $need " in *" $p "*) continue ;; esac
            need="$need $p"
            next="$next $(awk -v p="$p" -F': *' '$1 == p {print $2}' "$dep")"
        done
        todo=$(echo $next)
    done
    for m in $WANTED; do
        echo "$need" | grep -Eq "/${m//_/[-_]}\.ko( |$)" || { echo "image.sh: module $m not in $pkg" >&2; exit 1; }
    done
    mkdir -p "$kdir/modules/lib/modules/$kver"
    for p in $need; do
        mkdir -p "$kdir/modules/lib/modules/$kver/$(dirname "$p")"
        cp "$x/lib/modules/$kver/$p" "$kdir/modules/lib/modules/$kver/$p"
    done
    cp "$x/lib/modules/$kver"/modules.{dep,alias,symbols,builtin,order} "$kdir/modules/lib/modules/$kver/" 2>/dev/null || true
    busybox depmod -b "$kdir/modules" "$kver"
    mkdir -p "$kdir/full/lib/modules"
    mv "$x/lib/modules/$kver" "$kdir/full/lib/modules/$kver"
    depmod -b "$kdir/full" "$kver"
    rm -rf "$x"
    echo "$kver" > "$kdir/kver"
    echo "$CACHED" > "$kdir/.ok"
fi
kver=$(cat "$kdir/kver")

# The initramfs: cheap, rebuilt every time (the init script may have changed).
root=$(mktemp -d "$cache/initramfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,lower,rw,newroot}
cp /bin/busybox "$root/bin/busybox"
cp -a "$kdir/modules/lib" "$root/lib"
cp "$here/initramfs-init" "$root/init"
chmod 0755 "$root/init"
echo "$WANTED" > "$root/modules.wanted"
(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$cache/initramfs.cpio.gz.tmp"
mv "$cache/initramfs.cpio.gz.tmp" "$cache/initramfs.cpio.gz"
echo "$kdir/vmlinuz"
echo "$cache/initramfs.cpio.gz"
echo "$kdir/full/lib/modules/$kver"
