#!/usr/bin/env bash
# Stages what ci/gpu_ports.sh needs beside the working tree: the orthros CLI of this checkout (a
# CPU build: `golden` and `check --diagnose` need no GPU) and libgomp, in ports-carry/. Carry
# ports-carry and .whl (nvidia-cudnn-frontend 1.32.0 and xformers 0.0.35 wheels; fetch them with
# `pip download --no-deps --only-binary=:all: --python-version 3.12 nvidia-cudnn-frontend==1.32.0
# xformers==0.0.35 -d .whl/`).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DORTHROS_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target orthros
mkdir -p ports-carry
cp build/verify/cli/orthros ports-carry/
cp "$(g++ -print-file-name=libgomp.so.1)" ports-carry/
strip ports-carry/orthros
git rev-parse HEAD > ports-carry/COMMIT
du -sh ports-carry .whl 2>/dev/null || true
