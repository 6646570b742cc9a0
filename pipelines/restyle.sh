#!/usr/bin/env bash
# The example launch line of ditdenoise: frames -> vaeencode -> ditdenoise (img2img under a text
# prompt) -> vaedecode -> WebM. Every stage loads its part of one Qwen-Image pipeline root.
#
#   pipelines/restyle.sh                        # after a build, from the repository root
#
# LATENT_DIT_MODEL       Qwen-Image pipeline root (transformer/, scheduler/, vae/); default: the
#                        tiny test pipeline tests/fixtures/dit_qwen_image_tiny
# LATENT_PROMPT_EMBEDS   prompt embeddings (tools/compute_prompt_embeds.py); default: the tiny
#                        pipeline's fixture embeddings, extracted into LATENT_OUT_DIR
# LATENT_NEGATIVE_EMBEDS negative prompt embeddings (true CFG with LATENT_GUIDANCE > 1); optional
# LATENT_INPUT           a video file to restyle (default: videotestsrc)
# LATENT_STEPS / LATENT_STRENGTH / LATENT_GUIDANCE / LATENT_SEED   ditdenoise settings
# LATENT_OUT_DIR         where restyle.webm goes (default: out)
# LATENT_CI_SMALL        1: three 96x64 frames (a 12x8 latent) instead of 30 at 512x512
#
# The full-size Qwen-Image (about 20B parameters in the transformer: use device=cuda) with a real
# prompt, e.g.:
#
#   python3 tools/compute_prompt_embeds.py --model /models/Qwen-Image --dtype bf16 \
#       --prompt "a watercolour painting, soft washes of colour" --out watercolour.safetensors
#   python3 tools/compute_prompt_embeds.py --model /models/Qwen-Image --dtype bf16 \
#       --prompt " " --out negative.safetensors
#   gst-launch-1.0 filesrc location=in.mp4 ! decodebin ! videoconvert ! videoscale \
#     ! video/x-raw,width=1024,height=576 ! vaeencode model=/models/Qwen-Image \
#     ! ditdenoise model=/models/Qwen-Image prompt-embeds=watercolour.safetensors \
#       negative-prompt-embeds=negative.safetensors guidance-scale=4 steps=30 strength=0.6 \
#       noise-mode=fixed seed=42 device=cuda \
#     ! vaedecode model=/models/Qwen-Image ! videoconvert ! x264enc ! mp4mux \
#     ! filesink location=restyled.mp4
#
# (or: LATENT_DIT_MODEL=/models/Qwen-Image LATENT_PROMPT_EMBEDS=watercolour.safetensors
#  LATENT_INPUT=in.mp4 pipelines/restyle.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model="${LATENT_DIT_MODEL:-$root/tests/fixtures/dit_qwen_image_tiny}"
out="${LATENT_OUT_DIR:-out}"
mkdir -p "$out"

embeds="${LATENT_PROMPT_EMBEDS:-}"
if [ -z "$embeds" ]; then
  embeds="$out/restyle_prompt_embeds.safetensors"
  python3 "$root/tools/compute_prompt_embeds.py" --from-fixture "$model/io_denoise.safetensors" \
    --case t2i_cfg --out "$embeds" >/dev/null
fi
negative=()
[ -z "${LATENT_NEGATIVE_EMBEDS:-}" ] || negative=("negative-prompt-embeds=\"$LATENT_NEGATIVE_EMBEDS\"")

if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then
  frames=3 size="width=96,height=64" steps="${LATENT_STEPS:-4}"
else
  frames=30 size="width=512,height=512" steps="${LATENT_STEPS:-30}"
fi
if [ -n "${LATENT_INPUT:-}" ]; then
  src=(filesrc location="\"$LATENT_INPUT\"" ! decodebin ! videoconvert ! videoscale ! videorate)
else
  src=(videotestsrc num-buffers="$frames" pattern=smpte)
fi

gst-launch-1.0 -q "${src[@]}" ! "video/x-raw,$size,framerate=30/1" \
  ! vaeencode model="\"$model\"" \
  ! ditdenoise model="\"$model\"" prompt-embeds="\"$embeds\"" "${negative[@]}" \
    steps="$steps" strength="${LATENT_STRENGTH:-0.6}" guidance-scale="${LATENT_GUIDANCE:-4}" \
    seed="${LATENT_SEED:-42}" noise-mode=fixed \
  ! vaedecode model="\"$model\"" \
  ! videoconvert ! vp8enc deadline=1 ! webmmux ! filesink location="$out/restyle.webm"

test -s "$out/restyle.webm"
echo "wrote $out/restyle.webm"
