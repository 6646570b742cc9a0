// The video VAEs' channel RMS norm (rms_norm.cu) at the Wan 2.1 VAE's 720p shapes, per variant of
// its lanes-a-pixel split (launch_rms_norm_channels' max_packs: 6, 3, or 1, which takes the
// warp-a-pixel kernel at these sizes), against a device-to-device copy
// of the same bytes (what the memory system gives a pass that reads and writes them once).
// Per row: microseconds a call (CUDA events over --reps back-to-back calls after --warmup) and
// the bytes moved (read x + write y) per second. bf16, gamma, SiLU as the Wan residual blocks (and
// once without it, to see what the activation costs).
//
//   bench_norm [--reps 50] [--warmup 5]
//
// Not a ctest test (no GPU time on CI); built as its own target.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "engine/backends/cuda/rms_norm.cuh"

namespace {

using namespace latent;

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "bench_norm: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

struct NormShape {
  const char* name;
  int64_t pixels, channels;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 50, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--reps" || a == "--warmup") && i + 1 < argc) {
      (a == "--reps" ? reps : warmup) = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "bench_norm: unknown flag %s (--reps N, --warmup N)\n", a.c_str());
      return 2;
    }
  }
  if (reps < 1 || warmup < 0) {
    std::fprintf(stderr, "bench_norm: --reps >= 1, --warmup >= 0\n");
    return 2;
  }
  int sms = 0;
  if (!ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device")) return 77;
  const NormShape shapes[] = {{"wan 96ch 720p", 720 * 1280, 96},
                              {"wan 192ch 360p", 360 * 640, 192},
                              {"wan 384ch 180p x2", 2 * 180 * 320, 384},
                              {"wan 384ch 90p", 90 * 160, 384}};
  size_t most = 0;
  for (const NormShape& s : shapes)
    most = std::max(most, static_cast<size_t>(s.pixels * s.channels * 2));
  void *x = nullptr, *y = nullptr, *gamma = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  if (!ok(cudaMalloc(&x, most), "cudaMalloc") || !ok(cudaMalloc(&y, most), "cudaMalloc") ||
      !ok(cudaMalloc(&gamma, 4096), "cudaMalloc") || !ok(cudaStreamCreate(&stream), "stream") ||
      !ok(cudaEventCreate(&t0), "event") || !ok(cudaEventCreate(&t1), "event"))
    return 1;
  // Finite values: every bf16 element of x and gamma is 0x3c3c (0.0115).
  if (!ok(cudaMemset(x, 0x3c, most), "memset") || !ok(cudaMemset(gamma, 0x3c, 4096), "memset"))
    return 1;
  cuda::Launch l;
  l.stream = stream;
  l.sm_count = sms;
  std::printf("%-20s %-8s %10s %8s\n", "shape", "variant", "us a call", "TB/s");
  for (const NormShape& s : shapes) {
    const double bytes = 2.0 * s.pixels * s.channels * 2;  // read + write, bf16
    // (max packs a lane, SiLU after): packs 0 is a device-to-device copy.
    const std::pair<int, bool> variants[] = {
        {0, false}, {6, true}, {3, true}, {3, false}, {1, true}};
    for (auto [packs, silu] : variants) {
      auto call = [&]() -> bool {
        if (packs == 0)
          return ok(cudaMemcpyAsync(y, x, static_cast<size_t>(bytes / 2), cudaMemcpyDeviceToDevice,
                                    stream),
                    "copy");
        const Status st = cuda::launch_rms_norm_channels(
            x, y, s.pixels, s.channels, gamma, nullptr,
            silu ? Activation::kSiLU : Activation::kNone, DType::kBF16, l, packs);
        if (!st.ok()) std::fprintf(stderr, "bench_norm: %s\n", st.message().c_str());
        return st.ok();
      };
      bool good = true;
      for (int i = 0; i < warmup && good; ++i) good = call();
      good = good && ok(cudaEventRecord(t0, stream), "event");
      for (int i = 0; i < reps && good; ++i) good = call();
      good = good && ok(cudaEventRecord(t1, stream), "event") &&
             ok(cudaEventSynchronize(t1), "synchronize");
      float ms = 0.f;
      if (!good || !ok(cudaEventElapsedTime(&ms, t0, t1), "elapsed")) return 1;
      const double us = 1e3 * ms / reps;
      const std::string variant =
          packs == 0 ? "copy" : "p" + std::to_string(packs) + (silu ? " silu" : " none");
      std::printf("%-20s %-8s %10.1f %8.2f\n", s.name, variant.c_str(), us,
                  bytes / (us * 1e-6) / 1e12);
      std::printf("{\"shape\": \"%s\", \"variant\": \"%s\", \"us\": %.2f, \"tb_per_s\": %.3f}\n",
                  s.name, variant.c_str(), us, bytes / (us * 1e-6) / 1e12);
    }
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  cudaStreamDestroy(stream);
  cudaFree(x);
  cudaFree(y);
  cudaFree(gamma);
  return 0;
}
