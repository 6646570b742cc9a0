// Video mode of the Wan 2.1 / Qwen-Image and Wan 2.2 VAEs on the CUDA backend against the video
// fixtures (scripts/make_video_fixtures.py): fp32 within 1e-3 relative L2 (TF32 off); bf16 within
// 1e-2, or 1.25x of diffusers' own bf16 error where that is larger (`*_bf16` in the fixture).
// Streaming frame by frame equals the whole clip, and the device memory of a stream does not grow
// with the clip's length. Also the video ops (clip_to_frames, frames_to_clip, concat of NHWC
// frames) against the CPU backend. Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#ifdef LATENT_HAVE_CUDA
#include "engine/backends/cuda/cuda_backend.h"  // a backend of its own for the fallback test
#endif
#include "engine/backends/registry.h"
#include "engine/models/vae/planned_vae.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

const bool kSkipWithoutGpu = (test::exit_without_gpu("test_cuda_video_vae"), true);
// fp32 against diffusers' fp32 at 1e-3: exact convolutions (read when a backend is created).
const bool kNoTf32 = (setenv("LATENT_CUDA_TF32", "0", 1), true);

std::shared_ptr<Backend> cuda(const std::string& dtype) {
  auto b = get_backend(BackendOptions{"cuda", dtype});
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : nullptr;
}

Tensor host_of(Backend& b, const Result<Tensor>& t) {
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok() || !t->defined()) return Tensor();
  auto h = b.download(*t);
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : Tensor();
}

struct Param {
  const char* fixture;
  const char* file;  // "" = the folder
  const char* dtype;
  const char* io_fixture = nullptr;  // where io.safetensors is (null: `fixture`)
};

std::string io_path(const Param& p) {
  return test::fixtures_dir() + "/" + (p.io_fixture ? p.io_fixture : p.fixture) + "/io.safetensors";
}

class CudaVideo : public testing::TestWithParam<Param> {};

TEST_P(CudaVideo, MatchesDiffusers) {
  const Param& p = GetParam();
  const std::string dir = test::fixtures_dir() + "/" + p.fixture;
  auto backend = cuda(p.dtype);
  ASSERT_TRUE(backend);
  auto model = load_vae(std::string(p.file).empty() ? dir : dir + "/" + p.file, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(io_path(p));
  ASSERT_TRUE(io.ok()) << io.status().message();
  Backend& b = *backend;
  struct Dir {
    const char* in;
    const char* out;
    bool enc;
  };
  for (Dir d : {Dir{"sample", "latent_mean", true}, Dir{"latent", "decoded", false},
                Dir{"sample_odd", "latent_mean_odd", true}}) {
    auto in = (*io)->tensor(d.in);
    auto want = (*io)->tensor(d.out);
    ASSERT_TRUE(in.ok() && want.ok());
    auto x = b.upload(*in);
    ASSERT_TRUE(x.ok()) << x.status().message();
    Tensor got = host_of(b, d.enc ? (*model)->encode_video(*x) : (*model)->decode_video(*x));
    ASSERT_TRUE(got.defined());
    ASSERT_EQ(shape_str(got.shape()), shape_str(want->shape()));
    const double err = relative_l2(got, *want);
    double tol = 1e-3;
    if (std::string(p.dtype) == "bf16") {
      auto ref = (*io)->tensor(std::string(d.out) + "_bf16");
      ASSERT_TRUE(ref.ok()) << ref.status().message();
      tol = std::max(1e-2, 1.25 * relative_l2(*ref, *want));
    }
    std::printf("%-28s %-16s %s rel L2 %.3e (tolerance %.3e)\n", p.fixture, d.out, p.dtype, err,
                tol);
    EXPECT_LT(err, tol) << p.fixture << " " << d.out << " " << p.dtype;
  }
}

// Frame by frame through a stream equals the whole clip in one push (same backend and dtype).
TEST_P(CudaVideo, StreamingEqualsWholeClip) {
  const Param& p = GetParam();
  const std::string dir = test::fixtures_dir() + "/" + p.fixture;
  auto backend = cuda(p.dtype);
  ASSERT_TRUE(backend);
  auto model = load_vae(std::string(p.file).empty() ? dir : dir + "/" + p.file, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(io_path(p));
  ASSERT_TRUE(io.ok());
  Backend& b = *backend;
  for (bool enc : {true, false}) {
    auto in = (*io)->tensor(enc ? "sample" : "latent");
    ASSERT_TRUE(in.ok());
    auto x = b.upload(*in);
    ASSERT_TRUE(x.ok());
    Tensor whole = host_of(b, enc ? (*model)->encode_video(*x) : (*model)->decode_video(*x));
    auto stream = (*model)->open_stream(enc);
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    std::vector<Tensor> parts;
    for (int64_t t = 0; t < x->dim(2); ++t) {
      auto frame = b.slice(*x, 2, t, 1);
      ASSERT_TRUE(frame.ok()) << frame.status().message();
      auto y = (*stream)->push(*frame);
      ASSERT_TRUE(y.ok()) << y.status().message();
      if (y->defined()) parts.push_back(*y);
    }
    auto joined = b.concat(parts, 2);
    Tensor streamed = host_of(b, joined);
    ASSERT_EQ(shape_str(streamed.shape()), shape_str(whole.shape()));
    const double err = relative_l2(streamed, whole);
    const double tol = std::string(p.dtype) == "bf16" ? 1e-2 : 1e-4;
    EXPECT_LT(err, tol) << p.fixture << (enc ? " encoder" : " decoder") << " frame by frame";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaVideo,
    testing::Values(Param{"wan_vae_video_tiny", "", "bf16"},
                    Param{"wan_vae_video_tiny", "", "fp32"},
                    Param{"wan_vae_video_tiny_single", "vae_single.safetensors", "bf16"},
                    Param{"qwen_image_vae_video_tiny", "", "bf16"},
                    Param{"qwen_image_vae_video_tiny", "", "fp32"},
                    // Wan 2.2: residual blocks, 2x2 patches (NHWC
                    // pack_latents / unpack_latents)
                    Param{"wan22_vae_video_tiny", "", "bf16"},
                    Param{"wan22_vae_video_tiny", "", "fp32"},
                    Param{"wan22_vae_video_tiny_single", "vae_single.safetensors", "fp32",
                          "wan22_vae_video_tiny"}),
    [](const testing::TestParamInfo<Param>& i) {
      std::string n = std::string(i.param.fixture) + "_" + i.param.dtype;
      return n;
    });

// Frame 0 of a host clip [1, C, T, H, W] as an image [1, C, H, W].
Tensor first_frame(const Tensor& clip) {
  const int64_t c = clip.dim(1), t = clip.dim(2), hw = clip.dim(3) * clip.dim(4);
  const std::vector<float> src = clip.to_floats();
  Tensor out = Tensor::empty({1, c, clip.dim(3), clip.dim(4)}, DType::kF32);
  for (int64_t i = 0; i < c; ++i)
    std::copy(src.begin() + i * t * hw, src.begin() + (i * t + 1) * hw,
              out.data_as<float>() + i * hw);
  return out;
}

// Image mode of the Wan 2.2 VAE (a frame is a one-frame clip: diffusers' frame 0 / latent frame
// 0), plain and captured as a CUDA graph (the 2x2 patches through pack_latents /
// unpack_latents, the AvgDown3D / DupUp3D convolutions).
TEST(CudaVideoStream, Wan22ImageModeAndGraph) {
  auto backend = cuda("fp32");
  ASSERT_TRUE(backend);
  const std::string dir = test::fixtures_dir() + "/wan22_vae_video_tiny";
  auto model = load_vae(dir, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  Backend& b = *backend;
  VaeModel& m = **model;
  struct Dir {
    const char* in;
    const char* out;
    VaePart part;
  };
  for (Dir d : {Dir{"sample", "latent_mean", VaePart::kEncode},
                Dir{"latent", "decoded", VaePart::kDecode}}) {
    const Tensor in = first_frame(*(*io)->tensor(d.in));
    const Tensor want = first_frame(*(*io)->tensor(d.out));
    auto x = b.upload(in);
    ASSERT_TRUE(x.ok()) << x.status().message();
    Tensor plain = host_of(b, d.part == VaePart::kEncode ? m.encode(*x) : m.decode(*x));
    ASSERT_EQ(shape_str(plain.shape()), shape_str(want.shape()));
    EXPECT_LT(relative_l2(plain, want), 1e-3) << d.out;
    PlanOptions options;
    options.require_graph = b.supports_capture();
    auto plan = PlannedPart::build(m, d.part, *x, options);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    Tensor replay = host_of(b, (*plan)->run(*x));
    ASSERT_EQ(shape_str(replay.shape()), shape_str(want.shape()));
    EXPECT_LT(relative_l2(replay, plain), 1e-5) << d.out << " (graph replay)";
  }
}

// Peak device memory of a stream after 50 and after 500 frames: the same (caches are two frames
// a layer, chunks are freed as they go).
TEST(CudaVideoStream, DeviceMemoryDoesNotGrowWithClipLength) {
  auto backend = cuda("bf16");
  ASSERT_TRUE(backend);
  auto model = load_vae(test::fixtures_dir() + "/wan_vae_video_tiny", backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Backend& b = *backend;
  auto frames = b.upload(test::random_tensor({1, 3, 5, 64, 64}, 3));
  auto latent = b.upload(test::random_tensor({1, 16, 1, 8, 8}, 4));
  ASSERT_TRUE(frames.ok() && latent.ok());
  for (bool enc : {true, false}) {
    auto stream = (*model)->open_stream(enc);
    ASSERT_TRUE(stream.ok());
    int64_t done = 0;
    auto run_to = [&](int64_t n) {
      while (done < n) {
        auto y = (*stream)->push(enc ? *frames : *latent);
        ASSERT_TRUE(y.ok()) << y.status().message();
        done += enc ? 5 : (y->defined() ? y->dim(2) : 0);
      }
      ASSERT_TRUE(b.synchronize().ok());
    };
    b.reset_peak_memory();
    run_to(50);
    const int64_t peak_50 = b.peak_memory_bytes();
    b.reset_peak_memory();
    run_to(500);
    const int64_t peak_500 = b.peak_memory_bytes();
    std::printf("%s stream: peak device memory %lld bytes over frames 0-50, %lld over 50-500\n",
                enc ? "encoder" : "decoder", static_cast<long long>(peak_50),
                static_cast<long long>(peak_500));
    ASSERT_GT(peak_50, 0);
    EXPECT_LE(peak_500, peak_50 + peak_50 / 20) << (enc ? "encoder" : "decoder");
  }
}

// The video ops against the CPU backend: values move unchanged.
TEST(CudaVideoOps, ClipFramesRoundTripAndConcat) {
  auto cpu = get_backend(BackendOptions{"cpu", "fp32"});
  ASSERT_TRUE(cpu.ok());
  // 5 channels: the transposes' short-side kernel (RGB frames); 40: the 32 x 32 tiles.
  for (const char* dtype : {"fp32", "bf16"})
    for (int64_t ch : {5, 40}) {
      SCOPED_TRACE(str_cat(dtype, ", ", ch, " channels"));
      auto gpu = cuda(dtype);
      ASSERT_TRUE(gpu);
      // bf16-exact values so both dtypes compare exactly.
      Tensor host =
          test::random_tensor({1, ch, 3, 6, 7}, 11).to_dtype(DType::kBF16).to_dtype(DType::kF32);
      auto c_in = (*cpu)->upload(host);
      auto g_in = gpu->upload(host);
      ASSERT_TRUE(c_in.ok() && g_in.ok());
      auto c_frames = (*cpu)->clip_to_frames(*c_in);
      auto g_frames = gpu->clip_to_frames(*g_in);
      ASSERT_TRUE(c_frames.ok()) << c_frames.status().message();
      ASSERT_TRUE(g_frames.ok()) << g_frames.status().message();
      EXPECT_EQ(shape_str(g_frames->shape()), str_cat("[3, ", ch, ", 6, 7]"));
      EXPECT_EQ(relative_l2(host_of(*gpu, *g_frames), host_of(**cpu, *c_frames)), 0.0) << dtype;
      // frames joined along dim 0 (NHWC on the GPU), then back to a clip
      auto g_cat = gpu->concat({*g_frames, *g_frames}, 0);
      auto c_cat = (*cpu)->concat({*c_frames, *c_frames}, 0);
      ASSERT_TRUE(g_cat.ok()) << g_cat.status().message();
      ASSERT_TRUE(c_cat.ok());
      EXPECT_EQ(relative_l2(host_of(*gpu, *g_cat), host_of(**cpu, *c_cat)), 0.0) << dtype;
      auto g_clip = gpu->frames_to_clip(*g_cat);
      auto c_clip = (*cpu)->frames_to_clip(*c_cat);
      ASSERT_TRUE(g_clip.ok()) << g_clip.status().message();
      ASSERT_TRUE(c_clip.ok());
      EXPECT_EQ(shape_str(g_clip->shape()), str_cat("[1, ", ch, ", 6, 6, 7]"));
      EXPECT_EQ(relative_l2(host_of(*gpu, *g_clip), host_of(**cpu, *c_clip)), 0.0) << dtype;
      // a clip round trip gives the input back
      auto back = gpu->frames_to_clip(*g_frames);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(relative_l2(host_of(*gpu, *back), host), 0.0) << dtype;
    }
}

// conv3d_frames (cuDNN 3-D convolution over NDHWC frames) against the CPU backend's (one conv2d
// per temporal tap), with bias, residual and SiLU, at tiny and VAE-sized shapes.
TEST(CudaVideoOps, Conv3dFramesMatchesCpu) {
  auto cpu = create_cpu_backend(DType::kF32);
  ASSERT_TRUE(cpu.ok());
  struct Shape3 {
    int64_t frames, cin, h, w, cout, k;
  };
  for (const char* dtype : {"fp32", "bf16"}) {
    auto gpu = cuda(dtype);
    ASSERT_TRUE(gpu);
    ASSERT_TRUE(gpu->supports_conv3d_frames()) << "LATENT_CUDA_CONV3D=0?";
    for (Shape3 s : {Shape3{6, 8, 10, 12, 16, 3}, Shape3{3, 8, 5, 7, 16, 1},
                     Shape3{6, 96, 64, 64, 96, 3}, Shape3{4, 384, 23, 40, 384, 3}}) {
      const Tensor x = test::random_tensor({s.frames, s.cin, s.h, s.w}, 21);
      const Tensor w = test::random_tensor({s.cout, s.cin, 3 * s.k, s.k}, 22, -0.05f, 0.05f);
      const Tensor bias = test::random_tensor({s.cout}, 23);
      const Tensor res = test::random_tensor({s.frames - 2, s.cout, s.h, s.w}, 24);
      const Conv2dParams p = Conv2dParams::same(static_cast<int>(s.k));
      Tensor want;
      {
        auto r =
            (*cpu)->conv3d_frames(*(*cpu)->upload(x), *(*cpu)->upload(w), 3, *(*cpu)->upload(bias),
                                  p, *(*cpu)->upload(res), Activation::kSiLU);
        ASSERT_TRUE(r.ok()) << r.status().message();
        want = host_of(**cpu, r);
      }
      auto r = gpu->conv3d_frames(*gpu->upload(x), *gpu->upload(w), 3, *gpu->upload(bias), p,
                                  *gpu->upload(res), Activation::kSiLU);
      ASSERT_TRUE(r.ok()) << r.status().message();
      const Tensor got = host_of(*gpu, r);
      ASSERT_EQ(shape_str(got.shape()), shape_str(want.shape()));
      const double err = relative_l2(got, want);
      const double tol = std::string(dtype) == "bf16" ? 1e-2 : 1e-4;
      std::printf("conv3d_frames %s x[%lld, %lld, %lld, %lld] k %lld: rel L2 %.2e\n", dtype,
                  static_cast<long long>(s.frames), static_cast<long long>(s.cin),
                  static_cast<long long>(s.h), static_cast<long long>(s.w),
                  static_cast<long long>(s.k), err);
      EXPECT_LT(err, tol) << dtype << " cin " << s.cin << " k " << s.k;
    }
  }
}

#ifdef LATENT_HAVE_CUDA
// The fallback of conv3d_frames (one cuDNN 2-D convolution per tap over weights gathered from
// the 3-D kernel, what runs where cuDNN has no 3-D plan), forced with LATENT_CUDA_CONV3D=taps on
// a backend of its own: the op against the CPU, and a whole model against diffusers.
TEST(CudaVideoOps, Conv3dFramesFallbackMatches) {
  setenv("LATENT_CUDA_CONV3D", "taps", 1);
  auto gpu = create_cuda_backend(0, DType::kBF16);
  unsetenv("LATENT_CUDA_CONV3D");
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  auto cpu = create_cpu_backend(DType::kF32);
  ASSERT_TRUE(cpu.ok());
  const Tensor x = test::random_tensor({5, 16, 12, 10}, 31);
  const Tensor w = test::random_tensor({24, 16, 9, 3}, 32, -0.1f, 0.1f);
  const Tensor bias = test::random_tensor({24}, 33);
  auto want =
      (*cpu)->conv3d_frames(x, w, 3, bias, Conv2dParams::same(3), Tensor(), Activation::kSiLU);
  ASSERT_TRUE(want.ok()) << want.status().message();
  auto got = (*gpu)->conv3d_frames(*(*gpu)->upload(x), *(*gpu)->upload(w), 3, *(*gpu)->upload(bias),
                                   Conv2dParams::same(3), Tensor(), Activation::kSiLU);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_LT(relative_l2(host_of(**gpu, got), *want), 1e-2);

  const std::string dir = test::fixtures_dir() + "/wan_vae_video_tiny";
  auto model = load_vae(dir, *gpu);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok());
  auto x5 = (*gpu)->upload(*(*io)->tensor("sample"));
  ASSERT_TRUE(x5.ok());
  const Tensor lat = host_of(**gpu, (*model)->encode_video(*x5));
  const double tol = std::max(
      1e-2, 1.25 * relative_l2(*(*io)->tensor("latent_mean_bf16"), *(*io)->tensor("latent_mean")));
  EXPECT_LT(relative_l2(lat, *(*io)->tensor("latent_mean")), tol);
}

#endif  // LATENT_HAVE_CUDA

}  // namespace
}  // namespace latent
