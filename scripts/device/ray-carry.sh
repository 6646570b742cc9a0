#!/usr/bin/env bash
# Packs Ray for the lent GPU machine (Python 3.12 there, no network): .carry/ray-a.tar.xz, ~27 MB.
# Ray 2.60 (the pin of scripts/install-deps.sh) and what it needs that the machine's own Python
# lacks, as cp312 wheels, unpacked, with what the job never loads removed (Java jars, RLlib,
# Serve, the LLM libraries, the dashboard's web client) and the binaries stripped. pyarrow,
# pandas and numpy are the machine's own (seen 2026-11-27: pyarrow 25.0.1, pandas 3.0.6).
# It does not fit one 64 MiB call beside the build carry: send it alone first, unpacked to
# /tmp/ray-site, then the run (gpu-checks.sh's precompute step adds /tmp/ray-site to PYTHONPATH)
# while the machine is still warm:
#   call 1 (carry .carry/ray-a.tar.xz): mkdir -p /tmp/u && tar xJf .carry/ray-a.tar.xz -C /tmp/u && mv /tmp/u/site /tmp/ray-site
#   call 2 (the usual carry): STEPS="pygi precompute" PRE_ENGINES=ray,local ... bash scripts/device/gpu-checks.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$W/whl" \
  ray==2.60.0 msgpack==1.2.4 click==8.5.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 protobuf==7.36.2 fsspec==2026.9.0 tzdata==2026.6 \
  python-dateutil==4.0.0 six==1.16.0 tqdm==4.64.1 filelock==4.3.1 PyYAML==6.0.3
mkdir -p "$W/site"
for w in "$W"/whl/*.whl; do unzip -q -o "$w" -d "$W/site"; done  # unzip keeps the executables' mode
rm -rf "$W"/site/ray/{jars,rllib,serve,llm} "$W/site/ray/dashboard/client/build"
find "$W/site" -name __pycache__ -prune -exec rm -rf {} +
find "$W/site" -type f \( -name '*.so*' -o -path '*/core/src/ray/*' \) -exec sh -c \
  'file "$1" | grep -q "ELF.*not stripped" && strip --strip-unneeded "$1" || true' _ {} \;
mkdir -p .carry
tar cf - -C "$W" site | xz -T2 -6 > .carry/ray-a.tar.xz
ls -la .carry/ray-a.tar.xz
