#!/usr/bin/env python3
"""Tests of scripts/patch-crates.py on a copy of the checkout's patch set.

Each test runs the script in a temp root holding Cargo.lock, patches/ and
the script, with the .crate files of the real checkout's download cache
(so no network is needed once the checkout has been assembled). Run by
scripts/test.sh; alone: python3 scripts/tests/patch_crates_test.py
"""

import shutil
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class PatchCrates(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        (self.root / "scripts").mkdir()
        shutil.copy(REPO / "scripts" / "patch-crates.py", self.root / "scripts")
        shutil.copy(REPO / "Cargo.lock", self.root)
        shutil.copytree(REPO / "patches", self.root / "patches")
        downloads = REPO / ".patched-crates" / ".downloads"
        if downloads.is_dir():
            shutil.copytree(downloads, self.root / ".patched-crates" / ".downloads")

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args):
        return subprocess.run([str(self.root / "scripts" / "patch-crates.py"), *args],
                              capture_output=True, text=True)

    def test_assembles_every_patch_then_does_nothing_again(self):
        r = self.run_script()
        self.assertEqual(r.returncode, 0, r.stderr)
        for crate in ("libcontainer", "libcgroups"):
            patches = sorted(p.name for p in (self.root / "patches" / crate).glob("*.patch"))
            log = subprocess.run(["git", "-C", str(self.root / ".patched-crates" / crate), "log",
                                  "--format=%s", "--reverse"], capture_output=True, text=True).stdout
            self.assertEqual(log.split("\n")[1:-1], patches, crate)
            self.assertIn("nri-shim patch:", subprocess.run(
                ["grep", "-r", "nri-shim patch:", str(self.root / ".patched-crates" / crate / "src")],
                capture_output=True, text=True).stdout)
        config = (self.root / ".cargo" / "config.toml").read_text()
        self.assertIn('libcontainer = { path = ".patched-crates/libcontainer" }', config)
        before = {p: p.stat().st_mtime_ns for p in (self.root / ".patched-crates").rglob("*") if p.is_file()}
        start = time.monotonic()
        r = self.run_script()
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertLess(time.monotonic() - start, 1.0)
        after = {p: p.stat().st_mtime_ns for p in (self.root / ".patched-crates").rglob("*") if p.is_file()}
        self.assertEqual(before, after, "a second run rewrote files")

    def test_a_patch_that_no_longer_applies_is_named_with_its_hunk(self):
        patch = next((self.root / "patches" / "libcontainer").glob("0003-*.patch"))
        text = patch.read_text()
        removed = next(line for line in text.splitlines() if line.startswith("-") and not line.startswith("---"))
        patch.write_text(text.replace(removed, removed + " // changed upstream", 1))
        r = self.run_script()
        self.assertEqual(r.returncode, 1)
        self.assertIn(f"patches/libcontainer/{patch.name} no longer applies to libcontainer 0.7.0: hunk src/", r.stderr)
        self.assertRegex(r.stderr, r"hunk src/\S+ @@ -\d+,\d+ \+\d+,\d+ @@")
        self.assertFalse((self.root / ".patched-crates" / ".libcontainer.new").exists())

    def test_edits_no_patch_carries_are_kept_unless_forced(self):
        self.assertEqual(self.run_script().returncode, 0)
        lib = self.root / ".patched-crates" / "libcontainer" / "src" / "lib.rs"
        lib.write_text(lib.read_text() + "// work in progress\n")
        note = self.run_script()
        self.assertEqual(note.returncode, 0)
        self.assertIn("has changes that no patch file carries", note.stderr)
        first = next((self.root / "patches" / "libcontainer").glob("0001-*.patch"))
        first.write_text("A changed header.\n" + first.read_text())
        r = self.run_script()
        self.assertEqual(r.returncode, 1)
        self.assertIn("has edits that no patch file carries", r.stderr)
        self.assertIn("// work in progress", lib.read_text())
        self.assertEqual(self.run_script("--force").returncode, 0)
        self.assertNotIn("// work in progress", lib.read_text())

    def test_a_crate_that_differs_from_the_pin_is_refused(self):
        pins = self.root / "patches" / "crates.toml"
        pins.write_text(pins.read_text().replace('sha256 = "2c', 'sha256 = "3c', 1))
        r = self.run_script()
        self.assertEqual(r.returncode, 1)
        self.assertRegex(r.stderr, r"libcontainer 0\.7\.0: \S+/libcontainer-0\.7\.0\.crate has SHA256 2c")

    def test_a_file_other_than_patches_is_refused(self):
        (self.root / "patches" / "libcgroups" / "lib.rs").write_text("")
        r = self.run_script()
        self.assertEqual(r.returncode, 1)
        self.assertIn("patches/libcgroups: only PATCHES.md and NNNN-*.patch belong here, found ['lib.rs']", r.stderr)


if __name__ == "__main__":
    unittest.main()
