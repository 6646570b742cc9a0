#!/usr/bin/env bash
# Installs the Debian 12 packages gst-latent needs to build, test and run (CPU build; the CUDA
# backend is added automatically when a CUDA toolkit with cuDNN is present, and then the pinned
# cudnn-frontend headers too, see below).
# Only what is missing is installed; with everything present it does nothing.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libgstreamer-plugins-bad1.0-dev
  gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good
  libdnnl-dev nlohmann-json3-dev libgtest-dev libcli11-dev
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev
  meson
  # The Python and RTSP examples in pipelines/ (Debian's /usr/bin/python3).
  python3-gi gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 gir1.2-gst-rtsp-server-1.0
)
# --- Python side: the precompute job (python/gst_latent, scripts/latent-precompute) ----------
# PyGObject and GStreamer's introspection data from Debian; Ray goes into a venv (below).
PKGS+=(python3-gi gir1.2-gstreamer-1.0 python3-tqdm python3-venv)
# The parsers and decoders clips need (h264parse, h265parse, openh264dec; nvh264dec / nvh265dec
# where a GPU driver is present) and the H.264 clips the tests make (openh264enc).
PKGS+=(gstreamer1.0-plugins-bad)
# --- end of the Python side's packages ------------------------------------------------------
# Extras for the test command: clang + sanitizer/fuzzer runtimes.
if [ "${1:-}" = "--test" ]; then
  PKGS+=(clang libclang-rt-14-dev libomp-14-dev)  # libomp: the fuzz build is clang + OpenMP (oneDNN)
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# cudnn-frontend: NVIDIA's header-only C++ API to cuDNN's graph engines (MIT), for cuDNN's fused
# flash attention (engine/backends/cuda/sdpa.cpp). Not in Debian nor in the CUDA toolkit: only
# with a CUDA toolkit that has cuDNN, the pinned release's include/ is taken from its PyPI wheel
# (checksum checked; GitHub's source tarball if pip cannot fetch it) into
# /usr/local/include/cudnn-frontend/include (root or sudo) or ~/.cache/gst-latent/cudnn-frontend/include
# (the folder must be named include: the headers include "../include/..."),
# both of which CMake searches. LATENT_CUDNN_FRONTEND_DIR=<folder> picks another (then configure
# with -DLATENT_CUDNN_FRONTEND_INCLUDE_DIR=<folder>). Nothing is written into the repository.
FE_VERSION=1.32.0
FE_WHEEL=nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
FE_WHEEL_SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
install_cudnn_frontend() {
  local nvcc cudnn_h="" dir="" d
  if [ "${LATENT_CUDA:-AUTO}" = OFF ]; then
    echo "install-deps: LATENT_CUDA=OFF, cudnn-frontend not needed"
    return 0
  fi
  nvcc=$(command -v nvcc || true)
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  for d in /usr/local/cuda/include /usr/include /usr/include/x86_64-linux-gnu /usr/local/include; do
    [ -f "$d/cudnn.h" ] && cudnn_h=$d/cudnn.h && break
  done
  if [ -z "$nvcc" ] || [ -z "$cudnn_h" ]; then
    echo "install-deps: no CUDA toolkit with cuDNN, cudnn-frontend not needed"
    return 0
  fi
  if [ -n "${LATENT_CUDNN_FRONTEND_DIR:-}" ]; then
    dir=$LATENT_CUDNN_FRONTEND_DIR
  elif [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null; then
    dir=/usr/local/include/cudnn-frontend/include
  else
    dir=$HOME/.cache/gst-latent/cudnn-frontend/include
  fi
  local have="$dir/cudnn_frontend_version.h"
  if [ -f "$have" ] && grep -q "CUDNN_FRONTEND_MINOR_VERSION $(echo $FE_VERSION | cut -d. -f2)\b" "$have" &&
     grep -q "CUDNN_FRONTEND_MAJOR_VERSION $(echo $FE_VERSION | cut -d. -f1)\b" "$have"; then
    echo "install-deps: cudnn-frontend $FE_VERSION present in $dir"
    return 0
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "${tmp:-}"; trap - RETURN' RETURN
  local src=""
  if [ "$(uname -m)" = x86_64 ]; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
      $SUDO apt-get update -qq
      $SUDO apt-get install -y -q --no-install-recommends python3-pip
    fi
    # The wheel only carries the headers for us (its Python module is not used); any Python
    # version's wheel holds the same include/.
    if python3 -m pip download -q "nvidia-cudnn-frontend==$FE_VERSION" --no-deps \
         --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$tmp"; then
      if [ -f "$tmp/$FE_WHEEL" ] && echo "$FE_WHEEL_SHA256  $tmp/$FE_WHEEL" | sha256sum -c --quiet; then
        python3 - "$tmp/$FE_WHEEL" "$tmp/x" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
        src=$tmp/x/include
      else
        echo "install-deps: cudnn-frontend wheel missing or checksum mismatch, trying GitHub" >&2
      fi
    fi
  fi
  if [ -z "$src" ]; then
    local url="https://github.com/NVIDIA/cudnn-frontend/archive/refs/tags/v$FE_VERSION.tar.gz"
    if command -v curl >/dev/null; then
      curl -fsSL "$url" -o "$tmp/fe.tar.gz"
    else
      python3 -c "import sys,urllib.request;urllib.request.urlretrieve(sys.argv[1],sys.argv[2])" "$url" "$tmp/fe.tar.gz"
    fi
    tar xzf "$tmp/fe.tar.gz" -C "$tmp"
    src=$tmp/cudnn-frontend-$FE_VERSION/include
  fi
  [ -f "$src/cudnn_frontend.h" ] || { echo "install-deps: no cudnn_frontend.h in $src" >&2; return 1; }
  local as=""
  case "$dir" in /usr/*|/opt/*) as=$SUDO ;; esac
  $as rm -rf "$dir"
  $as mkdir -p "$dir"
  $as cp -r "$src/." "$dir/"
  echo "install-deps: cudnn-frontend $FE_VERSION installed in $dir"
}
# Optional: without it the build uses our own attention kernels (no network: a warning, not a failure).
install_cudnn_frontend ||
  echo "install-deps: warning: cudnn-frontend not installed; the DiT attention will use our own kernels" >&2

# --- Python side: the precompute job's environment -----------------------------------------
# A venv made with Debian's /usr/bin/python3 (3.11 on Debian 12) and --system-site-packages, so it
# sees python3-gi and python3-tqdm, with the pinned Ray (Ray Data), safetensors and pytest from
# PyPI (about 1 minute and 600 MB: Ray, pyarrow, pandas, numpy). $LATENT_VENV picks the folder
# (default ~/.cache/gst-latent/venv); scripts/latent-precompute and the Python tests use it.
LATENT_PY_PINS=("ray[data]==2.60.0" "safetensors==0.8.0" "pytest==9.2.0")
install_python_env() {
  local venv="${LATENT_VENV:-$HOME/.cache/gst-latent/venv}"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" - "${LATENT_PY_PINS[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    if version(name.split("[")[0]) != want:
        sys.exit(1)
import gi, tqdm  # Debian's, through --system-site-packages
PY
    echo "install-deps: Python environment present in $venv"
    return 0
  fi
  echo "install-deps: making the Python environment in $venv (${LATENT_PY_PINS[*]})"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${LATENT_PY_PINS[@]}"
}
install_python_env
