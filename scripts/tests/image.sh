#!/usr/bin/env bash
# The installer image's test (issue 27 items 3 and 4):
# 1. scripts/build-image.sh twice, into two directories: the same bytes
#    (layout tar and manifest digest);
# 2. `ctr images import` into a private containerd (config, root, state and
#    socket in a temp dir), which lists it by name;
# 3. `ctr run` of the image against a host root in a temp dir holding
#    containerd's default config, as the DaemonSet runs it (--root /host,
#    the default host namespace mode; no containerd restart, no Kubernetes):
#    its binaries run on the libraries in the image, it installs the shim
#    and the handler, its readiness command answers, and SIGTERM gives the
#    config back byte for byte and removes the binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/env.sh
nri_need_packages containerd

t=$(mktemp -d /tmp/nri-image-test.XXXXXX)
cleanup() {
    nri_containerd_stop "$t" 2>/dev/null || true
    rm -rf "$t"
}
trap cleanup EXIT

start=$(date +%s)
first=$(scripts/build-image.sh "$t/one" | tail -n 1)
second=$(scripts/build-image.sh "$t/two" | tail -n 1)
read -r name digest1 tar1 <<< "$first"
read -r _ digest2 tar2 <<< "$second"
sum1=$(sha256sum < "$tar1" | cut -d' ' -f1)
sum2=$(sha256sum < "$tar2" | cut -d' ' -f1)
echo "image $name: manifest $digest1 / $digest2, layout tar sha256 $sum1 / $sum2, $(stat -c %s "$tar1") bytes" >&2
if [ "$digest1" != "$digest2" ] || [ "$sum1" != "$sum2" ]; then
    echo "FAIL: two builds of the same commit differ" >&2
    diff -r "$t/one/oci" "$t/two/oci" >&2 || true
    exit 1
fi

# A private containerd (no CRI) to import and run it.
mkdir -p "$t/bin"
nri_containerd_start "$t" "$t/bin"
ctr="ctr -a $t/containerd.sock"
$ctr images import "$tar1" >&2
if ! $ctr images ls -q | grep -qx "$name"; then
    echo "FAIL: ctr images ls does not list $name after the import:" >&2
    $ctr images ls >&2
    exit 1
fi

# The host root the installer sees at /host.
host=$t/host
mkdir -p "$host/etc/containerd"
containerd config default > "$host/etc/containerd/config.toml"
cp "$host/etc/containerd/config.toml" "$t/original.toml"
$ctr run -d --log-uri "file://$t/installer.log" \
    --mount "type=bind,src=$host,dst=/host,options=rbind:rw" \
    "$name" nri-installer /usr/bin/nri-shim-installer install --root=/host \
    --restart=none --no-kubernetes >&2
for _ in $(seq 1 300); do
    grep -q "ready; waiting for SIGTERM" "$t/installer.log" 2>/dev/null && break
    sleep 0.1
done
cat "$t/installer.log" >&2
fail() {
    echo "FAIL: $*" >&2
    cat "$t/installer.log" >&2
    exit 1
}
grep -q "ready; waiting for SIGTERM" "$t/installer.log" || fail "the installer did not finish installing"
cmp "$host/usr/local/bin/containerd-shim-nri-shim-v2" target/image-build/dist/containerd-shim-nri-shim-v2 ||
    fail "the installed binary is not the image's shim"
grep -q 'runtimes.nri-shim\]' "$host/etc/containerd/config.toml" || fail "no nri-shim handler in the config"
containerd --config "$host/etc/containerd/config.toml" config dump | grep -q 'io.containerd.nri-shim.v2' ||
    fail "containerd config dump does not show the handler"
$ctr task exec --exec-id ready nri-installer /usr/bin/nri-shim-installer ready || fail "the readiness command failed"
$ctr task kill -s SIGTERM nri-installer
for _ in $(seq 1 300); do
    $ctr task ls | grep -q "nri-installer.*STOPPED" && break
    sleep 0.1
done
$ctr task ls | grep -q "nri-installer.*STOPPED" || fail "the installer did not stop after SIGTERM"
cat "$t/installer.log" >&2
grep -q "nri-shim-installer: uninstalled" "$t/installer.log" || fail "no uninstall"
[ ! -e "$host/usr/local/bin/containerd-shim-nri-shim-v2" ] || fail "the binary was not removed"
cmp "$host/etc/containerd/config.toml" "$t/original.toml" || fail "the config is not the original again"
$ctr task rm nri-installer >/dev/null
$ctr containers rm nri-installer
echo "installer image: reproducible, imported and run ($(($(date +%s) - start)) s)" >&2
