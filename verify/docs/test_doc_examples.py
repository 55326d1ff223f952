"""The examples of README.md, docs/*.md and examples/*/README.md that write a golden suite
(`orthros golden ... --out DIR`, without --force) each use their own DIR.

`orthros golden` refuses a non-empty --out, so two pages whose examples write the same
directory (say README's `golden-bf16 --grad` and porting.md's `golden-bf16`) fail the reader
who follows both in one checkout. Usage: test_doc_examples.py REPO_ROOT; exit status 0 when every
directory is written by one example line, 1 otherwise (each clash printed).
"""
import glob
import os
import re
import sys


def golden_outputs(path):
    """(line number, --out directory) of every `orthros golden` command line in a Markdown file."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            for m in re.finditer(r"orthros golden\b([^`|\n]*)", line):
                args = m.group(1).split()
                if "--force" in args or "--out" not in args[:-1]:
                    continue
                out = args[args.index("--out") + 1]
                if out.upper() == out:  # a placeholder: DIR, OUT
                    continue
                yield n, out


def main(root):
    pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md"))) + sorted(
        glob.glob(os.path.join(root, "examples", "*", "README.md")))
    seen, clashes, count = {}, 0, 0
    for p in pages:
        for n, out in golden_outputs(p):
            count += 1
            where = f"{os.path.relpath(p, root)}:{n}"
            if out in seen:
                clashes += 1
                print(f"{where}: `orthros golden --out {out}` also written at {seen[out]}")
            else:
                seen[out] = where
    print(f"{count} `orthros golden --out` examples in {len(pages)} pages, {clashes} clashes")
    return 1 if clashes or count == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
