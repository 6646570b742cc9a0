#!/usr/bin/env bash
# The example launch line of vaeencode and vaedecode: test frames -> latents -> frames -> WebM.
#
#   pipelines/encode_decode.sh                  # after a build, from the repository root
#
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_OUT_DIR   where encode_decode.webm goes (default: out)
# LATENT_CI_SMALL  1: three small frames (100x70, not a multiple of 8) instead of 60 at 320x240
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=\"$LATENT_MODEL\"")
out="${LATENT_OUT_DIR:-out}"
mkdir -p "$out"
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then frames=3 size="width=100,height=70"; else frames=60 size="width=320,height=240"; fi

gst-launch-1.0 -q videotestsrc num-buffers="$frames" ! "video/x-raw,$size,framerate=30/1" \
  ! vaeencode "${model[@]}" ! vaedecode "${model[@]}" \
  ! videoconvert ! vp8enc deadline=1 ! webmmux ! filesink location="$out/encode_decode.webm"

test -s "$out/encode_decode.webm"
echo "wrote $out/encode_decode.webm ($frames frames)"
