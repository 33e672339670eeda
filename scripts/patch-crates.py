#!/usr/bin/env python3
"""Assembles the crates.io packages nri-shim builds with its own fixes.

For each crate pinned in patches/crates.toml (libcontainer, libcgroups):
take the .crate from our download cache or cargo's (on the first run,
`cargo fetch` of a small manifest that pins it puts it there, through
whatever registry cargo is configured to use), check its SHA256 against the pin and its version against
Cargo.lock, unpack it into .patched-crates/<crate>/ and apply the unified
diffs patches/<crate>/NNNN-*.patch in order, one git commit each (so that
`git -C .patched-crates/<crate> diff` shows a change being made for a new
patch file). Then write .cargo/config.toml, whose [patch.crates-io] points
cargo at the assembled crates; it takes precedence over the guards that
Cargo.toml's own [patch.crates-io] names (patches/guard/<crate>), which
only exist to stop a build on a fresh clone with the command to run.

Idempotent: a crate whose stamp (the pin, the patch files and this script)
is unchanged is left alone, so a second run takes well under a second;
--force assembles it again.
A patch that no longer applies fails the run naming the patch file and
the hunk. An assembled tree with edits that no patch file carries is not
replaced unless --force is given (it would lose them).

Usage: scripts/patch-crates.py [--force] [--quiet]
Needs python3 (3.11: tomllib), git, and cargo with its registry reachable
on the first run.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "patches" / "crates.toml"
OUT = ROOT / ".patched-crates"
CONFIG = ROOT / ".cargo" / "config.toml"
CONFIG_MARK = "# Written by scripts/patch-crates.py"
STAMP = ".nri-shim-assembled"


class Failure(Exception):
    """An error for the user: printed without a traceback, exit status 1."""


def git(cwd, *args, check=True):
    # A clean git environment: the assembled tree is its own repository,
    # whatever repository or hook this script runs under.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="nri-shim", GIT_AUTHOR_EMAIL="nri-shim@localhost",
               GIT_COMMITTER_NAME="nri-shim", GIT_COMMITTER_EMAIL="nri-shim@localhost",
               GIT_AUTHOR_DATE="2000-01-01T00:00:00Z", GIT_COMMITTER_DATE="2000-01-01T00:00:00Z")
    return subprocess.run(["git", "-C", str(cwd), *args], env=env, check=check,
                          capture_output=True, text=True)


def locked_version(name):
    """The version Cargo.lock resolved for `name` (the [patch]ed package)."""
    lock = tomllib.loads((ROOT / "Cargo.lock").read_text())
    versions = [p["version"] for p in lock.get("package", []) if p["name"] == name]
    if len(versions) != 1:
        raise Failure(f"Cargo.lock: expected one package {name}, found versions {versions}")
    return versions[0]


def patch_files(name):
    d = ROOT / "patches" / name
    files = sorted(d.glob("[0-9][0-9][0-9][0-9]-*.patch"))
    others = sorted(p.name for p in d.iterdir() if p not in files and p.name != "PATCHES.md")
    if others:
        raise Failure(f"{d.relative_to(ROOT)}: only PATCHES.md and NNNN-*.patch belong here, found {others}")
    return files


def stamp_of(name, pin, patches):
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(f"{name} {pin['version']} {pin['sha256']}\n".encode())
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def cargo_cached(fname):
    """The copies of `fname` in cargo's registry cache (one per registry)."""
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    return sorted((cargo_home / "registry" / "cache").glob(f"*/{fname}"))


def cargo_fetch(name, version):
    """Puts `name` `version` into cargo's cache: `cargo fetch` of a manifest
    that depends on exactly that version, through cargo's own registry
    configuration (the workspace cannot: it [patch]es the crate away)."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "Cargo.toml").write_text(
            '[package]\nname = "nri-shim-crate-fetch"\nversion = "0.0.0"\nedition = "2021"\n'
            f'[lib]\npath = "lib.rs"\n[dependencies]\n{name} = "={version}"\n')
        (d / "lib.rs").write_text("")
        r = subprocess.run(["cargo", "fetch", "--manifest-path", str(d / "Cargo.toml")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise Failure(f"{name} {version}: cargo fetch failed: {r.stderr.strip()}")


def crate_file(name, version, sha256):
    """The .crate file, checked against the pinned SHA256."""
    fname = f"{name}-{version}.crate"
    cache = OUT / ".downloads" / fname
    for fetched in (False, True):
        if fetched:
            cargo_fetch(name, version)
        found = [c for c in [cache, *cargo_cached(fname)] if c.is_file()]
        for c in found:
            if hashlib.sha256(c.read_bytes()).hexdigest() == sha256:
                if c != cache:
                    # Kept beside the assembled crates (the tests copy it).
                    cache.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(c, cache)
                return cache
        if fetched and found:
            got = hashlib.sha256(found[-1].read_bytes()).hexdigest()
            raise Failure(f"{name} {version}: {found[-1]} has SHA256 {got}, patches/crates.toml pins {sha256}")
    raise Failure(f"{name} {version}: cargo fetch left no {fname} in cargo's registry cache")


def failing_hunk(patch, message):
    """The hunk git apply refused: '<file> @@ ... @@' from its 'patch failed: FILE:LINE'."""
    m = re.search(r"patch failed: (\S+):(\d+)", message)
    if not m:
        return None
    target, line = m.group(1), int(m.group(2))
    current = None
    for text in patch.read_text().splitlines():
        if text.startswith("+++ b/"):
            current = text[6:]
        elif text.startswith("@@") and current == target:
            h = re.match(r"@@ -(\d+)", text)
            if h and int(h.group(1)) == line:
                return f"{target} {text}"
    return f"{target} line {line}"


def assemble(name, pin, patches, dest):
    """Unpack the pinned crate into `dest` and apply the patch files, one commit each."""
    crate = crate_file(name, pin["version"], pin["sha256"])
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        with tarfile.open(crate) as t:
            t.extractall(tmp, filter="data")
        shutil.move(Path(tmp) / f"{name}-{pin['version']}", dest)
    git(dest, "init", "-q")
    # Ours, not the package's: kept out of its history and its `git status`.
    (dest / ".git" / "info" / "exclude").write_text(f"/rustfmt.toml\n/{STAMP}\n")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"{name} {pin['version']} from crates.io")
    for p in patches:
        r = git(dest, "apply", "--whitespace=nowarn", str(p), check=False)
        if r.returncode != 0:
            hunk = failing_hunk(p, r.stderr)
            raise Failure(f"{p.relative_to(ROOT)} no longer applies to {name} {pin['version']}"
                          + (f": hunk {hunk}" if hunk else "") + f"\n{r.stderr.strip()}")
        git(dest, "add", "-A")
        git(dest, "commit", "-q", "-m", p.name)
    # The published source is in rustfmt's default style; without a config of
    # its own, `cargo fmt --all` (which formats path dependencies) would apply
    # the workspace's rustfmt.toml to it.
    (dest / "rustfmt.toml").write_text("# rustfmt defaults: the style of the published source\n")


def tree_files(d):
    """Relative path -> bytes of every file under `d`, without git's own."""
    return {p.relative_to(d): p.read_bytes() for p in d.rglob("*")
            if p.is_file() and ".git" not in p.relative_to(d).parts and p.name != STAMP}


def write_config(names):
    body = "\n".join(f'{n} = {{ path = ".patched-crates/{n}" }}' for n in names)
    text = (f"{CONFIG_MARK}: the crates.io packages with nri-shim's patch files\n"
            "# (patches/*/PATCHES.md). Not tracked; this [patch] takes precedence over the\n"
            "# guards in Cargo.toml's. Rerun the script after changing patches/.\n"
            f"[patch.crates-io]\n{body}\n")
    if CONFIG.exists():
        old = CONFIG.read_text()
        if old == text:
            return
        if not old.startswith(CONFIG_MARK):
            raise Failure(f"{CONFIG.relative_to(ROOT)} exists and was not written by this script: "
                          "move its settings to ~/.cargo/config.toml and remove it")
    CONFIG.parent.mkdir(exist_ok=True)
    CONFIG.write_text(text)


def main():
    args = set(sys.argv[1:])
    unknown = args - {"--force", "--quiet"}
    if unknown:
        raise Failure(f"unknown arguments {sorted(unknown)}; usage: scripts/patch-crates.py [--force] [--quiet]")
    force, quiet = "--force" in args, "--quiet" in args
    pins = tomllib.loads(PINS.read_text())
    OUT.mkdir(exist_ok=True)
    for name, pin in pins.items():
        locked = locked_version(name)
        if locked != pin["version"]:
            raise Failure(f"Cargo.lock has {name} {locked}, patches/crates.toml pins {pin['version']}: "
                          "pin the new version's SHA256 and check every patch file against it")
        patches = patch_files(name)
        stamp = stamp_of(name, pin, patches)
        dest = OUT / name
        if not force and (dest / STAMP).is_file() and (dest / STAMP).read_text().strip() == stamp:
            if git(dest, "--no-optional-locks", "status", "--porcelain").stdout.strip():
                print(f"note: {dest.relative_to(ROOT)} has changes that no patch file carries "
                      f"(git -C {dest.relative_to(ROOT)} diff)", file=sys.stderr)
            continue
        fresh = OUT / f".{name}.new"
        shutil.rmtree(fresh, ignore_errors=True)
        try:
            assemble(name, pin, patches, fresh)
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise
        if dest.exists():
            edited = (dest / ".git").is_dir() and git(dest, "--no-optional-locks", "status", "--porcelain").stdout.strip()
            if edited and not force and tree_files(dest) != tree_files(fresh):
                shutil.rmtree(fresh)
                raise Failure(f"{dest.relative_to(ROOT)} has edits that no patch file carries: save them "
                              f"(git -C {dest.relative_to(ROOT)} diff > patches/{name}/NNNN-what.patch) "
                              "or rerun with --force to drop them")
            shutil.rmtree(dest)
        (fresh / STAMP).write_text(stamp + "\n")
        fresh.rename(dest)
        if not quiet:
            print(f"patch-crates: {name} {pin['version']} from crates.io with "
                  f"{len(patches)} patch files in {dest.relative_to(ROOT)}", file=sys.stderr)
    write_config(list(pins))


if __name__ == "__main__":
    try:
        main()
    except Failure as e:
        print(f"patch-crates: {e}", file=sys.stderr)
        sys.exit(1)
