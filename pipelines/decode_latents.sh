#!/usr/bin/env bash
# Latents on disk (as pipelines/precompute_latents.sh writes them) -> vaedecode -> WebM video.
# rawvideoparse gives the decoded frames timestamps from the caps' framerate (the files have none).
#
# LATENT_LATENTS   the dump folder (default: $LATENT_OUT_DIR/latents, made first if missing)
# LATENT_MODEL     model folder or .safetensors file: the one that made the latents
#                  (default: the built-in default model)
# LATENT_OUT_DIR   where decoded.webm goes (default: out)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=\"$LATENT_MODEL\"")
out="${LATENT_OUT_DIR:-out}"
dir="${LATENT_LATENTS:-$out/latents}"
if [ ! -s "$dir/caps.txt" ]; then
  LATENT_LATENTS="$dir" bash "$root/pipelines/precompute_latents.sh"
fi
mkdir -p "$out"

gst-launch-1.0 -q multifilesrc location="$dir/latent_%05d.bin" caps="$(cat "$dir/caps.txt")" \
  ! vaedecode "${model[@]}" ! rawvideoparse use-sink-caps=true \
  ! videoconvert ! vp8enc deadline=1 ! webmmux ! filesink location="$out/decoded.webm"

test -s "$out/decoded.webm"
echo "wrote $out/decoded.webm from $dir"
