#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: install what is missing, build, and run the main job
# (a test clip through vaeencode ! vaedecode on the built-in default model, written to a playable
# file, printing PSNR and frames per second).
# LATENT_CUDA=OFF forces a CPU build (see scripts/configure.sh). Runs before or after
# scripts/test.sh: it only builds what the main job needs (the plugin and latent-tool) and leaves
# the tests of an earlier scripts/test.sh configured.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "setup.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR
. scripts/configure.sh
bash scripts/install-deps.sh
latent_configure_main keep
cmake --build "$LATENT_BUILD_DIR" -j"$(nproc)" --target gstlatent latent-tool
bash pipelines/main_job.sh
