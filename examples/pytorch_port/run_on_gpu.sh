#!/usr/bin/env bash
# Runs the PyTorch port (torch_port.py) on golden suites made elsewhere, on a machine with
# PyTorch (and a GPU). Generates no inputs itself.
#
#   bash examples/pytorch_port/run_on_gpu.sh OUT_DIR SUITE_DIR [SUITE_DIR ...]
#
# For each suite: results of the sdpa backend, the flex backend, and the deliberately broken
# variant (sdpa, --bug window-off-by-one) ($VARIANTS overrides the list; flex-bug is the broken
# flex port; $PORT_ARGS are added to every torch_port.py call, e.g. "--grad-accum fp32"), packed in OUT_DIR/torch_results.tar.gz as <suite>.<variant>/NAME.safetensors
# (RESULTS_ARCHIVE=0: no archive, for suites whose results are too large to bring back;
# ARCHIVE_SUITES="NAME ...": only those suites' results), plus
# OUT_DIR/torch_port.log. A gradient suite (`orthros golden --grad`: cases hold `do`, `do_out`)
# makes the port add dq, dq_out, dk, dv through autograd, and the checks judge all eight tensors.
# If an `orthros` binary is found ($ORTHROS or build*/verify/cli/orthros), the checks run here too,
# each in the background while the next variant runs (check_parallel.py; CHECK_JOBS=N spreads a
# check's cases over N processes; CHECK_TEXT=0 writes the JSON report only): all text reports in
# OUT_DIR/checks.txt, all JSON reports in OUT_DIR/checks.jsonl (one line per suite and variant,
# {"label", "report"}), and a per-tensor summary of each in the log (summarize_checks.py;
# `summarize_checks.py --table OUT_DIR/checks.jsonl` makes a Markdown table).
# Otherwise unpack the archive where orthros is built and run, for each variant:
#   orthros check --suite SUITE_DIR --actual-dir <suite>.<variant>
#
# Exit status: 0 only if every port run succeeded and, where orthros was found, every check came
# out as intended (sdpa and flex pass; a -bug variant is caught, i.e. its check exits 1, and on a
# gradient suite at least one of dq, dq_out, dk, dv fails too); 1 otherwise;
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
jsonl="$out/checks.jsonl"
: >"$jsonl"
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
  for c in build*/verify/cli/orthros; do [ -x "$c" ] && orthros=$c && break; done
fi
checks_dir="$work/.checks"  # per variant: NAME.txt, NAME.json, NAME.rc (written in the background)
mkdir -p "$checks_dir"
runs=()
for suite in "$@"; do
  name=$(basename "$suite")
  for variant in ${VARIANTS:-sdpa flex sdpa-bug}; do
    args=(--golden "$suite" --out "$work/$name.$variant" --backend "${variant%-bug}" ${PORT_ARGS:-})
    [ "$variant" != "${variant%-bug}" ] && args+=(--bug window-off-by-one)
    "$py" "$here/torch_port.py" "${args[@]}" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
      echo "FAILED: torch_port.py ${args[*]} exited $rc" | tee -a "$log" >&2
      failures=$((failures + 1))
    fi
    runs+=("$suite|$name.$variant")
    if [ -n "$orthros" ]; then  # check in the background while the next variant runs on the GPU
      c="$checks_dir/$name.$variant"
      targs=(--text "$c.txt")
      [ "${CHECK_TEXT:-1}" = 0 ] && targs=()
      ( "$py" "$here/check_parallel.py" --orthros "$orthros" --suite "$suite" --actual-dir "$work/$name.$variant" \
          --jobs "${CHECK_JOBS:-1}" --json "$c.json" "${targs[@]}" 2>"$c.err"; echo $? >"$c.rc" ) &
    fi
  done
done
wait
if [ -n "$orthros" ]; then
  for run in "${runs[@]}"; do
    suite=${run%%|*}
    label=${run#*|}
    c="$checks_dir/$label"
    rc=$(cat "$c.rc")
    echo "===== orthros check --suite $suite --actual-dir $label" >>"$checks"
    if [ -f "$c.txt" ]; then
      cat "$c.txt" >>"$checks"
      echo "check $label: $(tail -1 "$c.txt")" | tee -a "$log"
    else
      echo "(text report not written: CHECK_TEXT=0; see checks.jsonl)" >>"$checks"
    fi
    cat "$c.err" >>"$checks"
    want=0
    [ "$label" != "${label%-bug}" ] && want=1  # the injected bug must be caught (exit 1), not pass
    if [ "$rc" -ne "$want" ]; then
      echo "FAILED: check $label exited $rc (want $want)" | tee -a "$log" >&2
      failures=$((failures + 1))
    fi
    sargs=("$c.json" --label "$label" --append "$jsonl")
    [ "$want" = 1 ] && sargs+=(--bug)  # on a gradient suite the bug must fail a gradient tensor too
    if ! "$py" "$here/summarize_checks.py" "${sargs[@]}" 2>&1 | tee -a "$log"; then
      echo "FAILED: summary of $label" | tee -a "$log" >&2
      failures=$((failures + 1))
    fi
  done
fi
rm -rf "$checks_dir"
if [ "${RESULTS_ARCHIVE:-1}" != 0 ]; then
  sel=(.)
  if [ -n "${ARCHIVE_SUITES:-}" ]; then  # only these suites' results (names as given, space-separated)
    sel=()
    for s in $ARCHIVE_SUITES; do for d in "$work/$s".*; do [ -d "$d" ] && sel+=("$(basename "$d")"); done; done
  fi
  tar -C "$work" -czf "$out/torch_results.tar.gz" "${sel[@]}"
  echo "run_on_gpu.sh: results in $out/torch_results.tar.gz" | tee -a "$log"
fi
rm -rf "$work"
if [ "$failures" -ne 0 ]; then
  echo "run_on_gpu.sh: $failures port run(s) or check(s) failed (see $log)" | tee -a "$log" >&2
  exit 1
fi
