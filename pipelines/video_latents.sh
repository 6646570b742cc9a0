#!/usr/bin/env bash
# Video -> a latent file in video mode -> video, with a frame-count check:
#
#   gst-launch-1.0 filesrc location=clip.mp4 ! decodebin ! videoconvert \
#       ! vaeencode model=/models/Wan2.1-T2V-1.3B-Diffusers mode=video ! latentsink location=clip.safetensors
#   gst-launch-1.0 latentsrc location=clip.safetensors ! vaedecode model=/models/Wan2.1-T2V-1.3B-Diffusers \
#       ! videoconvert ! vp8enc ! webmmux ! filesink location=clip.webm
#
# In video mode a causal video VAE (Wan 2.1 / Qwen-Image VAE, TAEW) encodes frame 0 alone and then
# every 4 frames into one latent frame, streaming with constant memory (README "Video mode"). The
# file records each latent frame's timestamps and the source frames it covers; the last chunk is
# padded at EOS by repeating the last frame and vaedecode drops the padding again, so the decoded
# video has exactly as many frames as the source. This script checks that.
#
# LATENT_INPUT     a video file (default: videotestsrc)
# LATENT_MODEL     a video VAE: diffusers AutoencoderKLWan / AutoencoderKLQwenImage folder or
#                  pipeline root, Wan2.1_VAE.safetensors, taew2_1.safetensors (default: the tiny
#                  Wan test model, tests/fixtures/wan_vae_video_tiny)
# LATENT_OUT_DIR   where video_latents.safetensors and video_latents.webm go (default: out)
# LATENT_CI_SMALL  1: eleven small test frames (not 1 + 4k: the last chunk is padded)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model="${LATENT_MODEL:-$root/tests/fixtures/wan_vae_video_tiny}"
out="${LATENT_OUT_DIR:-out}"
file="$out/video_latents.safetensors"
expected=""
if [ -n "${LATENT_INPUT:-}" ]; then
  src=(filesrc location="\"$LATENT_INPUT\"" ! decodebin ! videoconvert)
elif [ "${LATENT_CI_SMALL:-0}" = 1 ]; then
  expected=11
  src=(videotestsrc num-buffers=11 pattern=ball ! "video/x-raw,width=64,height=48,framerate=24/1")
else
  expected=30
  src=(videotestsrc num-buffers=30 pattern=ball ! "video/x-raw,width=320,height=240,framerate=30/1")
fi
mkdir -p "$out"
rm -f "$file" "$out/video_latents.rgb" "$out/video_latents.webm"

gst-launch-1.0 -q "${src[@]}" ! vaeencode model="$model" mode=video ! latentsink location="$file"
test -s "$file"

# The file's metadata (safetensors: an 8-byte header length, then the JSON header).
read -r video_mode frames width height latent_frames < <(/usr/bin/env python3 - "$file" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    m = json.loads(f.read(n))["__metadata__"]
print(m["video_mode"], m["frame_count"], m["frame_width"], m["frame_height"], m["latent_frames"])
PY
)
if [ "$video_mode" != true ]; then
  echo "FAIL: $file is not a video-mode latent file (video_mode=$video_mode)" >&2
  exit 1
fi
if [ -n "$expected" ] && [ "$frames" != "$expected" ]; then
  echo "FAIL: $file covers $frames frames, the source had $expected" >&2
  exit 1
fi

gst-launch-1.0 -q latentsrc location="$file" ! vaedecode model="$model" ! tee name=t \
  t. ! queue ! videoconvert ! vp8enc deadline=1 ! webmmux ! filesink location="$out/video_latents.webm" \
  t. ! queue ! videoconvert ! video/x-raw,format=RGB ! filesink location="$out/video_latents.rgb"
test -s "$out/video_latents.webm"
bytes=$(stat -c %s "$out/video_latents.rgb")
decoded=$((bytes / (width * height * 3)))
rm -f "$out/video_latents.rgb"
if [ "$decoded" != "$frames" ]; then
  echo "FAIL: decoded $decoded frames from $latent_frames latent frames, the source had $frames" >&2
  exit 1
fi
echo "$frames frames -> $latent_frames latent frames ($file) -> $decoded frames ($out/video_latents.webm)"
