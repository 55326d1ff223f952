"""ctest entry of verify/hf: runs pytest on the given test files, or exits 77 (skipped) naming what
is missing (torch, transformers or pytest) so a machine without them skips cleanly."""
import sys

missing = []
for mod in ("torch", "transformers", "pytest", "safetensors"):
    try:
        __import__(mod)
    except ImportError as e:
        missing.append(f"{mod} ({e})")
if missing:
    print("skipped: this Python lacks " + ", ".join(missing) + " (bash ci/setup.sh installs them)")
    sys.exit(77)

import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-rs", "-p", "no:cacheprovider", *sys.argv[1:]]))
