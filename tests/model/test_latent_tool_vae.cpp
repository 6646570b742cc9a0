// `latent-tool run` on every VAE fixture (scripts/make_fixtures.py): the CLI runner that the
// benchmarks use gives diffusers' outputs within 1e-3 relative L2 on the CPU in fp32, under
// diffusers' tensor names; bad invocations fail with a message naming the problem.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

struct ToolRun {
  int status;
  std::string output;
};

ToolRun run_tool(const std::string& args) {
  const char* tool = std::getenv("LATENT_TOOL");
  std::string cmd = std::string(tool ? tool : "latent-tool") + " " + args + " 2>&1";
  ToolRun r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

struct Case {
  const char* fixture;
  const char* model;  // relative to the fixture folder; "" = the folder
  const char* latent_name;
};

class LatentToolRun : public testing::TestWithParam<Case> {};

TEST_P(LatentToolRun, MatchesDiffusers) {
  ASSERT_NE(std::getenv("LATENT_TOOL"), nullptr) << "run through ctest (LATENT_TOOL)";
  const Case& c = GetParam();
  const std::string dir = test::fixtures_dir() + "/" + c.fixture;
  const std::string model = std::string(c.model).empty() ? dir : dir + "/" + c.model;
  const std::string out = test::temp_dir() + "/" + c.fixture;
  auto io = SafetensorsFile::open(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  struct Part {
    const char* part;
    const char* out_name;
    const char* want;
  };
  for (Part p :
       {Part{"encoder", c.latent_name, "latent_mean"}, Part{"decoder", "sample", "decoded"}}) {
    const std::string file = out + "-" + p.part + ".safetensors";
    ToolRun r =
        run_tool(std::string("run --device cpu --dtype fp32 --model ") + model + " --part " +
                 p.part + " --inputs " + dir + "/io.safetensors --outputs " + file + " --repeat 2");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("median"), std::string::npos) << r.output;  // it prints its timing
    auto got = SafetensorsFile::open(file);
    ASSERT_TRUE(got.ok()) << got.status().message();
    auto y = (*got)->tensor(p.out_name);
    ASSERT_TRUE(y.ok()) << y.status().message();
    auto want = (*io)->tensor(p.want);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(y->shape(), want->shape());
    EXPECT_LT(relative_l2(*y, *want), 1e-3) << c.fixture << " " << p.part;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, LatentToolRun,
    testing::Values(Case{"kl_tiny", "", "latent_mean"}, Case{"kl_tiny_bf16", "", "latent_mean"},
                    Case{"kl_flux_tiny", "", "latent_mean"}, Case{"tiny_taesd", "", "latents"},
                    Case{"tiny_taesd_single", "taesd_encoder.safetensors", "latents"},
                    Case{"tiny_taef2", "taef2.safetensors", "latents"},
                    Case{"qwen_image_vae_tiny", "", "latent_mean"},
                    Case{"qwen_image_vae_tiny_single", "vae_single.safetensors", "latent_mean"},
                    // video (5-D [N, C, T, H, W]; scripts/make_video_fixtures.py)
                    Case{"wan_vae_video_tiny", "", "latent_mean"},
                    Case{"wan_vae_video_tiny_single", "vae_single.safetensors", "latent_mean"},
                    Case{"qwen_image_vae_video_tiny", "", "latent_mean"},
                    Case{"wan22_vae_video_tiny", "", "latent_mean"}),
    [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.fixture); });

// A clip whose length is not 1 + 4k, fed 3 frames a push: diffusers on the clip padded with its
// last frame; `inspect` reports the video mode.
TEST(LatentToolVideo, ChunkedOddClipAndInspect) {
  ASSERT_NE(std::getenv("LATENT_TOOL"), nullptr) << "run through ctest (LATENT_TOOL)";
  const std::string dir = test::fixtures_dir() + "/wan_vae_video_tiny";
  auto io = SafetensorsFile::open(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  const std::string in = test::temp_dir() + "/odd_clip.safetensors";
  ASSERT_TRUE(write_safetensors(in, {{"sample", *(*io)->tensor("sample_odd")}}).ok());
  const std::string out = test::temp_dir() + "/odd_latents.safetensors";
  ToolRun r = run_tool("run --device cpu --model " + dir + " --part encoder --inputs " + in +
                       " --outputs " + out + " --chunk 3 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("padded with 2 copies"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"frames_per_s\""), std::string::npos) << r.output;
  auto got = SafetensorsFile::open(out);
  ASSERT_TRUE(got.ok()) << got.status().message();
  auto y = (*got)->tensor("latent_mean");
  ASSERT_TRUE(y.ok()) << y.status().message();
  auto want = (*io)->tensor("latent_mean_odd");
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(shape_str(y->shape()), shape_str(want->shape()));
  EXPECT_LT(relative_l2(*y, *want), 1e-3);

  r = run_tool("inspect --device cpu " + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("video: temporal factor 4"), std::string::npos) << r.output;

  // 5-D input to an image model: an error naming the model, no crash.
  r = run_tool("run --device cpu --model " + test::fixtures_dir() +
               "/kl_tiny --part encoder --inputs " + in + " --outputs " + out);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("no video mode"), std::string::npos) << r.output;
}

// `inspect` of a Wan 2.2 single file (no config): the network, its 16x compression, the video
// mode and the patching, all read from the weights.
TEST(LatentToolVideo, InspectWan22) {
  ASSERT_NE(std::getenv("LATENT_TOOL"), nullptr) << "run through ctest (LATENT_TOOL)";
  ToolRun r = run_tool("inspect --device cpu " + test::fixtures_dir() +
                       "/wan22_vae_video_tiny_single/vae_single.safetensors");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* want :
       {"AutoencoderKLWan", "Wan 2.2 VAE", "16 channels, 16x downsampling",
        "video:         temporal factor 4", "patch_size: 2", "key names: Wan-Video / ComfyUI"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
}

TEST(LatentToolErrors, NameTheProblem) {
  ASSERT_NE(std::getenv("LATENT_TOOL"), nullptr) << "run through ctest (LATENT_TOOL)";
  const std::string dir = test::fixtures_dir() + "/kl_tiny";
  ToolRun r = run_tool("run --model /nonexistent/model --part encoder --inputs " + dir +
                       "/io.safetensors --outputs /tmp/x.safetensors");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("/nonexistent/model"), std::string::npos) << r.output;

  r = run_tool("run --model " + dir + " --part middle --inputs a --outputs b");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--part"), std::string::npos) << r.output;

  // The decoder's input file has no `latent` tensor.
  const std::string only_sample = test::temp_dir() + "/only_sample.safetensors";
  auto io = SafetensorsFile::open(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok());
  ASSERT_TRUE(write_safetensors(only_sample, {{"sample", *(*io)->tensor("sample")}}).ok());
  r = run_tool("run --device cpu --model " + dir + " --part decoder --inputs " + only_sample +
               " --outputs /tmp/y.safetensors");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("latent"), std::string::npos) << r.output;

  // decode writes one image: a file of two latents is refused, not decoded to its first alone.
  const std::string two = test::temp_dir() + "/two_latents.safetensors";
  ASSERT_TRUE(write_safetensors(two, {{"latent", Tensor::zeros({2, 4, 3, 5}, DType::kF32)}}).ok());
  const std::string png = test::temp_dir() + "/two_latents.png";
  std::remove(png.c_str());
  r = run_tool("decode --device cpu --model " + dir + " --input " + two + " --output " + png);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("holds 2 latents [2, 4, 3, 5] and decode writes one image"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(png)) << "an image of the first latent was written";
  // One latent decodes.
  const std::string one = test::temp_dir() + "/one_latent.safetensors";
  ASSERT_TRUE(write_safetensors(one, {{"latent", Tensor::zeros({1, 4, 3, 5}, DType::kF32)}}).ok());
  r = run_tool("decode --device cpu --model " + dir + " --input " + one + " --output " + png);
  EXPECT_EQ(r.status, 0) << r.output;

  // Truncated weights: an error naming the file, no crash.
  r = run_tool("inspect " + test::fixtures_dir() + "/photos/LICENSES.md");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("LICENSES.md"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace latent
