#!/bin/sh
# The README's four commands, shortened (ctest example_hf_conversion): PY ORTHROS RUN_DIR.
set -e
PY="$1"; ORTHROS="$2"; RUN="$3"
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "skipped: $PY lacks torch or transformers"; exit 77; }
EX="$(dirname "$0")/hf_conversion.py"
rm -rf "$RUN"
"$PY" "$EX" convert --run "$RUN" --arch llama --shape tiny --window 8
"$PY" "$EX" train --run "$RUN" --steps 2 --seq-len 32 --batch 2 --sft
"$PY" "$EX" generate --run "$RUN" --new 4 --chunk 3
"$PY" "$EX" check --run "$RUN" --orthros "$ORTHROS" --seq-len 16
