#!/usr/bin/env bash
# Runs every test of nri-shim. On a fresh Debian machine (as root) it first
# installs the system packages the build and the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh

# containerd and busybox-static: the end-to-end tests run a real containerd
# with busybox containers; libseccomp-dev: libcontainer links libseccomp.
nri_need_packages pkg-config libseccomp-dev containerd busybox-static

cargo test --workspace --locked
