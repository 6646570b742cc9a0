#!/usr/bin/env bash
# Live pipelines (README "Live pipelines"): a live camera-like source faster than the stages, with
# the two ways of keeping up.
#
#   pipelines/live.sh                           # after a build, from the repository root
#
# 1. Dropping (the default, QoS): the sink synchronises to the clock and reports lateness
#    upstream; vaeencode and vaedecode drop frames that are already late before computing them,
#    posting a QoS message for each. The lag stays at about the stages' latency; the output frame
#    rate is what the stages can manage.
# 2. Queueing with a leaky queue: qos=false, and a `queue leaky=downstream` of N frames in front
#    of the stages keeps only the newest N while the stages are busy. The lag is bounded by N
#    frames of processing; every frame the stages do see is rendered.
#
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_SINK      the video sink (default: fakesink; autovideosink to watch it)
# LATENT_CI_SMALL  1: 2 s at 128x128 instead of 10 s at 320x240
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
model=()
[ -z "${LATENT_MODEL:-}" ] || model=("model=\"$LATENT_MODEL\"")
sink="${LATENT_SINK:-fakesink}"
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then frames=60 size="width=128,height=128"; else frames=300 size="width=320,height=240"; fi

# 1. Dropping late frames (default properties).
gst-launch-1.0 -q videotestsrc is-live=true num-buffers="$frames" pattern=ball \
  ! "video/x-raw,$size,framerate=30/1" \
  ! vaeencode "${model[@]}" ! vaedecode "${model[@]}" \
  ! videoconvert ! "$sink" sync=true

# 2. Queueing: a leaky queue of two frames in front of the stages, QoS off.
gst-launch-1.0 -q videotestsrc is-live=true num-buffers="$frames" pattern=ball \
  ! "video/x-raw,$size,framerate=30/1" \
  ! queue leaky=downstream max-size-buffers=2 max-size-bytes=0 max-size-time=0 \
  ! vaeencode qos=false "${model[@]}" ! vaedecode qos=false "${model[@]}" \
  ! videoconvert ! "$sink" sync=true

echo "ran both live pipelines ($frames frames each)"
