// Convolution benchmark: the Hopper implicit-GEMM kernel (conv_wgmma.cu, fused epilogue; forced
// with LATENT_CUDA_CONV=wgmma, LATENT_CONV_WGMMA_TILE picks its tile) against cuDNN plus its
// separate epilogue pass (LATENT_CUDA_CONV=cudnn) and cuDNN with the epilogue fused into an
// operation graph (LATENT_CUDA_CONV=cudnn LATENT_CUDNN_FUSION=on: "fused"; =precompiled, cuDNN's
// precompiled engines only: "fusedpc"; the first calls are not timed), through the CUDA
// backend's conv2d / conv3d_frames at the shapes of the video and image VAEs (bf16, bias, and
// the residual + SiLU or ReLU where the VAEs have them). Per row: median milliseconds of --reps
// calls (each call synchronised, after --warmup untimed ones), TFLOP/s counted as 2 M N K, and the
// fraction of the FLOP floor at --peak TFLOP/s (default 800: cuBLAS bf16 GEMM as measured on the
// H100). Prints one JSON object per row as it goes, then a table. Shapes "... norm" time a
// convolution followed by the Wan VAEs' channel RMS norm + SiLU (a residual block's conv1 ->
// norm2): "wgmma" with the norm in the kernel's epilogue (conv3d_frames_normed), "wgmma2" the
// same kernel then the norm's own pass, the cuDNN rows then the norm's pass.
//
//   bench_conv [--reps 10] [--warmup 3] [--peak 800] [--only NAME-SUBSTRING]
//
// Not a ctest test (no GPU time on CI); built as its own target.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/registry.h"
#include "tests/util/test_util.h"

namespace {

using namespace latent;

struct Case {
  std::string name;
  int64_t frames;  // output frames (or images)
  int kt;          // temporal taps: 3 = conv3d_frames with 2 cached frames, 1 = conv2d
  int64_t cin, cout, h, w;
  int k;    // spatial kernel (3 or 1)
  int epi;  // after the bias: 0 nothing, 1 residual + SiLU, 2 ReLU, 3 residual + ReLU; 4: no bias;
            // 5: the channel RMS norm + SiLU (3x3x3 only)
  int stride = 1;  // 2: diffusers' downsampling, zero padding (0, 1, 0, 1)
};

struct Row {
  std::string name, variant;
  double ms, tflops, of_floor;
};

std::shared_ptr<Backend> backend(const char* conv, const char* fusion = "off") {
  setenv("LATENT_CUDA_CONV", conv, 1);
  setenv("LATENT_CUDNN_FUSION", fusion, 1);
  Result<std::shared_ptr<Backend>> r = create_cuda_backend(0, DType::kBF16);
  unsetenv("LATENT_CUDA_CONV");
  unsetenv("LATENT_CUDNN_FUSION");
  if (!r.ok()) {
    std::fprintf(stderr, "bench_conv: %s\n", r.status().message().c_str());
    std::exit(1);
  }
  return r.value();
}

Tensor up(Backend& b, const Tensor& t) {
  Result<Tensor> r = b.upload(t);
  if (!r.ok()) {
    std::fprintf(stderr, "bench_conv: upload: %s\n", r.status().message().c_str());
    std::exit(1);
  }
  return r.value();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10, warmup = 3;
  double peak = 800.0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_conv: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--reps") {
      reps = std::atoi(next().c_str());
    } else if (a == "--warmup") {
      warmup = std::atoi(next().c_str());
    } else if (a == "--peak") {
      peak = std::atof(next().c_str());
    } else if (a == "--only") {
      only = next();
    } else {
      std::fprintf(stderr, "bench_conv: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (reps < 1 || warmup < 0 || !(peak > 0)) {
    std::fprintf(stderr, "bench_conv: --reps >= 1, --warmup >= 0, --peak > 0\n");
    return 2;
  }
  const std::vector<Case> cases = {
      // Wan 2.1 VAE at 1280x720 (frame-by-frame levels, then 2- and 1-frame chunks)
      {"wan 3x3x3 96->96 720p", 1, 3, 96, 96, 720, 1280, 3, true},
      {"wan 3x3x3 96->96 720p norm", 1, 3, 96, 96, 720, 1280, 3, 5},
      // the encoder's first convolution (RGB, padded to 8 channels for the wgmma kernel)
      {"wan 3x3x3 3->96 720p", 1, 3, 3, 96, 720, 1280, 3, 0},
      {"wan 3x3x3 192->192 360p", 1, 3, 192, 192, 360, 640, 3, true},
      {"wan 3x3x3 192->192 360p norm", 1, 3, 192, 192, 360, 640, 3, 5},
      {"wan 3x3x3 192->192 360p x2", 2, 3, 192, 192, 360, 640, 3, true},
      {"wan 3x3x3 384->384 180p x2", 2, 3, 384, 384, 180, 320, 3, true},
      {"wan 3x3 96->96 720p", 1, 1, 96, 96, 720, 1280, 3, true},
      {"wan 3x3 96->192 360p", 1, 1, 96, 192, 360, 640, 3, false},
      {"wan 3x3 192->192 360p", 1, 1, 192, 192, 360, 640, 3, true},
      {"wan 3x3x3 384->384 180p", 1, 3, 384, 384, 180, 320, 3, true},
      {"wan 3x3x3 384->384 90p", 1, 3, 384, 384, 90, 160, 3, true},
      {"wan 1x1 96->192 360p x2", 2, 1, 96, 192, 360, 640, 1, false},
      {"wan 3x3 s2 96->96 720p", 1, 1, 96, 96, 720, 1280, 3, false, 2},
      {"wan 3x3 s2 192->192 360p", 1, 1, 192, 192, 360, 640, 3, false, 2},
      {"wan 3x3 s2 384->384 180p", 1, 1, 384, 384, 180, 320, 3, false, 2},
      {"taesd 3x3 s2 64->64 1080p", 1, 1, 64, 64, 1080, 1920, 3, false, 2},
      {"qwen 3x3 s2 128->128 1024^2", 1, 1, 128, 128, 1024, 1024, 3, false, 2},
      // image VAEs: Qwen-Image at 1024^2, TAESD-size at 1080p
      {"qwen 3x3 128->128 1024^2", 1, 1, 128, 128, 1024, 1024, 3, true},
      {"qwen 3x3 512->512 128^2", 1, 1, 512, 512, 128, 128, 3, true},
      {"taesd 3x3 64->64 1080p", 1, 1, 64, 64, 1080, 1920, 3, true},
      // TAESD-size / default model blocks (ReLU) at 1080p, TAEW2.1 decoder stages at 720p
      {"taesd 3x3 64->64 1080p relu", 1, 1, 64, 64, 1080, 1920, 3, 2},
      {"taesd 3x3 64->64 1080p res relu", 1, 1, 64, 64, 1080, 1920, 3, 3},
      {"taesd 3x3 64->64 540p relu", 1, 1, 64, 64, 540, 960, 3, 2},
      {"taew 3x3 128->64 360p relu", 1, 1, 128, 64, 360, 640, 3, 2},
      {"taew 3x3 64->64 360p res relu", 1, 1, 64, 64, 360, 640, 3, 3},
      {"taew 3x3 64->64 720p", 1, 1, 64, 64, 720, 1280, 3, 0},
      {"taesd 3x3 64->64 1080p no bias", 1, 1, 64, 64, 1080, 1920, 3, 4},
      {"taew 3x3 256->128 180p relu", 1, 1, 256, 128, 180, 320, 3, 2},
      {"taew 3x3 512->256 90p relu", 1, 1, 512, 256, 90, 160, 3, 2},
  };
  std::shared_ptr<Backend> wgmma = backend("wgmma"), cudnn = backend("cudnn"),
                           fused = backend("cudnn", "on"),
                           fusedpc = backend("cudnn", "precompiled");
  std::vector<Row> rows;
  for (const Case& c : cases) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    const int64_t in_frames = c.kt == 3 ? c.frames + 2 : c.frames;
    const float ws = 1.f / std::sqrt(static_cast<float>(c.cin * c.k * c.k * c.kt));
    Tensor x = test::random_tensor({in_frames, c.cin, c.h, c.w}, 1);
    Tensor w = test::random_tensor({c.cout, c.cin, c.kt * c.k, c.k}, 2, -ws, ws);
    Tensor b = test::random_tensor({c.cout}, 3);
    const int64_t ho = c.h / c.stride, wo = c.w / c.stride;
    const bool residual = c.epi == 1 || c.epi == 3;
    Tensor r = residual ? test::random_tensor({c.frames, c.cout, ho, wo}, 4) : Tensor();
    const bool norm = c.epi == 5;
    Tensor g = test::random_tensor({c.cout}, 5, 0.5f, 1.5f);
    const double flop = 2.0 * c.frames * ho * wo * c.cout * c.cin * c.k * c.k * c.kt;
    std::vector<std::pair<std::string, std::shared_ptr<Backend>>> variants = {
        {"wgmma", wgmma}, {"cudnn", cudnn}, {"fused", fused}, {"fusedpc", fusedpc}};
    if (norm) variants.insert(variants.begin() + 1, {"wgmma2", wgmma});
    for (auto& [variant, be] : variants) {
      Tensor gx = up(*be, x), gw = up(*be, w), gb = c.epi == 4 ? Tensor() : up(*be, b),
             gr = r.defined() ? up(*be, r) : r, gg = up(*be, g);
      Conv2dParams p = Conv2dParams::same(c.k);
      if (c.stride == 2) {
        p.stride = 2;
        p.pad_top = p.pad_left = 0;
        p.pad_bottom = p.pad_right = 1;
      }
      const Activation act = c.epi == 1                 ? Activation::kSiLU
                             : c.epi == 2 || c.epi == 3 ? Activation::kReLU
                                                        : Activation::kNone;
      auto call = [&]() -> Status {
        if (norm && variant == "wgmma") {
          Result<Tensor> y = be->conv3d_frames_normed(gx, gw, 3, gb, p, gg, Activation::kSiLU);
          if (!y.ok()) return y.status();
          if (!y.value().defined()) return Status::error("conv3d_frames_normed declined");
          return be->synchronize();
        }
        Result<Tensor> y = c.kt == 3 ? be->conv3d_frames(gx, gw, 3, gb, p, gr, act)
                                     : be->conv2d(gx, gw, gb, p, gr, act);
        if (!y.ok()) return y.status();
        if (norm) {
          y = be->rms_norm_channels(y.value(), gg, Tensor(), Activation::kSiLU);
          if (!y.ok()) return y.status();
        }
        return be->synchronize();
      };
      std::vector<double> ms;
      bool failed = false;
      for (int i = 0; i < warmup + reps && !failed; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const Status st = call();
        const auto t1 = std::chrono::steady_clock::now();
        if (!st.ok()) {
          std::fprintf(stderr, "bench_conv: %s [%s]: %s\n", c.name.c_str(), variant.c_str(),
                       st.message().c_str());
          failed = true;
        } else if (i >= warmup) {
          ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
      }
      if (failed) continue;
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2], tf = flop / (med * 1e-3) / 1e12;
      rows.push_back({c.name, variant, med, tf, tf / peak});
      std::printf(
          "{\"shape\": \"%s\", \"variant\": \"%s\", \"frames\": %lld, \"cin\": %lld, \"cout\": "
          "%lld, \"h\": %lld, \"w\": %lld, \"taps\": %d, \"k\": %d, \"ms\": %.4f, \"tflops\": "
          "%.1f, \"of_floor\": %.3f}\n",
          c.name.c_str(), variant.c_str(), static_cast<long long>(c.frames),
          static_cast<long long>(c.cin), static_cast<long long>(c.cout),
          static_cast<long long>(c.h), static_cast<long long>(c.w), c.kt, c.k, med, tf, tf / peak);
      std::fflush(stdout);
    }
  }
  std::printf("\n%-30s %-7s %9s %8s %8s\n", "shape", "kernel", "ms", "TFLOP/s", "of peak");
  for (const Row& r : rows)
    std::printf("%-30s %-7s %9.3f %8.1f %7.0f%%\n", r.name.c_str(), r.variant.c_str(), r.ms,
                r.tflops, 100.0 * r.of_floor);
  return 0;
}
