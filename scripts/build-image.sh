#!/usr/bin/env bash
# Builds the installer image: an OCI image layout holding
# nri-shim-installer (/usr/bin) and the shim it installs
# (/opt/nri-shim/containerd-shim-nri-shim-v2), both built here with the
# dist profile, and the shared libraries they need from Debian 12's
# packages (libc6, libgcc-s1, libseccomp2, pinned by version and SHA256;
# gcc-12-base for libgcc-s1's copyright file, which its package links to).
#
#   scripts/build-image.sh [OUT_DIR]      # default target/image
#
# Writes OUT_DIR/oci/ and OUT_DIR/nri-shim-installer.oci.tar and prints the
# image name and manifest digest. Load it with
#   ctr -n k8s.io images import OUT_DIR/nri-shim-installer.oci.tar
# Reproducible: the same commit gives the same bytes (scripts/image/
# assemble.py: sorted entries, fixed owners and mtimes; the binaries are
# built with the checkout's and cargo's paths remapped, in their own target
# directory, target/image-build). The mtimes and the config's `created` are
# the commit's time (SOURCE_DATE_EPOCH overrides it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/env.sh
. scripts/lib/containerd-versions.sh
out=${1:-target/image}

nri_need_rust
nri_need_packages pkg-config libseccomp-dev protobuf-compiler binutils curl python3
nri_patch_crates

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
name=localhost/nri-shim/installer:$version
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD)}

# Debian 12's libraries for the binaries (built against its glibc 2.36).
# package, version, pool path, SHA256 (from Debian's signed Packages index)
debs=(
    "libc6 2.36-9+deb12u14 main/g/glibc ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf"
    "libgcc-s1 12.2.0-14+deb12u1 main/g/gcc-12 3016e62cb4b7cd8038822870601f5ed131befe942774d0f745622cc77d8a88f7"
    "gcc-12-base 12.2.0-14+deb12u1 main/g/gcc-12 1896a2aacf4ad681ff5eacc24a5b0ca4d5d9c9b9c9e4b6de5197bc1e116ea619"
    "libseccomp2 2.5.4-1+deb12u1 main/libs/libseccomp 108fe67957ca7cf9ba51d801118a1b37d404bea7b6e365025cd00779e9eca38d"
)
cache=$NRI_CONTAINERD_CACHE/debs
mkdir -p "$cache"
deb_args=()
for entry in "${debs[@]}"; do
    read -r pkg ver pool sha <<< "$entry"
    file=${pkg}_${ver}_amd64.deb
    if ! echo "$sha  $cache/$file" | sha256sum -c --quiet >/dev/null 2>&1; then
        nri_debian_fetch "$pool/$file" "$sha" "$cache/$file" || {
            echo "build-image: cannot fetch $file" >&2
            exit 1
        }
    fi
    deb_args+=(--deb "$cache/$file")
done

# The binaries: dist profile, paths of the checkout and of cargo's registry
# remapped so that another clone builds the same bytes.
target=$PWD/target/image-build
CARGO_TARGET_DIR=$target \
    RUSTFLAGS="--remap-path-prefix=$PWD=/nri-shim --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo" \
    cargo build --locked --profile dist -p nri-shim -p nri-shim-installer

digest=$(python3 scripts/image/assemble.py \
    --shim "$target/dist/containerd-shim-nri-shim-v2" \
    --installer "$target/dist/nri-shim-installer" \
    "${deb_args[@]}" --name "$name" --version "$version" --epoch "$epoch" --out "$out")
echo "$name $digest $out/nri-shim-installer.oci.tar"
