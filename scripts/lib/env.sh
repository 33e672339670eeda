# Shared by the scripts: Debian packages, a private containerd with the
# shim on its PATH, and a busybox rootfs. Source it; needs root.

# nri_need_packages [--no-install-recommends] PACKAGE...: installs the
# packages that are not installed yet (apt-get, as root).
nri_need_packages() {
    local missing=() opts=()
    if [ "${1:-}" = --no-install-recommends ]; then
        opts+=("$1")
        shift
    fi
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" -ne 0 ]; then
            echo "missing packages ${missing[*]}: run as root or install them" >&2
            return 1
        fi
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
    fi
}

# nri_need_rust: fails, saying what to do, unless cargo and a rustc at least
# as new as the workspace's rust-version (Cargo.toml) are on PATH. Debian
# 12's packaged rustc (1.63) is too old for edition 2024.
nri_need_rust() {
    local want have
    want=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../../Cargo.toml")
    if ! command -v cargo >/dev/null 2>&1 || ! command -v rustc >/dev/null 2>&1; then
        echo "nri-shim needs Rust $want or later (cargo and rustc on PATH): install it with rustup (https://rustup.rs)" >&2
        return 1
    fi
    have=$(rustc --version | awk '{print $2}')
    if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n 1)" != "$want" ]; then
        echo "nri-shim needs Rust $want or later (edition 2024); this rustc is $have$( [ "$(command -v rustc)" = /usr/bin/rustc ] && echo ", Debian's package" ): install a newer toolchain with rustup (https://rustup.rs) and put it first on PATH" >&2
        return 1
    fi
}

# nri_patch_crates: assembles the crates.io packages the workspace builds
# with our patch files (scripts/patch-crates.py, patches/*/PATCHES.md);
# every script runs it before its first cargo command. Nothing to do (well
# under a second) when they are already assembled.
nri_patch_crates() {
    command -v python3 >/dev/null 2>&1 || nri_need_packages python3
    command -v git >/dev/null 2>&1 || nri_need_packages git
    "$(dirname "${BASH_SOURCE[0]}")/../patch-crates.py"
}

# nri_existing PATH: PATH, or before it exists its nearest existing parent
# (the file system it will be on).
nri_existing() {
    local p=$1
    while [ ! -e "$p" ]; do p=$(dirname "$p"); done
    echo "$p"
}

# nri_free_mb PATH: megabytes available on the file system of PATH.
nri_free_mb() {
    df -P -BM "$(nri_existing "$1")" | awk 'NR == 2 { sub(/M$/, "", $4); print $4 }'
}

# nri_need_disk PATH GB: fails, naming the mount point and both figures,
# unless about GB gigabytes are available where PATH is (or will be).
nri_need_disk() {
    local free
    free=$(nri_free_mb "$1")
    if [ "$free" -lt $(($2 * 1024)) ]; then
        echo "nri-shim's build and tests need about $2 GB free for $1; $(df -P "$(nri_existing "$1")" | awk 'NR == 2 { print $6 }') has $free MB: free some space (an old build: cargo clean)" >&2
        return 1
    fi
}

# nri_busybox_rootfs DIR
nri_busybox_rootfs() {
    local r=$1
    mkdir -p "$r"/{bin,proc,sys,dev,tmp,etc,root,run}
    cp /bin/busybox "$r/bin/busybox"
    for a in $("$r/bin/busybox" --list); do
        [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"
    done
}

# nri_containerd_start DIR SHIM_BIN_DIR [IDLE_TIMEOUT]
# Starts containerd with config, root, state and sockets under DIR.
nri_containerd_start() {
    local t=$1 bindir=$2 idle=${3:-2s}
    mkdir -p "$t/logs" "$t/plugins" "$t/conf.d"
    cat > "$t/config.toml" <<TOML
version = 2
root = "$t/root"
state = "$t/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$t/containerd.sock"
[ttrpc]
  address = "$t/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$t/opt"
TOML
    cat > "$t/shim.toml" <<TOML
[nri]
socket_path = "$t/nri.sock"
plugin_path = "$t/plugins"
plugin_config_path = "$t/conf.d"
[shim]
state_root = "$t/shim-state"
idle_timeout = "$idle"
TOML
    # exec: $! is containerd itself, so nri_containerd_stop can stop it.
    (cd "$t" && exec env PATH="$bindir:$PATH" NRI_SHIM_CONFIG="$t/shim.toml" \
        containerd --config "$t/config.toml" >> "$t/logs/containerd.log" 2>&1) &
    echo $! > "$t/containerd.pid"
    for _ in $(seq 1 500); do
        ctr -a "$t/containerd.sock" version >/dev/null 2>&1 && return 0
        sleep 0.02
    done
    echo "containerd did not start; see $t/logs/containerd.log" >&2
    return 1
}

# nri_containerd_stop DIR: containerd, the shim daemon, leftover cgroups.
nri_containerd_stop() {
    local t=$1
    local a="ctr -a $t/containerd.sock"
    for id in $($a t ls -q 2>/dev/null); do $a t kill -s SIGKILL "$id" >/dev/null 2>&1; $a t rm -f "$id" >/dev/null 2>&1; done
    for id in $($a c ls -q 2>/dev/null); do $a c rm "$id" >/dev/null 2>&1; done
    pkill -f "containerd-shim-nri-shim-v2 .*-address $t/containerd.sock .*daemon" 2>/dev/null || true
    if [ -f "$t/containerd.pid" ]; then
        local pid
        pid=$(cat "$t/containerd.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 250); do kill -0 "$pid" 2>/dev/null || break; sleep 0.02; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    for c in /sys/fs/cgroup/*/default; do rmdir "$c" 2>/dev/null || true; done
}
