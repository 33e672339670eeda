#!/usr/bin/env python3
"""Runs docs/quickstart.md as written (issue 31 item 2), for one containerd
line, inside a mount namespace of its own (scripts/tests/quickstart.sh
starts it with `unshare --mount`; run that, not this file).

The page's sh blocks are taken from the page itself, in order, so what
runs is what the page says. Each runs with `bash -euo pipefail` from the
root of the checkout. Nothing of the machine changes: in this namespace
/etc, /opt and /usr/local are overlays whose writes go to a temp dir, /run
and /var/lib/containerd are temp dirs, and containerd is a private one
started from the line's binaries. Markers (an HTML comment
`<!-- quickstart: ... -->` right before a fence):

- `containerd 1` / `containerd 2`: run only on that major version;
- `skip: REASON`: not run (the reason is printed);
- `output`: the next ```text block's lines must all appear in the output
  of the sh block run last.

Stand-ins, for what cannot run here as written: `systemctl` (a script
first on PATH: `daemon-reload`, `start`, `stop`, `restart containerd`,
starting containerd with the Environment= lines of the drop-ins in
/etc/systemd/system/containerd.service.d/, as systemd would), and the
image pull (a busybox image of Debian's busybox-static is imported under
the pulled name first).

At the end the overlays must hold no change but an unchanged copy of a
file (the page's removal leaves the machine as it found it), and
containerd's config must be the package's file again, byte for byte.
"""

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "quickstart.md")
OVERLAYS = ["/etc", "/opt", "/usr/local"]
TEMPS = ["/run", "/var/lib/containerd"]
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGE = "docker.io/library/busybox:1.36"

SYSTEMCTL = r"""#!/bin/bash
# systemctl stand-in of scripts/tests/quickstart_test.py: containerd only.
set -euo pipefail
state=$QUICKSTART_STATE
start() {
    local envs=()
    for f in /etc/systemd/system/containerd.service.d/*.conf; do
        [ -e "$f" ] || continue
        while IFS= read -r l; do
            case "$l" in Environment=*) envs+=("${l#Environment=}") ;; esac
        done < "$f"
    done
    echo "systemctl stand-in: starting containerd with ${envs[*]:-no Environment=}" >&2
    setsid env -i PATH="$QUICKSTART_CONTAINERD_PATH" "${envs[@]}" containerd \
        >> "$state/containerd.log" 2>&1 < /dev/null &
    echo $! > "$state/containerd.pid"
    for _ in $(seq 1 600); do
        ctr version >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "systemctl stand-in: containerd did not start; $state/containerd.log:" >&2
    tail -n 30 "$state/containerd.log" >&2
    return 1
}
stop() {
    local pid
    pid=$(cat "$state/containerd.pid" 2>/dev/null) || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 400); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    rm -f "$state/containerd.pid"
}
case "${1:-} ${2:-}" in
    "daemon-reload ") exit 0 ;;
    "start containerd"|"start containerd.service") start ;;
    "stop containerd"|"stop containerd.service") stop ;;
    "restart containerd"|"restart containerd.service") stop; start ;;
    *) echo "systemctl stand-in: only daemon-reload and start, stop, restart containerd, not: $*" >&2; exit 1 ;;
esac
"""


def blocks(text):
    """[(marker or None, lang, body)] of the page's fenced blocks, in order."""
    out = []
    marker = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.fullmatch(r"<!-- quickstart: (.*?) -->", lines[i].strip())
        if m:
            marker = m.group(1)
            i += 1
            continue
        m = re.fullmatch(r"```(\w*)", lines[i].strip())
        if m:
            lang, body = m.group(1), []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            out.append((marker, lang, "\n".join(body) + "\n"))
            marker = None
        elif lines[i].strip():
            marker = None
        i += 1
    return out


def sh(cmd, **kw):
    subprocess.run(cmd, shell=True, check=True, **kw)


def busybox_image(dir_):
    """An OCI layout tar of one layer: Debian's busybox-static with its applets."""
    busybox = open("/bin/busybox", "rb").read()
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(busybox), 0o755
        t.addfile(info, io.BytesIO(busybox))
        for a in applets:
            if a != "busybox":
                info = tarfile.TarInfo(f"bin/{a}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                t.addfile(info)
    layer = raw.getvalue()
    blobs = {}

    def blob(media, data):
        d = hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return {"mediaType": media, "digest": f"sha256:{d}", "size": len(data)}

    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": [f"PATH={SYSTEMD_PATH}"], "Cmd": ["sh"]},
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": blob("application/vnd.oci.image.config.v1+json", json.dumps(config).encode()),
                "layers": [blob("application/vnd.oci.image.layer.v1.tar", layer)]}
    desc = blob("application/vnd.oci.image.manifest.v1+json", json.dumps(manifest).encode())
    desc["platform"] = {"architecture": "amd64", "os": "linux"}
    desc["annotations"] = {"io.containerd.image.name": IMAGE, "org.opencontainers.image.ref.name": "1.36"}
    path = os.path.join(dir_, "busybox.oci.tar")
    with tarfile.open(path, "w") as t:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps({"schemaVersion": 2, "manifests": [desc]}).encode())
        for d, data in blobs.items():
            add(f"blobs/sha256/{d}", data)
    return path


def changes(upper):
    """Files an overlay's upper dir holds (what was written through it)."""
    out = []
    for d, dirs, files in os.walk(upper):
        for n in files:
            out.append(os.path.join(d, n))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--line", required=True)
    p.add_argument("--containerd-bin", required=True, help="the line's containerd, ctr, containerd-shim-runc-v2")
    p.add_argument("--package-config", required=True, help="the line's packaged /etc/containerd/config.toml")
    a = p.parse_args()
    major = a.line.split(".")[0]
    t = tempfile.mkdtemp(prefix=f"nri-quickstart-{a.line}-")
    state = os.path.join(t, "state")
    fake = os.path.join(t, "fake-bin")
    os.makedirs(state)
    os.makedirs(fake)
    with open(os.path.join(fake, "systemctl"), "w") as f:
        f.write(SYSTEMCTL)
    os.chmod(os.path.join(fake, "systemctl"), 0o755)
    image = busybox_image(t)
    package_config = open(a.package_config, "rb").read()

    sh("mount --make-rprivate /")
    uppers = {}
    for d in OVERLAYS:
        name = d.strip("/").replace("/", "_")
        up, work = os.path.join(t, "up", name), os.path.join(t, "work", name)
        os.makedirs(up)
        os.makedirs(work)
        sh(f"mount -t overlay overlay -o lowerdir={d},upperdir={up},workdir={work} {d}")
        uppers[d] = up
    for d in TEMPS:
        tmp = os.path.join(t, "tmp", d.strip("/").replace("/", "_"))
        os.makedirs(tmp)
        os.makedirs(d, exist_ok=True)
        sh(f"mount --bind {tmp} {d}")
    os.makedirs("/run/lock", exist_ok=True)
    # The node's containerd config as its package ships it.
    os.makedirs("/etc/containerd", exist_ok=True)
    with open("/etc/containerd/config.toml", "wb") as f:
        f.write(package_config)
    # Copying it in is the harness's change, not the page's.
    baseline = {os.path.relpath(f, uppers["/etc"]) for f in changes(uppers["/etc"])}

    # The line's containerd binaries alone, first on PATH (not all of
    # /usr/bin, which would put Debian's old cargo before rustup's).
    linebin = os.path.join(t, "containerd-bin")
    os.makedirs(linebin)
    for b in ("containerd", "ctr", "containerd-shim-runc-v2"):
        os.symlink(os.path.join(a.containerd_bin, b), os.path.join(linebin, b))
    env = dict(os.environ)
    env["PATH"] = f"{fake}:{linebin}:{env['PATH']}"
    env["QUICKSTART_STATE"] = state
    env["QUICKSTART_CONTAINERD_PATH"] = f"{linebin}:{SYSTEMD_PATH}"
    failed = None
    try:
        sh("systemctl start containerd", env=env)
        sh(f"ctr images import {image} >/dev/null", env=env)
        last_output = ""
        ran = 0
        for marker, lang, body in blocks(open(PAGE).read()):
            if marker == "output":
                assert lang == "text", f"an output marker before a {lang} block"
                for line in body.splitlines():
                    if line.strip() and line.strip() not in last_output:
                        raise AssertionError(f"docs/quickstart.md: {line.strip()!r} not in the output:\n{last_output}")
                print(f"quickstart {a.line}: output as the page says ({len(body.splitlines())} lines)", flush=True)
                continue
            if lang != "sh":
                continue
            if marker and marker.startswith("skip"):
                print(f"quickstart {a.line}: not run ({marker}):\n{body}", flush=True)
                continue
            if marker and marker.startswith("containerd ") and marker.split()[1] != major:
                continue
            print(f"quickstart {a.line}: $ " + body.rstrip().replace("\n", "\n  $ "), flush=True)
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            last_output = r.stdout
            print("  " + r.stdout.rstrip().replace("\n", "\n  "), flush=True)
            if r.returncode != 0:
                raise AssertionError(f"docs/quickstart.md: this block exited {r.returncode} on containerd {a.line}:\n{body}")
            ran += 1
        assert ran >= 8, f"only {ran} blocks ran (the page has 8 for each line)"
        # What the page left: nothing but unchanged copies.
        left = []
        for d, up in uppers.items():
            for f in changes(up):
                rel = os.path.relpath(f, up)
                if d == "/etc" and rel in baseline:
                    continue
                lower = os.path.join(d, rel)
                if os.path.islink(f) or not os.path.exists(lower):
                    left.append(os.path.join(d, rel))
        assert not left, f"the removal left {left}"
        now = open("/etc/containerd/config.toml", "rb").read()
        assert now == package_config, "/etc/containerd/config.toml is not the package's file again"
        print(f"quickstart {a.line}: {ran} blocks run as written; removal left nothing", flush=True)
    except AssertionError as e:
        failed = str(e)
        print(f"--- containerd.log (tail)\n" + "".join(open(os.path.join(state, "containerd.log")).readlines()[-40:]),
              file=sys.stderr)
    finally:
        # Containers a failed run left behind, then containerd and its shims.
        subprocess.run("for n in $(ctr ns ls -q); do for t in $(ctr -n $n tasks ls -q); do "
                       "ctr -n $n tasks rm -f $t; done; done", shell=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run("systemctl stop containerd", shell=True, env=env)
        me = os.readlink("/proc/self/ns/mnt")
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    if os.readlink(f"/proc/{pid}/ns/mnt") == me and "containerd-shim" in open(f"/proc/{pid}/cmdline").read():
                        os.kill(int(pid), 9)
                except OSError:
                    pass
        time.sleep(0.5)
        for c in ("/sys/fs/cgroup/*/default/app", "/sys/fs/cgroup/default/app"):
            subprocess.run(f"rmdir {c} 2>/dev/null", shell=True)
        for d in TEMPS + OVERLAYS:
            subprocess.run(["umount", "-l", d])
        shutil.rmtree(t, ignore_errors=True)
    if failed:
        sys.exit(f"quickstart {a.line}: FAILED: {failed}")


if __name__ == "__main__":
    main()
