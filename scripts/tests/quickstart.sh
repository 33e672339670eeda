#!/usr/bin/env bash
# Runs docs/quickstart.md as written on each containerd line (issue 31 item
# 2), each in a mount namespace of its own with a private containerd
# (scripts/tests/quickstart_test.py says how). `quickstart.sh 2.1` runs one
# line; default: 1.6 (the system's), 1.7, 2.1 and 2.4 (built from its Go
# module, scripts/lib/go-peers.sh). Needs root.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/env.sh
. scripts/lib/containerd-versions.sh
. scripts/lib/go-peers.sh
nri_need_packages containerd busybox-static python3 util-linux
nri_containerd_versions
nri_go_peers
lines=("$@")
[ ${#lines[@]} -gt 0 ] || lines=(1.6 1.7 2.1 2.4)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
for line in "${lines[@]}"; do
    if [ "$line" = 1.6 ]; then
        bin=/usr/bin
        # The machine's own file (Debian 12's package installed it).
        config=/etc/containerd/config.toml
    elif [ "$line" = 2.4 ]; then
        # No package: the page's advice, `containerd config default`.
        bin=$NRI_GO_PEERS_BIN
        config=$scratch/config-2.4.toml
        "$bin/containerd" config default > "$config"
    else
        bin=$NRI_CONTAINERD_CACHE/containerd-$line/usr/bin
        config=$NRI_CONTAINERD_CACHE/containerd-$line/etc/containerd/config.toml
    fi
    start=$(date +%s)
    if unshare --mount --propagation private -- /usr/bin/python3 scripts/tests/quickstart_test.py \
        --line "$line" --containerd-bin "$bin" --package-config "$config"; then
        echo "quickstart on containerd $line: passed ($(($(date +%s) - start)) s)" >&2
    else
        echo "quickstart on containerd $line: FAILED ($(($(date +%s) - start)) s)" >&2
        failed=1
    fi
done
exit "$failed"
