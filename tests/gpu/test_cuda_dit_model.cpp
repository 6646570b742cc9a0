// The Qwen-Image MMDiT on the CUDA backend against the diffusers fixtures of
// scripts/make_dit_fixtures.py (dit_qwen_image_tiny: text-to-image cases incl. a masked batch and
// two images in one sequence; dit_qwen_image_edit_tiny: zero_cond_t edit cases):
// fp32 within 1e-3 (TF32 matrix products: 3e-3), bf16 within 2e-2 relative L2.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backends/registry.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

const bool kSkipWithoutGpu = [] {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "test_cuda_dit_model: no CUDA device, skipping\n");
    std::exit(77);
  }
  return true;
}();

Tensor get(const SafetensorsFile& f, const std::string& name, bool optional = false) {
  auto t = f.tensor(name);
  if (!t.ok()) {
    if (!optional) ADD_FAILURE() << t.status().message();
    return Tensor();
  }
  return *t;
}

void check(const std::string& fixture, const std::vector<std::string>& cases, const std::string& dtype,
           double tolerance) {
  const std::string root = test::fixtures_dir() + "/" + fixture;
  auto backend = get_backend(BackendOptions{"cuda", dtype});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto model = QwenImageMmdit::load(root, *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(root + "/io_transformer.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  Backend& b = **backend;
  for (const std::string& c : cases) {
    SCOPED_TRACE(fixture + " " + c);
    MmditInputs in;
    auto hs = b.upload(get(**io, c + ".hidden_states"));
    auto ehs = b.upload(get(**io, c + ".encoder_hidden_states"));
    ASSERT_TRUE(hs.ok() && ehs.ok());
    in.hidden_states = *hs;
    in.encoder_hidden_states = *ehs;
    Tensor mask = get(**io, c + ".encoder_hidden_states_mask", true);
    if (mask.defined()) in.encoder_hidden_states_mask = mask.to_floats();
    in.timestep = get(**io, c + ".timestep").to_floats();
    std::vector<float> s = get(**io, c + ".img_shapes").to_floats();
    for (size_t i = 0; i + 2 < s.size(); i += 3)
      in.img_shapes.push_back({static_cast<int64_t>(s[i]), static_cast<int64_t>(s[i + 1]),
                               static_cast<int64_t>(s[i + 2])});
    auto y = (*model)->forward(in);
    ASSERT_TRUE(y.ok()) << y.status().message();
    auto host = b.download(*y);
    ASSERT_TRUE(host.ok()) << host.status().message();
    Tensor want = get(**io, c + ".sample");
    ASSERT_EQ(host->shape(), want.shape());
    const double err = relative_l2(*host, want);
    std::printf("%-26s %-13s %s rel L2 %.3e (tolerance %.0e)\n", fixture.c_str(), c.c_str(),
                dtype.c_str(), err, tolerance);
    EXPECT_LT(err, tolerance);
  }
}

TEST(CudaMmdit, TextToImageFp32) {
  check("dit_qwen_image_tiny", {"single", "masked_batch", "multi_image"}, "fp32", 3e-3);
}
TEST(CudaMmdit, TextToImageBf16) {
  check("dit_qwen_image_tiny", {"single", "masked_batch", "multi_image"}, "bf16", 2e-2);
}
TEST(CudaMmdit, ZeroCondTEditFp32) {
  check("dit_qwen_image_edit_tiny", {"edit", "edit_batch", "edit_single"}, "fp32", 3e-3);
}
TEST(CudaMmdit, ZeroCondTEditBf16) {
  check("dit_qwen_image_edit_tiny", {"edit", "edit_batch", "edit_single"}, "bf16", 2e-2);
}

}  // namespace
}  // namespace latent
