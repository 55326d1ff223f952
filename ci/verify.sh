#!/usr/bin/env bash
# Quick start 1: install dependencies, build, and run the main job `orthros verify`.
# Extra arguments go to `orthros verify` (e.g. --config llama3.1-8b --seq-len 512).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
./build/reference/orthros verify "$@"
