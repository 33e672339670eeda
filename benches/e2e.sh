#!/usr/bin/env bash
# End-to-end timings, in one go so ratios are fair: median wall time of
# `ctr run --rm` of a trivial busybox container over N runs (default 20) for
#   (a) containerd's runc v2 shim with runc 1.5 (from the Go peers,
#   scripts/lib/go-peers.sh), (b) nri-shim without plugins,
#   (c) nri-shim with 2 plugin processes (nri-adjuster + nri-logger);
# and the nri-shim daemon's RSS with 20 running containers.
# Run as root (builds the `dist` binaries first: the node artifact). Prints one line per figure.
# NRI_SHIM_BIN=path compares another build of the shim.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh
. scripts/lib/go-peers.sh
N=${1:-20}
nri_need_packages pkg-config libseccomp-dev containerd busybox-static bc
nri_patch_crates
nri_go_peers
cargo build --profile dist --locked -q -p nri-shim -p nri-adjuster -p nri-logger

median_run() { # DIR RUNTIME LABEL
    local t=$1 rt=$2 label=$3 times=() runc=()
    # runc's shim runs the reference runc, 1.5.
    [ "$rt" != io.containerd.runc.v2 ] || runc=(--runc-binary "$NRI_GO_PEERS_BIN/runc")
    for i in $(seq 1 "$N"); do
        local s e
        s=$(date +%s%N)
        ctr -a "$t/containerd.sock" run --rm --fifo-dir "$t/fifo" --runtime "$rt" "${runc[@]}" \
            --rootfs "$t/rootfs" "bench-$i" /bin/true >&2
        e=$(date +%s%N)
        times+=($(( (e - s) / 1000 )))
    done
    local med
    med=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    # The figure to the terminal (stderr), the number to the caller.
    printf '%-40s median %6.1f ms over %d runs\n' "$label" "$(echo "$med / 1000" | bc -l)" "$N" >&2
    echo "$med"
}

setup() { # DIR PLUGINS(0|2)
    local t=$1
    mkdir -p "$t/bin"
    ln -sf "${NRI_SHIM_BIN:-$PWD/target/dist/containerd-shim-nri-shim-v2}" "$t/bin/containerd-shim-nri-shim-v2"
    nri_busybox_rootfs "$t/rootfs"
    mkdir -p "$t/plugins" "$t/conf.d"
    if [ "$2" = 2 ]; then
        cp target/dist/nri-adjuster "$t/plugins/10-adjuster"
        cp testdata/plugins/adjuster.toml "$t/conf.d/10-adjuster.conf"
        cp target/dist/nri-logger "$t/plugins/90-logger"
    fi
    nri_containerd_start "$t" "$t/bin" 60s
}

A=$(mktemp -d /tmp/nri-bench-a.XXXXXX); B=$(mktemp -d /tmp/nri-bench-b.XXXXXX); C=$(mktemp -d /tmp/nri-bench-c.XXXXXX)
trap 'for d in "$A" "$B" "$C"; do nri_containerd_stop "$d"; rm -rf "$d"; done' EXIT
setup "$A" 0; setup "$B" 0; setup "$C" 2
# Warm-up: page cache, and the nri-shim daemons come up.
for d in "$A" "$B" "$C"; do ctr -a "$d/containerd.sock" run --rm --fifo-dir "$d/fifo" --runtime io.containerd.nri-shim.v2 --rootfs "$d/rootfs" warm /bin/true; done
ra=$(median_run "$A" io.containerd.runc.v2 "(a) runc v2 shim")
rb=$(median_run "$B" io.containerd.nri-shim.v2 "(b) nri-shim, no plugins")
rc=$(median_run "$C" io.containerd.nri-shim.v2 "(c) nri-shim, 2 plugin processes")
printf 'ratio (b)/(a) %.2f   (c)/(a) %.2f\n' "$(echo "$rb / $ra" | bc -l)" "$(echo "$rc / $ra" | bc -l)"
# RSS of the daemon with 20 running containers.
for i in $(seq 1 20); do
    ctr -a "$C/containerd.sock" run -d --fifo-dir "$C/fifo" --runtime io.containerd.nri-shim.v2 --rootfs "$C/rootfs" "idle-$i" /bin/sleep 300
done
pid=$(pgrep -f "containerd-shim-nri-shim-v2 .*-address $C/containerd.sock .*daemon")
printf 'nri-shim daemon RSS with 20 containers (2 plugins): %s KiB (anon %s, file %s; threads %s)\n' \
    "$(awk '/VmRSS/ {print $2}' /proc/"$pid"/status)" "$(awk '/RssAnon/ {print $2}' /proc/"$pid"/status)" \
    "$(awk '/RssFile/ {print $2}' /proc/"$pid"/status)" "$(awk '/Threads/ {print $2}' /proc/"$pid"/status)"
