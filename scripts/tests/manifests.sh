#!/usr/bin/env bash
# The tests of deploy/ (scripts/tests/manifests_test.py): fetches helm,
# kubectl and kubernetes-validate into the cache (scripts/lib/k8s-tools.sh),
# then runs them against the Kustomize base, the Helm chart, the installer
# built by `cargo build` (target/debug/nri-shim-installer) and the docs.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/env.sh
. scripts/lib/k8s-tools.sh
nri_k8s_tools
export NRI_K8S_TOOLS
export NRI_INSTALLER_BIN=${NRI_INSTALLER_BIN:-$PWD/target/debug/nri-shim-installer}
if [ ! -x "$NRI_INSTALLER_BIN" ]; then
    echo "$NRI_INSTALLER_BIN is missing: cargo build -p nri-shim-installer (scripts/test.sh builds every binary first)" >&2
    exit 1
fi
exec "$NRI_K8S_TOOLS/venv/bin/python3" scripts/tests/manifests_test.py
