#!/usr/bin/env bash
# The shim's responsiveness while busy (benches/benches/busy_daemon.rs),
# runc against nri-shim on one private containerd: Task.State and
# Task.ResizePty of a canary task every 5 ms while N containers (50, or
# NRI_BUSY_CREATES) are created and started at once, nri-shim with 8
# pre-installed plugin processes. Prints p50/p99/max per call, idle and
# during the burst. Run as root. Builds and measures the `dist` shim (the
# node artifact); NRI_SHIM_BIN=path measures another build;
# NRI_CONTAINERD=1.7|2.1 picks another containerd line.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh
nri_need_packages pkg-config libseccomp-dev protobuf-compiler containerd runc busybox-static
if [ -n "${NRI_CONTAINERD:-}" ] && [ "$NRI_CONTAINERD" != 1.6 ]; then
    . scripts/lib/containerd-versions.sh
    nri_containerd_versions
fi
nri_patch_crates
# runc 1.5, the reference handler's runc (the harness names it to containerd).
. scripts/lib/go-peers.sh
nri_go_peers
if [ -z "${NRI_SHIM_BIN:-}" ]; then
    cargo build --profile dist --locked -q -p nri-shim
    export NRI_SHIM_BIN=$PWD/target/dist/containerd-shim-nri-shim-v2
fi
exec cargo bench --locked -q -p nri-benches --bench busy_daemon
