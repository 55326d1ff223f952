#!/usr/bin/env bash
# `orthros verify` refuses an option its mode does not use (--device cuda, --grad --device cuda,
# --grad, --weights) with exit status 2 and a message naming the mode, the option and its value;
# the options a mode honours pass that check. Holds in every build: the check runs before the
# command looks for CUDA kernels or a GPU.
# Usage: test_verify_unused_options.sh ORTHROS_BINARY. Exit status 0 when every check holds.
set -uo pipefail
BIN=$1
TEXT=$(mktemp)
trap 'rm -f "$TEXT"' EXIT
echo "a text of a few bytes" >"$TEXT"
fails=0
# refused "EXPECTED MESSAGE" ARGS...: the command must exit 2 and print the message.
refused() {
  local want=$1; shift
  local out rc
  out=$(timeout 60 "$BIN" verify "$@" 2>&1); rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "orthros: error: $want" <<<"$out"; then
    echo "ok   verify $* -> exit 2: $want"
  else
    echo "FAIL verify $*: exit status $rc, output:"; echo "$out" | tail -3; fails=$((fails + 1))
  fi
}
CUDA="--device cuda (the GPU operator on random q, k, v of --config's head shapes) does not use"
GRAD_CUDA="--grad --device cuda (the GPU backward on random q, k, v and one layer's weights) does not use"
refused "$CUDA --layers (got 4); it honours only --device, --config, --seq-len, --seed" --device cuda --layers 4
refused "$CUDA --text (got $TEXT)" --device cuda --text "$TEXT"
refused "$CUDA --dtype (got f32)" --device cuda --dtype f32
refused "$CUDA --dtype (got f64)" --dtype f64 --device cuda
refused "$CUDA --d-model (got 64)" --device cuda --config tiny --d-model 64
refused "$CUDA --weights (got $TEXT)" --device cuda --weights "$TEXT"
refused "$GRAD_CUDA --layers (got 3)" --grad --device cuda --layers 3
refused "$GRAD_CUDA --text (got $TEXT)" --grad --device cuda --text "$TEXT"
refused "$GRAD_CUDA --dtype (got f64)" --grad --device cuda --dtype f64
refused "$GRAD_CUDA --weights (got $TEXT)" --grad --device cuda --weights "$TEXT"
refused "--grad (seeded random weights of --config) does not use --weights (got $TEXT)" --grad --weights "$TEXT"
refused "--weights (the model file defines the configuration) does not use --config (got tiny)" --weights "$TEXT" --config tiny
refused "--weights (the model file defines the configuration) does not use --layers (got 2)" --weights "$TEXT" --layers 2

# honoured options only: past the check (to the kernels, or "no CUDA kernels" / "no usable CUDA GPU")
for args in "--device cuda --config tiny --seq-len 8 --seed 3" "--grad --device cuda --config tiny --d-model 16 --seq-len 8 --seed 3"; do
  # shellcheck disable=SC2086
  out=$(timeout 120 "$BIN" verify $args 2>&1)
  if grep -qF "does not use" <<<"$out"; then
    echo "FAIL verify $args: refused an honoured option:"; echo "$out" | tail -2; fails=$((fails + 1))
  else
    echo "ok   verify $args: not refused ($(echo "$out" | tail -1))"
  fi
done
[ "$fails" -eq 0 ] && echo "all checks hold" || echo "$fails check(s) failed"
exit $((fails > 0))
