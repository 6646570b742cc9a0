#!/usr/bin/env bash
# Few-step restyling with a Lightning LoRA: frames -> vaeencode -> ditdenoise (4 steps, guidance
# off: one transformer pass per step, the LoRA applied at run time so its strength can change
# while playing) -> vaedecode -> WebM.
#
#   pipelines/lightning.sh                      # after a build, from the repository root
#
# LATENT_DIT_MODEL       Qwen-Image pipeline root; default: tests/fixtures/dit_qwen_image_tiny
# LATENT_LORA            the Lightning LoRA (any layout ditdenoise reads); default: the tiny
#                        fixture tests/fixtures/dit_lora/lora_lightning.safetensors
# LATENT_LORA_STRENGTH   default 1.0
# LATENT_PROMPT_EMBEDS   prompt embeddings; default: the tiny pipeline's fixture embeddings
# LATENT_STEPS           4 or 8 (the Lightning LoRA's step count; default 4)
# LATENT_OUT_DIR         where lightning.webm and the scheduler config go (default: out)
# LATENT_CI_SMALL        1: three 96x64 frames instead of 30 at 512x512
#
# Qwen-Image-Lightning's scheduler config (exponential time shift fixed at log 3, no terminal
# sigma) is written to LATENT_OUT_DIR and given as `scheduler=`. With the full-size model:
#
#   gst-launch-1.0 filesrc location=in.mp4 ! decodebin ! videoconvert ! videoscale \
#     ! video/x-raw,width=1024,height=576 ! vaeencode model=/models/Qwen-Image device=cuda \
#     ! ditdenoise model=/models/Qwen-Image prompt-embeds=watercolour.safetensors \
#       lora="Qwen-Image-Lightning-4steps-V2.0.safetensors:1.0" lora-mode=merged \
#       scheduler=lightning_scheduler_config.json steps=4 guidance-scale=1 strength=0.7 \
#       device=cuda \
#     ! vaedecode model=/models/Qwen-Image device=cuda ! videoconvert ! x264enc ! mp4mux \
#     ! filesink location=restyled.mp4
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model="${LATENT_DIT_MODEL:-$root/tests/fixtures/dit_qwen_image_tiny}"
lora="${LATENT_LORA:-$root/tests/fixtures/dit_lora/lora_lightning.safetensors}"
out="${LATENT_OUT_DIR:-out}"
mkdir -p "$out"

embeds="${LATENT_PROMPT_EMBEDS:-}"
if [ -z "$embeds" ]; then
  embeds="$out/lightning_prompt_embeds.safetensors"
  python3 "$root/tools/compute_prompt_embeds.py" --from-fixture "$model/io_denoise.safetensors" \
    --case t2i_cfg --out "$embeds" >/dev/null
fi
scheduler="$out/lightning_scheduler_config.json"
cat > "$scheduler" <<'JSON'
{
  "_class_name": "FlowMatchEulerDiscreteScheduler",
  "base_image_seq_len": 256,
  "base_shift": 1.0986122886681098,
  "invert_sigmas": false,
  "max_image_seq_len": 8192,
  "max_shift": 1.0986122886681098,
  "num_train_timesteps": 1000,
  "shift": 1.0,
  "shift_terminal": null,
  "stochastic_sampling": false,
  "time_shift_type": "exponential",
  "use_beta_sigmas": false,
  "use_dynamic_shifting": true,
  "use_exponential_sigmas": false,
  "use_karras_sigmas": false
}
JSON

if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then
  frames=3 size="width=96,height=64"
else
  frames=30 size="width=512,height=512"
fi

gst-launch-1.0 -q videotestsrc num-buffers="$frames" pattern=smpte \
  ! "video/x-raw,$size,framerate=30/1" \
  ! vaeencode model="\"$model\"" \
  ! ditdenoise model="\"$model\"" prompt-embeds="\"$embeds\"" \
    lora="\"$lora:${LATENT_LORA_STRENGTH:-1.0}\"" lora-mode=runtime \
    scheduler="\"$scheduler\"" steps="${LATENT_STEPS:-4}" guidance-scale=1 strength=0.7 \
    seed=42 noise-mode=fixed \
  ! vaedecode model="\"$model\"" \
  ! videoconvert ! vp8enc deadline=1 ! webmmux ! filesink location="$out/lightning.webm"

test -s "$out/lightning.webm"
echo "wrote $out/lightning.webm"
