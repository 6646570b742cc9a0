#!/usr/bin/env bash
# Installs the Debian 12 packages gst-latent needs to build, test and run (CPU build; the CUDA
# backend is added automatically when a CUDA toolkit with cuDNN is present).
# Only what is missing is installed; with everything present it does nothing.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libgstreamer-plugins-bad1.0-dev
  gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good
  libdnnl-dev nlohmann-json3-dev libgtest-dev
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
  meson
)
# Extras for the test command: clang + sanitizer/fuzzer runtimes.
if [ "${1:-}" = "--test" ]; then
  PKGS+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
