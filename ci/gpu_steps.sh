# Sourced by the budgeted device-call scripts (bench/results/*/run*.sh), after ci/gpu_env.sh:
#   BUDGET            seconds the call's steps may take in all (default 560)
#   L                 the log folder, $OUTDIR/logs
#   rc_all            the first non-zero exit status of a step (0 while all passed)
#   st MSG            MSG with the elapsed seconds, to stdout and $OUTDIR/summary.txt
#   pack              logs/ as $OUTDIR/logs.tar.xz (the device returns at most 8 files)
#   step NAME LIMIT CMD...
#                     runs CMD under `timeout LIMIT` (stdout and stderr to $L/NAME.log) when the
#                     budget still holds LIMIT seconds, else records it as skipped; prints the
#                     test or sanitizer summary line, and the failures when it fails.
BUDGET=${BUDGET:-560}
L=$OUTDIR/logs; mkdir -p "$L"
rc_all=0
pack() { tar -C "$OUTDIR" -cJf "$OUTDIR/logs.tar.xz" logs; }
st() { echo "[$SECONDS s] $*" | tee -a "$OUTDIR/summary.txt"; }
step() {
  local name=$1 limit=$2; shift 2
  if [ $((SECONDS + limit)) -gt "$BUDGET" ]; then st "$name: SKIPPED (budget)"; return; fi
  timeout "$limit" "$@" > "$L/$name.log" 2>&1
  local rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "$name exit $rc: $(grep -hE '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' "$L/$name.log" | head -2 | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E -A4 "Failure|FAILED|rror" "$L/$name.log" | head -12
}
