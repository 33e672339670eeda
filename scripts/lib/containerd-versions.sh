# Debian's containerd 1.7 (Debian 13) and 2.1 (Debian unstable), unpacked
# privately for the CRI lane (integration/tests/cri.rs runs on each next to
# the system's 1.6). Source it; `nri_containerd_versions` needs root.
#
# Each .deb is fetched from Debian's pool by its exact file name, checked
# against the SHA256 pinned here (the hash Debian's signed Packages index
# gave for it), and unpacked with `dpkg -x` into
# $NRI_CONTAINERD_CACHE/containerd-<line>/ (binaries in usr/bin). Nothing is
# installed: /usr/bin/containerd and the system's apt state stay as they
# are. A line already unpacked from the pinned .deb is left alone, so a
# second run costs nothing. When unstable moves on and the mirror drops a
# file, snapshot.debian.org still serves it.

NRI_CONTAINERD_CACHE=${NRI_CONTAINERD_CACHE:-/var/cache/nri-shim}
NRI_DEBIAN_MIRROR=${NRI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NRI_DEBIAN_SNAPSHOT=${NRI_DEBIAN_SNAPSHOT:-https://snapshot.debian.org/archive/debian/20261201T000000Z}

# line, Debian version, SHA256 of the amd64 .deb
NRI_CONTAINERD_LINES=(
    "1.7 1.7.24~ds1-6+deb13u1 ed708deb96fe476a3bce4efa5c0538dfbcf717ab9a7c7944ba7260342c25899c"
    "2.1 2.1.9+ds1-5 2dda86ce7033fd612fc50e136679d8174ccad680eb29cd4611e0d2a1b84cf591"
)

# nri_containerd_fetch LINE VERSION SHA256
nri_containerd_fetch() {
    local line=$1 version=$2 sha=$3
    local dest="$NRI_CONTAINERD_CACHE/containerd-$line"
    if [ -x "$dest/usr/bin/containerd" ] && [ "$(cat "$dest/.deb-sha256" 2>/dev/null)" = "$sha" ]; then
        return 0
    fi
    local file="containerd_${version}_amd64.deb"
    local tmp
    tmp=$(mktemp -d "$NRI_CONTAINERD_CACHE/.fetch-$line.XXXXXX")
    local url ok=""
    for url in "$NRI_DEBIAN_MIRROR/pool/main/c/containerd/$file" \
        "$NRI_DEBIAN_SNAPSHOT/pool/main/c/containerd/$file"; do
        if curl -fsSL --retry 2 --connect-timeout 20 -o "$tmp/$file" "$url" &&
            echo "$sha  $tmp/$file" | sha256sum -c --quiet >/dev/null 2>&1; then
            ok=$url
            break
        fi
        rm -f "$tmp/$file"
    done
    if [ -z "$ok" ]; then
        rm -rf "$tmp"
        echo "containerd $version: $file not found (or its SHA256 differs) at $NRI_DEBIAN_MIRROR and $NRI_DEBIAN_SNAPSHOT" >&2
        return 1
    fi
    dpkg -x "$tmp/$file" "$tmp/root"
    echo "$sha" > "$tmp/root/.deb-sha256"
    rm -rf "$dest"
    mv "$tmp/root" "$dest"
    rm -rf "$tmp"
    echo "containerd $version unpacked in $dest (from $ok)" >&2
}

# nri_containerd_versions: every line of NRI_CONTAINERD_LINES, one run at a
# time (a lock in the cache directory).
nri_containerd_versions() {
    if [ "$(dpkg --print-architecture)" != amd64 ]; then
        echo "the CRI lane's containerd 1.7 and 2.1 are pinned for amd64, not $(dpkg --print-architecture)" >&2
        return 1
    fi
    mkdir -p "$NRI_CONTAINERD_CACHE"
    (
        flock 9
        local entry
        for entry in "${NRI_CONTAINERD_LINES[@]}"; do
            # shellcheck disable=SC2086 # three words
            nri_containerd_fetch $entry || exit 1
        done
    ) 9> "$NRI_CONTAINERD_CACHE/.lock"
}
