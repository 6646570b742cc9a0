#!/usr/bin/env bash
# A latent file (as pipelines/precompute_latents.sh or scripts/latent-precompute write them)
# -> vaedecode -> WebM video:
#
#   gst-launch-1.0 latentsrc location=clip.safetensors ! vaedecode ! videoconvert \
#       ! vp8enc ! webmmux ! filesink location=decoded.webm
#
# latentsrc pushes the latents with the caps and timestamps they were recorded with.
#
# LATENT_LATENTS   the latent file (default: $LATENT_OUT_DIR/latents.safetensors, made first if
#                  missing)
# LATENT_MODEL     model folder or .safetensors file: the one that made the latents
#                  (default: the built-in default model)
# LATENT_OUT_DIR   where decoded.webm goes (default: out)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=\"$LATENT_MODEL\"")
out="${LATENT_OUT_DIR:-out}"
file="${LATENT_LATENTS:-$out/latents.safetensors}"
if [ ! -s "$file" ]; then
  LATENT_LATENTS="$file" bash "$root/pipelines/precompute_latents.sh"
fi
mkdir -p "$out"
gst-launch-1.0 -q latentsrc location="$file" ! vaedecode "${model[@]}" ! videoconvert \
  ! vp8enc deadline=1 ! webmmux ! filesink location="$out/decoded.webm"
test -s "$out/decoded.webm"
echo "wrote $out/decoded.webm from $file"
