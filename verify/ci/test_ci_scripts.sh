#!/usr/bin/env bash
# Tests of ci/test.sh, ci/verify.sh and ci/setup.sh --minimal with stub commands.
# Usage: test_ci_scripts.sh REPO_ROOT. Exit status 0 when every check holds; each failure is printed.
set -uo pipefail
REPO=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fails=0
check() {  # check WHAT COMMAND...: runs COMMAND (a test), reports WHAT on failure
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
has() { grep -qF -- "$2" "$1"; }

# ---- ci/test.sh: stages and summary ----------------------------------------------------------
tree() {  # a repository copy with ci/test.sh and stub stages; $2 = exit status of ci/build.sh
  local t=$WORK/$1
  mkdir -p "$t/ci" "$t/build"
  cp "$REPO/ci/test.sh" "$t/ci/"
  echo 'echo setup-ran' >"$t/ci/setup.sh"
  echo "echo build-ran; exit $2" >"$t/ci/build.sh"
  echo 'echo sanitize-ran; echo "100% tests passed, 0 tests failed out of 7"' >"$t/ci/sanitize.sh"
  echo 'echo fuzz-ran' >"$t/ci/fuzz.sh"
  printf 'add_test(a /bin/true)\nadd_test(b /bin/true)\nadd_test(c /bin/false)\nset_tests_properties(c PROPERTIES LABELS bench)\n' \
    >"$t/build/CTestTestfile.cmake"
  echo "$t"
}
t=$(tree green 0)
(cd "$t" && bash ci/test.sh) >"$WORK/green.log" 2>&1
check "test.sh: exit status 0 when every stage passes" test $? -eq 0
for i in "1/5: setup" "2/5: build" "3/5: ctest" "4/5: sanitize" "5/5: fuzz"; do
  check "test.sh: announces stage $i" has "$WORK/green.log" "== [test] stage $i"
done
check "test.sh: summary header" has "$WORK/green.log" "== [test] summary (exit status 0)"
check "test.sh: ctest counts in the summary" grep -qE '^  ctest +ok \([0-9]+ s\): 2 tests, 0 failed$' "$WORK/green.log"
check "test.sh: sanitizer counts in the summary" grep -qE '^  sanitize +ok \([0-9]+ s\): 7 tests, 0 failed$' "$WORK/green.log"
check "test.sh: the summary is last" bash -c "tail -1 '$WORK/green.log' | grep -qE '^  fuzz +ok'"

t=$(tree red 4)
(cd "$t" && bash ci/test.sh) >"$WORK/red.log" 2>&1
check "test.sh: a failing stage's exit status is the script's" test $? -eq 4
check "test.sh: the failing stage is named" grep -qE '^  build +FAILED, exit status 4' "$WORK/red.log"
check "test.sh: later stages are not run" bash -c "! grep -q fuzz-ran '$WORK/red.log' && grep -qE '^  fuzz +not run$' '$WORK/red.log'"
check "test.sh: summary printed after a failure" has "$WORK/red.log" "== [test] summary (exit status 4)"

# ---- ci/verify.sh: only the orthros target, CUDA only when asked or with a GPU ------------------
stubs=$WORK/bin
mkdir -p "$stubs"
cat >"$stubs/cmake" <<'STUB'
#!/usr/bin/env bash
echo "cmake $*" >>"$CALLS"
if [ "$1" = --build ]; then mkdir -p "$2/verify/cli"; printf '#!/usr/bin/env bash\necho "orthros $*" >>"$CALLS"\n' >"$2/verify/cli/orthros"; chmod +x "$2/verify/cli/orthros"; fi
STUB
chmod +x "$stubs/cmake"
vtree() {
  local t=$WORK/$1
  mkdir -p "$t/ci"
  cp "$REPO/ci/verify.sh" "$t/ci/"
  echo 'echo "setup $*" >>"$CALLS"' >"$t/ci/setup.sh"
  echo "$t"
}
run_verify() {  # run_verify NAME PATH_PREFIX [ENV...]: runs verify.sh --config tiny, calls in $WORK/NAME.calls
  local name=$1 prefix=$2; shift 2
  local t; t=$(vtree "$name")
  (cd "$t" && env CALLS="$WORK/$name.calls" PATH="$prefix:$stubs:/usr/bin:/bin" "$@" bash ci/verify.sh --config tiny) \
    >"$WORK/$name.log" 2>&1
}
mkdir -p "$WORK/nogpu" "$WORK/gpu"
printf '#!/bin/sh\nexit 9\n' >"$WORK/nogpu/nvidia-smi"
printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n' >"$WORK/gpu/nvidia-smi"
printf '#!/bin/sh\nexit 0\n' >"$WORK/gpu/nvcc"
cp "$WORK/gpu/nvcc" "$WORK/nogpu/nvcc"
chmod +x "$WORK"/nogpu/* "$WORK"/gpu/*
run_verify cpu "$WORK/nogpu"
c=$WORK/cpu.calls
check "verify.sh: exit status 0" test $? -eq 0
check "verify.sh: setup --minimal (no NCCL download)" has "$c" "setup --minimal"
check "verify.sh: configures build-verify without CUDA, tests, benchmarks, Python" \
  grep -qE '^cmake -S \. -B build-verify .*-DORTHROS_CUDA=OFF -DORTHROS_TESTS=OFF -DORTHROS_BENCH=OFF -DORTHROS_PYTHON=OFF' "$c"
check "verify.sh: builds only the orthros target" grep -qE '^cmake --build build-verify -j [0-9]+ --target orthros$' "$c"
check "verify.sh: runs orthros verify with the arguments" has "$c" "orthros verify --config tiny"
run_verify asked "$WORK/nogpu" ORTHROS_CUDA=ON
check "verify.sh: ORTHROS_CUDA=ON builds the CUDA kernels with the full setup" \
  bash -c "grep -q -- '-DORTHROS_CUDA=ON' '$WORK/asked.calls' && grep -qx 'setup ' '$WORK/asked.calls'"
run_verify withgpu "$WORK/gpu"
check "verify.sh: a present GPU turns the CUDA kernels on" has "$WORK/withgpu.calls" "-DORTHROS_CUDA=ON"
run_verify forcedoff "$WORK/gpu" ORTHROS_CUDA=OFF
check "verify.sh: ORTHROS_CUDA=OFF wins over a present GPU" has "$WORK/forcedoff.calls" "-DORTHROS_CUDA=OFF"

# ---- ci/setup.sh --minimal: the verify path's packages, no NCCL --------------------------------
s=$WORK/setup
mkdir -p "$s/ci" "$s/bin"
cp "$REPO/ci/setup.sh" "$s/ci/"
printf '#!/bin/sh\necho "dpkg-query $*" >>"%s/dpkg.calls"\nprintf "install ok installed"\n' "$s" >"$s/bin/dpkg-query"
printf '#!/bin/sh\necho "apt-get $*" >>"%s/apt.calls"\n' "$s" >"$s/bin/apt-get"
cp "$WORK/gpu/nvcc" "$s/bin/nvcc"
chmod +x "$s/bin"/*
(cd "$s" && PATH="$s/bin:/usr/bin:/bin" bash ci/setup.sh --minimal) >"$WORK/setup.log" 2>&1
check "setup.sh --minimal: exit status 0" test $? -eq 0
check "setup.sh --minimal: skips NCCL even with nvcc present" has "$WORK/setup.log" "NCCL: skipped (--minimal"
check "setup.sh --minimal: checks only the verify packages" bash -c \
  "grep -q libeigen3-dev '$s/dpkg.calls' && ! grep -q -e doxygen -e librapidcheck '$s/dpkg.calls'"
check "setup.sh --minimal: downloads nothing" test ! -e "$s/.deps"
check "setup.sh: installs pytest (python3-pytest)" grep -qE '^ +python3-pytest ' "$REPO/ci/setup.sh"

echo "$fails failures"
exit $((fails > 0))
