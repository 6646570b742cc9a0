#!/usr/bin/env bash
# The main job: a test clip (a slideshow of photographs the built-in model never saw in training,
# tests/fixtures/photos) through vaeencode ! vaedecode, written to a playable WebM file, with the
# round-trip PSNR / SSIM and the frames per second printed. Runs on the GPU when there is one
# (device=auto), else on the CPU.
#
#   pipelines/main_job.sh          # after a build, from the repository root (scripts/setup.sh runs it)
#
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_OUT_DIR   where main_job.webm goes (default: out)
# LATENT_CI_SMALL  1: 256x256 and 5 frames instead of 512x512 and 15
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
tool="${LATENT_TOOL:-$root/build/tools/latent-tool}"
out="${LATENT_OUT_DIR:-out}"
mkdir -p "$out"
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=$LATENT_MODEL")
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then size=256 fps=1; else size=512 fps=3; fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
i=0
for p in "$root"/tests/fixtures/photos/*.png; do
  ln -s "$p" "$work/photo-$i.png"
  i=$((i + 1))
done
last=$((i - 1))

start=$(date +%s.%N)
gst-launch-1.0 -q \
  multifilesrc location="$work/photo-%d.png" index=0 stop-index=$last caps="image/png,framerate=1/1" \
  ! pngdec ! videoconvert ! aspectratiocrop aspect-ratio=1/1 ! videoscale \
  ! "video/x-raw,format=RGB,width=$size,height=$size,pixel-aspect-ratio=1/1" \
  ! videorate ! "video/x-raw,framerate=$fps/1" ! tee name=src \
  src. ! queue ! pngenc ! multifilesink location="$work/ref-%03d.png" \
  src. ! queue ! vaeencode "${model[@]}" ! vaedecode "${model[@]}" ! tee name=dec \
  dec. ! queue ! videoconvert ! vp8enc deadline=1 target-bitrate=4000000 ! webmmux \
       ! filesink location="$out/main_job.webm" \
  dec. ! queue ! pngenc ! multifilesink location="$work/out-%03d.png"
end=$(date +%s.%N)

test -s "$out/main_job.webm"
frames=$(ls "$work"/out-*.png | wc -l)
[ "$frames" -gt 0 ] || { echo "main_job: no frames came out" >&2; exit 1; }
psnr_sum=0 ssim_sum=0
for o in "$work"/out-*.png; do
  r="$work/ref-${o##*/out-}"
  read -r _ psnr _ _ ssim < <("$tool" compare "$r" "$o")
  psnr_sum=$(awk -v a="$psnr_sum" -v b="$psnr" 'BEGIN { printf "%.10g", a + b }')
  ssim_sum=$(awk -v a="$ssim_sum" -v b="$ssim" 'BEGIN { printf "%.10g", a + b }')
done
printf 'main job: %d frames of %dx%d through vaeencode ! vaedecode -> %s\n' "$frames" "$size" "$size" "$out/main_job.webm"
printf 'round trip: PSNR %.2f dB, SSIM %.4f (mean over frames)\n' \
  "$(awk -v s="$psnr_sum" -v n="$frames" 'BEGIN { printf "%.10g", s / n }')" \
  "$(awk -v s="$ssim_sum" -v n="$frames" 'BEGIN { printf "%.10g", s / n }')"
printf 'throughput: %.2f frames/s end to end (including PNG and VP8 encoding)\n' \
  "$(awk -v n="$frames" -v a="$start" -v b="$end" 'BEGIN { printf "%.10g", n / (b - a) }')"
