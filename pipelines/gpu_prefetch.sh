#!/usr/bin/env bash
# The system-memory GPU launch line: frames in host memory go up through pinned slots on a copy
# stream (vaeencode prefetch-depth) and come back the same way (vaedecode prefetch-depth), each
# stage replaying the CUDA graph it captured when caps were negotiated (cuda-graphs).
#
#   pipelines/gpu_prefetch.sh          # after a build, from the repository root, on a GPU machine
#
# Exits 77 (skipped) without a usable GPU when LATENT_DEVICE is cuda (the default).
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_DEVICE    cuda (default), cuda:N, or cpu (the properties are then no-ops)
# LATENT_CI_SMALL  1: 5 frames at 320x240 instead of 120 at 1920x1080
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
device="${LATENT_DEVICE:-cuda}"
if [ "$device" != cpu ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_prefetch: no GPU here, skipping"
  exit 77
fi
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=$LATENT_MODEL")
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then frames=5 w=320 h=240; else frames=120 w=1920 h=1080; fi

gst-launch-1.0 -q videotestsrc num-buffers="$frames" ! "video/x-raw,format=RGBx,width=$w,height=$h" \
  ! vaeencode device="$device" prefetch-depth=2 cuda-graphs=true "${model[@]}" \
  ! vaedecode device="$device" prefetch-depth=2 cuda-graphs=true "${model[@]}" \
  ! fakesink sync=false
echo "gpu_prefetch: $frames frames of ${w}x${h} on $device (prefetch-depth=2, cuda-graphs=true)"
