# Sourced by the budgeted device-call scripts (bench/results/*/run*.sh), after ci/gpu_env.sh
# (BIN, OUTDIR):
#   BUDGET            seconds the call's steps may take in all (default 560)
#   L                 the log folder, /tmp/orthros-call/logs (emptied here: a warm machine keeps
#                     /tmp between calls); only its archive goes under $OUTDIR, since the device
#                     returns at most 8 files
#   rc_all            the first non-zero exit status of a step (0 while all passed)
#   st MSG            MSG with the elapsed seconds, to stdout and $OUTDIR/summary.txt
#   pack              logs/ as $OUTDIR/logs.tar.xz
#   step NAME LIMIT CMD...
#                     runs CMD under `timeout LIMIT` (stdout and stderr to $L/NAME.log) when the
#                     budget still holds LIMIT seconds, else records it as skipped; prints the
#                     test or sanitizer summary line, and the failures when it fails.
BUDGET=${BUDGET:-560}
L=/tmp/orthros-call/logs; rm -rf "$L"; mkdir -p "$L"
rc_all=0
pack() { tar -C "$(dirname "$L")" -cJf "$OUTDIR/logs.tar.xz" logs; }
st() { echo "[$SECONDS s] $*" | tee -a "$OUTDIR/summary.txt"; }
step() {
  local name=$1 limit=$2; shift 2
  if [ $((SECONDS + limit)) -gt "$BUDGET" ]; then st "$name: SKIPPED (budget)"; return; fi
  timeout "$limit" "$@" > "$L/$name.log" 2>&1
  local rc=$?; [ $rc_all -eq 0 ] && rc_all=$rc
  st "$name exit $rc: $(grep -hE '^\[  (PASSED|FAILED)|ERROR SUMMARY|RACECHECK SUMMARY|^(PASS|FAIL)' "$L/$name.log" | head -2 | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E -A4 "Failure|FAILED|rror" "$L/$name.log" | head -12
}

# bwd_suite NAME BINARY PATH: the backward suite BINARY as step NAME on one dispatch path:
# automatic, generic (the pre-Hopper kernels), fused (the fused dq forced), unpiped (the pipelined
# dk/dv loop off) or serial (the dq and dk/dv kernels on one stream).
bwd_suite() {
  local name=$1 bin=$2 path=$3 kernel=automatic fused= pipe= concurrent=
  case $path in generic) kernel=generic ;; fused) fused=1 ;; unpiped) pipe=0 ;; serial) concurrent=0 ;; esac
  ORTHROS_TEST_KERNEL=$kernel ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe ORTHROS_BWD_CONCURRENT=$concurrent \
    step "$name" 60 "$bin"
}
# gpu_tests: the GPU tests of $BIN on both paths (issue 20's "Done when"): the backward suite on
# the five paths, the layer backward (default and fused dq), `orthros verify --grad` on three
# models, then the forward suite (Hopper and generic), the kernel families (default and band 7),
# the layer forward and `orthros verify`. Packs the logs after each half.
gpu_tests() {
  local path fused cfg kernel band
  for path in automatic generic fused unpiped serial; do bwd_suite tests_bwd_$path "$BIN/test_attention_backward_gpu" $path; done
  for fused in "" 1; do ORTHROS_BWD_FUSED_DQ=$fused step tests_layer_bwd$fused 60 "$BIN/test_layer_backward_gpu"; done
  for cfg in "qwen3-8b 256" "llama3.1-8b 200" "tiny 40"; do
    set -- $cfg; step verify_grad_$1 60 "$BIN/orthros" verify --grad --device cuda --config $1 --seq-len $2
  done
  pack
  for kernel in automatic generic; do
    ORTHROS_TEST_KERNEL=$kernel RC_PARAMS=max_success=100 step tests_fwd_$kernel 150 "$BIN/test_attention_gpu"
  done
  for band in "" 7; do ORTHROS_FWD_BAND=$band step tests_kernels$band 120 "$BIN/test_attention_kernels_gpu"; done
  step tests_layer 60 "$BIN/test_layer_gpu"
  for cfg in "tiny 300" "qwen3-8b 1200"; do set -- $cfg; step verify_$1 90 "$BIN/orthros" verify --device cuda --config $1 --seq-len $2; done
  pack
}

# san_bwd STEM BINARY VARIANT: compute-sanitizer's four tools on BINARY's SanitizerSmall tests, as
# steps STEM_TOOLVARIANT, with the fused dq forced (VARIANT fused), the pipelined dk/dv loop off
# (unpiped) or the default dispatch ("").
san_bwd() {
  local stem=$1 bin=$2 variant=$3 fused= pipe= tool
  case $variant in fused) fused=1 ;; unpiped) pipe=0 ;; esac
  for tool in memcheck racecheck initcheck synccheck; do
    ORTHROS_BWD_FUSED_DQ=$fused ORTHROS_BWD_PIPE=$pipe step ${stem}_$tool$variant 60 compute-sanitizer --tool $tool \
      --error-exitcode 3 "$bin" --gtest_filter='*SanitizerSmall*'
  done
}
# san_fwd: compute-sanitizer's four tools on $BIN's forward suite (3 draws per property, the three
# largest cases left out), as steps san_fwd_TOOL, packing the logs after each.
san_fwd() {
  local tool
  for tool in memcheck racecheck initcheck synccheck; do
    RC_PARAMS=max_success=3 step san_fwd_$tool 150 compute-sanitizer --tool $tool --error-exitcode 3 "$BIN/test_attention_gpu" \
      --gtest_filter='-*RaggedBatchOver48Sequences*:*DecodeSplitCounts4096*:*HopperWindowsAndGroupsMatchGeneric*'
    pack
  done
}
