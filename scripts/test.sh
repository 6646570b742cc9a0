#!/usr/bin/env bash
# One command: install what is missing, build everything and run the whole test suite.
#  1. the main build (CUDA backend too when a CUDA toolkit with cuDNN is found) + ctest
#     (GPU tests skip without a GPU);
#  2. an AddressSanitizer + UndefinedBehaviorSanitizer build (CPU) + ctest -LE slow;
#  3. the meson build in meson_compat/ (same plugin), checked with gst-inspect;
#  4. libFuzzer targets for the safetensors and config parsers, run briefly.
# LATENT_TEST_QUICK=1 skips 2-4. LATENT_CUDA=OFF forces a CPU main build (scripts/configure.sh).
# Runs before or after scripts/setup.sh (it turns the tests on in the build folder setup made).
# LATENT_CTEST_ARGS: extra ctest arguments for the main ctest (e.g. "-L unit" or "-R frames").
# The last line says what ran: "tests: N passed, N failed, N skipped (...)".
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "test.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR
. scripts/configure.sh
bash scripts/install-deps.sh --test
J=$(nproc)
log() { printf '\n=== %s ===\n' "$*"; }
# cmake --build DIR [ARGS...] on every core. A failure is built again once on one core without
# ccache, after printing the disk and memory left: a compiler killed for memory, or ccache on a
# full disk, can fail with nothing printed of its own. A real compile error fails again.
cmake_build() {
  cmake --build "$@" -j"$J" && return 0
  echo "test.sh: the build in $1 failed; disk and memory left:" >&2
  df -h . "${TMPDIR:-/tmp}" >&2 || true
  free -m >&2 || true
  echo "test.sh: building $1 again on one core without ccache" >&2
  CCACHE_DISABLE=1 cmake --build "$@" -j1
}

# "N passed N failed N skipped" of a ctest log (ctest prints "N% tests passed, F tests failed out
# of T" and "***Skipped" for each skipped test); nothing when no test ran.
counts() {
  local f t s
  read -r f t < <(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1 \2/p' "$1")
  [ -n "${t:-}" ] || return 0
  s=$(grep -c '\*\*\*Skipped' "$1" || true)
  echo "$((t - f - s)) $f $s"
}
# ctest in $1 with the rest of the arguments, logged to $1/ctest.log; fails when a test failed
# or when no test was found (a build folder configured without tests).
run_ctest() {
  local dir=$1 rc=0
  shift
  ctest --test-dir "$dir" --output-on-failure -j"$J" "$@" 2>&1 | tee "$dir/ctest.log"
  rc=${PIPESTATUS[0]}
  if grep -q "No tests were found" "$dir/ctest.log" || [ -z "$(counts "$dir/ctest.log")" ]; then
    echo "test.sh: no tests ran in $dir (was it configured with -DLATENT_BUILD_TESTS=OFF?)" >&2
    return 1
  fi
  return $rc
}
ran=()
passed=0 failed=0 skipped=0
add_counts() {
  local p=0 f=0 s=0
  read -r p f s < <(counts "$2") || true
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  ran+=("$1")
}
summary() {
  local IFS=", "
  echo "tests: $passed passed, $failed failed, $skipped skipped (${ran[*]})"
}

log "main build"
latent_configure_main ON
cmake_build build
main_rc=0
# shellcheck disable=SC2086  # LATENT_CTEST_ARGS is a list of arguments
run_ctest build ${LATENT_CTEST_ARGS:-} || main_rc=$?
add_counts "main ctest" build/ctest.log
if [ "$main_rc" -ne 0 ]; then
  summary
  exit "$main_rc"
fi

if [ "${LATENT_TEST_QUICK:-0}" = 1 ]; then
  log "LATENT_TEST_QUICK=1: sanitizer build, meson build and fuzzers skipped"
  summary
  exit 0
fi

log "sanitizer build (address,undefined)"
mapfile -t common < <(latent_cmake_common_args)
# -g1: line tables and functions, all a sanitizer report prints; full -g made this folder 3.4 GB
# (every test binary links the static engine), enough to fill a small CI disk.
cmake -S . -B build-asan "${common[@]}" -DCMAKE_BUILD_TYPE=Debug -DLATENT_CUDA=OFF \
  -DLATENT_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS=-O1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
  -DCMAKE_C_FLAGS_DEBUG=-g1
cmake_build build-asan
# GStreamer's plugin scanner is not built with ASan: scan in-process, no leak check of glib's
# intentional one-off allocations.
asan_rc=0
ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  GST_REGISTRY_FORK=no run_ctest build-asan -LE "slow|pipeline" || asan_rc=$?
add_counts "sanitizer ctest" build-asan/ctest.log
if [ "$asan_rc" -ne 0 ]; then
  summary
  exit "$asan_rc"
fi

log "meson build (meson_compat/)"
meson setup build-meson meson_compat --reconfigure >/dev/null 2>&1 || meson setup build-meson meson_compat
meson compile -C build-meson
GST_PLUGIN_PATH_1_0="$PWD/build-meson" GST_REGISTRY_1_0="$PWD/build-meson/registry.bin" \
  gst-inspect-1.0 latent | tee build-meson/inspect.txt | head -20
grep -q vaeencode build-meson/inspect.txt && grep -q vaedecode build-meson/inspect.txt
ran+=("meson build")

log "fuzzers"
CC=clang CXX=clang++ cmake -S . -B build-fuzz "${common[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLATENT_CUDA=OFF -DLATENT_BUILD_FUZZERS=ON -DLATENT_BUILD_TESTS=OFF -DLATENT_BUILD_PLUGIN=OFF \
  -DLATENT_SANITIZE=address,undefined
cmake_build build-fuzz --target fuzz_safetensors fuzz_config fuzz_latent_file
for f in safetensors config latent_file; do
  mkdir -p build-fuzz/corpus-$f
  # libFuzzer reports every new input; keep its log, show the end.
  if ! build-fuzz/tests/fuzz/fuzz_$f -max_total_time="${LATENT_FUZZ_SECONDS:-60}" \
      build-fuzz/corpus-$f tests/fuzz/corpus/$f > build-fuzz/fuzz_$f.log 2>&1; then
    tail -60 build-fuzz/fuzz_$f.log
    echo "fuzz_$f found a problem (log: build-fuzz/fuzz_$f.log)"
    summary
    exit 1
  fi
  tail -2 build-fuzz/fuzz_$f.log
done

ran+=("fuzzers")
log "all tests passed"
summary
