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
# second run costs nothing.
#
# The Debian archive is the one this machine's apt uses (nri_debian_mirror;
# NRI_DEBIAN_MIRROR overrides it): every Debian mirror has the same pool.
# When unstable moves on and the mirror drops a pinned file, set
# NRI_DEBIAN_SNAPSHOT to a snapshot archive of Debian taken while it was
# there (the base URL, under which pool/ is); it is tried second.

NRI_CONTAINERD_CACHE=${NRI_CONTAINERD_CACHE:-/var/cache/nri-shim}

# nri_debian_mirror: prints the URI of the first apt source of this
# machine (one-line sources.list files, then deb822 .sources files) of type
# deb for its own release ($VERSION_CODENAME), which is Debian's archive
# (a security archive serves only <release>-security).
nri_debian_mirror() {
    if [ -n "${NRI_DEBIAN_MIRROR:-}" ]; then
        echo "$NRI_DEBIAN_MIRROR"
        return 0
    fi
    local codename mirror
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    mirror=$(
        {
            cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
                awk -v c="$codename" '$1 == "deb" {
                    i = 2
                    if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == c) print $i
                }'
            cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
                awk -v c="$codename" 'BEGIN { RS = "" }
                {
                    deb = 0; uri = ""; ours = 0
                    n = split($0, lines, "\n")
                    for (j = 1; j <= n; j++) {
                        if (lines[j] ~ /^#/) continue
                        split(lines[j], f, /[ \t]+/)
                        if (f[1] == "Types:" && lines[j] ~ /[ \t]deb([ \t]|$)/) deb = 1
                        if (f[1] == "URIs:") uri = f[2]
                        if (f[1] == "Suites:") for (k = 2; k in f; k++) if (f[k] == c) ours = 1
                    }
                    if (deb && ours && uri != "") print uri
                }'
        } | head -n 1
    )
    if [ -z "$mirror" ]; then
        echo "no apt source for Debian $codename in /etc/apt/sources.list or /etc/apt/sources.list.d: set NRI_DEBIAN_MIRROR to a Debian mirror" >&2
        return 1
    fi
    echo "${mirror%/}"
}

# nri_debian_fetch POOL_PATH SHA256 DEST: fetches pool/POOL_PATH of Debian's
# archive (nri_debian_mirror, then $NRI_DEBIAN_SNAPSHOT when set) into DEST,
# checked against SHA256; says where it looked when it is found nowhere.
nri_debian_fetch() {
    local path=$1 sha=$2 dest=$3 mirror base
    mirror=$(nri_debian_mirror) || return 1
    for base in "$mirror" ${NRI_DEBIAN_SNAPSHOT:+"$NRI_DEBIAN_SNAPSHOT"}; do
        if curl -fsSL --retry 2 --connect-timeout 20 -o "$dest.tmp" "$base/pool/$path" &&
            echo "$sha  $dest.tmp" | sha256sum -c --quiet >/dev/null 2>&1; then
            mv "$dest.tmp" "$dest"
            return 0
        fi
        rm -f "$dest.tmp"
    done
    echo "pool/$path not found (or its SHA256 is not $sha) at $mirror${NRI_DEBIAN_SNAPSHOT:+ and $NRI_DEBIAN_SNAPSHOT}; if Debian dropped it, set NRI_DEBIAN_SNAPSHOT to a snapshot archive that has it" >&2
    return 1
}

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
    if ! nri_debian_fetch "main/c/containerd/$file" "$sha" "$tmp/$file"; then
        rm -rf "$tmp"
        echo "containerd $version: cannot fetch $file" >&2
        return 1
    fi
    dpkg -x "$tmp/$file" "$tmp/root"
    echo "$sha" > "$tmp/root/.deb-sha256"
    rm -rf "$dest"
    mv "$tmp/root" "$dest"
    rm -rf "$tmp"
    echo "containerd $version unpacked in $dest" >&2
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
