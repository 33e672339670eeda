#!/usr/bin/env python3
"""Assembles the installer image (scripts/build-image.sh runs it): an OCI
image layout with one layer holding the two binaries and the shared
libraries they need, taken from Debian's packages.

Reproducible: the same inputs give the same bytes. Every tar entry has the
mtime --epoch, owner 0:0 without names, a fixed mode, and the entries are
sorted by path (ustar format: no pax headers with times); gzip is written
without a name or time; the JSON documents have sorted keys and no spaces.

usage: assemble.py --shim BIN --installer BIN --deb FILE... --name NAME
                   --version V --epoch SECONDS --out DIR
Writes DIR/oci/ (the layout) and DIR/nri-shim-installer.oci.tar (the same
layout as one tar, for `ctr images import`); prints the manifest digest.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

LIBDIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"]
INTERP = "lib64/ld-linux-x86-64.so.2"


def needed(data):
    """The NEEDED sonames of an ELF file (readelf from binutils)."""
    tmp = os.path.join(args.out, ".elf")
    with open(tmp, "wb") as f:
        f.write(data)
    out = subprocess.run(["readelf", "-d", tmp], capture_output=True, text=True, check=True).stdout
    os.unlink(tmp)
    return [l.split("[", 1)[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]


def deb_members(path):
    """{path: (kind, data or link target, mode)} of a .deb's files."""
    tar_bytes = subprocess.run(["dpkg-deb", "--fsys-tarfile", path], capture_output=True, check=True).stdout
    members = {}
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
        for m in t.getmembers():
            name = os.path.normpath(m.name).lstrip("./")
            if m.issym():
                members[name] = ("link", m.linkname, 0o777)
            elif m.isfile():
                members[name] = ("file", t.extractfile(m).read(), m.mode & 0o777)
    return members


def resolve(members, path):
    """Follows symlinks inside the packages; returns the chain of paths."""
    chain = [path]
    while members.get(path, ("",))[0] == "link":
        target = members[path][1]
        path = os.path.normpath(os.path.join(os.path.dirname(path), target)).lstrip("/")
        chain.append(path)
    return chain


def main():
    global args
    p = argparse.ArgumentParser()
    p.add_argument("--shim", required=True)
    p.add_argument("--installer", required=True)
    p.add_argument("--deb", action="append", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--epoch", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    files = {}  # path in the image -> ("file", bytes, mode) | ("link", target, 0o777) | ("dir", None, mode)
    files["usr/bin/nri-shim-installer"] = ("file", open(args.installer, "rb").read(), 0o755)
    files["opt/nri-shim/containerd-shim-nri-shim-v2"] = ("file", open(args.shim, "rb").read(), 0o755)

    members, packages = {}, []
    for d in args.deb:
        m = deb_members(d)
        members.update(m)
        packages.append(os.path.basename(d).split("_")[0])

    # The NEEDED closure of both binaries, from the packages' libraries.
    want = needed(files["usr/bin/nri-shim-installer"][1]) + needed(files["opt/nri-shim/containerd-shim-nri-shim-v2"][1])
    seen = set()
    while want:
        so = want.pop()
        if so in seen:
            continue
        seen.add(so)
        found = [f"{d}/{so}" for d in LIBDIRS if f"{d}/{so}" in members]
        if not found:
            sys.exit(f"assemble.py: {so} is needed but none of {', '.join(packages)} ships it in /{' or /'.join(LIBDIRS)}")
        path = found[0]
        for p_ in resolve(members, path):
            files[p_] = members[p_]
        real = resolve(members, path)[-1]
        want += needed(members[real][1])
    interp = resolve(members, INTERP)
    if interp[-1] not in members:
        sys.exit(f"assemble.py: the program interpreter /{INTERP} is not in {', '.join(packages)}")
    for p_ in interp:
        files[p_] = members[p_]
    # The libraries' licences (libgcc-s1's doc directory links to
    # gcc-12-base's).
    for pkg in packages:
        doc = f"usr/share/doc/{pkg}"
        chain = resolve(members, doc)
        for p_ in chain[:-1]:
            files[p_] = members[p_]
        if f"{chain[-1]}/copyright" not in members:
            sys.exit(f"assemble.py: no copyright file for {pkg} (/{chain[-1]}/copyright)")
        files[f"{chain[-1]}/copyright"] = members[f"{chain[-1]}/copyright"]
    files["tmp"] = ("dir", None, 0o1777)
    for path in list(files):
        d = os.path.dirname(path)
        while d and d not in files:
            files[d] = ("dir", None, 0o755)
            d = os.path.dirname(d)

    # The layer: sorted ustar, fixed times and owners.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for path in sorted(files):
            kind, data, mode = files[path]
            info = tarfile.TarInfo(path)
            info.mtime = args.epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            elif kind == "link":
                info.type = tarfile.SYMTYPE
                info.linkname = data
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    layer = raw.getvalue()
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, compresslevel=9, mtime=0) as g:
        g.write(layer)
    layer_gz = gz.getvalue()

    oci = os.path.join(args.out, "oci")
    shutil.rmtree(oci, ignore_errors=True)
    os.makedirs(os.path.join(oci, "blobs", "sha256"))

    def blob(media_type, data):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(oci, "blobs", "sha256", digest), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    def js(v):
        return json.dumps(v, sort_keys=True, separators=(",", ":")).encode()

    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(args.epoch))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Entrypoint": ["/usr/bin/nri-shim-installer"],
            "Cmd": ["install"],
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Labels": {
                "org.opencontainers.image.title": "nri-shim-installer",
                "org.opencontainers.image.version": args.version,
                "org.opencontainers.image.licenses": "Apache-2.0",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
        "history": [{"created": created, "created_by": "scripts/build-image.sh"}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob("application/vnd.oci.image.config.v1+json", js(config)),
        "layers": [blob("application/vnd.oci.image.layer.v1.tar+gzip", layer_gz)],
    }
    desc = blob("application/vnd.oci.image.manifest.v1+json", js(manifest))
    desc["platform"] = {"architecture": "amd64", "os": "linux"}
    desc["annotations"] = {
        "io.containerd.image.name": args.name,
        "org.opencontainers.image.ref.name": args.name.rsplit(":", 1)[1],
    }
    with open(os.path.join(oci, "index.json"), "wb") as f:
        f.write(js({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [desc]}))
    with open(os.path.join(oci, "oci-layout"), "wb") as f:
        f.write(js({"imageLayoutVersion": "1.0.0"}))

    # The layout as one tar, as reproducible as the layer.
    out_tar = os.path.join(args.out, "nri-shim-installer.oci.tar")
    with tarfile.open(out_tar + ".tmp", mode="w", format=tarfile.USTAR_FORMAT) as t:
        entries = []
        for d, dirs, fs in os.walk(oci):
            for n in dirs + fs:
                entries.append(os.path.relpath(os.path.join(d, n), oci))
        for rel in sorted(entries):
            full = os.path.join(oci, rel)
            info = tarfile.TarInfo(rel)
            info.mtime = args.epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if os.path.isdir(full):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                t.addfile(info)
            else:
                data = open(full, "rb").read()
                info.mode, info.size = 0o644, len(data)
                t.addfile(info, io.BytesIO(data))
    os.replace(out_tar + ".tmp", out_tar)
    print(desc["digest"])


if __name__ == "__main__":
    main()
