#!/usr/bin/env bash
# One command: install what is missing, build everything and run the whole test suite.
#  1. the main build (CUDA backend too when a CUDA toolkit with cuDNN is found) + ctest
#     (GPU tests skip without a GPU);
#  2. an AddressSanitizer + UndefinedBehaviorSanitizer build (CPU) + ctest -LE slow;
#  3. the meson build in meson_compat/ (same plugin), checked with gst-inspect;
#  4. libFuzzer targets for the safetensors and config parsers, run briefly.
# LATENT_TEST_QUICK=1 skips 2-4.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
J=$(nproc)
log() { printf '\n=== %s ===\n' "$*"; }

log "main build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$J"
ctest --test-dir build --output-on-failure -j"$J" 2>&1 | tee build/ctest.log

if [ "${LATENT_TEST_QUICK:-0}" = 1 ]; then exit 0; fi

log "sanitizer build (address,undefined)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLATENT_CUDA=OFF \
  -DLATENT_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS=-O1
cmake --build build-asan -j"$J"
# GStreamer's plugin scanner is not built with ASan: scan in-process, no leak check of glib's
# intentional one-off allocations.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  GST_REGISTRY_FORK=no ctest --test-dir build-asan --output-on-failure -LE "slow|pipeline" -j"$J" \
  2>&1 | tee build-asan/ctest.log

log "meson build (meson_compat/)"
meson setup build-meson meson_compat --reconfigure >/dev/null 2>&1 || meson setup build-meson meson_compat
meson compile -C build-meson
GST_PLUGIN_PATH_1_0="$PWD/build-meson" GST_REGISTRY_1_0="$PWD/build-meson/registry.bin" \
  gst-inspect-1.0 latent | tee build-meson/inspect.txt | head -20
grep -q vaeencode build-meson/inspect.txt && grep -q vaedecode build-meson/inspect.txt

log "fuzzers"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLATENT_CUDA=OFF -DLATENT_BUILD_FUZZERS=ON -DLATENT_BUILD_TESTS=OFF -DLATENT_BUILD_PLUGIN=OFF \
  -DLATENT_SANITIZE=address,undefined
cmake --build build-fuzz -j"$J" --target fuzz_safetensors fuzz_config
for f in safetensors config; do
  mkdir -p build-fuzz/corpus-$f
  # libFuzzer reports every new input; keep its log, show the end.
  if ! build-fuzz/tests/fuzz/fuzz_$f -max_total_time="${LATENT_FUZZ_SECONDS:-60}" \
      build-fuzz/corpus-$f tests/fuzz/corpus/$f > build-fuzz/fuzz_$f.log 2>&1; then
    tail -60 build-fuzz/fuzz_$f.log
    echo "fuzz_$f found a problem (log: build-fuzz/fuzz_$f.log)"
    exit 1
  fi
  tail -2 build-fuzz/fuzz_$f.log
done

# One closing line over both test runs (ctest prints "N% tests passed, F tests failed out of T").
summary() { sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1 \2/p' "$1"; }
read -r f1 t1 < <(summary build/ctest.log)
read -r f2 t2 < <(summary build-asan/ctest.log)
skipped=$(cat build/ctest.log build-asan/ctest.log | grep -c "\*\*\*Skipped" || true)
log "all tests passed"
echo "tests: $((t1 + t2 - f1 - f2 - skipped)) passed, $((f1 + f2)) failed, $skipped skipped"
