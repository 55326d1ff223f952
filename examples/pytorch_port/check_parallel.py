#!/usr/bin/env python3
"""Runs `orthros check --suite SUITE --actual-dir RESULTS` with its cases spread over N processes
(standard library only): the same per-case reports, merged in manifest order.

    check_parallel.py --orthros BIN --suite SUITE --actual-dir RESULTS [--jobs N]
                      [--json FILE] [--text FILE]

`orthros check` is single-threaded, and a gradient suite at real shapes (config qwen3-8b) takes
minutes to check; a GPU machine has cores to spare. With --jobs 1 (the default) it runs the two
plain commands (`--json` for --json FILE, the text report for --text FILE). With N > 1 each case
is checked on its own, through a one-case copy of the manifest (the case and expected files are
the suite's own, by symbolic link), and the reports are joined: the JSON has the same keys
(passed, failed, skipped, judged, total, pass, cases), the text the same case blocks and the closing
"N passed, M failed" line. Exit status as `orthros check`: 0 when every case passes, 1 when one
fails, 2 (with its message on stderr) when a check's own input is bad.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile


def run_one(orthros, suite, actual, as_json):
    cmd = [orthros, "check", "--suite", suite, "--actual-dir", actual] + (["--json"] if as_json else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def text_blocks(text):
    """Case blocks of a text report (header line `[PASS] NAME  (...` or `[FAIL] ...` and the lines
    below it), without the closing summary line."""
    blocks, cur = [], None
    for line in text.splitlines(keepends=True):
        if line.startswith("[") and "] " in line[:8]:
            cur = [line]
            blocks.append(cur)
        elif cur is not None and not (line[:1].isdigit() and " passed, " in line):
            cur.append(line)
    return ["".join(b) for b in blocks]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orthros", required=True)
    ap.add_argument("--suite", required=True)
    ap.add_argument("--actual-dir", required=True)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", help="write the JSON report here")
    ap.add_argument("--text", help="write the text report here")
    a = ap.parse_args()
    modes = [m for m, f in (("json", a.json), ("text", a.text)) if f]
    if a.jobs <= 1:
        rcs = []
        for m in modes:
            rc, out, err = run_one(a.orthros, a.suite, a.actual_dir, m == "json")
            sys.stderr.write(err)
            with open(a.json if m == "json" else a.text, "w") as f:
                f.write(out)
            rcs.append(rc)
        return max(rcs) if rcs else 0
    suite = os.path.abspath(a.suite)
    with open(os.path.join(suite, "manifest.json")) as f:
        manifest = json.load(f)
    tmp = tempfile.TemporaryDirectory()
    jobs = []
    for c in manifest["cases"]:
        d = os.path.join(tmp.name, c["name"])
        os.makedirs(d)
        for sub in {os.path.dirname(c["file"]), os.path.dirname(c["expected"])}:
            os.symlink(os.path.join(suite, sub), os.path.join(d, sub))
        one = dict(manifest, cases=[c])
        one.pop("groups", None)
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(one, f)
        for m in modes:
            jobs.append((c["name"], m, d))
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        done = list(ex.map(lambda j: (j, run_one(a.orthros, j[2], a.actual_dir, j[1] == "json")), jobs))
    tmp.cleanup()
    for (name, m, _), (rc, out, err) in done:
        if rc == 2:
            sys.stderr.write(err)
            return 2
    if a.json:
        cases = [json.loads(out)["cases"][0] for (name, m, _), (rc, out, err) in done if m == "json"]
        passed = sum(c["status"] == "pass" for c in cases)
        failed = sum(c["status"] == "fail" for c in cases)
        skipped = sum(c["status"] == "skipped" for c in cases)
        with open(a.json, "w") as f:
            json.dump({"passed": passed, "failed": failed, "skipped": skipped, "judged": passed + failed,
                       "total": len(cases), "pass": failed == 0 and passed > 0, "cases": cases}, f, indent=2)
            f.write("\n")
    if a.text:
        blocks = [b for (name, m, _), (rc, out, err) in done if m == "text" for b in text_blocks(out)]
        passed = sum(b.startswith("[PASS]") for b in blocks)
        failed = len(blocks) - passed
        with open(a.text, "w") as f:
            f.write("".join(blocks) + f"{passed} passed, {failed} failed\n")
    rcs = [rc for _, (rc, _, _) in done]
    return 1 if any(rcs) else 0


if __name__ == "__main__":
    sys.exit(main())
