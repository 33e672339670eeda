#!/usr/bin/env bash
# Runs every test of nri-shim. On a fresh Debian machine (as root) it first
# installs the system packages the build and the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."

# containerd and busybox-static: the end-to-end tests run a real containerd
# with busybox containers; libseccomp-dev: libcontainer links libseccomp.
packages=(pkg-config libseccomp-dev containerd busybox-static)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "test.sh: missing packages ${missing[*]}; run as root or install them" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

cargo test --workspace --locked
