#!/usr/bin/env bash
# Video -> one latent file, e.g. to train or run a diffusion model on the latents later:
#
#   gst-launch-1.0 filesrc location=clip.mp4 ! decodebin ! videoconvert ! vaeencode \
#       ! latentsink location=clip.safetensors
#
# The file is a safetensors file (tensor `latents` [T, C, h, w] and the stream's description in
# its metadata; README "The latent file"), complete or absent: latentsink writes
# clip.safetensors.partial and renames it at EOS. For a whole dataset on every GPU:
# scripts/latent-precompute. pipelines/decode_latents.sh turns the file back into video.
#
# LATENT_INPUT     a video file (default: videotestsrc)
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_LATENTS   the latent file (default: $LATENT_OUT_DIR/latents.safetensors; LATENT_OUT_DIR
#                  default: out)
# LATENT_CI_SMALL  1: three small test frames
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=\"$LATENT_MODEL\"")
file="${LATENT_LATENTS:-${LATENT_OUT_DIR:-out}/latents.safetensors}"
if [ -n "${LATENT_INPUT:-}" ]; then
  src=(filesrc location="\"$LATENT_INPUT\"" ! decodebin ! videoconvert)
elif [ "${LATENT_CI_SMALL:-0}" = 1 ]; then
  src=(videotestsrc num-buffers=3 ! "video/x-raw,width=100,height=70,framerate=30/1")
else
  src=(videotestsrc num-buffers=30 ! "video/x-raw,width=320,height=240,framerate=30/1")
fi
mkdir -p "$(dirname "$file")"
gst-launch-1.0 -q "${src[@]}" ! vaeencode "${model[@]}" ! latentsink location="$file"
test -s "$file"
if [ -x "$root/build/tools/latent-tool" ]; then
  "$root/build/tools/latent-tool" inspect "$file"
else
  echo "wrote $file"
fi
