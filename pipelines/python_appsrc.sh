#!/usr/bin/env bash
# The PyGObject example (pipelines/python_appsrc.py): frames made in Python go through appsrc !
# vaeencode ! vaedecode ! appsink and come back, with the round trip's PSNR.
#
#   pipelines/python_appsrc.sh          # after a build, from the repository root
#
# Needs /usr/bin/python3 with python3-gi (scripts/install-deps.sh); exits 77 (skipped) without.
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_CI_SMALL  1: 3 frames of 64x48 instead of 10 of 128x96
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
py=/usr/bin/python3
if ! "$py" -c 'import gi; gi.require_version("Gst", "1.0"); from gi.repository import Gst' 2>/dev/null; then
  echo "python_appsrc: needs $py with python3-gi and gir1.2-gstreamer-1.0, skipping"
  exit 77
fi
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then args=(--frames 3 --size 64x48); else args=(--frames 10 --size 128x96); fi
# The built-in model's round trip is far above 20 dB on these gradients; a broken path is not.
timeout 300 "$py" "$root/pipelines/python_appsrc.py" "${args[@]}" --min-psnr 20 \
  ${LATENT_MODEL:+--model "$LATENT_MODEL"}
