#!/usr/bin/env bash
# The RTSP server example (pipelines/rtsp_server.py, gst-rtsp-server) with a bounded client:
# the server listens on 127.0.0.1 (a free port), a client reads N frames of its stream and
# exits, the server is stopped. Fails when the client gets no frames or takes too long.
#
#   pipelines/rtsp_server.sh          # after a build, from the repository root
#
# Needs /usr/bin/python3 with python3-gi and gir1.2-gst-rtsp-server-1.0 (scripts/install-deps.sh);
# exits 77 (skipped) without them.
# LATENT_MODEL     model folder or .safetensors file (default: the built-in default model)
# LATENT_CI_SMALL  1: 64x64 and 5 frames instead of 256x256 and 30
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ -n "${GST_PLUGIN_PATH_1_0:-}${GST_PLUGIN_PATH:-}" ] || export GST_PLUGIN_PATH="$root/build/plugin"
py=/usr/bin/python3
if ! "$py" -c 'import gi; gi.require_version("GstRtspServer", "1.0"); from gi.repository import GstRtspServer' 2>/dev/null; then
  echo "rtsp_server: needs $py with python3-gi and gir1.2-gst-rtsp-server-1.0, skipping"
  exit 77
fi
if [ "${LATENT_CI_SMALL:-0}" = 1 ]; then size=64x64 frames=5; else size=256x256 frames=30; fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$py" "$root/pipelines/rtsp_server.py" --port 0 --size "$size" ${LATENT_MODEL:+--model "$LATENT_MODEL"} \
  > "$work/url" 2> "$work/server.log" &
server_pid=$!
for _ in $(seq 100); do
  [ -s "$work/url" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "rtsp_server: the server died" >&2; exit 1; }
  sleep 0.1
done
url="$(head -1 "$work/url")"
case "$url" in rtsp://127.0.0.1:*) ;; *) cat "$work/server.log" >&2; echo "rtsp_server: no URL from the server" >&2; exit 1 ;; esac

# The bounded client: N frames, then EOS; at most 120 s.
start=$(date +%s.%N)
client=0
timeout 120 gst-launch-1.0 -q rtspsrc location="$url" latency=100 protocols=tcp \
  ! rtpvp8depay ! vp8dec ! videoconvert ! identity eos-after="$((frames + 1))" \
  ! pngenc ! multifilesink location="$work/frame-%03d.png" || client=$?
end=$(date +%s.%N)
if [ "$client" != 0 ]; then
  # what the server said, and whether it is still there
  cat "$work/server.log" >&2
  kill -0 "$server_pid" 2>/dev/null && state="still running" || state="gone"
  echo "rtsp_server: the client exited with $client (the server: $state)" >&2
  exit 1
fi
got=$(ls "$work"/frame-*.png 2>/dev/null | wc -l)
[ "$got" -ge "$frames" ] || { cat "$work/server.log" >&2; echo "rtsp_server: the client got $got of $frames frames" >&2; exit 1; }
printf 'rtsp_server: %d frames of %s from %s in %.1f s\n' "$got" "$size" "$url" "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.10g", b - a }')"
