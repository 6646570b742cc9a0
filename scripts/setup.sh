#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: install what is missing, build, and run the main job
# (a test clip through vaeencode ! vaedecode on the built-in default model, written to a playable
# file, printing PSNR and frames per second).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATENT_BUILD_TESTS=OFF
cmake --build build -j"$(nproc)"
bash pipelines/main_job.sh
