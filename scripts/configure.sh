#!/usr/bin/env bash
# Sourced by scripts/setup.sh and scripts/test.sh: one way to configure the main build dir, so
# either command may run first and reuse what the other built.
#
#   LATENT_CUDA=AUTO|ON|OFF   the CUDA backend (default AUTO: built when a CUDA toolkit with
#                             cuDNN is found; OFF: a CPU build even on a machine with CUDA)
# ccache is used when it is installed.
LATENT_BUILD_DIR=build  # pipelines/ and the README expect build/

latent_cmake_common_args() {
  local args=(-G Ninja)
  if command -v ccache >/dev/null 2>&1; then
    args+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
           -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  printf '%s\n' "${args[@]}"
}

# latent_configure_main TESTS: configures $LATENT_BUILD_DIR (Release). TESTS=ON builds the
# tests; TESTS=keep leaves an existing build folder's choice as it is (a fresh one gets OFF).
latent_configure_main() {
  local tests=$1 args
  mapfile -t args < <(latent_cmake_common_args)
  args+=(-DCMAKE_BUILD_TYPE=Release "-DLATENT_CUDA=${LATENT_CUDA:-AUTO}")
  if [ "$tests" = keep ]; then
    [ -f "$LATENT_BUILD_DIR/CMakeCache.txt" ] || args+=(-DLATENT_BUILD_TESTS=OFF)
  else
    args+=("-DLATENT_BUILD_TESTS=$tests")
  fi
  cmake -S . -B "$LATENT_BUILD_DIR" "${args[@]}"
}
