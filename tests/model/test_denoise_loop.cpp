// The Qwen-Image denoising loop against diffusers (io_denoise.safetensors of the fixture roots,
// made by scripts/make_dit_fixtures.py): QwenImagePipeline (true CFG, explicit noise; seeded
// generator), QwenImageImg2ImgPipeline (strength) and the QwenImageEditPlusPipeline loop with
// two reference latents on a zero_cond_t transformer. Also torch.randn, latent packing (host and
// backend ops) and the loop on the backend (qwen_image_denoise_on_backend) with inputs uploaded
// once and reused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "engine/backends/registry.h"
#include "engine/models/dit/denoise.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"
#include "tests/util/dit_test_util.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

constexpr double kTolerance = 1e-3;

std::string root(const std::string& name) { return test::fixtures_dir() + "/" + name; }

using test::cpu_backend;

using Fixture = test::DenoiseFixture;
using test::case_request;

Fixture open(const std::string& name) { return test::open_denoise_fixture(name, cpu_backend()); }

Tensor get(const Fixture& f, const std::string& name, bool optional = false) {
  return test::fixture_tensor(*f.io, name, optional);
}

void expect_latents(const Fixture& f, const std::string& c, const DenoiseRequest& r,
                    const char* label) {
  auto out = qwen_image_denoise(*f.model, f.scheduler, r);
  ASSERT_TRUE(out.ok()) << out.status().message();
  Tensor want = get(f, c + ".latents");
  ASSERT_EQ(out->latents.shape(), want.shape());
  const double err = relative_l2(out->latents, want);
  EXPECT_LT(err, kTolerance) << c << " " << label;
  std::printf("%s (%s): latents relative L2 %.2e\n", c.c_str(), label, err);
}

TEST(DenoiseLoop, TextToImageWithTrueCfgMatchesQwenImagePipeline) {
  Fixture f = open("dit_qwen_image_tiny");
  ASSERT_TRUE(f.model);
  DenoiseRequest r = case_request(f, "t2i_cfg");
  ASSERT_TRUE(r.negative.defined());
  expect_latents(f, "t2i_cfg", r, "batched cfg");
  r.batch_cfg = false;
  expect_latents(f, "t2i_cfg", r, "separate cfg passes");
}

TEST(DenoiseLoop, DecodedImageMatchesThePipeline) {
  Fixture f = open("dit_qwen_image_tiny");
  ASSERT_TRUE(f.model);
  auto vae = load_vae(root("dit_qwen_image_tiny"), cpu_backend(), {false, true});
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  auto img = decode_latents(**vae, get(f, "t2i_cfg.latents"));
  ASSERT_TRUE(img.ok()) << img.status().message();
  Tensor want = get(f, "t2i_cfg.decoded");
  ASSERT_EQ(img->shape(), want.shape());
  EXPECT_LT(relative_l2(*img, want), kTolerance);
}

TEST(DenoiseLoop, SeededNoiseMatchesTorchGenerator) {
  Fixture f = open("dit_qwen_image_tiny");
  ASSERT_TRUE(f.model);
  DenoiseRequest r = case_request(f, "t2i_seed");
  EXPECT_FALSE(r.negative.defined());
  r.noise = Tensor();  // from the seed, as the pipeline's generator
  r.height = 8;
  r.width = 12;
  r.seed = f.cases["t2i_seed"]["seed"].get<uint64_t>();
  auto out = qwen_image_denoise(*f.model, f.scheduler, r);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_LT(relative_l2(out->noise, get(f, "t2i_seed.noise")), 1e-6);
  EXPECT_LT(relative_l2(out->latents, get(f, "t2i_seed.latents")), kTolerance);
}

TEST(DenoiseLoop, Img2ImgStrengthMatchesImg2ImgPipeline) {
  Fixture f = open("dit_qwen_image_tiny");
  ASSERT_TRUE(f.model);
  DenoiseRequest r = case_request(f, "img2img");
  ASSERT_TRUE(r.init_latents.defined());
  ASSERT_LT(r.strength, 1.0);
  expect_latents(f, "img2img", r, "explicit noise");
  r.noise = Tensor();
  r.seed = f.cases["img2img"]["seed"].get<uint64_t>();
  expect_latents(f, "img2img", r, "seeded noise");
}

TEST(DenoiseLoop, EditWithReferencesMatchesEditPlusLoop) {
  Fixture f = open("dit_qwen_image_edit_tiny");
  ASSERT_TRUE(f.model);
  ASSERT_TRUE(f.model->config().zero_cond_t);
  DenoiseRequest r = case_request(f, "edit_cfg");
  ASSERT_EQ(r.reference_latents.size(), 2u);
  expect_latents(f, "edit_cfg", r, "batched cfg");
  r.batch_cfg = false;
  expect_latents(f, "edit_cfg", r, "separate cfg passes");
}

TEST(DenoiseLoop, RequestErrors) {
  Fixture f = open("dit_qwen_image_tiny");
  ASSERT_TRUE(f.model);
  DenoiseRequest r = case_request(f, "t2i_cfg");
  DenoiseRequest bad = r;
  bad.strength = 0.5;  // no init latents
  auto out = qwen_image_denoise(*f.model, f.scheduler, bad);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("init latents"), std::string::npos);
  bad = r;
  bad.noise = test::random_tensor({1, 16, 1, 7, 12}, 3);
  out = qwen_image_denoise(*f.model, f.scheduler, bad);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("even"), std::string::npos) << out.status().message();
  bad = r;
  bad.prompt.embeds = test::random_tensor({1, 7, 25}, 3);
  out = qwen_image_denoise(*f.model, f.scheduler, bad);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("prompt embeds must be [1, T, 24]"), std::string::npos)
      << out.status().message();
  bad = r;
  bad.reference_latents = {test::random_tensor({1, 8, 1, 4, 4}, 3)};
  out = qwen_image_denoise(*f.model, f.scheduler, bad);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("reference latents 0"), std::string::npos);
  int calls = 0;
  out = qwen_image_denoise(*f.model, f.scheduler, r, [&](int step, int total) {
    EXPECT_EQ(total, 3);
    EXPECT_EQ(step, ++calls);
    return step < 2;
  });
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("stopped after step 2 of 3"), std::string::npos);
}

// latent-tool's run --part transformer and denoise on the fixtures ($LATENT_TOOL from ctest).
struct ToolRun {
  int status = -1;
  std::string output;
};

ToolRun run_tool(const std::string& args) {
  const char* tool = std::getenv("LATENT_TOOL");
  ToolRun r;
  if (!tool) return r;
  const std::string log = test::temp_dir() + "/tool.log";
  r.status = std::system((std::string(tool) + " " + args + " > " + log + " 2>&1").c_str());
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  return r;
}

TEST(LatentTool, RunTransformerAndDenoiseMatchTheFixtures) {
  if (!std::getenv("LATENT_TOOL")) GTEST_SKIP() << "LATENT_TOOL is not set (run through ctest)";
  const std::string dir = test::temp_dir();
  const std::string t2i = root("dit_qwen_image_tiny"), edit = root("dit_qwen_image_edit_tiny");
  ToolRun r = run_tool("run --device cpu --model " + edit + " --part transformer --inputs " + edit +
                       "/io_transformer.safetensors --case edit_batch --outputs " + dir +
                       "/sample.safetensors --repeat 2");
  ASSERT_EQ(r.status, 0) << r.output;
  auto sample = SafetensorsFile::open(dir + "/sample.safetensors");
  ASSERT_TRUE(sample.ok()) << sample.status().message();
  auto io = SafetensorsFile::open(edit + "/io_transformer.safetensors");
  ASSERT_TRUE(io.ok());
  EXPECT_LT(relative_l2(*(*sample)->tensor("sample"), *(*io)->tensor("edit_batch.sample")),
            kTolerance);

  r = run_tool("denoise --device cpu --model " + t2i + " --inputs " + t2i +
               "/io_denoise.safetensors --case t2i_cfg --steps 3 --output-latents " + dir +
               "/lat.safetensors --output-sample " + dir + "/decoded.safetensors");
  ASSERT_EQ(r.status, 0) << r.output;
  auto lat = SafetensorsFile::open(dir + "/lat.safetensors");
  ASSERT_TRUE(lat.ok()) << lat.status().message();
  EXPECT_EQ(lat->get()->metadata().at("latent_space"), "qwen-image");
  Fixture f = open("dit_qwen_image_tiny");
  Tensor want = get(f, "t2i_cfg.latents");
  EXPECT_LT(relative_l2(*(*lat)->tensor("latent"), want), kTolerance);
  auto decoded = SafetensorsFile::open(dir + "/decoded.safetensors");
  ASSERT_TRUE(decoded.ok());
  EXPECT_LT(relative_l2(*(*decoded)->tensor("sample"), get(f, "t2i_cfg.decoded")), kTolerance);

  // Bad input: an error naming the problem, exit status 1.
  r = run_tool("denoise --device cpu --model " + t2i + " --inputs " + t2i +
               "/io_denoise.safetensors --case t2i_cfg --steps 3 --width 100 --height 64 "
               "--output-latents " +
               dir + "/x.safetensors");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("multiples of 16"), std::string::npos) << r.output;
}

TEST(TorchRandn, MatchesTorchCpuGenerator) {
  auto file = SafetensorsFile::open(root("dit_rng") + "/randn.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();
  const struct {
    const char* name;
    uint64_t seed;
    int64_t n;
  } cases[] = {{"s1234_1536", 1234, 1536},
               {"s0_35", 0, 35},
               {"s42_4096", 42, 4096},
               {"s2p40_64", (uint64_t{1} << 40) + 5, 64}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto want = (*file)->tensor(c.name);
    ASSERT_TRUE(want.ok()) << want.status().message();
    auto got = torch_randn({c.n}, c.seed);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(want->numel(), c.n);
    const std::vector<float> a = got->to_floats(), b = want->to_floats();
    for (int64_t i = 0; i < c.n; ++i) ASSERT_NEAR(a[i], b[i], 2e-5) << "element " << i;
  }
  EXPECT_FALSE(torch_randn({15}, 1).ok());
}

TEST(LatentPacking, PatchOrderAndRoundTrip) {
  // [1, 2, 1, 2, 4]: value = c * 100 + y * 10 + x
  std::vector<float> v;
  for (int c = 0; c < 2; ++c)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 4; ++x) v.push_back(static_cast<float>(c * 100 + y * 10 + x));
  Tensor lat = Tensor::from_floats({1, 2, 1, 2, 4}, v);
  auto p = pack_latents(lat);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->shape(), (Shape{1, 2, 8}));
  // token 1 = patch (0, 1): channels-major (c, dy, dx)
  const std::vector<float> want = {2, 3, 12, 13, 102, 103, 112, 113};
  const std::vector<float> got = p->to_floats();
  EXPECT_EQ(std::vector<float>(got.begin() + 8, got.end()), want);
  auto u = unpack_latents(*p, 2, 4);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->shape(), (Shape{1, 2, 1, 2, 4}));
  EXPECT_EQ(u->to_floats(), v);
  EXPECT_FALSE(pack_latents(Tensor::from_floats({1, 1, 1, 3, 4}, std::vector<float>(12))).ok());
  EXPECT_FALSE(unpack_latents(*p, 4, 4).ok());
}

TEST(LatentPacking, BackendOpsMatchTheHostPacking) {
  test::check_backend_packing("cpu", /*nhwc=*/false, [](Backend& be, const Tensor& p) {
    // Errors name the problem.
    auto odd = be.upload(test::random_tensor({1, 16, 5, 8}, 1));
    ASSERT_TRUE(odd.ok());
    auto bad = be.pack_latents(*odd);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("even"), std::string::npos) << bad.status().message();
    bad = be.unpack_latents(p, 8, 8);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("tokens do not make"), std::string::npos);
  });
}

// The loop on the backend with its inputs uploaded once: the same latents as the host form, loop
// after loop with the same uploaded prompts, noise and image.
TEST(DenoiseLoop, OnTheBackendReusesItsUploadedInputs) {
  Fixture f = open("dit_qwen_image_tiny");
  ASSERT_TRUE(f.model);
  Backend& be = f.model->backend();
  DenoiseRequest r = case_request(f, "img2img");
  auto host = qwen_image_denoise(*f.model, f.scheduler, r);
  ASSERT_TRUE(host.ok()) << host.status().message();
  auto prompts = upload_denoise_prompts(*f.model, r.prompt, r.negative);
  ASSERT_TRUE(prompts.ok()) << prompts.status().message();
  EXPECT_TRUE(prompts->batched);
  EXPECT_EQ(prompts->cond.shape(), (Shape{2, 7, 24}));
  DeviceDenoiseRequest d;
  d.steps = r.steps;
  d.strength = r.strength;
  d.true_cfg_scale = r.true_cfg_scale;
  d.prompts = &*prompts;
  auto noise = upload_latent(be, r.noise), init = upload_latent(be, r.init_latents);
  ASSERT_TRUE(noise.ok() && init.ok());
  d.noise = *noise;
  d.init_latents = *init;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    auto out = qwen_image_denoise_on_backend(*f.model, f.scheduler, d);
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(out->latents.shape(), (Shape{1, 16, 8, 12}));
    EXPECT_EQ(out->latents.device(), be.device());
    EXPECT_EQ(out->schedule.begin_index, host->schedule.begin_index);
    auto got = be.download(out->latents);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->to_floats(), host->latents.to_floats());
    EXPECT_LT(relative_l2(*got, get(f, "img2img.latents")), kTolerance);
  }
  // A batched pair with guidance off runs the prompt alone (its padding masked): as without a
  // negative prompt.
  d.true_cfg_scale = 1.f;
  auto pair = qwen_image_denoise_on_backend(*f.model, f.scheduler, d);
  ASSERT_TRUE(pair.ok()) << pair.status().message();
  auto alone_prompts = upload_denoise_prompts(*f.model, r.prompt, PromptEmbeds());
  ASSERT_TRUE(alone_prompts.ok());
  EXPECT_FALSE(alone_prompts->has_negative);
  d.prompts = &*alone_prompts;
  auto alone = qwen_image_denoise_on_backend(*f.model, f.scheduler, d);
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  EXPECT_LT(relative_l2(*be.download(pair->latents), *be.download(alone->latents)), 1e-5);
  // Missing inputs are errors, not crashes.
  DeviceDenoiseRequest bad = d;
  bad.prompts = nullptr;
  EXPECT_FALSE(qwen_image_denoise_on_backend(*f.model, f.scheduler, bad).ok());
  bad = d;
  bad.noise = Tensor();
  EXPECT_FALSE(qwen_image_denoise_on_backend(*f.model, f.scheduler, bad).ok());
  bad = d;
  bad.init_latents = Tensor();  // strength 0.6 without an image
  auto no_image = qwen_image_denoise_on_backend(*f.model, f.scheduler, bad);
  ASSERT_FALSE(no_image.ok());
  EXPECT_NE(no_image.status().message().find("init latents"), std::string::npos);
}

}  // namespace
}  // namespace latent
