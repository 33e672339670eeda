# The Go reference peers (peers/go.mod: containerd v2.4, runc 1.5, critest
# and crictl 1.37, crane, ginkgo), built from their Go modules for the tests, never shipped.
# Source it after env.sh; `nri_go_peers` needs root the first time (Debian
# packages) and the Go module proxy the first time on a machine (modules).
#
# Each build goes to $NRI_GO_PEERS_CACHE/<key>/, where <key> hashes
# peers/go.mod, peers/go.sum, this file and the Go toolchain: a pin, flag or
# Go change gets a new directory, and an unchanged one is found by its stamp
# and costs nothing. A build is made in a temporary directory and renamed
# into place, so a half-built one is never used. $NRI_GO_PEERS_CACHE/current
# (a symlink) names the newest build for tools outside bash.
#
# Go's build cache (GOCACHE, its default place unless the caller sets it)
# and module cache are left alone and kept between runs: after a pin change
# only what changed compiles again.
#
# nri's sample plugins (plugins/logger, ..., plugins/wasm) are not built:
# each is a nested Go module that upstream never tags and the module proxy
# does not serve (peers/README.md). Were they served, they would go in
# bin/nri-<plugin> and wasm/<plugin>.wasm, and NRI_GO_PEERS_WASM names that
# folder already.

NRI_GO_PEERS_CACHE=${NRI_GO_PEERS_CACHE:-${NRI_CONTAINERD_CACHE:-/var/cache/nri-shim}/go-peers}

# nri_go_peers_key: the cache key (16 hex digits) of this checkout's pins.
nri_go_peers_key() {
    local root
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    {
        cat "$root/peers/go.mod" "$root/peers/go.sum" "${BASH_SOURCE[0]}"
        go env GOVERSION GOOS GOARCH
    } | sha256sum | cut -c1-16
}

# nri_go_peers_export DIR: the variables the tests read.
nri_go_peers_export() {
    export NRI_GO_PEERS=$1
    export NRI_GO_PEERS_BIN=$1/bin
    export NRI_GO_PEERS_WASM=$1/wasm
}

# nri_go_peers_current KEY: points $NRI_GO_PEERS_CACHE/current at KEY,
# swapped in by one rename so that a reader never finds it missing.
nri_go_peers_current() {
    [ "$(readlink "$NRI_GO_PEERS_CACHE/current" 2>/dev/null)" = "$1" ] && return 0
    ln -sfn "$1" "$NRI_GO_PEERS_CACHE/.current.$$" &&
        mv -T "$NRI_GO_PEERS_CACHE/.current.$$" "$NRI_GO_PEERS_CACHE/current"
}

# nri_go_peers_build PEERS_DIR OUT NAME GO_COMMAND [ARGS...]: one program
# (`go build ARGS` or `go test -c ARGS`) into OUT/bin/NAME, timed.
nri_go_peers_build() {
    local peers=$1 out=$2 name=$3 cmd=$4
    shift 4
    local start=$EPOCHREALTIME
    if ! (cd "$peers" && go "$cmd" -o "$out/bin/$name" "$@" 2> "$out/log/$name.log"); then
        echo "go-peers: $name failed; its log ($out/log/$name.log):" >&2
        cat "$out/log/$name.log" >&2
        return 1
    fi
    echo "go-peers: $name built in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s" >&2
}

# nri_go_peers_make PEERS_DIR OUT: every peer into OUT/bin.
nri_go_peers_make() {
    local peers=$1 out=$2
    mkdir -p "$out/bin" "$out/wasm" "$out/log"
    # The versions the upstream Makefiles stamp in with -X (from git there),
    # read from our pins so that --version tells what was built.
    local ctrd cri
    ctrd=$(cd "$peers" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2) || return 1
    cri=$(cd "$peers" && go list -m -f '{{.Version}}' sigs.k8s.io/cri-tools) || return 1
    local ctrd_x="-X github.com/containerd/containerd/v2/version.Version=$ctrd"
    local cri_x="-X sigs.k8s.io/cri-tools/pkg/version.Version=${cri#v}"
    local m=github.com/containerd/containerd/v2/cmd

    # The upstream Makefiles' tags, but every program with cgo on (upstream
    # builds the shim and cri-tools with CGO_ENABLED=0): one cgo setting
    # means one build of the standard library and of the dependencies the
    # programs share, which is most of a cold build on two cores. Not
    # stripped, not PIE: a test's stack trace or debugger gets symbols.
    nri_go_peers_build "$peers" "$out" containerd build -tags urfave_cli_no_docs -ldflags "$ctrd_x" $m/containerd &&
        nri_go_peers_build "$peers" "$out" ctr build -tags urfave_cli_no_docs -ldflags "$ctrd_x" $m/ctr &&
        nri_go_peers_build "$peers" "$out" containerd-shim-runc-v2 build -tags "urfave_cli_no_docs no_grpc" -ldflags "$ctrd_x" $m/containerd-shim-runc-v2 &&
        nri_go_peers_build "$peers" "$out" crictl build -ldflags "$cri_x" sigs.k8s.io/cri-tools/cmd/crictl &&
        # critest is a ginkgo suite: its package has only _test.go files.
        nri_go_peers_build "$peers" "$out" critest test -c -ldflags "$cri_x" sigs.k8s.io/cri-tools/cmd/critest &&
        # runc: cgo for libseccomp (the seccomp tag). Upstream's default tags
        # add libpathrs, a Rust C library that Debian 12 does not package;
        # without it runc uses its pure-Go path resolution. runc reads its
        # version from the module's VERSION file.
        nri_go_peers_build "$peers" "$out" runc build -tags "seccomp urfave_cli_no_docs" github.com/opencontainers/runc &&
        # crane: the loopback registry critest's stand-in images are
        # pushed to and pulled from (integration/src/critest.rs).
        nri_go_peers_build "$peers" "$out" crane build github.com/google/go-containerregistry/cmd/crane &&
        # ginkgo: critest runs its specs on several nodes through it
        # (critest --parallel), finding it on PATH.
        nri_go_peers_build "$peers" "$out" ginkgo build github.com/onsi/ginkgo/v2/ginkgo &&
        # Ours: critest's nonewprivs stand-in image. Static (no cgo), as it
        # runs in an image without a C library.
        CGO_ENABLED=0 nri_go_peers_build "$peers" "$out" effective-uid build ./cmd/effective-uid
}

# nri_go_peers: builds the peers unless this checkout's build is there,
# exports NRI_GO_PEERS (the build), NRI_GO_PEERS_BIN and NRI_GO_PEERS_WASM,
# and prints nothing. One build at a time (a lock in the cache directory).
nri_go_peers() {
    if ! command -v go >/dev/null 2>&1; then
        echo "the Go reference peers need Go 1.26.6 or later (go on PATH)" >&2
        return 1
    fi
    local root key dir
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    key=$(nri_go_peers_key) || return 1
    dir=$NRI_GO_PEERS_CACHE/$key
    if [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$key" ]; then
        nri_go_peers_current "$key" || return 1
        nri_go_peers_export "$dir"
        return 0
    fi
    # cgo (runc's libseccomp, and every program here: see
    # nri_go_peers_make) needs a C compiler and the C library's headers.
    nri_need_packages gcc libc6-dev libseccomp-dev pkg-config || return 1
    mkdir -p "$NRI_GO_PEERS_CACHE"
    nri_need_disk "$NRI_GO_PEERS_CACHE" 4 || return 1
    (
        flock 9
        # Another run may have built it while this one waited.
        if [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$key" ]; then
            nri_go_peers_current "$key"
            exit
        fi
        # Left by a run that was killed (the lock says none is running).
        rm -rf "$NRI_GO_PEERS_CACHE"/.build-*
        tmp=$(mktemp -d "$NRI_GO_PEERS_CACHE/.build-$key.XXXXXX") || exit 1
        trap 'rm -rf "$tmp"' EXIT
        chmod 0755 "$tmp"
        # Our flags only: -mod=readonly makes go.sum the law (a missing or
        # wrong sum fails instead of being written), -trimpath keeps this
        # checkout's path out of the binaries, and no go.work or caller's
        # GOFLAGS changes what is built. GOTOOLCHAIN=local: the pins ask for
        # Go 1.26.6, which this machine's Go satisfies; a newer demand fails
        # here instead of fetching a toolchain.
        # CGO_ENABLED=1 for every program (see nri_go_peers_make), set
        # rather than left to the go command, which turns it off quietly
        # where it finds no C compiler.
        export GOFLAGS="-trimpath -mod=readonly" GOWORK=off GOTOOLCHAIN=local CGO_ENABLED=1
        echo "go-peers: building $key with $(go env GOVERSION) (build cache $(go env GOCACHE))" >&2
        start=$EPOCHREALTIME
        nri_go_peers_make "$root/peers" "$tmp" || exit 1
        echo "go-peers: all built in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s" >&2
        echo "$key" > "$tmp/.stamp"
        rm -rf "$dir"
        mv -T "$tmp" "$dir" || exit 1
        # current -> <key>, swapped in one rename. Builds other than this
        # one and the one current named before are removed: switching
        # between two pins (two branches) rebuilds neither.
        old=$(readlink "$NRI_GO_PEERS_CACHE/current" 2>/dev/null || true)
        nri_go_peers_current "$key" || exit 1
        for d in "$NRI_GO_PEERS_CACHE"/*; do
            [ -d "$d" ] && [ ! -L "$d" ] || continue
            case ${d##*/} in "$key" | "$old") ;; *) rm -rf "$d" ;; esac
        done
        echo "go-peers: $dir" >&2
    ) 9> "$NRI_GO_PEERS_CACHE/.lock" || return 1
    nri_go_peers_export "$dir"
}
