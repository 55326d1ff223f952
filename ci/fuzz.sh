#!/usr/bin/env bash
# Fuzzes the file readers (verify/fuzz) for a bounded time: clang + libFuzzer + AddressSanitizer
# + UndefinedBehaviorSanitizer, one target per reader, each started from the committed seed corpus
# (verify/fuzz/corpus/<target>, copied: the committed corpus is never modified).
# Usage: ci/fuzz.sh [SECONDS_PER_TARGET]   (default 60; env ORTHROS_FUZZ_SECONDS overrides)
# Exit status: 0 when every target ran its time without a crash, leak, sanitizer report or
# uncaught exception; non-zero otherwise (the crashing input is kept under build-fuzz/artifacts/).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-${ORTHROS_FUZZ_SECONDS:-60}}"
SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DORTHROS_FUZZ=ON \
  -DORTHROS_TESTS=OFF -DORTHROS_BENCH=OFF -DORTHROS_PYTHON=OFF -DORTHROS_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="$SAN" >/dev/null
cmake --build build-fuzz -j "${ORTHROS_JOBS:-2}" --target fuzz_safetensors fuzz_case fuzz_result
mkdir -p build-fuzz/artifacts
status=0
summary=""
for t in safetensors case result; do
  work=$(mktemp -d)
  cp -r "verify/fuzz/corpus/$t/." "$work/"
  log="build-fuzz/fuzz_$t.log"
  # -rss_limit_mb: the oracle on a fuzzed case must stay small; -max_len bounds the file size.
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "build-fuzz/verify/fuzz/fuzz_$t" "$work" -max_total_time="$SECS" -max_len=16384 -rss_limit_mb=2048 \
      -timeout=20 -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$t-" >"$log" 2>&1; then
    status=1
    echo "[fuzz] $t: FAILED (see $log and build-fuzz/artifacts/)"
    tail -40 "$log"
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  summary+="$(printf '[fuzz] %-12s %10s executions in %ss, coverage %s edges, corpus %s -> %s inputs\n' \
    "$t" "$execs" "$SECS" "$cov" "$(ls "verify/fuzz/corpus/$t" | wc -l)" "$(ls "$work" | wc -l)")"$'\n'
  rm -rf "$work"
done
printf '%s' "$summary"
exit $status
