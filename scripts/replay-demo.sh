#!/usr/bin/env bash
# The NRI runtime side at work: nri-replay hosts an adaptation, launches a
# pre-installed plugin (the scriptable test plugin, configured to add env,
# an annotation, a mount and a memory limit), replays a pod with two
# containers and prints what the plugin changed in the container's OCI spec.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/env.sh
# The integration crate's CRI client (k8s-cri) runs `protoc` at build time.
nri_need_packages protobuf-compiler

nri_patch_crates
cargo build --release --locked -p nri-replay -p integration
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/plugins" "$T/conf.d"
cp target/release/nri-test-plugin "$T/plugins/10-adjuster"
cat > "$T/conf.d/10-adjuster.conf" <<'JSON'
{"events": "RunPodSandbox,CreateContainer,StartContainer,StopContainer",
 "adjust": {"env": [{"key": "FOO", "value": "set-by-nri"}],
            "annotations": {"adjusted-by": "10-adjuster"},
            "mounts": [{"destination": "/opt/nri", "type": "tmpfs", "source": "tmpfs"}],
            "linux": {"resources": {"memory": {"limit": {"value": "134217728"}}}}}}
JSON
./target/release/nri-replay \
    --socket-path "$T/nri.sock" \
    --plugin-path "$T/plugins" --plugin-config-path "$T/conf.d" \
    --wait-plugins 1 \
    testdata/scenarios/basic.json > "$T/out.jsonl"
echo "== steps"
python3 - "$T/out.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    s = json.loads(line)
    if "step" in s:
        status = "ok" if s["ok"] else "FAILED: " + s.get("error", "")
        print("%2d %-20s %-4s %s" % (s["step"], s["action"], s["target"], status))
    if s.get("spec"):
        spec = s["spec"]
        print("   env:        ", spec["process"]["env"])
        print("   annotation: ", spec["annotations"].get("adjusted-by"))
        print("   mounts:     ", [m["destination"] for m in spec["mounts"]])
        print("   memory:     ", spec["linux"]["resources"]["memory"])
PY
