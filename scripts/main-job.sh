#!/usr/bin/env bash
# The main job: a private containerd (Debian's) runs a busybox container
# through containerd-shim-nri-shim-v2 with the nri-adjuster plugin
# pre-installed; the container prints what NRI changed. Run as root on
# Debian; installs what is missing, builds, cleans up after itself.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh

nri_need_packages pkg-config libseccomp-dev containerd busybox-static
# NRI_SHIM_BIN_DIR: run prebuilt binaries from there (the cgroup v2 VM lane
# runs the debug build it already has) instead of building.
bindir=${NRI_SHIM_BIN_DIR:-}
if [ -z "$bindir" ]; then
    echo "== building (release; the first build takes about 5 minutes on 2 idle cores)"
    nri_need_rust
    nri_patch_crates
    cargo build --release --locked -p nri-shim -p nri-adjuster
    bindir=target/release
fi
bindir=$(cd "$bindir" && pwd)
T=$(mktemp -d /tmp/nri-shim-main.XXXXXX)
trap 'nri_containerd_stop "$T"; rm -rf "$T"' EXIT
mkdir -p "$T/bin"
ln -s "$bindir/containerd-shim-nri-shim-v2" "$T/bin/"
nri_busybox_rootfs "$T/rootfs"
mkdir -p "$T/plugins" "$T/conf.d"
cp "$bindir/nri-adjuster" "$T/plugins/10-adjuster"
cp testdata/plugins/adjuster.toml "$T/conf.d/10-adjuster.conf"
nri_containerd_start "$T" "$T/bin"
echo "== containerd $(containerd --version | awk '{print $3}') on $T/containerd.sock, runtime io.containerd.nri-shim.v2"
echo "== plugin 10-adjuster rules: testdata/plugins/adjuster.toml"
echo "== ctr run --rm --runtime io.containerd.nri-shim.v2 app (inside the container:)"
rc=0
ctr -a "$T/containerd.sock" run --rm --fifo-dir "$T/fifo" --runtime io.containerd.nri-shim.v2 \
    --mount type=bind,src=/sys/fs/cgroup,dst=/sys/fs/cgroup,options=rbind:ro \
    --rootfs "$T/rootfs" app /bin/sh -c '
        echo "  FOO=$FOO"
        echo "  mount: $(grep " /opt/nri " /proc/mounts)"
        echo "  memory limit: $(cat /sys/fs/cgroup/memory/default/app/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/default/app/memory.max) bytes"
        echo "  cgroup: $(grep memory /proc/self/cgroup || grep "^0::" /proc/self/cgroup)"' || rc=$?
echo "== ctr exit status $rc; what the shim logged (it goes to containerd's log too):"
grep -hE "plugin registration|NRI plugin active|task created|process exited|task deleted" "$T"/shim-state/*/shim.log | sed 's/^/  /' || true
exit "$rc"
