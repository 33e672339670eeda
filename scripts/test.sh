#!/usr/bin/env bash
# Runs every test of nri-shim. On a fresh Debian machine (as root) it first
# installs the system packages the build and the tests need.
#
# Every part runs even when one before failed (a failure on containerd 1.6
# does not hide 1.7 and 2.1); the run ends with one summary line per part
# (passed or FAILED, and its time) and exits non-zero if any part failed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh
. scripts/lib/containerd-versions.sh
. scripts/lib/go-peers.sh

nri_need_rust
# containerd and busybox-static: the end-to-end tests run a real containerd
# with busybox containers; libseccomp-dev: libcontainer links libseccomp.
nri_need_packages pkg-config libseccomp-dev containerd busybox-static
# The CRI lane (integration/tests/cri.rs): runc, the reference handler next to
# nri-shim; containernetworking-plugins (bridge, host-local, loopback) for pod
# networks; iproute2 (`ip`: the lane picks a free subnet, removes its bridge);
# protobuf-compiler: the k8s-cri crate's build runs `protoc`.
# iptables: the CNI portmap plugin's hostPort rules.
nri_need_packages runc containernetworking-plugins iproute2 protobuf-compiler iptables
# The WebAssembly plugins of the tests (plugins/wasm/build.rs): Debian's
# Rust 1.63 compiler (/usr/bin/rustc; rustup's stays first on PATH) with
# the wasm32-wasi standard library, and the linker it calls. Without
# recommends: Debian's cargo, clang and llvm are not needed.
nri_need_packages --no-install-recommends rustc libstd-rust-dev-wasm32 lld-14
# The CRI lane also runs on containerd 1.7 and 2.1, unpacked privately under
# /var/cache/nri-shim (curl fetches them).
nri_need_packages curl
# The installer's tests: openssl makes the stand-in API server's CA and
# certificate; binutils (readelf) for the installer image's libraries;
# python3-venv for the manifest tests' kubernetes-validate (scripts/lib/
# k8s-tools.sh); util-linux (unshare) for the quickstart's mount namespace.
nri_need_packages openssl binutils python3-venv util-linux
nri_containerd_versions
# The Go reference peers (peers/go.mod): containerd 2.4 (the fourth line
# below) and runc 1.5, built from their Go modules into the cache once per
# pin (about 3.5 minutes cold on two cores, nothing after); exports
# NRI_GO_PEERS_BIN, where the tests find them.
nri_go_peers

nri_patch_crates
# A cold build of every test binary took 7.9 GB under target/debug
# (2026-12-05); the release build, the installer image and the VM lane add
# a few more. Stop now, saying so, rather than with a linker killed midway.
nri_need_disk target 15

summary=()
failed=0
# part NAME COMMAND...: runs the command, records its outcome and time.
part() {
    local name=$1 start rc=0
    shift
    start=$(date +%s)
    echo "== $name" >&2
    "$@" || rc=$?
    local took=$(($(date +%s) - start)) free full=
    # Free space where the build writes: a full disk shows up as a linker
    # killed by SIGBUS or an ENOSPC deep in a test, so the summary says it.
    free=$(nri_free_mb target)
    if [ "$rc" -eq 0 ]; then
        summary+=("passed  $name (${took} s, ${free} MB free after)")
    else
        if [ "$free" -lt 1024 ]; then full=": the disk is full"; fi
        summary+=("FAILED  $name (${took} s, exit status $rc, ${free} MB free after$full)")
        failed=1
    fi
}

# The assembly itself: a patch that no longer applies, edits kept, pins.
part "patch-crates tests" python3 scripts/tests/patch_crates_test.py
# The fuzz crate is outside the workspace, with a lock file of its own
# that a new dependency of a workspace crate makes stale; .ci/run fuzzes
# last, so say it here, in the summary, not after the whole run.
part "fuzz/Cargo.lock up to date" \
    cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml -q >/dev/null
# cargo test builds the binaries of packages that have integration tests
# only; the integration tests run every binary of the workspace (the
# installer's package has no tests of its own), so build them all first.
part "workspace binaries" cargo build --workspace --bins --locked
part "workspace (containerd $(containerd --version | awk '{print $3}'), system's)" \
    cargo test --workspace --locked --no-fail-fast
# deploy/: the Kustomize base and Helm chart render and validate against
# Kubernetes' schemas, with the installer the workspace run built.
part "deploy manifests (kustomize, helm, kubernetes-validate)" scripts/tests/manifests.sh
# The installer image: built twice (the same bytes), imported and run with ctr.
part "installer image (scripts/build-image.sh)" scripts/tests/image.sh
# docs/quickstart.md, every command as written, on each containerd line.
part "quickstart (docs/quickstart.md on containerd 1.6, 1.7, 2.1, 2.4)" scripts/tests/quickstart.sh
# The containerd tests, the CRI lane, `configure containerd` on the line's
# own config, the node-safety tests (containerd restarts, config reloads,
# in-place upgrades), the kubelet-shaped workload under load and the
# private state again on each containerd line unpacked above and on 2.4,
# built from its Go module (the workspace run used the system's 1.6); the
# integration tests pick the line from NRI_CONTAINERD.
for line in "${NRI_CONTAINERD_LINES[@]%% *}" 2.4; do
    part "containerd $line: containerd, cri, configure, installer, node_safe, node_reload, upgrade, kubelet_workload, private_state" \
        env NRI_CONTAINERD="$line" cargo test --locked --no-fail-fast -p integration \
        --test containerd --test cri --test configure --test installer --test node_safe --test node_reload --test upgrade --test kubelet_workload --test private_state
done

# critest (cri-tools' CRI validation suite) with runc 1.5 and nri-shim on
# the same containerd, one 1.x line and 2.4: fails when a spec passes with
# runc and not with nri-shim (beyond the differences docs/testing.md
# lists); prints one summary line per handler. About 2 minutes a line.
for line in 1.7 2.4; do
    part "critest on containerd $line (runc 1.5 and nri-shim)" \
        env NRI_CONTAINERD="$line" NRI_CRITEST_OUT="$PWD/target/critest/$line" \
        cargo test --locked -p integration --test critest -- --nocapture
done

echo "== summary" >&2
printf '%s\n' "${summary[@]}" >&2
exit "$failed"
