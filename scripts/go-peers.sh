#!/usr/bin/env bash
# Builds the Go reference peers pinned in peers/go.mod (containerd, ctr,
# containerd-shim-runc-v2, runc, critest, crictl) into the cache, unless
# this checkout's build is already there (scripts/lib/go-peers.sh), and
# prints its directory: the programs are in its bin/. Needs root the first
# time on a machine (Debian packages).
#
#   scripts/go-peers.sh
#   PATH=$(scripts/go-peers.sh)/bin:$PATH containerd --version
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh
. scripts/lib/go-peers.sh
nri_go_peers
echo "$NRI_GO_PEERS"
