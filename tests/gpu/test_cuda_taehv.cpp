// TAEW2.1 / TAEW2.2 on the CUDA backend against taehv.py (the taew2_*_tiny fixtures of
// scripts/make_taehv_fixtures.py): whole clips in bf16 and fp16 within 1e-2 relative L2 (or 1.25x
// taehv.py's own error in that dtype where that is larger), fp32 within 1e-3; streams in chunks
// equal to the whole clip; device memory constant with the clip's length (a full-size TAEW2.1
// with random weights). Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/backends/registry.h"
#include "engine/models/vae/vae.h"
#include "tests/util/taehv_test_util.h"
#include "tests/util/test_util.h"
#include "tests/util/vae_test_util.h"

namespace latent {
namespace {

const bool kSkipWithoutGpu = (test::exit_without_gpu("test_cuda_taehv"), true);

using namespace test;

struct Param {
  const char* dir;
  const char* file;
  const char* dtype;
};

std::shared_ptr<Backend> cuda(const std::string& dtype) {
  auto b = get_backend(BackendOptions{"cuda", dtype});
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : nullptr;
}

class CudaTaehv : public testing::TestWithParam<Param> {};

TEST_P(CudaTaehv, MatchesTaehvPyAndStreams) {
  const Param& p = GetParam();
  auto backend = cuda(p.dtype);
  ASSERT_TRUE(backend);
  const std::string dir = fixtures_dir() + "/" + p.dir;
  auto model = load_vae(dir + "/" + p.file, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = read_all(dir + "/io.safetensors");
  Backend& be = *backend;
  const std::string dtype = p.dtype;
  struct Dir {
    const char* in;
    const char* out;
    bool enc;
  };
  for (Dir d : {Dir{"sample", "latent_mean", true}, Dir{"latent", "decoded", false}}) {
    auto x = be.upload(io[d.in]);
    ASSERT_TRUE(x.ok()) << x.status().message();
    auto y = d.enc ? (*model)->encode_video(*x) : (*model)->decode_video(*x);
    ASSERT_TRUE(y.ok()) << y.status().message();
    Tensor got = *be.download(*y);
    const Tensor& want = io[d.out];
    ASSERT_EQ(got.shape(), want.shape());
    const double err = relative_l2(got, want);
    double tol = 1e-3;
    double ref_err = 0;
    if (dtype != "fp32") {
      ref_err = relative_l2(io[std::string(d.out) + "_" + dtype], want);
      tol = std::max(1e-2, 1.25 * ref_err);
    }
    std::printf("%-14s %-12s %-4s rel L2 %.3e (taehv.py %s %.3e, tolerance %.3e)\n", p.dir, d.out,
                p.dtype, err, p.dtype, ref_err, tol);
    EXPECT_LT(err, tol) << d.out;

    // The same clip through a stream in uneven chunks equals the whole clip.
    auto s = (*model)->open_stream(d.enc);
    ASSERT_TRUE(s.ok()) << s.status().message();
    Tensor chunked = run_chunked(
        **model, **s, io[d.in], d.enc ? std::vector<int64_t>{2, 3, 1} : std::vector<int64_t>{1, 2});
    ASSERT_TRUE(chunked.defined());
    ASSERT_EQ(chunked.shape(), got.shape());
    EXPECT_LT(relative_l2(chunked, got), 1e-6) << d.out << " streamed";
  }
  // Image mode: decode(latent frame 0) is the clip's frame 0.
  Tensor l0 = host_frames(io["latent"], 0, 1);
  auto l4 = l0.reshape({l0.dim(0), l0.dim(1), l0.dim(3), l0.dim(4)});
  auto img = (*model)->decode(*be.upload(*l4));
  ASSERT_TRUE(img.ok()) << img.status().message();
  EXPECT_LT(relative_l2(*be.download(*img), host_frames(io["decoded"], 0, 1)),
            dtype == "fp32" ? 1e-3 : 3e-2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTaehv,
                         testing::Values(Param{"taew2_1_tiny", "taew2_1.safetensors", "bf16"},
                                         Param{"taew2_1_tiny", "taew2_1.safetensors", "fp16"},
                                         Param{"taew2_1_tiny", "taew2_1.safetensors", "fp32"},
                                         Param{"taew2_2_tiny", "taew2_2.safetensors", "bf16"},
                                         Param{"taew2_2_tiny", "taew2_2.safetensors", "fp16"},
                                         Param{"taew2_2_tiny", "taew2_2.safetensors", "fp32"}),
                         [](const testing::TestParamInfo<Param>& p) {
                           return std::string(p.param.dir) + "_" + p.param.dtype;
                         });

// Full-size TAEW2.1 (random weights in the published layout) at 256x384: peak device memory of
// a stream does not grow from 8 to 40 frames (outputs dropped as they come, as an element does).
TEST(CudaTaehvMemory, PeakIsConstantWithClipLength) {
  auto backend = cuda("fp16");
  ASSERT_TRUE(backend);
  const nlohmann::json j = read_json(fixtures_dir() + "/taehv_published_shapes.json");
  std::map<std::string, Tensor> weights;
  uint64_t seed = 11;
  for (const auto& [name, shape] : j["models"]["taew2_1"].items()) {
    Shape s = shape.get<Shape>();
    int64_t fan_in = 1;
    for (size_t i = 1; i < s.size(); ++i) fan_in *= s[i];
    const float a = s.size() == 4 ? 1.f / std::sqrt(static_cast<float>(fan_in)) : 0.1f;
    weights[name] = random_tensor(s, seed++, -a, a).to_dtype(DType::kF16);
  }
  const std::string file = new_dir("cuda_taew2_1") + "/taew2_1.safetensors";
  write_all(file, weights);
  auto model = load_vae(file, backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  Backend& be = *backend;
  const Tensor frame = random_tensor({1, 3, 1, 256, 384}, 5);
  const Tensor latent = random_tensor({1, 16, 1, 32, 48}, 6);
  for (bool encoder : {true, false}) {
    std::vector<int64_t> peaks;
    for (int frames : {4, 8, 40}) {  // the first run plans the convolutions (cuDNN search)
      auto s = (*model)->open_stream(encoder);
      ASSERT_TRUE(s.ok());
      auto x = be.upload(encoder ? frame : latent);
      ASSERT_TRUE(x.ok());
      ASSERT_TRUE(be.synchronize().ok());
      be.reset_peak_memory();
      for (int i = 0; i < frames; ++i) {
        auto y = (*s)->push(*x);
        ASSERT_TRUE(y.ok()) << y.status().message();
      }
      ASSERT_TRUE((*s)->finish().ok());
      ASSERT_TRUE(be.synchronize().ok());
      peaks.push_back(be.peak_memory_bytes());
    }
    std::printf("%s 256x384: peak %.1f MiB after 8 frames, %.1f MiB after 40\n",
                encoder ? "encoder" : "decoder", peaks[1] / 1048576.0, peaks[2] / 1048576.0);
    EXPECT_LE(peaks[2], peaks[1] + (1 << 20)) << (encoder ? "encoder" : "decoder");
  }
}

}  // namespace
}  // namespace latent
