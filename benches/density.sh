#!/usr/bin/env bash
# Pod density under containerd's CRI (benches/benches/density.rs), runc
# against nri-shim on one private containerd: N pods (50 and 100, or
# NRI_DENSITY_N=a,b) with one container each, created sequentially and 10 at
# a time; time until all run, the shims' process count, RSS and PSS, their
# container processes, and the teardown time. Prints one line per figure.
# Run as root. Builds and measures the `dist` shim (the node artifact);
# NRI_SHIM_BIN=path measures another build; NRI_CONTAINERD=1.7|2.1 picks
# another containerd line (scripts/lib/containerd-versions.sh unpacks it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh
nri_need_packages pkg-config libseccomp-dev protobuf-compiler containerd runc busybox-static containernetworking-plugins iproute2
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
exec cargo bench --locked -q -p nri-benches --bench density
