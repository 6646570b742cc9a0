#!/usr/bin/env bash
# Video -> latents on disk, e.g. to train or run a diffusion model on them later: one file per
# frame (latent_00000.bin, ...: the normalised latent [C, h, w] in the caps' dtype) and caps.txt,
# the caps that describe them (dtype, latent size and space, original frame size).
# pipelines/decode_latents.sh turns them back into video.
#
# LATENT_INPUT     a video file (default: videotestsrc)
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_LATENTS   the dump folder (default: $LATENT_OUT_DIR/latents; LATENT_OUT_DIR default: out)
# LATENT_CI_SMALL  1: three small test frames
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=\"$LATENT_MODEL\"")
dir="${LATENT_LATENTS:-${LATENT_OUT_DIR:-out}/latents}"
if [ -n "${LATENT_INPUT:-}" ]; then
  src=(filesrc location="\"$LATENT_INPUT\"" ! decodebin ! videoconvert)
elif [ "${LATENT_CI_SMALL:-0}" = 1 ]; then
  src=(videotestsrc num-buffers=3 ! "video/x-raw,width=100,height=70,framerate=30/1")
else
  src=(videotestsrc num-buffers=30 ! "video/x-raw,width=320,height=240,framerate=30/1")
fi

# Written beside the target and moved into place at the end: a reader never sees half a dump.
mkdir -p "$(dirname "$dir")"
tmp="$(mktemp -d "$dir.tmp.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
if ! gst-launch-1.0 -v "${src[@]}" ! vaeencode name=enc "${model[@]}" \
    ! multifilesink location="$tmp/latent_%05d.bin" >"$tmp/launch.log" 2>&1; then
  grep -A2 -E "^(ERROR|WARNING)" "$tmp/launch.log" | head -n 12 >&2 || tail -n 12 "$tmp/launch.log" >&2
  exit 1
fi
# The caps vaeencode negotiated (gst-launch -v prints them).
grep -o 'GstVaeEncode:enc\.GstPad:src: caps = .*' "$tmp/launch.log" | sed 's/.*caps = //' \
  | sort -u >"$tmp/caps.txt"
if [ "$(wc -l <"$tmp/caps.txt")" != 1 ]; then
  echo "precompute_latents.sh: the video changed format mid-stream; a dump holds one format" >&2
  exit 1
fi
rm "$tmp/launch.log"
rm -rf "$dir" && mv "$tmp" "$dir"
echo "wrote $(ls "$dir" | grep -c '^latent_') latents to $dir: $(cat "$dir/caps.txt")"
