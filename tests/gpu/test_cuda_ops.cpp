// Every op of the CUDA backend against the CPU backend (fp32) at VAE-sized shapes, for bf16,
// fp16 and fp32. Inputs are rounded to the dtype under test before both backends see them, so
// the comparison measures the GPU's arithmetic, not the rounding of the inputs.
//
// Tolerances (relative L2 over the whole output): bf16 1e-2, fp16 5e-3, fp32 1e-3, except fp32
// convolutions, which run on TF32 tensor cores (10-bit mantissa products): 3e-3.
// The backends are created with LATENT_CUDA_POISON=1: every new device buffer starts as NaN,
// so an output element an op leaves unwritten fails the test.
//
// Without a GPU (or in a build without CUDA) the binary exits with 77, which ctest reports as
// skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backends/registry.h"
#include "engine/models/vae/upsample_conv.h"
#include "tests/util/test_util.h"
#ifdef LATENT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/backends/cuda/conv2d.cuh"
#include "engine/backends/cuda/conv_wgmma.cuh"
#include "engine/backends/cuda/cuda_backend.h"
#include "tests/util/cuda_test_util.h"
#endif

// Runs before gtest's main: no GPU, no test.
const bool kGpuPresent = (latent::test::exit_without_gpu("test_cuda_ops"), true);

#ifdef LATENT_HAVE_CUDA

namespace latent {
namespace {

using test::random_tensor;

using test::AttentionRow;
using test::poisoned_cuda_backend;

class CudaOps : public test::CudaOpTest {
 protected:
  double tol() const {
    switch (dtype()) {
      case DType::kBF16:
        return 1e-2;
      case DType::kF16:
        return 5e-3;
      case DType::kF32:
        break;
    }
    return 1e-3;
  }
  double conv_tol() const { return dtype() == DType::kF32 ? 3e-3 : tol(); }

  // conv2d on both backends with the same inputs. Weights scaled by 1/sqrt(fan_in).
  void check_conv(const std::string& what, const Shape& xs, int64_t cout, int kernel,
                  const Conv2dParams& p, bool bias, bool residual, Activation act, uint64_t seed,
                  Backend* gpu = nullptr) {
    const float ws = 1.f / std::sqrt(static_cast<float>(xs[1] * kernel * kernel));
    Tensor x = input(xs, seed);
    Tensor w = input({cout, xs[1], kernel, kernel}, seed + 1, -ws, ws);
    Tensor b = bias ? input({cout}, seed + 2) : Tensor();
    const int64_t ho = (xs[2] + p.pad_top + p.pad_bottom - kernel) / p.stride + 1;
    const int64_t wo = (xs[3] + p.pad_left + p.pad_right - kernel) / p.stride + 1;
    Tensor r = residual ? input({xs[0], cout, ho, wo}, seed + 3) : Tensor();
    Result<Tensor> got =
        gpu ? gpu->conv2d(up(*gpu, x), up(*gpu, w), up(*gpu, b), p, up(*gpu, r), act)
            : gpu_->conv2d(on_gpu(x), on_gpu(w), on_gpu(b), p, on_gpu(r), act);
    if (gpu) {
      EXPECT_TRUE(gpu->synchronize().ok());
    }
    Result<Tensor> want = cpu_->conv2d(on_cpu(x), on_cpu(w), on_cpu(b), p, on_cpu(r), act);
    EXPECT_TRUE(close(what, got, want, conv_tol()));
  }

  // The CPU reference of conv3d_frames with 3 temporal taps: x [frames + 2, cin, h, w] (host),
  // w [cout, cin, 9, 3] (the 3-D kernel with its temporal and height axes merged): one CPU conv2d
  // per tap dt over frames [dt, dt + frames), summed through the residual input (what a causal
  // convolution is), bias and activation on the last.
  Result<Tensor> conv3d_reference(const Tensor& x, const Tensor& w, const Tensor& b,
                                  const Tensor& r, Activation act) {
    const int64_t frames = x.dim(0) - 2, cin = x.dim(1), h = x.dim(2), wd = x.dim(3);
    const int64_t cout = w.dim(0), plane = cin * h * wd, tap = 9;
    const Conv2dParams p = Conv2dParams::same(3);
    auto frames_of = [&](int64_t first) {
      Tensor t = Tensor::empty({frames, cin, h, wd}, DType::kF32);
      std::copy(x.data_as<float>() + first * plane, x.data_as<float>() + (first + frames) * plane,
                t.data_as<float>());
      return t;
    };
    auto tap_of = [&](int64_t dt) {
      Tensor t = Tensor::empty({cout, cin, 3, 3}, DType::kF32);
      for (int64_t oi = 0; oi < cout * cin; ++oi)
        std::copy(w.data_as<float>() + oi * 3 * tap + dt * tap,
                  w.data_as<float>() + oi * 3 * tap + (dt + 1) * tap,
                  t.data_as<float>() + oi * tap);
      return t;
    };
    Result<Tensor> y = cpu_->conv2d(on_cpu(frames_of(0)), on_cpu(tap_of(0)), Tensor(), p, on_cpu(r),
                                    Activation::kNone);
    if (!y.ok()) return y;
    y = cpu_->conv2d(on_cpu(frames_of(1)), on_cpu(tap_of(1)), Tensor(), p, y.value(),
                     Activation::kNone);
    if (!y.ok()) return y;
    return cpu_->conv2d(on_cpu(frames_of(2)), on_cpu(tap_of(2)), on_cpu(b), p, y.value(), act);
  }
  // Uploads to another backend on the same device (undefined stays undefined).
  static Tensor up(Backend& b, const Tensor& t) {
    if (!t.defined()) return Tensor();
    Result<Tensor> r = b.upload(t);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r.value() : Tensor();
  }

  // check_conv on this fixture's backend, then on each of `also` ("[name]" after `what`).
  void check_conv_also(const std::vector<std::pair<std::string, Backend*>>& also,
                       const std::string& what, const Shape& xs, int64_t cout, int kernel,
                       const Conv2dParams& p, bool bias, bool residual, Activation act,
                       uint64_t seed) {
    check_conv(what, xs, cout, kernel, p, bias, residual, act, seed);
    for (const auto& [name, b] : also)
      check_conv(str_cat(what, " [", name, "]"), xs, cout, kernel, p, bias, residual, act, seed, b);
  }

  // A poisoned backend of this dtype made with the variables `env` (NAME, VALUE) set, which are
  // unset again after; one per dtype and `env`, kept for the test binary's life. Null (and a
  // failure) if it cannot be made.
  std::shared_ptr<Backend> backend_with(
      const std::vector<std::pair<const char*, const char*>>& env) {
    static std::map<std::string, std::shared_ptr<Backend>> cache;
    std::string key = dtype_name(dtype());
    for (const auto& [name, value] : env) key += str_cat(' ', name, '=', value);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    for (const auto& [name, value] : env) setenv(name, value, 1);
    setenv("LATENT_CUDA_POISON", "1", 1);
    Result<std::shared_ptr<Backend>> r = create_cuda_backend(0, dtype());
    for (const auto& [name, value] : env) unsetenv(name);
    EXPECT_TRUE(r.ok()) << key << ": " << r.status().message();
    if (!r.ok()) return nullptr;
    return cache[key] = r.value();
  }

  // A backend that runs every convolution the Hopper implicit-GEMM kernel takes through it
  // (LATENT_CUDA_CONV=wgmma), not only the shapes where it beats cuDNN; cuDNN elsewhere.
  std::shared_ptr<Backend> wgmma_backend() { return backend_with({{"LATENT_CUDA_CONV", "wgmma"}}); }

  // Whether conv_wgmma's epilogue can hold the channel norm here: a 9.0 device, bf16 / fp16.
  bool epilogue_norm_runs() const {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess)
      return false;
    return major == 9 && dtype() != DType::kF32;
  }
  // A frame ring's slots for ops that write into one: `around` (frames + 2 frames of
  // [c, h, w], host) on `f`'s device as `ring`, and `slot`, the view of its frames
  // [1, 1 + frames).
  struct RingSlot {
    Tensor around, ring, slot;
  };
  RingSlot ring_slot(Backend& f, int64_t frames, int64_t c, int64_t h, int64_t w, uint64_t seed) {
    RingSlot r;
    r.around = input({frames + 2, c, h, w}, seed);
    r.ring = up(f, r.around);
    r.slot = Tensor::from_storage(r.ring.storage(),
                                  r.ring.byte_offset() + r.ring.nbytes() / (frames + 2),
                                  {frames, c, h, w}, r.ring.dtype(), r.ring.layout());
    return r;
  }
  // The ring's frames 0 and frames + 1 (outside the slot) still hold what they held.
  void expect_ring_kept(Backend& f, const RingSlot& r, const std::string& what) {
    const int64_t frames = r.slot.dim(0);
    Result<Tensor> back = f.download(r.ring);
    ASSERT_TRUE(back.ok()) << back.status().message();
    const int64_t frame = r.slot.numel() / frames;
    Result<Tensor> held = f.download(up(f, r.around));  // `around` rounded to the dtype
    ASSERT_TRUE(held.ok());
    for (int64_t fi : {int64_t{0}, frames + 1}) {
      const float* a = back.value().data_as<float>() + fi * frame;
      const float* e = held.value().data_as<float>() + fi * frame;
      EXPECT_TRUE(std::equal(a, a + frame, e))
          << what << ": frame " << fi << " of the ring changed";
    }
  }

  void check_attention(const std::string& what, Backend& gpu, const Shape& s, int heads,
                       uint64_t seed) {
    Tensor q = input(s, seed, -2.f, 2.f), k = input(s, seed + 1, -2.f, 2.f), v = input(s, seed + 2);
    auto up = [&](const Tensor& t) {
      Result<Tensor> r = gpu.upload(t);
      EXPECT_TRUE(r.ok()) << r.status().message();
      return r.ok() ? r.value() : Tensor();
    };
    Result<Tensor> got = gpu.spatial_attention(up(q), up(k), up(v), heads);
    Result<Tensor> want = cpu_->spatial_attention(on_cpu(q), on_cpu(k), on_cpu(v), heads);
    // `gpu` may be another backend instance on the same device, with its own stream, while gpu_
    // downloads the result on gpu_'s stream: wait for `gpu`'s work first (without this the
    // download raced the kernel and read the NaN poison, seen once on an H200).
    EXPECT_TRUE(gpu.synchronize().ok());
    EXPECT_TRUE(close(what, got, want, tol()));
  }

  // VAE-sized attention ([n, c, h, w], T = h * w up to 32,640), where a full CPU reference would
  // take minutes: every output must be finite (the poison is NaN) and sampled query rows (tile
  // edges and ends, every image, first and last head) match a float64 reference. Once per
  // kernel variant in `kernels` on the same device inputs.
  void check_attention_sampled(const std::string& what, const Shape& sh, int heads, uint64_t seed,
                               const std::vector<const char*>& kernels) {
    const int64_t n = sh[0], c = sh[1], t = sh[2] * sh[3], d = c / heads;
    Tensor q = input(sh, seed, -2.f, 2.f), k = input(sh, seed + 1, -2.f, 2.f),
           v = input(sh, seed + 2);
    Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v);
    // Host tensors are [n][c][t]: channel ch of token j of image b at (b * c + ch) * t + j.
    const float* qp = q.data_as<float>();
    const float* kp = k.data_as<float>();
    const float* vp = v.data_as<float>();
    const std::vector<int64_t> queries =
        test::sample_queries({0, 1, 63, 64, 127, t / 2 + 5, t - 65, t - 64, t - 1}, t);
    std::vector<AttentionRow> rows;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    std::vector<double> p(static_cast<size_t>(t));
    std::vector<int> hs = {0};
    if (heads > 1) hs.push_back(heads - 1);
    for (int64_t b = 0; b < n; ++b)
      for (int h : hs)
        for (int64_t qi : queries) {
          AttentionRow r{b, qi, h, std::vector<double>(static_cast<size_t>(d), 0.0)};
          std::fill(p.begin(), p.end(), 0.0);
          for (int64_t e = 0; e < d; ++e) {
            const double qe = qp[(b * c + h * d + e) * t + qi];
            const float* kr = kp + (b * c + h * d + e) * t;
            for (int64_t j = 0; j < t; ++j) p[j] += qe * kr[j];
          }
          double mx = -INFINITY;
          for (int64_t j = 0; j < t; ++j) mx = std::max(mx, p[j] *= scale);
          double sum = 0;
          for (int64_t j = 0; j < t; ++j) sum += (p[j] = std::exp(p[j] - mx));
          for (int64_t e = 0; e < d; ++e) {
            const float* vr = vp + (b * c + h * d + e) * t;
            double acc = 0;
            for (int64_t j = 0; j < t; ++j) acc += p[j] * vr[j];
            r.out[e] = acc / sum;
          }
          rows.push_back(std::move(r));
        }
    for (const char* kernel : kernels) {
      setenv("LATENT_ATTENTION_KERNEL", kernel, 1);
      const std::string name = what + " [" + kernel + "]";
      Result<Tensor> y = gpu_->spatial_attention(gq, gk, gv, heads);
      unsetenv("LATENT_ATTENTION_KERNEL");
      ASSERT_TRUE(y.ok()) << name << ": " << y.status().message();
      const Tensor host = test::download_finite(*gpu_, y.value(), n * c * t, name);
      ASSERT_TRUE(host.defined());
      const float* yp = host.data_as<float>();
      const double err = test::rows_rel_l2(rows, [&](const AttentionRow& r, int64_t e) {
        return static_cast<double>(yp[(r.bi * c + r.h * d + e) * t + r.qi]);
      });
      std::printf("  %-58s %-5s rel L2 %.3e (tol %.0e, %zu rows)\n", name.c_str(),
                  dtype_name(dtype()), err, tol(), rows.size());
      EXPECT_LT(err, tol()) << name;
    }
  }
};

// Every attention kernel variant LATENT_ATTENTION_KERNEL can force (attention_flash.cuh; "wgmma"
// is the Hopper kernel for d = 128 on compute capability 9.0 and the default elsewhere, "simple"
// the CUDA-core kernel, "gemm" the unfused one-head path of spatial_attention: q k^T in fp32 on
// cuBLASLt, a row softmax, p v; several heads run the default there). The untimed Hopper kernel
// last, so the others have run if it breaks.
const std::vector<const char*> kAttentionKernels = {"mma",    "mma16", "mma32",
                                                    "simple", "gemm",  "wgmma"};

TEST_P(CudaOps, UploadDownloadRoundTrip) {
  for (const Shape& s : {Shape{2, 5, 7, 9}, Shape{1, 16, 1, 1}, Shape{1, 1, 3, 4}, Shape{13},
                         Shape{3, 17}, Shape{2, 3, 5}}) {
    Tensor host = input(s, 7);
    Result<Tensor> dev = gpu_->upload(host);
    ASSERT_TRUE(dev.ok()) << dev.status().message();
    EXPECT_EQ(dev.value().dtype(), dtype());
    EXPECT_EQ(dev.value().layout(), s.size() == 4 ? Layout::kNHWC : Layout::kContiguous);
    Result<Tensor> back = gpu_->download(dev.value());
    ASSERT_TRUE(back.ok()) << back.status().message();
    ASSERT_EQ(back.value().shape(), s);
    // The input is already representable in the dtype: the round trip is exact.
    EXPECT_EQ(relative_l2(back.value(), host), 0.0) << shape_str(s);
  }
  // Host tensors in other dtypes convert on upload.
  Tensor host = input({1, 24, 5, 6}, 8);
  for (DType src : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor converted = host.to_dtype(src);
    Result<Tensor> dev = gpu_->upload(converted);
    ASSERT_TRUE(dev.ok()) << dev.status().message();
    Result<Tensor> back = gpu_->download(dev.value());
    ASSERT_TRUE(back.ok()) << back.status().message();
    Tensor expected = converted.to_dtype(dtype()).to_dtype(DType::kF32);
    EXPECT_EQ(relative_l2(back.value(), expected), 0.0) << "from " << dtype_name(src);
  }
}

TEST_P(CudaOps, Conv3x3) {
  check_conv("conv 3x3 [1,128,128,128] pad 1 +bias", {1, 128, 128, 128}, 128, 3,
             Conv2dParams::same(3), true, false, Activation::kNone, 100);
}

TEST_P(CudaOps, Conv3x3ResidualSiLU) {
  check_conv("conv 3x3 [1,128,64,64] +bias +residual, SiLU", {1, 128, 64, 64}, 128, 3,
             Conv2dParams::same(3), true, true, Activation::kSiLU, 110);
  check_conv("conv 3x3 [2,64,20,28] -> 96 +residual, ReLU", {2, 64, 20, 28}, 96, 3,
             Conv2dParams::same(3), false, true, Activation::kReLU, 120);
}

TEST_P(CudaOps, ConvStride2AsymmetricPad) {
  Conv2dParams p;
  p.stride = 2;
  p.pad_bottom = p.pad_right = 1;  // diffusers Downsample2D: F.pad(x, (0, 1, 0, 1))
  check_conv("conv 3x3 s2 pad(0,1,0,1) [1,128,128,128]", {1, 128, 128, 128}, 128, 3, p, true, false,
             Activation::kNone, 200);
  check_conv("conv 3x3 s2 pad(0,1,0,1) [1,64,33,47]", {1, 64, 33, 47}, 64, 3, p, true, false,
             Activation::kNone, 210);
  Conv2dParams q;
  q.pad_top = 2;
  q.pad_left = 1;
  q.pad_right = 1;  // causal-style: all height padding on top
  check_conv("conv 3x3 pad(t2,b0,l1,r1) [1,32,19,23]", {1, 32, 19, 23}, 48, 3, q, true, false,
             Activation::kNone, 220);
}

TEST_P(CudaOps, Conv1x1) {
  check_conv("conv 1x1 [1,128,128,128] -> 256 +bias", {1, 128, 128, 128}, 256, 1, Conv2dParams(),
             true, false, Activation::kNone, 300);
  check_conv("conv 1x1 [1,512,64,64] -> 512 +bias +residual", {1, 512, 64, 64}, 512, 1,
             Conv2dParams(), true, true, Activation::kNone, 310);
}

TEST_P(CudaOps, ConvOddChannels) {
  check_conv("conv_in 3x3 [1,3,128,128] -> 128", {1, 3, 128, 128}, 128, 3, Conv2dParams::same(3),
             true, false, Activation::kNone, 400);
  check_conv("conv_out 3x3 [1,128,64,64] -> 3", {1, 128, 64, 64}, 3, 3, Conv2dParams::same(3), true,
             false, Activation::kNone, 410);
  check_conv("conv 1x1 [1,16,32,32] -> 32 (latent)", {1, 16, 32, 32}, 32, 1, Conv2dParams(), true,
             false, Activation::kNone, 420);
}

// Shapes of the video VAEs' convolutions for the Hopper implicit-GEMM kernel (conv_wgmma.cu;
// bf16/fp16 on a 9.0 device, cuDNN elsewhere): 96 channels (a 64-wide K step spans two taps),
// every output-channel tile (64, 96, 128, 192, 256), pixel counts that leave a partial tile,
// the smallest channel count it takes (8); then again with the four-warpgroup tiles forced
// (LATENT_CONV_WGMMA_TILE 256x64w4, 256x96w4s5, 256x128w4: where their width divides the
// output channels, the default tile elsewhere), the halo kernels wherever they fit (halo,
// halotma) and the implicit-GEMM tiles only ("implicit": the default picks the TMA halo kernel
// at 96 -> 96 and at 64 -> 64 with a residual; "strip64" / "strip64s": the strip kernel at
// 64 -> 64 with its TMA-store epilogue, with session 23's staged one).
TEST_P(CudaOps, ConvWgmmaShapes) {
  const Conv2dParams same = Conv2dParams::same(3);
  std::vector<std::pair<std::string, Backend*>> forced = {
      {"LATENT_CUDA_CONV=wgmma", wgmma_backend().get()}};
  for (const char* tile :
       {"256x64w4", "256x96w4s5", "256x128w4", "halo", "halotma", "halotmar4", "halotmar4s2",
        "halotmas3", "halotmas4", "implicit", "strip64", "strip64s"})
    forced.emplace_back(
        str_cat("LATENT_CUDA_CONV=wgmma, tile ", tile),
        backend_with({{"LATENT_CUDA_CONV", "wgmma"}, {"LATENT_CONV_WGMMA_TILE", tile}}).get());
  for (const auto& [name, b] : forced) ASSERT_TRUE(b) << name;
  check_conv_also(forced, "conv 3x3 [1,96,45,80] -> 96 +bias +residual, SiLU", {1, 96, 45, 80}, 96,
                  3, same, true, true, Activation::kSiLU, 600);
  check_conv_also(forced, "conv 3x3 [1,384,23,40] -> 384 +bias", {1, 384, 23, 40}, 384, 3, same,
                  true, false, Activation::kNone, 610);
  check_conv_also(forced, "conv 3x3 [1,192,17,30] -> 384 +bias", {1, 192, 17, 30}, 384, 3, same,
                  true, false, Activation::kNone, 620);
  check_conv_also(forced, "conv 3x3 [3,64,19,21] -> 64 +bias, ReLU", {3, 64, 19, 21}, 64, 3, same,
                  true, false, Activation::kReLU, 630);
  check_conv_also(forced, "conv 3x3 [1,8,33,31] -> 256", {1, 8, 33, 31}, 256, 3, same, false, false,
                  Activation::kNone, 640);
  // 64 -> 64 over several strips of 128 pixels, the last partial, more strips than SMs on a small
  // card's share (the strip kernel's persistent loop, its 3 buffers' reuse).
  check_conv_also(forced, "conv 3x3 [2,64,75,300] -> 64 +bias +residual, SiLU", {2, 64, 75, 300},
                  64, 3, same, true, true, Activation::kSiLU, 645);
  check_conv_also(forced, "conv 3x3 [1,64,9,130] -> 64", {1, 64, 9, 130}, 64, 3, same, false, false,
                  Activation::kNone, 646);
  // GELU: the strip kernel's staged form (its TMA-store form takes none, ReLU and SiLU)
  check_conv_also(forced, "conv 3x3 [1,64,10,150] -> 64 +bias +residual, GELU", {1, 64, 10, 150},
                  64, 3, same, true, true, Activation::kGELU, 647);
  check_conv_also(forced, "conv 1x1 [1,96,30,50] -> 192 +bias", {1, 96, 30, 50}, 192, 1,
                  Conv2dParams(), true, false, Activation::kNone, 650);
  check_conv_also(forced, "conv 3x3 [1,128,40,40] -> 128 +bias +residual, GELU", {1, 128, 40, 40},
                  128, 3, same, true, true, Activation::kGELU, 660);
  Conv2dParams down;  // diffusers' downsampling: F.pad(x, (0, 1, 0, 1)), stride 2
  down.stride = 2;
  down.pad_bottom = down.pad_right = 1;
  check_conv_also(forced, "conv 3x3 s2 pad(0,1,0,1) [1,96,45,81] -> 96 +bias", {1, 96, 45, 81}, 96,
                  3, down, true, false, Activation::kNone, 670);
  check_conv_also(forced, "conv 3x3 s2 pad(0,1,0,1) [2,192,20,34] -> 192 +residual",
                  {2, 192, 20, 34}, 192, 3, down, false, true, Activation::kNone, 680);
  const Conv2dParams taesd_down = Conv2dParams::same(3, 2);  // TAESD's: pad 1, stride 2
  check_conv_also(forced, "conv 3x3 s2 pad 1 [2,64,27,41] -> 64 +bias", {2, 64, 27, 41}, 64, 3,
                  taesd_down, true, false, Activation::kNone, 685);
  Conv2dParams lopsided;  // all height padding on top, stride 1
  lopsided.pad_top = 2;
  lopsided.pad_left = lopsided.pad_right = 1;
  check_conv_also(forced, "conv 3x3 pad(t2,b0,l1,r1) [1,32,19,23] -> 64", {1, 32, 19, 23}, 64, 3,
                  lopsided, true, false, Activation::kNone, 690);
  check_conv_also(forced, "conv 3x3 pad(t2,b0,l1,r1) [1,64,19,140] -> 64 +bias, ReLU",
                  {1, 64, 19, 140}, 64, 3, lopsided, true, false, Activation::kReLU, 695);
  // Input channels padded to a multiple of 8 (an RGB image's first convolution).
  check_conv_also(forced, "conv 3x3 [2,3,21,34] -> 64 +bias, ReLU (channels padded)",
                  {2, 3, 21, 34}, 64, 3, same, true, false, Activation::kReLU, 700);
}

// Convolutions with <= 16 output channels (a decoder's last, to RGB or to 2x2 patches of RGB):
// conv_narrow.cu by default on bf16 / fp16 (one n8 tile up to 8 channels, two up to 16), cuDNN
// with LATENT_CUDA_CONV_NARROW=0; both against the CPU. Partial tiles (sides not multiples of
// 8 x 32), a batch, every epilogue, 1x1 and lopsided padding, the widest input it takes (256).
TEST_P(CudaOps, ConvNarrowShapes) {
  const Conv2dParams same = Conv2dParams::same(3);
  std::shared_ptr<Backend> cudnn = backend_with({{"LATENT_CUDA_CONV_NARROW", "0"}});
  ASSERT_TRUE(cudnn);
  const std::vector<std::pair<std::string, Backend*>> also = {
      {"LATENT_CUDA_CONV_NARROW=0", cudnn.get()}};
  check_conv_also(also, "conv 3x3 [1,64,48,96] -> 3 +bias (TAEW's last)", {1, 64, 48, 96}, 3, 3,
                  same, true, false, Activation::kNone, 1100);
  check_conv_also(also, "conv 3x3 [2,64,19,37] -> 3 +bias, ReLU", {2, 64, 19, 37}, 3, 3, same, true,
                  false, Activation::kReLU, 1110);
  check_conv_also(also, "conv 3x3 [1,128,24,40] -> 12 +bias +residual, SiLU", {1, 128, 24, 40}, 12,
                  3, same, true, true, Activation::kSiLU, 1120);
  check_conv_also(also, "conv 3x3 [1,96,16,17] -> 16", {1, 96, 16, 17}, 16, 3, same, false, false,
                  Activation::kNone, 1130);
  check_conv_also(also, "conv 3x3 [1,256,10,12] -> 8 +bias, GELU", {1, 256, 10, 12}, 8, 3, same,
                  true, false, Activation::kGELU, 1140);
  check_conv_also(also, "conv 1x1 [1,32,9,10] -> 16 +bias", {1, 32, 9, 10}, 16, 1, Conv2dParams(),
                  true, false, Activation::kNone, 1150);
  Conv2dParams lopsided;  // all height padding on top
  lopsided.pad_top = 2;
  lopsided.pad_left = lopsided.pad_right = 1;
  check_conv_also(also, "conv 3x3 pad(t2,b0,l1,r1) [1,32,19,23] -> 3 +bias", {1, 32, 19, 23}, 3, 3,
                  lopsided, true, false, Activation::kNone, 1160);
  Conv2dParams valid;  // no padding: the output is smaller than the input
  check_conv_also(also, "conv 3x3 valid [1,48,13,40] -> 5 +bias", {1, 48, 13, 40}, 5, 3, valid,
                  true, false, Activation::kTanh, 1170);
}

// A causal 3x3x3 convolution over frames (Backend::conv3d_frames): [T + 2] frames in, [T] out.
TEST_P(CudaOps, Conv3dFrames) {
  struct Case {
    int64_t frames, cin, cout, h, w;
    bool residual;
    Activation act;
  };
  // 3 -> 96: an RGB clip's first convolution (the Wan encoder's conv_in), its channels padded
  // to 8 for the implicit-GEMM kernel (the default path on a 9.0 device).
  for (const Case& c : {Case{6, 96, 96, 18, 33, true, Activation::kSiLU},
                        Case{3, 192, 384, 9, 16, false, Activation::kNone},
                        Case{3, 192, 192, 20, 70, true, Activation::kSiLU},
                        Case{4, 64, 64, 12, 12, false, Activation::kReLU},
                        Case{5, 3, 96, 17, 30, false, Activation::kNone},
                        Case{4, 12, 96, 9, 14, true, Activation::kSiLU},
                        // few output channels (conv_narrow.cu): the Wan decoder's conv_out,
                        // 2x2 patches of RGB (Wan 2.2)
                        Case{5, 96, 3, 20, 37, false, Activation::kNone},
                        Case{4, 32, 12, 11, 9, true, Activation::kSiLU}}) {
    const uint64_t seed = 700 + static_cast<uint64_t>(c.cin + c.cout);
    const float ws = 1.f / std::sqrt(static_cast<float>(c.cin * 27));
    Tensor x = input({c.frames + 2, c.cin, c.h, c.w}, seed);
    Tensor w = input({c.cout, c.cin, 9, 3}, seed + 1, -ws, ws);
    Tensor b = input({c.cout}, seed + 2);
    Tensor r = c.residual ? input({c.frames, c.cout, c.h, c.w}, seed + 3) : Tensor();
    const Conv2dParams p = Conv2dParams::same(3);
    if (!gpu_->supports_conv3d_frames()) GTEST_SKIP() << "LATENT_CUDA_CONV3D=0";
    Result<Tensor> got =
        gpu_->conv3d_frames(on_gpu(x), on_gpu(w), 3, on_gpu(b), p, on_gpu(r), c.act);
    // The implicit-GEMM kernel forced, with its default tiles, with the halo tiles (64 / 96
    // input channels; the default tile for the rest) and with the implicit-GEMM tiles only.
    const std::shared_ptr<Backend> wgmma = wgmma_backend(),
                                   halo = backend_with({{"LATENT_CUDA_CONV", "wgmma"},
                                                        {"LATENT_CONV_WGMMA_TILE", "halo"}}),
                                   halo_tma = backend_with({{"LATENT_CUDA_CONV", "wgmma"},
                                                            {"LATENT_CONV_WGMMA_TILE", "halotma"}}),
                                   implicit =
                                       backend_with({{"LATENT_CUDA_CONV", "wgmma"},
                                                     {"LATENT_CONV_WGMMA_TILE", "implicit"}}),
                                   r4s2 = backend_with({{"LATENT_CUDA_CONV", "wgmma"},
                                                        {"LATENT_CONV_WGMMA_TILE", "halotmar4s2"}});
    ASSERT_TRUE(wgmma && halo && halo_tma && implicit && r4s2);
    Result<Tensor> want = conv3d_reference(x, w, b, r, c.act);
    ASSERT_TRUE(want.ok()) << want.status().message();
    const int64_t plane = c.cin * c.h * c.w;
    const std::string what = "conv3d_frames " + std::to_string(c.frames) + "+2 frames " +
                             std::to_string(c.cin) + "->" + std::to_string(c.cout);
    EXPECT_TRUE(close(what, got, want, conv_tol()));
    auto slice = [&](int64_t first, int64_t count) {
      Tensor t = Tensor::empty({count, c.cin, c.h, c.w}, DType::kF32);
      std::copy(x.data_as<float>() + first * plane, x.data_as<float>() + (first + count) * plane,
                t.data_as<float>());
      return t;
    };
    // The same with the 2 past frames and the chunk in separate tensors (a causal cache read in
    // place).
    Result<Tensor> after =
        gpu_->conv3d_frames_after({on_gpu(slice(0, 2))}, on_gpu(slice(2, c.frames)), on_gpu(w), 3,
                                  on_gpu(b), p, on_gpu(r), c.act);
    EXPECT_TRUE(close(what + " (past, x)", after, want, conv_tol()));
    // The 2 past frames in two tensors of one frame each (a cache that kept the frames as they
    // came: the kernel reads three places).
    Result<Tensor> after3 = gpu_->conv3d_frames_after({on_gpu(slice(0, 1)), on_gpu(slice(1, 1))},
                                                      on_gpu(slice(2, c.frames)), on_gpu(w), 3,
                                                      on_gpu(b), p, on_gpu(r), c.act);
    EXPECT_TRUE(close(what + " (past0, past1, x)", after3, want, conv_tol()));
    for (const auto& [name, f] :
         {std::make_pair(std::string(" [LATENT_CUDA_CONV=wgmma]"), wgmma.get()),
          std::make_pair(std::string(" [LATENT_CUDA_CONV=wgmma, tile halo]"), halo.get()),
          std::make_pair(std::string(" [LATENT_CUDA_CONV=wgmma, tile halotma]"), halo_tma.get()),
          std::make_pair(std::string(" [LATENT_CUDA_CONV=wgmma, tile implicit]"), implicit.get()),
          std::make_pair(std::string(" [LATENT_CUDA_CONV=wgmma, tile halotmar4s2]"), r4s2.get())}) {
      Result<Tensor> all =
          f->conv3d_frames(up(*f, x), up(*f, w), 3, up(*f, b), p, up(*f, r), c.act);
      Result<Tensor> two = f->conv3d_frames_after({up(*f, slice(0, 2))}, up(*f, slice(2, c.frames)),
                                                  up(*f, w), 3, up(*f, b), p, up(*f, r), c.act);
      Result<Tensor> three = f->conv3d_frames_after({up(*f, slice(0, 1)), up(*f, slice(1, 1))},
                                                    up(*f, slice(2, c.frames)), up(*f, w), 3,
                                                    up(*f, b), p, up(*f, r), c.act);
      EXPECT_TRUE(f->synchronize().ok());
      EXPECT_TRUE(close(what + name, all, want, conv_tol()));
      EXPECT_TRUE(close(what + " (past, x)" + name, two, want, conv_tol()));
      EXPECT_TRUE(close(what + " (past0, past1, x)" + name, three, want, conv_tol()));
    }
  }
  // A past of three tensors is refused with a message (the kernel reads at most three places).
  {
    Tensor one = input({1, 8, 4, 4}, 790);
    Tensor w = input({8, 8, 9, 3}, 791, -0.1f, 0.1f);
    Result<Tensor> r =
        gpu_->conv3d_frames_after({on_gpu(one), on_gpu(one), on_gpu(one)}, on_gpu(one), on_gpu(w),
                                  3, Tensor(), Conv2dParams::same(3));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("1 or 2 past tensors"), std::string::npos)
        << r.status().message();
  }
}

// conv3d_frames_normed (on unless LATENT_CUDA_CONV_NORM=0): the channel RMS norm (gamma, SiLU or
// none) in the convolution's epilogue (conv_wgmma.cu's finish_tile), against the CPU's convolution
// then norm, and against the GPU's own two ops. It runs where the kernel's block holds every output
// channel (96 -> 96 on the TMA halo tile by default; with LATENT_CUDA_CONV=wgmma also the cp.async
// halo tile, the 4-row TMA tile, the implicit-GEMM tiles of 2 and 4 warpgroups, and 64 -> 64 on a
// 64-wide tile), at 192 -> 192 on the TMA halo tile's two 96-channel blocks of a pixel tile run as
// a cluster (their sums met through distributed shared memory), and declines elsewhere (an
// undefined result: 96 -> 192, fp32, devices other than 9.0), leaving the caller to run the two
// ops. Written into a slot of a larger tensor (a frame ring's) it touches nothing else.
TEST_P(CudaOps, Conv3dFramesNormed) {
  if (!gpu_->supports_conv3d_frames()) GTEST_SKIP() << "LATENT_CUDA_CONV3D=0";
  const bool fuses = epilogue_norm_runs();
  struct Case {
    int64_t frames, cin, cout, h, w;
    Activation act;
    const char* tile;  // LATENT_CONV_WGMMA_TILE with LATENT_CUDA_CONV=wgmma; null: the default
    bool fused;        // on a 9.0 device in bf16 / fp16
  };
  for (const Case& c : {Case{3, 96, 96, 18, 70, Activation::kSiLU, nullptr, true},
                        Case{1, 96, 96, 9, 130, Activation::kNone, nullptr, true},
                        Case{3, 96, 96, 18, 70, Activation::kSiLU, "halo", true},
                        Case{3, 96, 96, 18, 70, Activation::kSiLU, "halotmar4s2", true},
                        Case{3, 96, 96, 18, 70, Activation::kSiLU, "implicit", true},
                        Case{2, 96, 96, 13, 37, Activation::kSiLU, "256x96w4", true},
                        Case{2, 96, 96, 13, 37, Activation::kSiLU, "256x96", true},
                        Case{2, 64, 64, 10, 21, Activation::kSiLU, "", true},
                        // 192 -> 192: the pixel tile's two 96-channel blocks as a cluster
                        Case{2, 192, 192, 10, 21, Activation::kSiLU, nullptr, true},
                        Case{1, 192, 192, 7, 70, Activation::kNone, nullptr, true},
                        Case{2, 96, 192, 10, 21, Activation::kSiLU, nullptr, false}}) {
    const uint64_t seed = 900 + static_cast<uint64_t>(c.cin + c.h);
    const float ws = 1.f / std::sqrt(static_cast<float>(c.cin * 27));
    Tensor x = input({c.frames + 2, c.cin, c.h, c.w}, seed);
    Tensor w = input({c.cout, c.cin, 9, 3}, seed + 1, -ws, ws);
    Tensor b = input({c.cout}, seed + 2);
    Tensor g = input({c.cout}, seed + 3, 0.5f, 1.5f);
    const std::shared_ptr<Backend> own =
        !c.tile   ? backend_with({{"LATENT_CUDA_CONV_NORM", "1"}})
        : *c.tile ? backend_with({{"LATENT_CUDA_CONV_NORM", "1"},
                                  {"LATENT_CUDA_CONV", "wgmma"},
                                  {"LATENT_CONV_WGMMA_TILE", c.tile}})
                  : backend_with({{"LATENT_CUDA_CONV_NORM", "1"}, {"LATENT_CUDA_CONV", "wgmma"}});
    ASSERT_TRUE(own);
    Backend& f = *own;
    const std::string what =
        str_cat("conv3d_frames_normed ", c.frames, "+2 frames ", c.cin, "->", c.cout, " ", c.h, "x",
                c.w, c.act == Activation::kSiLU ? " SiLU" : "",
                c.tile ? str_cat(" [wgmma, tile ", *c.tile ? c.tile : "default", "]") : "");
    Result<Tensor> conv = conv3d_reference(x, w, b, Tensor(), Activation::kNone);
    ASSERT_TRUE(conv.ok()) << conv.status().message();
    Result<Tensor> want = cpu_->rms_norm_channels(conv.value(), on_cpu(g), Tensor(), c.act);
    const Conv2dParams p = Conv2dParams::same(3);
    const Tensor gx = up(f, x), gw = up(f, w), gb = up(f, b), gg = up(f, g);
    Result<Tensor> got = f.conv3d_frames_normed(gx, gw, 3, gb, p, gg, c.act);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status().message();
    ASSERT_EQ(got.value().defined(), fuses && c.fused) << what;
    if (!got.value().defined()) continue;
    // The GPU's own two ops: the same convolution, its output rounded, the norm after.
    Result<Tensor> y = f.conv3d_frames(gx, gw, 3, gb, p);
    ASSERT_TRUE(y.ok()) << y.status().message();
    Result<Tensor> two_gpu = f.rms_norm_channels(y.value(), gg, Tensor(), c.act);
    ASSERT_TRUE(two_gpu.ok()) << two_gpu.status().message();
    EXPECT_TRUE(f.synchronize().ok());
    // close() reads its reference on the host.
    Result<Tensor> two = f.download(two_gpu.value());
    EXPECT_TRUE(close(what, got, want, conv_tol()));
    EXPECT_TRUE(close(what + " vs conv then norm on the GPU", got, two, 2e-3));
    // Into frames [1, 1 + frames) of a tensor of frames + 2 (a ring's slots): the frames around
    // keep what they held.
    const RingSlot rs = ring_slot(f, c.frames, c.cout, c.h, c.w, seed + 4);
    Result<Tensor> into = f.conv3d_frames_normed(gx, gw, 3, gb, p, gg, c.act, rs.slot);
    ASSERT_TRUE(into.ok()) << what << ": " << into.status().message();
    ASSERT_TRUE(into.value().defined()) << what;
    EXPECT_EQ(into.value().storage(), rs.ring.storage());
    EXPECT_EQ(into.value().byte_offset(), rs.slot.byte_offset());
    EXPECT_TRUE(f.synchronize().ok());
    EXPECT_TRUE(close(what + " into a slot", into, two, 2e-3));
    expect_ring_kept(f, rs, what);
  }
  // A misshaped slot is refused with a message; with LATENT_CUDA_CONV_NORM=0 the backend
  // declines, and by default it fuses.
  Tensor x = input({3, 96, 9, 130}, 990), w = input({96, 96, 9, 3}, 991, -0.02f, 0.02f);
  Tensor g = input({96}, 992, 0.5f, 1.5f), wrong = input({2, 96, 9, 130}, 993);
  const std::shared_ptr<Backend> on = backend_with({{"LATENT_CUDA_CONV_NORM", "1"}});
  ASSERT_TRUE(on);
  Result<Tensor> r =
      on->conv3d_frames_normed(up(*on, x), up(*on, w), 3, Tensor(), Conv2dParams::same(3),
                               up(*on, g), Activation::kSiLU, up(*on, wrong));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("does not match the output"), std::string::npos)
      << r.status().message();
  const std::shared_ptr<Backend> no = backend_with({{"LATENT_CUDA_CONV_NORM", "0"}});
  ASSERT_TRUE(no);
  Result<Tensor> off = no->conv3d_frames_normed(
      up(*no, x), up(*no, w), 3, Tensor(), Conv2dParams::same(3), up(*no, g), Activation::kSiLU);
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_FALSE(off.value().defined());
  if (fuses) {
    Result<Tensor> by_default = gpu_->conv3d_frames_normed(
        on_gpu(x), on_gpu(w), 3, Tensor(), Conv2dParams::same(3), on_gpu(g), Activation::kSiLU);
    ASSERT_TRUE(by_default.ok()) << by_default.status().message();
    EXPECT_TRUE(by_default.value().defined()) << "the fused norm is the default";
  }
}

// cuDNN convolutions with the epilogue fused into one operation graph (LATENT_CUDA_CONV=cudnn
// LATENT_CUDNN_FUSION=on, conv_fused.cpp) against the CPU: every epilogue the VAEs use, 2-D and
// 3-D. Convolutions below 32 channels (the 3-channel ends) and fp32 run the plain convolution
// and the separate pass instead, and must agree as well. The 64- and 128-channel bf16 / fp16
// cases must really be fused (counted).
TEST_P(CudaOps, ConvCudnnFused) {
  if (!cuda::ConvPlanCache::fusion_available())
    GTEST_SKIP() << "built without cudnn-frontend: no fused convolutions";
  const std::shared_ptr<Backend> fused =
      backend_with({{"LATENT_CUDA_CONV", "cudnn"}, {"LATENT_CUDNN_FUSION", "on"}});
  ASSERT_TRUE(fused);
  const Conv2dParams same = Conv2dParams::same(3);
  const int64_t before = cuda::ConvPlanCache::fused_calls();
  check_conv("fused conv 3x3 [1,64,36,40] -> 64 +bias, ReLU", {1, 64, 36, 40}, 64, 3, same, true,
             false, Activation::kReLU, 800, fused.get());
  check_conv("fused conv 3x3 [2,64,20,28] -> 64 +bias +residual, ReLU", {2, 64, 20, 28}, 64, 3,
             same, true, true, Activation::kReLU, 810, fused.get());
  check_conv("fused conv 3x3 [1,128,32,32] -> 128 +bias +residual, SiLU", {1, 128, 32, 32}, 128, 3,
             same, true, true, Activation::kSiLU, 820, fused.get());
  check_conv("fused conv 3x3 [1,128,24,20] -> 64 +bias", {1, 128, 24, 20}, 64, 3, same, true, false,
             Activation::kNone, 830, fused.get());
  check_conv("fused conv 1x1 [1,128,16,16] -> 256 +residual", {1, 128, 16, 16}, 256, 1,
             Conv2dParams(), false, true, Activation::kNone, 840, fused.get());
  const int64_t counted = cuda::ConvPlanCache::fused_calls() - before;
  if (dtype() != DType::kF32) {
    EXPECT_GE(counted, 3) << "cuDNN fused none of the 64/128-channel 3x3 convolutions";
  } else {
    EXPECT_EQ(counted, 0) << "fp32 convolutions are never fused";
  }
  // diffusers' downsampling: the extra bottom / right padding as the fused graph's post-padding
  // where cuDNN builds that graph (the default), or (LATENT_CUDNN_PAD=copy) by a padded copy.
  Conv2dParams down;
  down.stride = 2;
  down.pad_bottom = down.pad_right = 1;
  {
    const int64_t before_down = cuda::ConvPlanCache::fused_calls();
    check_conv("fused conv 3x3 s2 pad(0,1,0,1) [1,64,33,47] -> 64 +bias", {1, 64, 33, 47}, 64, 3,
               down, true, false, Activation::kNone, 850, fused.get());
    check_conv("fused conv 3x3 s2 pad(0,1,0,1) [2,96,20,34] -> 96 +bias +residual, SiLU",
               {2, 96, 20, 34}, 96, 3, down, true, true, Activation::kSiLU, 855, fused.get());
    if (dtype() != DType::kF32)  // which way cuDNN took them (with the copy: 2 fused as well)
      std::printf("post-padding in the graph: %lld of 2 downsampling convolutions fused\n",
                  static_cast<long long>(cuda::ConvPlanCache::fused_calls() - before_down));
  }
  {
    const std::shared_ptr<Backend> copy =
        backend_with({{"LATENT_CUDA_CONV", "cudnn"}, {"LATENT_CUDNN_PAD", "copy"}});
    ASSERT_TRUE(copy);
    check_conv("fused conv 3x3 s2 pad(0,1,0,1) [1,64,33,47] -> 64 +bias [LATENT_CUDNN_PAD=copy]",
               {1, 64, 33, 47}, 64, 3, down, true, false, Activation::kNone, 850, copy.get());
    check_conv("fused conv 3x3 s2 pad(0,1,0,1) [2,96,20,34] -> 96 +bias +residual, SiLU [copy]",
               {2, 96, 20, 34}, 96, 3, down, true, true, Activation::kSiLU, 855, copy.get());
  }
  check_conv("fused conv_out 3x3 [1,64,30,30] -> 3 +bias", {1, 64, 30, 30}, 3, 3, same, true, false,
             Activation::kNone, 860, fused.get());
  check_conv("fused conv_in 3x3 [1,3,30,30] -> 64 +bias, ReLU", {1, 3, 30, 30}, 64, 3, same, true,
             false, Activation::kReLU, 870, fused.get());
  check_conv("fused conv 3x3 [1,64,30,30] -> 64 (no epilogue)", {1, 64, 30, 30}, 64, 3, same, false,
             false, Activation::kNone, 880, fused.get());
  // A causal 3x3x3 convolution over 4 + 2 frames with bias, residual and SiLU (the Wan blocks).
  if (fused->supports_conv3d_frames()) {
    const int64_t frames = 4, cin = 96, cout = 96, h = 10, w = 14;
    const float ws = 1.f / std::sqrt(static_cast<float>(cin * 27));
    Tensor x = input({frames + 2, cin, h, w}, 890);
    Tensor wt = input({cout, cin, 9, 3}, 891, -ws, ws);
    Tensor b = input({cout}, 892);
    Tensor r = input({frames, cout, h, w}, 893);
    Result<Tensor> got = fused->conv3d_frames(up(*fused, x), up(*fused, wt), 3, up(*fused, b), same,
                                              up(*fused, r), Activation::kSiLU);
    EXPECT_TRUE(fused->synchronize().ok());
    Result<Tensor> want = gpu_->conv3d_frames(on_gpu(x), on_gpu(wt), 3, on_gpu(b), same, on_gpu(r),
                                              Activation::kSiLU);
    // Against the default path (itself checked against the CPU in Conv3dFrames).
    ASSERT_TRUE(want.ok()) << want.status().message();
    Result<Tensor> want_host = gpu_->download(want.value());
    ASSERT_TRUE(want_host.ok()) << want_host.status().message();
    EXPECT_TRUE(close("fused conv3d_frames 4+2 frames 96->96 +bias +residual, SiLU", got,
                      on_cpu(want_host.value()), conv_tol()));
  }
}

TEST_P(CudaOps, ConvPlanCacheReuse) {
  // The second call reuses the cached plan; results agree with the reference each time.
  for (int i = 0; i < 2; ++i)
    check_conv("conv 3x3 [1,64,32,32] (cached plan, call " + std::to_string(i + 1) + ")",
               {1, 64, 32, 32}, 64, 3, Conv2dParams::same(3), true, false, Activation::kNone, 500);
}

TEST_P(CudaOps, GroupNorm) {
  struct Case {
    Shape shape;
    int groups;
    bool affine;
    Activation act;
    float offset;
  };
  const Case cases[] = {
      {{1, 512, 64, 64}, 32, true, Activation::kNone, 0.f},
      {{1, 512, 64, 64}, 32, true, Activation::kSiLU, 0.f},
      {{1, 128, 128, 128}, 32, true, Activation::kSiLU, 0.f},
      {{2, 64, 17, 19}, 32, false, Activation::kNone, 0.f},
      {{1, 256, 32, 32}, 32, true, Activation::kNone, 8.f},  // mean far from 0: Welford holds
      {{1, 12, 9, 7}, 3, true, Activation::kSiLU, 0.f},      // channels not a multiple of 8
  };
  uint64_t seed = 600;
  for (const Case& c : cases) {
    Tensor x = input(c.shape, seed++, -1.f + c.offset, 1.f + c.offset);
    Tensor g = c.affine ? input({c.shape[1]}, seed++, 0.5f, 1.5f) : Tensor();
    Tensor b = c.affine ? input({c.shape[1]}, seed++) : Tensor();
    Result<Tensor> got = gpu_->group_norm(on_gpu(x), c.groups, on_gpu(g), on_gpu(b), 1e-6f, c.act);
    Result<Tensor> want = cpu_->group_norm(on_cpu(x), c.groups, on_cpu(g), on_cpu(b), 1e-6f, c.act);
    EXPECT_TRUE(
        close(str_cat("group_norm ", shape_str(c.shape), " g", c.groups, c.affine ? " affine" : "",
                      c.act == Activation::kSiLU ? " SiLU" : "", c.offset != 0.f ? " offset" : ""),
              got, want, tol()));
  }
}

TEST_P(CudaOps, RmsNormChannels) {
  struct Case {
    Shape shape;
    bool gamma, beta;
    Activation act;
  };
  const Case cases[] = {
      {{1, 384, 32, 32}, true, false, Activation::kNone},
      {{1, 384, 32, 32}, true, true, Activation::kSiLU},
      {{1, 96, 64, 64}, false, false, Activation::kNone},
      // Lanes a pixel (at most 3 packs a lane by default): the last warp of pixels partly
      // filled (17 x 23 pixels), one lane a pixel (8 channels), 32 lanes (768 bf16 channels; fp32:
      // 192 packs, the warp-a-pixel kernel), 1,024 bf16 channels (128 packs: 4 a lane on 32 lanes
      // is over the default, so the warp-a-pixel kernel), 7 packs (no power of two divides them:
      // the warp-a-pixel kernel).
      {{1, 192, 17, 23}, true, true, Activation::kSiLU},
      {{3, 8, 9, 5}, true, false, Activation::kSiLU},
      {{1, 768, 4, 4}, true, true, Activation::kSiLU},
      {{1, 1024, 4, 4}, true, true, Activation::kNone},
      {{1, 56, 7, 7}, true, true, Activation::kSiLU},
      {{2, 12, 5, 7}, true, true, Activation::kSiLU},  // channels not a multiple of 8
  };
  uint64_t seed = 700;
  for (const Case& c : cases) {
    Tensor x = input(c.shape, seed++);
    Tensor g = c.gamma ? input({c.shape[1]}, seed++, 0.5f, 1.5f) : Tensor();
    Tensor b = c.beta ? input({c.shape[1]}, seed++) : Tensor();
    Result<Tensor> got = gpu_->rms_norm_channels(on_gpu(x), on_gpu(g), on_gpu(b), c.act);
    Result<Tensor> want = cpu_->rms_norm_channels(on_cpu(x), on_cpu(g), on_cpu(b), c.act);
    EXPECT_TRUE(close(str_cat("rms_norm_channels ", shape_str(c.shape), c.gamma ? " gamma" : "",
                              c.beta ? " beta" : "", c.act == Activation::kSiLU ? " SiLU" : ""),
                      got, want, tol()));
  }
}

TEST_P(CudaOps, Activations) {
  const std::pair<Activation, const char*> acts[] = {{Activation::kNone, "none"},
                                                     {Activation::kSiLU, "silu"},
                                                     {Activation::kReLU, "relu"},
                                                     {Activation::kGELU, "gelu"},
                                                     {Activation::kTanh, "tanh"}};
  uint64_t seed = 800;
  for (const Shape& s : {Shape{1, 64, 32, 32}, Shape{37}}) {
    for (const auto& [act, name] : acts) {
      Tensor x = input(s, seed++, -4.f, 4.f);
      EXPECT_TRUE(close(str_cat("activation ", name, " ", shape_str(s)),
                        gpu_->activation(on_gpu(x), act), cpu_->activation(on_cpu(x), act), tol()));
    }
  }
}

TEST_P(CudaOps, AddAffineClamp) {
  for (const Shape& s : {Shape{1, 128, 64, 64}, Shape{1, 3, 5, 7}, Shape{29}}) {
    Tensor a = input(s, 900), b = input(s, 901), x = input(s, 902, -3.f, 3.f);
    EXPECT_TRUE(close(str_cat("add ", shape_str(s)), gpu_->add(on_gpu(a), on_gpu(b)),
                      cpu_->add(on_cpu(a), on_cpu(b)), tol()));
    EXPECT_TRUE(close(str_cat("affine ", shape_str(s)), gpu_->affine(on_gpu(x), 0.5f, 0.25f),
                      cpu_->affine(on_cpu(x), 0.5f, 0.25f), tol()));
    EXPECT_TRUE(close(str_cat("clamp ", shape_str(s)), gpu_->clamp(on_gpu(x), -1.f, 1.f),
                      cpu_->clamp(on_cpu(x), -1.f, 1.f), tol()));
  }
}

TEST_P(CudaOps, ChannelAffine) {
  uint64_t seed = 1000;
  for (const Shape& s : {Shape{1, 16, 64, 64}, Shape{2, 3, 9, 11}, Shape{1, 48, 8, 8}}) {
    Tensor x = input(s, seed++);
    std::vector<float> scale = random_tensor({s[1]}, seed++, 0.5f, 2.f).to_floats();
    std::vector<float> shift = random_tensor({s[1]}, seed++).to_floats();
    EXPECT_TRUE(close(str_cat("channel_affine ", shape_str(s)),
                      gpu_->channel_affine(on_gpu(x), scale, shift),
                      cpu_->channel_affine(on_cpu(x), scale, shift), tol()));
  }
}

TEST_P(CudaOps, UpsampleAndSlice) {
  for (const Shape& s : {Shape{1, 128, 32, 48}, Shape{1, 3, 5, 7}, Shape{2, 5, 4, 3}}) {
    Tensor x = input(s, 1100);
    // Moves values unchanged: exact.
    EXPECT_TRUE(close(str_cat("upsample_nearest2x ", shape_str(s)),
                      gpu_->upsample_nearest2x(on_gpu(x)), cpu_->upsample_nearest2x(on_cpu(x)),
                      1e-7));
  }
  Tensor x = input({1, 32, 16, 24}, 1101);
  const std::pair<int64_t, int64_t> slices[] = {{0, 16}, {16, 16}, {8, 8}, {3, 5}, {31, 1}};
  for (const auto& [start, count] : slices)
    EXPECT_TRUE(close(str_cat("slice_channels [", start, ", ", start + count, ") of 32"),
                      gpu_->slice_channels(on_gpu(x), start, count),
                      cpu_->slice_channels(on_cpu(x), start, count), 1e-7));
}

// interleave_phases2x moves values unchanged (exact), at widths that take each access width;
// an upsampling convolution as phases on the GPU against the upsample and the 3x3 convolution
// on the CPU, at the shapes of the models' upsamplers (Wan 2.1's 192 -> 96 and 384 -> 192,
// FLUX.1's 512 -> 512, TAESD's 64 -> 64 without bias, with the ReLU TAEHV folds in) and odd
// ones.
TEST_P(CudaOps, UpsampleConvAsPhases) {
  for (const Shape& s :
       {Shape{1, 384, 9, 16}, Shape{2, 12, 5, 4}, Shape{1, 4, 3, 2}, Shape{1, 20, 6, 7}}) {
    Tensor z = input(s, 1150);
    EXPECT_TRUE(close(str_cat("interleave_phases2x ", shape_str(s)),
                      gpu_->interleave_phases2x(on_gpu(z)), cpu_->interleave_phases2x(on_cpu(z)),
                      1e-7));
  }
  struct Case {
    Shape x;
    int64_t cout;
    bool bias;
    Activation act;
  };
  const Case cases[] = {{{1, 192, 45, 80}, 96, true, Activation::kNone},
                        {{1, 384, 23, 40}, 192, true, Activation::kNone},
                        {{1, 512, 16, 16}, 512, true, Activation::kNone},
                        {{1, 64, 33, 40}, 64, false, Activation::kNone},
                        {{1, 64, 17, 30}, 64, false, Activation::kReLU},
                        {{2, 8, 5, 7}, 3, true, Activation::kSiLU}};
  uint64_t seed = 1160;
  for (const Case& c : cases) {
    const float ws = 1.f / std::sqrt(static_cast<float>(c.x[1] * 9));
    Tensor x = input(c.x, seed++);
    Tensor w = input({c.cout, c.x[1], 3, 3}, seed++, -ws, ws);
    Tensor b = c.bias ? input({c.cout}, seed++) : Tensor();
    // The way the models take (auto: phases from 128 input channels on a GPU) and phases.
    Result<UpsampleConv> chosen = make_upsample_conv(*gpu_, w, b);
    Result<UpsampleConv> phases = make_upsample_conv(*gpu_, w, b, UpsampleConvWay::kPhases);
    ASSERT_TRUE(chosen.ok()) << chosen.status().message();
    ASSERT_TRUE(phases.ok()) << phases.status().message();
    EXPECT_EQ(chosen->phases, c.x[1] >= 128) << shape_str(c.x);
    EXPECT_TRUE(phases->phases);
    Result<Tensor> up = cpu_->upsample_nearest2x(on_cpu(x));
    ASSERT_TRUE(up.ok()) << up.status().message();
    const Result<Tensor> want =
        cpu_->conv2d(*up, on_cpu(w), on_cpu(b), Conv2dParams::same(3), Tensor(), c.act);
    for (const UpsampleConv* conv : {&chosen.value(), &phases.value()})
      EXPECT_TRUE(close(str_cat("upsampling conv ", shape_str(c.x), " -> ", c.cout,
                                conv->phases ? " as phases" : " upsampled"),
                        (*conv)(*gpu_, on_gpu(x), c.act), want, conv_tol()));
  }
}

TEST_P(CudaOps, SpatialAttention) {
  check_attention("attention [1,512,64,64] 1 head (d 512)", *gpu_, {1, 512, 64, 64}, 1, 1200);
  check_attention("attention [1,384,32,32] 1 head (d 384)", *gpu_, {1, 384, 32, 32}, 1, 1210);
  check_attention("attention [1,128,15,17] 2 heads (d 64, T 255)", *gpu_, {1, 128, 15, 17}, 2,
                  1220);
  check_attention("attention [2,256,9,11] 2 heads (d 128, N 2)", *gpu_, {2, 256, 9, 11}, 2, 1230);
  check_attention("attention [1,192,10,10] 1 head (d 192)", *gpu_, {1, 192, 10, 10}, 1, 1240);
  check_attention("attention [1,96,12,12] 1 head (d 96)", *gpu_, {1, 96, 12, 12}, 1, 1250);
}

TEST_P(CudaOps, SpatialAttentionCudaCoreKernel) {
  if (dtype() == DType::kF32) GTEST_SKIP() << "fp32 always runs the CUDA-core kernel";
  std::shared_ptr<Backend> simple = poisoned_cuda_backend(dtype(), /*simple_attention=*/true);
  ASSERT_TRUE(simple);
  check_attention("attention (CUDA cores) [1,512,32,32] d 512", *simple, {1, 512, 32, 32}, 1, 1300);
  check_attention("attention (CUDA cores) [1,384,16,16] d 384", *simple, {1, 384, 16, 16}, 1, 1310);
  check_attention("attention (CUDA cores) [1,128,7,9] 4 heads", *simple, {1, 128, 7, 9}, 4, 1320);
}

TEST_P(CudaOps, SpatialAttentionEveryKernel) {
  // Token counts off every tile size (16, 32, 64, 128 queries; 32 or 64 keys), each variant
  // (fp32 has one kernel, whatever is forced).
  const std::vector<const char*> kernels =
      dtype() == DType::kF32 ? std::vector<const char*>{"mma"} : kAttentionKernels;
  for (const char* kernel : kernels) {
    setenv("LATENT_ATTENTION_KERNEL", kernel, 1);
    const std::string tag = std::string(" [") + kernel + "]";
    check_attention("attention [1,128,33,35] 1 head (d 128, T 1155)" + tag, *gpu_, {1, 128, 33, 35},
                    1, 1700);
    check_attention("attention [2,256,9,11] 2 heads (d 128, N 2)" + tag, *gpu_, {2, 256, 9, 11}, 2,
                    1710);
    check_attention("attention [1,128,15,17] 2 heads (d 64, T 255)" + tag, *gpu_, {1, 128, 15, 17},
                    2, 1720);
    check_attention("attention [1,512,20,21] 1 head (d 512, T 420)" + tag, *gpu_, {1, 512, 20, 21},
                    1, 1730);
    check_attention("attention [1,256,13,19] 1 head (d 256, T 247)" + tag, *gpu_, {1, 256, 13, 19},
                    1, 1740);
    unsetenv("LATENT_ATTENTION_KERNEL");
  }
}

TEST_P(CudaOps, SpatialAttentionVaeSized) {
  // The mid-block of a 1080p decode: T = 136 * 240 = 32,640 tokens (the latent of 1088 x 1920),
  // one head of 512; and one head of 128 at the same length (d <= 128 configurations).
  const bool f32 = dtype() == DType::kF32;  // one kernel, whatever is forced
  check_attention_sampled(
      "attention [1,512,136,240] 1 head (d 512)", {1, 512, 136, 240}, 1, 1800,
      f32 ? std::vector<const char*>{"mma"} : std::vector<const char*>{"mma", "simple", "gemm"});
  // The Wan / Qwen-Image VAE's mid-block at 720p (d 384), two images: the unfused path's chunks
  // and its per-image transposed v.
  check_attention_sampled(
      "attention [2,384,90,160] 1 head (d 384)", {2, 384, 90, 160}, 1, 1820,
      f32 ? std::vector<const char*>{"mma"} : std::vector<const char*>{"mma", "gemm"});
  check_attention_sampled("attention [1,128,136,240] 1 head (d 128)", {1, 128, 136, 240}, 1, 1810,
                          f32 ? std::vector<const char*>{"mma"} : kAttentionKernels);
}

TEST_P(CudaOps, SteadyStateAllocatesNothing) {
  Tensor x = on_gpu(input({1, 128, 64, 64}, 1400));
  Tensor w = on_gpu(input({128, 128, 3, 3}, 1401, -0.03f, 0.03f));
  Tensor g = on_gpu(input({128}, 1402)), b = on_gpu(input({128}, 1403));
  auto step = [&]() {
    Result<Tensor> y = gpu_->group_norm(x, 32, g, b, 1e-6f, Activation::kSiLU);
    ASSERT_TRUE(y.ok()) << y.status().message();
    Result<Tensor> z = gpu_->conv2d(y.value(), w, b, Conv2dParams::same(3), x);
    ASSERT_TRUE(z.ok()) << z.status().message();
  };
  for (int i = 0; i < 3; ++i) step();
  ASSERT_TRUE(gpu_->synchronize().ok());
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  for (int i = 0; i < 20; ++i) step();
  ASSERT_TRUE(gpu_->synchronize().ok());
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_EQ(free_before, free_after) << "device memory changed in steady state";
}

TEST_P(CudaOps, SupportsAndRejects) {
  for (int op = 0; op <= static_cast<int>(OpKind::kInterleavePhases2x); ++op) {
    EXPECT_TRUE(gpu_->supports(static_cast<OpKind>(op), dtype()))
        << op_name(static_cast<OpKind>(op));
    EXPECT_FALSE(gpu_->supports(static_cast<OpKind>(op),
                                dtype() == DType::kF32 ? DType::kBF16 : DType::kF32));
    // With the shape: rank 4, positive sizes, each within the 32-bit sizes of cuDNN.
    EXPECT_TRUE(gpu_->supports(static_cast<OpKind>(op), dtype(), Shape{1, 8, 16, 16}));
    EXPECT_FALSE(gpu_->supports(static_cast<OpKind>(op), dtype(), Shape{1, 8, 0, 16}));
    EXPECT_FALSE(gpu_->supports(static_cast<OpKind>(op), dtype(), Shape{8, 16, 16}));
    EXPECT_FALSE(
        gpu_->supports(static_cast<OpKind>(op), dtype(), Shape{1, 1, int64_t{1} << 32, 1}));
  }
  Tensor host = input({1, 8, 4, 4}, 1500);
  Result<Tensor> r = gpu_->activation(host, Activation::kSiLU);  // a host tensor
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("upload"), std::string::npos) << r.status().message();
  Tensor x = on_gpu(host);
  Tensor w = on_gpu(input({8, 4, 3, 3}, 1501));  // 4 input channels, x has 8
  r = gpu_->conv2d(x, w, Tensor(), Conv2dParams::same(3));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("input channels"), std::string::npos) << r.status().message();
  r = gpu_->group_norm(x, 3, Tensor(), Tensor(), 1e-6f);
  EXPECT_FALSE(r.ok());
  r = gpu_->spatial_attention(x, x, x, 3);
  EXPECT_FALSE(r.ok());
  r = gpu_->slice_channels(x, 6, 4);
  EXPECT_FALSE(r.ok());
  r = gpu_->channel_affine(x, {1.f}, {0.f});
  EXPECT_FALSE(r.ok());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

TEST(CudaBackend, ErrorsNameTheDevice) {
  const int count = cuda_runtime_device_count();
  ASSERT_GT(count, 0);
  Result<std::shared_ptr<Backend>> r = create_cuda_backend(count + 3, DType::kBF16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(str_cat("cuda:", count + 3)), std::string::npos)
      << r.status().message();
}

// LATENT_CONV_WGMMA_TILE's names (what ConvWgmmaShapes forces) and refused ones.
TEST(CudaBackend, ConvWgmmaTileNames) {
  struct Want {
    const char* text;
    int mt, bn, wg, stages;
  };
  for (const Want& w : {Want{"", 1, 0, 2, 4}, Want{"128x96", 1, 96, 2, 4},
                        Want{"256x128", 2, 128, 2, 4}, Want{"256x96w4", 1, 96, 4, 4},
                        Want{"256x64w4s5", 1, 64, 4, 5}, Want{"128x256", 1, 256, 2, 4}}) {
    Result<cuda::ConvWgmmaTile> t = cuda::parse_conv_wgmma_tile(w.text);
    ASSERT_TRUE(t.ok()) << w.text << ": " << t.status().message();
    EXPECT_EQ(t.value().mt, w.mt) << w.text;
    EXPECT_EQ(t.value().bn, w.bn) << w.text;
    EXPECT_EQ(t.value().wg, w.wg) << w.text;
    EXPECT_EQ(t.value().stages, w.stages) << w.text;
    EXPECT_FALSE(t.value().halo) << w.text;
  }
  Result<cuda::ConvWgmmaTile> halo = cuda::parse_conv_wgmma_tile("halo");
  ASSERT_TRUE(halo.ok()) << halo.status().message();
  EXPECT_TRUE(halo.value().halo);
  Result<cuda::ConvWgmmaTile> halo_tma = cuda::parse_conv_wgmma_tile("halotma");
  ASSERT_TRUE(halo_tma.ok()) << halo_tma.status().message();
  EXPECT_TRUE(halo_tma.value().halo_tma);
  Result<cuda::ConvWgmmaTile> implicit = cuda::parse_conv_wgmma_tile("implicit");
  ASSERT_TRUE(implicit.ok()) << implicit.status().message();
  EXPECT_TRUE(implicit.value().no_halo);
  Result<cuda::ConvWgmmaTile> strip = cuda::parse_conv_wgmma_tile("strip64");
  ASSERT_TRUE(strip.ok()) << strip.status().message();
  EXPECT_TRUE(strip.value().strip64);
  Result<cuda::ConvWgmmaTile> strip_staged = cuda::parse_conv_wgmma_tile("strip64s");
  ASSERT_TRUE(strip_staged.ok()) << strip_staged.status().message();
  EXPECT_TRUE(strip_staged.value().strip64_staged);
  Result<cuda::ConvWgmmaTile> r4s2 = cuda::parse_conv_wgmma_tile("halotmar4s2");
  ASSERT_TRUE(r4s2.ok()) << r4s2.status().message();
  EXPECT_TRUE(r4s2.value().halo_tma);
  EXPECT_EQ(r4s2.value().halo_rows, 4);
  EXPECT_EQ(r4s2.value().halo_stages, 2);
  EXPECT_FALSE(implicit.value().halo_tma);
  for (const char* bad :
       {"256x192w4", "128x96w4", "256x96w5", "96", "128x80", "halo2", "halotmar3", "halotmas5"}) {
    Result<cuda::ConvWgmmaTile> t = cuda::parse_conv_wgmma_tile(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find(bad), std::string::npos) << t.status().message();
  }
}

TEST(CudaBackend, WrongDtypeIsRejected) {
  std::shared_ptr<Backend> bf16 = poisoned_cuda_backend(DType::kBF16),
                           fp32 = poisoned_cuda_backend(DType::kF32);
  ASSERT_TRUE(bf16 && fp32);
  Result<Tensor> t = fp32->upload(random_tensor({1, 8, 4, 4}, 1600));
  ASSERT_TRUE(t.ok()) << t.status().message();
  Result<Tensor> r = bf16->activation(t.value(), Activation::kReLU);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos) << r.status().message();
  EXPECT_EQ(bf16->name(), "cuda:0");
}

}  // namespace
}  // namespace latent

#endif  // LATENT_HAVE_CUDA
