#!/usr/bin/env bash
# The CUDA-memory launch line of vaeencode: frames uploaded once by cudaupload, latents kept in GPU
# memory between vaeencode and vaedecode, decoded frames handed to cudadownload as CUDA memory.
#
#   pipelines/cuda_memory.sh            # after a build, from the repository root, on a GPU machine
#
# Exits 77 (skipped) without a usable GPU or without GStreamer's CUDA elements (nvcodec).
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_OUT_DIR   where cuda_memory.webm goes (default: out)
# LATENT_CI_SMALL  1: 5 frames at 320x240 instead of 60 at 1280x720
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
if ! nvidia-smi -L >/dev/null 2>&1 || ! gst-inspect-1.0 cudaupload >/dev/null 2>&1; then
  echo "cuda_memory: no GPU or no cudaupload element here, skipping"
  exit 77
fi
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=$LATENT_MODEL")
out="${LATENT_OUT_DIR:-out}"
mkdir -p "$out"
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then frames=5 w=320 h=240; else frames=60 w=1280 h=720; fi

# A playable WebM where GStreamer's VP8 encoder is installed (gstreamer1.0-plugins-good); a
# minimal runtime without it (the GPU machine's) still runs the CUDA-memory stages, into raw frames.
if gst-inspect-1.0 vp8enc >/dev/null 2>&1; then
  file="$out/cuda_memory.webm" tail=(videoconvert ! vp8enc deadline=1 ! webmmux)
else
  file="$out/cuda_memory.rgba" tail=(identity)
fi
gst-launch-1.0 -q videotestsrc num-buffers="$frames" ! "video/x-raw,format=NV12,width=$w,height=$h" \
  ! cudaupload ! vaeencode device=cuda "${model[@]}" ! vaedecode device=cuda "${model[@]}" \
  ! "video/x-raw(memory:CUDAMemory),format=RGBA" ! cudadownload ! "${tail[@]}" \
  ! filesink location="$file"

test -s "$file"
echo "wrote $file ($frames frames through CUDA memory)"
