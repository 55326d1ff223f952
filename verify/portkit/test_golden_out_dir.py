"""`orthros golden --out`: a missing or empty directory is written, a non-empty one refused
(naming what it holds) unless --force.

Run by ctest (label unit) with ORTHROS=<path of the orthros binary> and PORT_DIR=<examples/pytorch_port>.
"""
import filecmp
import os
import tempfile
import unittest

from golden_testing import run, all_files


class GoldenOutDirTest(unittest.TestCase):
    """`orthros golden` refuses a non-empty --out unless --force (also its own ctest, portkit_golden_out_dir)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def refused(self, out, *extra):
        p = run("golden", "--out", out, "--dtype", "f64", *extra, check=False)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertEqual(p.stdout, "")
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        return p.stderr.strip()

    def test_missing_and_empty_dirs_are_written(self):
        missing = os.path.join(self.tmp.name, "a", "b")
        run("golden", "--out", missing, "--dtype", "f64")
        self.assertTrue(os.path.isfile(os.path.join(missing, "manifest.json")))
        empty = os.path.join(self.tmp.name, "empty")
        os.mkdir(empty)
        run("golden", "--out", empty, "--dtype", "f64")
        self.assertEqual(all_files(missing), all_files(empty))

    def test_a_second_suite_is_refused_and_nothing_is_written(self):
        d = os.path.join(self.tmp.name, "suite")
        run("golden", "--out", d, "--dtype", "f64", "--seed", "7")
        before = {f: open(os.path.join(d, f), "rb").read() for f in all_files(d)}
        msg = self.refused(d, "--seed", "8")
        self.assertEqual(msg, f"orthros: error: golden: --out {d} is not empty (holds {len(before)} files, e.g. "
                              "manifest.json); pass --force to overwrite")
        self.assertEqual(before, {f: open(os.path.join(d, f), "rb").read() for f in all_files(d)})
        # the layer suite is refused the same way, before it writes anything
        self.assertIn(f"golden: --out {d} is not empty", self.refused(d, "--level", "layer"))
        self.assertEqual(sorted(before), all_files(d))

    def test_force_overwrites(self):
        d, fresh = os.path.join(self.tmp.name, "suite"), os.path.join(self.tmp.name, "fresh")
        run("golden", "--out", d, "--dtype", "f64", "--seed", "7")
        run("golden", "--out", d, "--dtype", "f64", "--seed", "8", "--force")
        run("golden", "--out", fresh, "--dtype", "f64", "--seed", "8")
        files = all_files(fresh)
        self.assertEqual(files, all_files(d))
        _, mismatch, errors = filecmp.cmpfiles(d, fresh, files, shallow=False)
        self.assertEqual(mismatch + errors, [])

    def test_any_content_is_named(self):
        d = os.path.join(self.tmp.name, "notes")
        os.mkdir(d)
        with open(os.path.join(d, "notes.txt"), "w") as f:
            f.write("mine\n")
        self.assertIn(f"--out {d} is not empty (holds 1 file, e.g. notes.txt); pass --force to overwrite",
                      self.refused(d))
        self.assertEqual(os.listdir(d), ["notes.txt"])  # no cases/ or expected/ created
        e = os.path.join(self.tmp.name, "dirs_only")
        os.makedirs(os.path.join(e, "cases"))
        self.assertIn(f"--out {e} is not empty (holds 0 files and 1 directory, e.g. cases/)", self.refused(e))
        f = os.path.join(self.tmp.name, "a_file")
        open(f, "w").close()
        self.assertIn(f"golden: --out {f} exists and is not a directory", self.refused(f, "--force"))


if __name__ == "__main__":
    unittest.main()
