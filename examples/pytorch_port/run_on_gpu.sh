#!/usr/bin/env bash
# Runs the PyTorch port (torch_port.py) on golden suites made elsewhere, on a machine with
# PyTorch (and a GPU). Generates no inputs itself.
#
#   bash examples/pytorch_port/run_on_gpu.sh OUT_DIR SUITE_DIR [SUITE_DIR ...]
#
# For each suite: results of the sdpa backend, the flex backend, and the deliberately broken
# variant (sdpa, --bug window-off-by-one), packed in OUT_DIR/torch_results.tar.gz as
# <suite>.<variant>/NAME.safetensors, plus OUT_DIR/torch_port.log. If an `orthros` binary is
# found ($ORTHROS or build*/reference/orthros), the checks run here too (all reports in
# OUT_DIR/checks.txt: three files in all, within the device tool's limit of 8);
# otherwise unpack the archive where orthros is built and run, for each variant:
#   orthros check --suite SUITE_DIR --actual-dir <suite>.<variant>
#
# Exit status: 0 only if every port run succeeded and, where orthros was found, every check came
# out as intended (sdpa and flex pass; sdpa-bug is caught, i.e. its check exits 1); 1 otherwise;
# 2 on a usage error or when the Python in $PYTHON (default python3) cannot import torch.
set -uo pipefail
out=${1:?usage: run_on_gpu.sh OUT_DIR SUITE_DIR [SUITE_DIR ...]}
shift
[ $# -ge 1 ] || { echo "run_on_gpu.sh: give at least one suite directory" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
work=$(mktemp -d)
log="$out/torch_port.log"
: >"$log"
checks="$out/checks.txt"
: >"$checks"
if ! "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' >"$work/torch.txt" 2>&1; then
  cat "$work/torch.txt" >>"$log"
  echo "run_on_gpu.sh: error: $py cannot import torch ($(tail -1 "$work/torch.txt")); install PyTorch or set PYTHON to a Python that has it" | tee -a "$log" >&2
  rm -rf "$work"
  exit 2
fi
tee -a "$log" <"$work/torch.txt"
rm -f "$work/torch.txt"
failures=0
orthros=${ORTHROS:-}
if [ -z "$orthros" ]; then
  for c in build*/reference/orthros; do [ -x "$c" ] && orthros=$c && break; done
fi
for suite in "$@"; do
  name=$(basename "$suite")
  for variant in sdpa flex sdpa-bug; do
    args=(--golden "$suite" --out "$work/$name.$variant" --backend "${variant%-bug}")
    [ "$variant" = sdpa-bug ] && args+=(--bug window-off-by-one)
    "$py" "$here/torch_port.py" "${args[@]}" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
      echo "FAILED: torch_port.py ${args[*]} exited $rc" | tee -a "$log" >&2
      failures=$((failures + 1))
    fi
    if [ -n "$orthros" ]; then
      echo "===== orthros check --suite $suite --actual-dir $name.$variant" >>"$checks"
      "$orthros" check --suite "$suite" --actual-dir "$work/$name.$variant" >"$work/check.txt" 2>&1
      rc=$?
      cat "$work/check.txt" >>"$checks"
      echo "check $name.$variant: $(tail -1 "$work/check.txt")" | tee -a "$log"
      want=0
      [ "$variant" = sdpa-bug ] && want=1  # the injected bug must be caught (exit 1), not pass
      if [ "$rc" -ne "$want" ]; then
        echo "FAILED: check $name.$variant exited $rc (want $want)" | tee -a "$log" >&2
        failures=$((failures + 1))
      fi
    fi
  done
done
rm -f "$work/check.txt"
tar -C "$work" -czf "$out/torch_results.tar.gz" .
rm -rf "$work"
echo "run_on_gpu.sh: results in $out/torch_results.tar.gz" | tee -a "$log"
if [ "$failures" -ne 0 ]; then
  echo "run_on_gpu.sh: $failures port run(s) or check(s) failed (see $log)" | tee -a "$log" >&2
  exit 1
fi
