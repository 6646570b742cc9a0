#!/usr/bin/env bash
# latentsink taking latents in CUDA memory, against the same latents in system memory:
#
#   gst-launch-1.0 videotestsrc num-buffers=30 ! cudaupload ! vaeencode device=cuda \
#       ! "application/x-latent(memory:CUDAMemory)" ! latentsink location=latents.safetensors
#
# The two files must be byte-identical (latentsink downloads CUDA memory through GStreamer's
# mapping; the metadata records no memory type).
#
# Exits 77 (skipped) without a usable GPU or without GStreamer's CUDA elements (nvcodec).
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_OUT_DIR   where the two files go (default: out)
# LATENT_CI_SMALL  1: 5 frames at 320x240 instead of 30 at 1280x720
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
if ! nvidia-smi -L >/dev/null 2>&1 || ! gst-inspect-1.0 cudaupload >/dev/null 2>&1; then
  echo "latents_cuda_memory: no GPU or no cudaupload element here, skipping"
  exit 77
fi
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=$LATENT_MODEL")
out="${LATENT_OUT_DIR:-out}"
mkdir -p "$out"
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then frames=5 w=320 h=240; else frames=30 w=1280 h=720; fi
src=(videotestsrc num-buffers="$frames" pattern=ball ! "video/x-raw,format=NV12,width=$w,height=$h,framerate=30/1" ! cudaupload)

gst-launch-1.0 -q "${src[@]}" ! vaeencode device=cuda "${model[@]}" \
  ! "application/x-latent(memory:CUDAMemory)" ! latentsink location="$out/latents_cuda.safetensors"
gst-launch-1.0 -q "${src[@]}" ! vaeencode device=cuda "${model[@]}" \
  ! "application/x-latent" ! latentsink location="$out/latents_system.safetensors"
cmp "$out/latents_cuda.safetensors" "$out/latents_system.safetensors"
echo "latents from CUDA memory and from system memory are the same ($frames frames, $out/latents_cuda.safetensors)"
