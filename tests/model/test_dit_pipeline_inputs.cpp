// The scheduler resolver and the prompt-embedding loader that ditdenoise and latent-tool denoise
// share (engine/models/dit/pipeline_inputs.h), on the tiny Qwen-Image fixture: every form of
// model path, a partial download without model_index.json, and each bad embedding file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "engine/models/dit/pipeline_inputs.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

const std::string& fixture() {
  static const std::string root = test::fixtures_dir() + "/dit_qwen_image_tiny";
  return root;
}
constexpr int64_t kJointDim = 24;  // the fixture's joint_attention_dim

::testing::AssertionResult has_substr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// A fresh folder holding links to the fixture's parts (no model_index.json: a partial download).
std::string partial_root(const std::string& name, const std::vector<std::string>& parts) {
  const std::string dir = test::temp_dir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& p : parts) fs::create_directory_symlink(fixture() + "/" + p, dir + "/" + p);
  return dir;
}

TEST(DitScheduler, PipelineRoot) {
  auto r = resolve_flow_match_scheduler(fixture());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, fixture() + "/scheduler/scheduler_config.json");
  EXPECT_DOUBLE_EQ(r->config.max_shift, 0.9);  // the fixture's, not Qwen-Image's default
  EXPECT_EQ(r->config.max_image_seq_len, 8192);
}

TEST(DitScheduler, TransformerFolderUsesTheSchedulerBesideIt) {
  auto r = resolve_flow_match_scheduler(fixture() + "/transformer");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, fixture() + "/scheduler/scheduler_config.json");
  EXPECT_DOUBLE_EQ(r->config.max_shift, 0.9);
}

// transformer/ and scheduler/ without model_index.json: the scheduler is found, and the
// transformer loads from the same root (ditdenoise and latent-tool denoise take such a root).
TEST(DitScheduler, PartialDownloadRoot) {
  const std::string root = partial_root("dit_partial", {"transformer", "scheduler", "vae"});
  auto r = resolve_flow_match_scheduler(root);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->path, root + "/scheduler/scheduler_config.json");
  EXPECT_DOUBLE_EQ(r->config.max_shift, 0.9);
  auto model = QwenImageMmdit::load(root, test::cpu_backend());
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->config().joint_attention_dim, kJointDim);
}

TEST(DitScheduler, NoSchedulerFallsBackToQwenImageDefault) {
  const std::string root = partial_root("dit_nosched", {"transformer"});
  for (const std::string& model : {root, root + "/transformer"}) {
    auto r = resolve_flow_match_scheduler(model);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->path.empty()) << r->path;
    EXPECT_DOUBLE_EQ(r->config.max_shift, qwen_image_scheduler_config().max_shift);
    EXPECT_EQ(r->config.max_image_seq_len, qwen_image_scheduler_config().max_image_seq_len);
  }
}

TEST(DitScheduler, ExplicitFileWinsAndMustExist) {
  const std::string root = partial_root("dit_explicit", {"transformer"});
  auto r = resolve_flow_match_scheduler(root, fixture() + "/scheduler/scheduler_config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->config.max_shift, 0.9);
  auto missing = resolve_flow_match_scheduler(root, root + "/nope.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(has_substr(missing.status().message(), root + "/nope.json"));
}

// A scheduler config that is there but broken is an error, never silently replaced.
TEST(DitScheduler, InvalidConfigIsAnError) {
  const std::string root = partial_root("dit_badsched", {"transformer"});
  fs::create_directories(root + "/scheduler");
  std::ofstream(root + "/scheduler/scheduler_config.json") << R"({"use_beta_sigmas": true})";
  auto r = resolve_flow_match_scheduler(root);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(has_substr(r.status().message(), "scheduler_config.json"));
}

std::string embeds_file(const std::string& name, const std::map<std::string, Tensor>& tensors) {
  const std::string path = test::temp_dir() + "/" + name;
  Status s = write_safetensors(path, tensors);
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

TEST(DitPromptEmbeds, ReadsEmbedsAndMask) {
  const std::string path = embeds_file(
      "pe_ok.safetensors", {{"prompt_embeds", test::random_tensor({1, 3, kJointDim}, 1)},
                            {"prompt_embeds_mask", Tensor::from_floats({1, 3}, {1, 1, 0})}});
  auto p = load_prompt_embeds(path, false, kJointDim);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->embeds.shape(), (Shape{1, 3, kJointDim}));
  EXPECT_EQ(p->embeds.dtype(), DType::kF32);
  EXPECT_EQ(p->mask, (std::vector<float>{1, 1, 0}));
}

TEST(DitPromptEmbeds, NegativeFileMayNameItsTensorNegative) {
  const std::string path =
      embeds_file("pe_neg.safetensors",
                  {{"negative_prompt_embeds", test::random_tensor({1, 2, kJointDim}, 2)}});
  auto n = load_prompt_embeds(path, true, kJointDim);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(n->embeds.dim(1), 2);
  auto p = load_prompt_embeds(path, false, kJointDim);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(has_substr(p.status().message(), "no tensor 'prompt_embeds'"));
}

TEST(DitPromptEmbeds, WrongWidthNamesJointAttentionDim) {
  const std::string path = embeds_file(
      "pe_width.safetensors", {{"prompt_embeds", test::random_tensor({1, 3, kJointDim + 1}, 3)}});
  auto p = load_prompt_embeds(path, false, kJointDim);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(has_substr(p.status().message(), "joint_attention_dim"));
  EXPECT_TRUE(has_substr(p.status().message(), path));
}

TEST(DitPromptEmbeds, BadMasks) {
  const std::string len = embeds_file(
      "pe_masklen.safetensors", {{"prompt_embeds", test::random_tensor({1, 3, kJointDim}, 4)},
                                 {"prompt_embeds_mask", Tensor::from_floats({1, 2}, {1, 1})}});
  auto a = load_prompt_embeds(len, false, kJointDim);
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(has_substr(a.status().message(), "prompt_embeds_mask"));
  const std::string zero = embeds_file(
      "pe_maskzero.safetensors", {{"prompt_embeds", test::random_tensor({1, 2, kJointDim}, 5)},
                                  {"prompt_embeds_mask", Tensor::from_floats({1, 2}, {0, 0})}});
  auto b = load_prompt_embeds(zero, false, kJointDim);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(has_substr(b.status().message(), "masks every token"));
  const std::string orphan =
      embeds_file("pe_orphan.safetensors",
                  {{"prompt_embeds", test::random_tensor({1, 2, kJointDim}, 6)},
                   {"negative_prompt_embeds_mask", Tensor::from_floats({1, 2}, {1, 1})}});
  auto file = SafetensorsFile::open(orphan);
  ASSERT_TRUE(file.ok());
  auto c = read_prompt_embeds(**file, "negative_prompt_embeds", kJointDim, /*optional=*/true);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(has_substr(c.status().message(), "without 'negative_prompt_embeds'"));
}

TEST(DitPromptEmbeds, NonFiniteValuesAreRefusedNamingWhere) {
  Tensor e = test::random_tensor({1, 3, kJointDim}, 8);
  e.data_as<float>()[kJointDim + 5] = std::numeric_limits<float>::quiet_NaN();
  const std::string path = embeds_file("pe_nan.safetensors", {{"prompt_embeds", e}});
  auto p = load_prompt_embeds(path, false, kJointDim);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(has_substr(p.status().message(),
                         path + ": tensor 'prompt_embeds' holds nan (token 1, feature 5)"));
  e.data_as<float>()[kJointDim + 5] = std::numeric_limits<float>::infinity();
  const std::string neg = embeds_file("pe_inf.safetensors", {{"negative_prompt_embeds", e}});
  p = load_prompt_embeds(neg, true, kJointDim);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(has_substr(p.status().message(), "tensor 'negative_prompt_embeds' holds inf"));
}

TEST(DitPromptEmbeds, OptionalAbsentIsUndefined) {
  const std::string path = embeds_file(
      "pe_opt.safetensors", {{"prompt_embeds", test::random_tensor({1, 2, kJointDim}, 7)}});
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok());
  auto n = read_prompt_embeds(**file, "negative_prompt_embeds", kJointDim, true);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_FALSE(n->defined());
  auto rank = read_prompt_embeds(**file, "prompt_embeds", kJointDim);
  ASSERT_TRUE(rank.ok());
}

}  // namespace
}  // namespace latent
