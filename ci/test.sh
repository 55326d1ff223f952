#!/usr/bin/env bash
# Quick start 2: install dependencies, build, and run the CPU test suite (labels unit, property).
# GPU tests (label gpu) skip without a GPU; timing checks (label bench) are excluded because
# wall-clock fits are noisy on shared CI machines (run them with `ctest -L bench`).
# Then the hardening jobs: the same suite under ASan + UBSan (ci/sanitize.sh) and the readers'
# fuzz targets for a bounded time (ci/fuzz.sh); ORTHROS_SKIP_HARDENING=1 skips both.
# Each stage is announced as it starts ("== [test] stage 2/5: build ..."); a summary of every
# stage (status, seconds, the suite's counts) is printed last, also when a stage fails (the run
# stops at the first failing stage; its exit status is the script's).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${ORTHROS_JOBS:-2}"
NAMES=(setup build ctest sanitize fuzz)
RESULTS=()
CTEST_COUNTS=""
LOGDIR=$(mktemp -d)

summary() {
  local rc=$?
  echo "== [test] summary (exit status $rc)"
  local i
  for ((i = 0; i < ${#NAMES[@]}; ++i)); do
    printf '  %-9s %s\n' "${NAMES[$i]}" "${RESULTS[$i]:-not run}"
  done
  rm -rf "$LOGDIR"
}
trap summary EXIT

# stage NAME COMMAND...: runs COMMAND, records "ok (N s)" or "FAILED, exit status S (N s)".
stage() {
  local name=$1 index=${#RESULTS[@]}
  shift
  echo "== [test] stage $((index + 1))/${#NAMES[@]}: $name ($(date -u +%H:%M:%S) UTC)"
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  if [ "$rc" -eq 0 ]; then
    RESULTS+=("ok ($((SECONDS - t0)) s)${CTEST_COUNTS:+: $CTEST_COUNTS}")
  else
    RESULTS+=("FAILED, exit status $rc ($((SECONDS - t0)) s)${CTEST_COUNTS:+: $CTEST_COUNTS}")
    exit "$rc"
  fi
  CTEST_COUNTS=""
}

# counted COMMAND...: runs COMMAND (a ctest run) with its output shown and kept; its last
# "N% tests passed, F tests failed out of T" line becomes the stage's counts.
counted() {
  local rc=0 line
  "$@" 2>&1 | tee "$LOGDIR/ctest.log" || rc=$?
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$LOGDIR/ctest.log" | tail -1 || true)
  [ -n "$line" ] && CTEST_COUNTS=$(echo "$line" | sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2 tests, \1 failed/')
  return "$rc"
}

stage setup env ORTHROS_SETUP_TORCH=1 bash ci/setup.sh   # also torch for verify/torch (the orthros.torch tests)
stage build bash ci/build.sh
stage ctest counted ctest --test-dir build -LE bench -j "$JOBS" --output-on-failure --timeout 900
if [ "${ORTHROS_SKIP_HARDENING:-0}" != 1 ]; then
  stage sanitize counted bash ci/sanitize.sh
  stage fuzz bash ci/fuzz.sh
else
  RESULTS+=("skipped (ORTHROS_SKIP_HARDENING=1)" "skipped (ORTHROS_SKIP_HARDENING=1)")
fi
