// Attention kernel benchmark: every variant LATENT_ATTENTION_KERNEL can force (attention_flash.cuh)
// at the Qwen-Image MMDiT shapes (24 heads of 128, [128 text | image] keys with a quarter of the
// text masked, batch 1 and the CFG batch of 2) and at the VAE mid-block shapes (one head,
// d = 512 / 256 / 128, T up to 32,640), bf16 and fp16. Per row: median milliseconds of
// --reps timed calls (CUDA events around each call, after --warmup untimed ones) and TFLOP/s
// counted as 4 B H Tq Tk d per call (masked keys counted: the work a dense kernel does).
// Prints one JSON object per row as it goes, then a table.
//
//   bench_attention [--variants mma16,mma32,...] [--reps 20] [--warmup 3] [--only dit|vae]
//
// Not a ctest test (no GPU time on CI); built as its own target.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backends/cuda/attention.cuh"
#include "engine/backends/cuda/dit_kernels.cuh"

namespace {

using latent::DType;
using latent::Status;

#define BENCH_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

struct Shape {
  std::string name;
  bool dit;  // launch_dit_attention (mask) or launch_spatial_attention
  int64_t b, t, heads, d;
  int64_t masked;  // text keys masked per batch row (dit): keys [128 - masked, 128)
};

struct Row {
  std::string variant, dtype, shape;
  int64_t b, heads, t, d;
  double ms, tflops;
};

// Host buffer of `n` uniform [-1, 1) values in the dtype's 16-bit encoding.
std::vector<uint16_t> random16(size_t n, DType dtype, uint64_t seed) {
  std::vector<uint16_t> h(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float f = static_cast<float>((s >> 40) & 0xFFFFFF) / 8388608.f - 1.f;
    if (dtype == DType::kBF16) {
      const __nv_bfloat16 v = __float2bfloat16(f);
      std::memcpy(&h[i], &v, 2);
    } else {
      const __half v = __float2half(f);
      std::memcpy(&h[i], &v, 2);
    }
  }
  return h;
}

void* upload16(const std::vector<uint16_t>& h) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, h.size() * 2));
  BENCH_CUDA(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return p;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> variants = {"mma16", "mma32", "wgmma"};
  int reps = 20, warmup = 3;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--variants" && i + 1 < argc)
      variants = split(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--warmup" && i + 1 < argc)
      warmup = std::max(0, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--variants mma16,mma32,wgmma,simple] [--reps N] [--warmup N] "
                   "[--only dit|vae]\n",
                   argv[0]);
      return 2;
    }
  }

  int dev = 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_attention: no CUDA device\n");
    return 77;
  }
  BENCH_CUDA(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreate(&stream));
  latent::cuda::Launch launch;
  launch.stream = stream;
  launch.sm_count = prop.multiProcessorCount;
  launch.smem_optin = prop.sharedMemPerBlockOptin;
  std::printf("# %s, %d SMs, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);

  const int64_t text = 128;
  std::vector<Shape> shapes = {
      {"dit_t2i_b1", true, 1, text + 4096, 24, 128, 32},
      {"dit_t2i_b2", true, 2, text + 4096, 24, 128, 32},
      {"dit_edit_b1", true, 1, text + 8192, 24, 128, 32},
      {"dit_edit_b2", true, 2, text + 8192, 24, 128, 32},
      {"vae_1080p_d512", false, 1, 136 * 240, 1, 512, 0},
      {"vae_1080p_d256", false, 1, 136 * 240, 1, 256, 0},
      {"vae_1080p_d128", false, 1, 136 * 240, 1, 128, 0},
      {"vae_540p_d512", false, 1, 68 * 120, 1, 512, 0},
  };

  std::vector<Row> rows;
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const char* dname = dtype == DType::kBF16 ? "bf16" : "fp16";
    for (const Shape& s : shapes) {
      if (only == "dit" && !s.dit) continue;
      if (only == "vae" && s.dit) continue;
      const size_t elems = static_cast<size_t>(s.b * s.t * s.heads * s.d);
      void* q = upload16(random16(elems, dtype, 1));
      void* k = upload16(random16(elems, dtype, 2));
      void* v = upload16(random16(elems, dtype, 3));
      void* out = nullptr;
      BENCH_CUDA(cudaMalloc(&out, elems * 2));
      void* mask = nullptr;
      if (s.dit) {
        const uint16_t one = dtype == DType::kBF16 ? 0x3F80 : 0x3C00;
        std::vector<uint16_t> m(static_cast<size_t>(s.b * s.t), one);
        for (int64_t bi = 0; bi < s.b; ++bi)
          for (int64_t j = text - s.masked; j < text; ++j) m[static_cast<size_t>(bi * s.t + j)] = 0;
        mask = upload16(m);
      }
      auto call = [&]() -> Status {
        if (s.dit)
          return latent::cuda::launch_dit_attention(q, k, v, mask, out, s.b, s.t, s.t,
                                                    static_cast<int>(s.heads), s.d, dtype, launch);
        return latent::cuda::launch_spatial_attention(
            q, k, v, out, s.b, s.t, s.heads * s.d, static_cast<int>(s.heads), dtype, true, launch);
      };
      for (const std::string& variant : variants) {
        setenv("LATENT_ATTENTION_KERNEL", variant.c_str(), 1);
        bool ok = true;
        for (int i = 0; i < warmup && ok; ++i) {
          const Status st = call();
          if (!st.ok()) {
            std::fprintf(stderr, "%s %s %s: %s\n", variant.c_str(), dname, s.name.c_str(),
                         st.message().c_str());
            ok = false;
          }
        }
        if (!ok) continue;
        BENCH_CUDA(cudaStreamSynchronize(stream));
        std::vector<float> times;
        for (int i = 0; i < reps; ++i) {
          BENCH_CUDA(cudaEventRecord(e0, stream));
          const Status st = call();
          BENCH_CUDA(cudaEventRecord(e1, stream));
          BENCH_CUDA(cudaEventSynchronize(e1));
          if (!st.ok()) {
            std::fprintf(stderr, "%s: %s\n", variant.c_str(), st.message().c_str());
            std::exit(1);
          }
          float ms = 0.f;
          BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
          times.push_back(ms);
        }
        BENCH_CUDA(cudaGetLastError());
        std::sort(times.begin(), times.end());
        const double ms = times[times.size() / 2];
        const double flop = 4.0 * s.b * s.heads * static_cast<double>(s.t) * s.t * s.d;
        Row r{variant, dname, s.name, s.b, s.heads, s.t, s.d, ms, flop / (ms * 1e-3) / 1e12};
        std::printf(
            "{\"kernel\":\"%s\",\"dtype\":\"%s\",\"shape\":\"%s\",\"b\":%lld,\"heads\":%lld,"
            "\"tq\":%lld,\"tk\":%lld,\"d\":%lld,\"masked_keys\":%lld,\"ms\":%.4f,\"min_ms\":%.4f,"
            "\"tflops\":%.1f}\n",
            r.variant.c_str(), r.dtype.c_str(), r.shape.c_str(), static_cast<long long>(s.b),
            static_cast<long long>(s.heads), static_cast<long long>(s.t),
            static_cast<long long>(s.t), static_cast<long long>(s.d),
            static_cast<long long>(s.masked), r.ms, static_cast<double>(times.front()), r.tflops);
        std::fflush(stdout);
        rows.push_back(r);
      }
      unsetenv("LATENT_ATTENTION_KERNEL");
      BENCH_CUDA(cudaFree(q));
      BENCH_CUDA(cudaFree(k));
      BENCH_CUDA(cudaFree(v));
      BENCH_CUDA(cudaFree(out));
      if (mask) BENCH_CUDA(cudaFree(mask));
    }
  }

  std::printf("\n%-8s %-5s %-16s %2s %3s %6s %4s %10s %8s\n", "kernel", "dtype", "shape", "B", "H",
              "T", "d", "median ms", "TFLOP/s");
  for (const Row& r : rows)
    std::printf("%-8s %-5s %-16s %2lld %3lld %6lld %4lld %10.3f %8.1f\n", r.variant.c_str(),
                r.dtype.c_str(), r.shape.c_str(), static_cast<long long>(r.b),
                static_cast<long long>(r.heads), static_cast<long long>(r.t),
                static_cast<long long>(r.d), r.ms, r.tflops);
  return 0;
}
