// LoRAs on the Qwen-Image transformer against diffusers' own LoRA loader
// (scripts/make_dit_lora_fixtures.py: tests/fixtures/dit_lora): every file layout, merged and at
// run time, stacking, strength changes at run time, and the errors for bad files.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/models/dit/lora.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/safetensors.h"
#include "tests/util/dit_test_util.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

constexpr double kTolerance = 1e-3;  // relative L2 vs diffusers, fp32

std::string fixture(const std::string& name) { return test::fixtures_dir() + "/" + name; }
std::string lora_path(const std::string& file) {
  return fixture("dit_lora/" + file + ".safetensors");
}
std::string tiny_root() { return fixture("dit_qwen_image_tiny"); }

nlohmann::json cases() {
  std::ifstream in(fixture("dit_lora/cases.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// The "masked_batch" transformer case (B = 2, padded text): its inputs, and the base model's
// output.
std::string tiny_io() { return tiny_root() + "/io_transformer.safetensors"; }
MmditInputs inputs(Backend& b) {
  return test::transformer_case_inputs(b, tiny_io(), "masked_batch");
}
Tensor base_sample() { return test::transformer_case_sample(tiny_io(), "masked_batch"); }

Tensor reference(const std::string& c) {
  auto io = SafetensorsFile::open(fixture("dit_lora/io_lora.safetensors"));
  EXPECT_TRUE(io.ok()) << io.status().message();
  auto t = (*io)->tensor(c + ".sample");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : Tensor();
}

MmditLoras specs_of(const nlohmann::json& list, LoraMode mode) {
  MmditLoras l;
  l.mode = mode;
  for (const auto& e : list) l.specs.push_back({lora_path(e[0]), e[1].get<float>()});
  return l;
}

Tensor run(QwenImageMmdit& m) {
  auto y = m.forward(inputs(m.backend()));
  EXPECT_TRUE(y.ok()) << y.status().message();
  if (!y.ok()) return Tensor();
  return *m.backend().download(*y);
}

std::unique_ptr<QwenImageMmdit> load(const MmditLoras& loras) {
  auto m = QwenImageMmdit::load(tiny_root(), test::cpu_backend(), loras);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(QwenImageLora, EveryLayoutMatchesDiffusersMergedAndAtRunTime) {
  const nlohmann::json all = cases()["transformer"];
  ASSERT_GE(all.size(), 6u);
  const Tensor base = base_sample();
  for (const auto& [name, list] : all.items()) {
    const Tensor ref = reference(name);
    ASSERT_TRUE(ref.defined());
    // The fixture moves the output: a loader that ignored the LoRA would fail.
    EXPECT_GT(relative_l2(base, ref), 0.1) << name;
    for (LoraMode mode : {LoraMode::kMerged, LoraMode::kRuntime}) {
      SCOPED_TRACE(name + " " + lora_mode_name(mode));
      auto m = load(specs_of(list, mode));
      ASSERT_TRUE(m);
      const Tensor y = run(*m);
      ASSERT_EQ(y.shape(), ref.shape());
      const double err = relative_l2(y, ref);
      EXPECT_LT(err, kTolerance) << "relative L2 " << err;
      std::printf("%s (%s): relative L2 %.2e\n", name.c_str(), lora_mode_name(mode), err);
    }
  }
}

TEST(QwenImageLora, RuntimeStrengthChangeEqualsMergedAtThatStrength) {
  auto rt = load({{{lora_path("lora_comfyui"), 1.5f}}, LoraMode::kRuntime});
  ASSERT_TRUE(rt);
  EXPECT_LT(relative_l2(run(*rt), reference("comfyui_s1_5")), kTolerance);
  ASSERT_TRUE(rt->set_lora_strengths({0.7f}).ok());
  EXPECT_FLOAT_EQ(rt->loras()[0].strength, 0.7f);
  const Tensor at07 = run(*rt);
  EXPECT_LT(relative_l2(at07, reference("comfyui")), kTolerance);
  auto merged = load({{{lora_path("lora_comfyui"), 0.7f}}, LoraMode::kMerged});
  ASSERT_TRUE(merged);
  EXPECT_LT(relative_l2(at07, run(*merged)), 1e-5);
  // Strength 0: the base model.
  ASSERT_TRUE(rt->set_lora_strengths({0.f}).ok());
  EXPECT_LT(relative_l2(run(*rt), base_sample()), kTolerance);
  // Merged strengths are fixed.
  auto st = merged->set_lora_strengths({1.f});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("reload"), std::string::npos) << st.message();
  // One strength per LoRA.
  st = rt->set_lora_strengths({1.f, 2.f});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("2 LoRA strengths given for 1"), std::string::npos) << st.message();
}

TEST(QwenImageLora, StackedStrengthsChangeIndependently) {
  // "stack" is comfyui 0.7 + kohya -0.5; at (1.5, 0) it is comfyui alone at 1.5.
  auto rt = load(specs_of(cases()["transformer"]["stack"], LoraMode::kRuntime));
  ASSERT_TRUE(rt);
  ASSERT_EQ(rt->loras().size(), 2u);
  EXPECT_LT(relative_l2(run(*rt), reference("stack")), kTolerance);
  ASSERT_TRUE(rt->set_lora_strengths({1.5f, 0.f}).ok());
  EXPECT_LT(relative_l2(run(*rt), reference("comfyui_s1_5")), kTolerance);
  ASSERT_TRUE(rt->set_lora_strengths({0.f, 1.f}).ok());
  EXPECT_LT(relative_l2(run(*rt), reference("kohya")), kTolerance);
  EXPECT_NE(rt->description().find("lora_kohya.safetensors strength 1 (runtime)"),
            std::string::npos)
      << rt->description();
}

// Runtime LoRAs on the blocks' q/k/v, attention-output and MLP layers are folded into the
// layer's own GEMM (QwenImageMmdit::folded_lora_layers); LATENT_LORA_FOLD=0 keeps their two
// GEMMs apart. Both compute the same thing, at every strength.
std::unique_ptr<QwenImageMmdit> load_unfolded(const MmditLoras& loras) {
  setenv("LATENT_LORA_FOLD", "0", 1);
  auto m = load(loras);
  unsetenv("LATENT_LORA_FOLD");
  return m;
}

TEST(QwenImageLora, FoldedRuntimeLorasEqualTheSeparateOnes) {
  // How many of the layers each case adapts fold (q/k/v, add_q/k/v, the attention outputs, the
  // MLPs' two layers per stream; not the modulations or the top-level layers).
  const std::map<std::string, int64_t> folded = {{"lightning", 24}, {"stack", 8}, {"kohya", 5}};
  for (const auto& [name, count] : folded) {
    SCOPED_TRACE(name);
    const MmditLoras specs = specs_of(cases()["transformer"][name], LoraMode::kRuntime);
    auto folded_model = load(specs);
    auto separate = load_unfolded(specs);
    ASSERT_TRUE(folded_model && separate);
    EXPECT_EQ(folded_model->folded_lora_layers(), count);
    EXPECT_EQ(separate->folded_lora_layers(), 0);
    EXPECT_NE(folded_model->description().find(str_cat(count, " of them folded")),
              std::string::npos)
        << folded_model->description();
    EXPECT_LT(relative_l2(run(*folded_model), run(*separate)), 1e-5);
    EXPECT_LT(relative_l2(run(*folded_model), reference(name)), kTolerance);
    // New strengths rebuild the folded down factors (and only a zero strength gives the base).
    std::vector<float> strengths(specs.specs.size(), -0.8f);
    ASSERT_TRUE(folded_model->set_lora_strengths(strengths).ok());
    ASSERT_TRUE(separate->set_lora_strengths(strengths).ok());
    const Tensor changed = run(*folded_model);
    EXPECT_LT(relative_l2(changed, run(*separate)), 1e-5);
    EXPECT_GT(relative_l2(changed, reference(name)), 1e-2);
    std::fill(strengths.begin(), strengths.end(), 0.f);
    ASSERT_TRUE(folded_model->set_lora_strengths(strengths).ok());
    EXPECT_LT(relative_l2(run(*folded_model), base_sample()), kTolerance);
  }
}

// The wide-input ops behind the folding refuse what would read columns they write, read past a
// row, or ask for a negative number of columns, naming the op (the CPU backend's defaults).
TEST(QwenImageLora, WideInputOpsRefuseBadShapes) {
  Backend& be = *test::cpu_backend();
  auto up = [&](const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto t = be.upload(Tensor::from_floats(shape, std::vector<float>(n, 0.5f)));
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t : Tensor();
  };
  const Tensor x = up({2, 3, 10}), w = up({4, 6});
  auto expect_error = [](const Result<Tensor>& r, const std::string& what) {
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  expect_error(be.linear_into_columns(x, w, 5), "linear_into_columns");  // reads column 5
  expect_error(be.linear_into_columns(x, w, 7), "linear_into_columns");  // writes past 10
  expect_error(be.linear_wide(x, up({4, 11}), Tensor(), DitActivation::kNone, 0), "linear_wide");
  expect_error(be.linear_wide(x, w, Tensor(), DitActivation::kNone, -1), "linear_wide");
  const Tensor cond = up({1, 2, 10});
  expect_error(be.layer_norm_modulate_wide(x, cond, cond, {0}, 1e-6f, -2),
               "layer_norm_modulate_wide");
  expect_error(be.attention_wide(x, x, x, 2, Tensor(), {}, -1), "attention_wide");
  // In range: columns [6, 10) = x[..., :6] w^T, the rest unchanged.
  auto filled = be.linear_into_columns(x, w, 6);
  ASSERT_TRUE(filled.ok()) << filled.status().message();
  const Tensor host = *be.download(*filled);
  ASSERT_EQ(host.shape(), x.shape());
  const std::vector<float> v = host.to_floats();
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 10; ++c)
      EXPECT_FLOAT_EQ(v[r * 10 + c], c < 6 ? 0.5f : 1.5f) << r << ", " << c;  // 6 x 0.25
}

TEST(QwenImageLora, ReadsLayoutsRanksAndAlphas) {
  struct Want {
    const char* file;
    LoraLayout layout;
    const char* rank;
    size_t modules;
  };
  for (const Want& w : {Want{"lora_diffusers", LoraLayout::kDiffusers, "4", 9},
                        Want{"lora_comfyui", LoraLayout::kComfyUI, "8", 9},
                        Want{"lora_kohya", LoraLayout::kKohya, "2", 8},
                        Want{"lora_lightning", LoraLayout::kBare, "4", 28}}) {
    SCOPED_TRACE(w.file);
    auto f = load_lora_file(lora_path(w.file));
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->layout, w.layout);
    EXPECT_EQ(f->rank_summary(), w.rank);
    EXPECT_EQ(f->modules.size(), w.modules);
    EXPECT_EQ(f->inner_dim(), 32);
    EXPECT_EQ(f->blocks_touched(), 2);
    const std::string d = describe_lora(*f);
    EXPECT_NE(d.find(std::string("layout: ") + lora_layout_name(w.layout)), std::string::npos)
        << d;
    EXPECT_NE(d.find("fits: the Qwen-Image family"), std::string::npos) << d;
  }
  // diffusers: alpha 8 from the adapter metadata, alpha_pattern 2 for one module.
  auto f = load_lora_file(lora_path("lora_diffusers"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->alpha_source, "adapter metadata");
  for (const auto& m : f->modules)
    EXPECT_FLOAT_EQ(m.alpha, m.module == "transformer_blocks.1.img_mlp.net.2" ? 2.f : 8.f)
        << m.module;
  // kohya: proj_out has no .alpha: alpha = rank.
  f = load_lora_file(lora_path("lora_kohya"));
  ASSERT_TRUE(f.ok());
  for (const auto& m : f->modules)
    EXPECT_FLOAT_EQ(m.alpha, m.module == "proj_out" ? 2.f : 1.f) << m.module;
  EXPECT_EQ(f->alpha_source, ".alpha tensors, none (alpha = rank)");
}

// A LoRA file written for one error case.
std::string write_lora(const std::string& name, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& meta = {}) {
  const std::string path = test::temp_dir() + "/" + name + ".safetensors";
  EXPECT_TRUE(write_safetensors(path, tensors, meta).ok());
  return path;
}

Tensor rnd(const Shape& s, uint64_t seed = 1) { return test::random_tensor(s, seed); }

void expect_load_error(const std::string& path, const std::string& part) {
  auto m = QwenImageMmdit::load(tiny_root(), test::cpu_backend(),
                                {{{path, 1.f}}, LoraMode::kRuntime});
  ASSERT_FALSE(m.ok()) << path;
  EXPECT_NE(m.status().message().find(part), std::string::npos) << m.status().message();
}

TEST(QwenImageLora, BadFilesAreRefusedNamingTheKey) {
  const std::string q = "diffusion_model.transformer_blocks.0.attn.to_q";
  // An unknown tensor kind, and a module that is not a linear layer of the model.
  expect_load_error(write_lora("unknown_kind", {{q + ".lora_down.weight", rnd({4, 32})},
                                                {q + ".lora_up.weight", rnd({32, 4})},
                                                {q + ".lora_mid.weight", rnd({4, 4})}}),
                    "LoRA key '" + q + ".lora_mid.weight' is not a LoRA tensor");
  expect_load_error(
      write_lora("unknown_module",
                 {{q + ".lora_down.weight", rnd({4, 32})},
                  {q + ".lora_up.weight", rnd({32, 4})},
                  {"diffusion_model.transformer_blocks.0.attn.norm_q.lora_down.weight",
                   rnd({4, 16})},
                  {"diffusion_model.transformer_blocks.0.attn.norm_q.lora_up.weight",
                   rnd({16, 4})}}),
      "'diffusion_model.transformer_blocks.0.attn.norm_q.lora_down.weight' names no linear "
      "layer");
  // Misshaped: wrong input width, wrong output width, ranks that differ.
  expect_load_error(write_lora("misshaped_in", {{q + ".lora_down.weight", rnd({4, 31})},
                                                {q + ".lora_up.weight", rnd({32, 4})}}),
                    "'" + q + ".lora_down.weight' is [4, 31] but transformer_blocks.0.attn.to_q "
                              "takes 32 inputs");
  expect_load_error(write_lora("misshaped_out",
                               {{"diffusion_model.img_in.lora_down.weight", rnd({4, 64})},
                                {"diffusion_model.img_in.lora_up.weight", rnd({33, 4})}}),
                    "'diffusion_model.img_in.lora_up.weight' is [33, 4] but img_in has 32 "
                    "outputs");
  expect_load_error(write_lora("ranks", {{q + ".lora_down.weight", rnd({4, 32})},
                                         {q + ".lora_up.weight", rnd({32, 3})}}),
                    "the ranks differ");
  expect_load_error(write_lora("no_up", {{q + ".lora_down.weight", rnd({4, 32})},
                                         {q + ".alpha", Tensor::from_floats({}, {4.f})}}),
                    "has no matching up");
  // Deeper than the model.
  expect_load_error(
      write_lora("deep",
                 {{"diffusion_model.transformer_blocks.7.attn.to_q.lora_down.weight",
                   rnd({4, 32})},
                  {"diffusion_model.transformer_blocks.7.attn.to_q.lora_up.weight",
                   rnd({32, 4})}}),
      "adapts transformer_blocks.7.attn.to_q, which this transformer (2 blocks) does not have");
  // A Qwen-Image 20B LoRA on the tiny model: one sentence.
  expect_load_error(write_lora("big", {{q + ".lora_down.weight", rnd({4, 3072})},
                                       {q + ".lora_up.weight", rnd({3072, 4})}}),
                    "is a LoRA for a Qwen-Image transformer of inner dim 3072");
  // Other models.
  expect_load_error(
      write_lora("flux",
                 {{"transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight",
                   rnd({4, 32})},
                  {"transformer.single_transformer_blocks.0.attn.to_q.lora_B.weight",
                   rnd({32, 4})}}),
      "is not a LoRA for Qwen-Image (QwenImageTransformer2DModel): its keys (e.g. "
      "'transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight') are for FLUX.1");
  expect_load_error(write_lora("sdxl", {{"lora_unet_input_blocks_1_1_proj_in.lora_down.weight",
                                         rnd({4, 32})},
                                        {"lora_unet_input_blocks_1_1_proj_in.lora_up.weight",
                                         rnd({32, 4})},
                                        {"lora_unet_input_blocks_1_1_proj_in.alpha",
                                         Tensor::from_floats({}, {4.f})}}),
                    "are for a Stable Diffusion / SDXL UNet");
  // A model's weights given as a LoRA (here a VAE's, whose 'up_blocks' / 'layers' names other
  // LoRAs share): not a LoRA file, not a LoRA of some other model.
  for (const char* model : {"kl_tiny", "tiny_taesd"}) {
    const std::string weights =
        test::fixtures_dir() + "/" + model + "/diffusion_pytorch_model.safetensors";
    auto r = load_lora_file(weights);
    ASSERT_FALSE(r.ok()) << model;
    EXPECT_NE(
        r.status().message().find(weights + " is not a LoRA file (no lora_A / lora_down keys"),
        std::string::npos)
        << r.status().message();
  }
  expect_load_error(write_lora("wan", {{"diffusion_model.blocks.0.self_attn.q.lora_A.weight",
                                        rnd({4, 32})},
                                       {"diffusion_model.blocks.0.self_attn.q.lora_B.weight",
                                        rnd({32, 4})}}),
                    "are for Wan 2.x");
  // A text-encoder part next to transformer keys: the key is named, and what it is for.
  expect_load_error(write_lora("with_te", {{q + ".lora_down.weight", rnd({4, 32})},
                                           {q + ".lora_up.weight", rnd({32, 4})},
                                           {"lora_te_text_model_encoder_layers_0_mlp_fc1"
                                            ".lora_down.weight",
                                            rnd({4, 32})}}),
                    "'lora_te_text_model_encoder_layers_0_mlp_fc1.lora_down.weight' names no "
                    "linear layer of the Qwen-Image transformer (it looks like a text encoder");
  // PEFT's save_pretrained prefix.
  {
    const std::string path = write_lora(
        "peft_prefix",
        {{"base_model.model.transformer_blocks.0.attn.to_q.lora_A.weight", rnd({4, 32})},
         {"base_model.model.transformer_blocks.0.attn.to_q.lora_B.weight", rnd({32, 4})}});
    auto f = load_lora_file(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->layout, LoraLayout::kDiffusers);
    ASSERT_EQ(f->modules.size(), 1u);
    EXPECT_EQ(f->modules[0].module, "transformer_blocks.0.attn.to_q");
    EXPECT_FLOAT_EQ(f->modules[0].alpha, 4.f);  // no alpha anywhere: alpha = rank
  }
  // Not a LoRA at all: the model's own weights.
  auto f = load_lora_file(tiny_root() + "/io_transformer.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("is not a LoRA file"), std::string::npos)
      << f.status().message();
  // DoRA in the adapter metadata.
  expect_load_error(
      write_lora("dora",
                 {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", rnd({4, 32})},
                  {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", rnd({32, 4})}},
                 {{"lora_adapter_metadata", R"({"transformer.use_dora": true})"}}),
      "use_dora");
  // Missing file.
  expect_load_error(test::temp_dir() + "/absent.safetensors", "absent.safetensors");
}

// latent-tool: output and exit status of one command line.
struct ToolRun {
  int status = -1;
  std::string output;
};
ToolRun run_tool(const std::string& args) {
  ToolRun r;
  const std::string cmd = std::string(std::getenv("LATENT_TOOL")) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(QwenImageLora, LatentToolAppliesAndInspectsLoras) {
  if (!std::getenv("LATENT_TOOL")) GTEST_SKIP() << "LATENT_TOOL is not set (run through ctest)";
  const std::string out = test::temp_dir() + "/tool_sample.safetensors";
  const std::string base = "run --device cpu --model " + tiny_root() +
                           " --part transformer --inputs " + tiny_root() +
                           "/io_transformer.safetensors --case masked_batch --outputs " + out;
  for (const char* mode : {"runtime", "merged"}) {
    ToolRun r = run_tool(base + " --lora " + lora_path("lora_comfyui") + ":0.7 --lora " +
                         lora_path("lora_kohya") + ":-0.5 --lora-mode " + mode);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(std::string("2 LoRA(s) ") + mode), std::string::npos) << r.output;
    auto f = SafetensorsFile::open(out);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_LT(relative_l2(*(*f)->tensor("sample"), reference("stack")), kTolerance) << mode;
  }
  // Strength 1 when omitted.
  ToolRun r = run_tool(base + " --lora " + lora_path("lora_kohya"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto f = SafetensorsFile::open(out);
  ASSERT_TRUE(f.ok());
  EXPECT_LT(relative_l2(*(*f)->tensor("sample"), reference("kohya")), kTolerance);
  // Errors: a bad strength, a mode without LoRAs, LoRAs on a VAE part, another model's file.
  r = run_tool(base + " --lora " + lora_path("lora_kohya") + ":inf");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("not finite"), std::string::npos) << r.output;
  r = run_tool(base + " --lora-mode runtime");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--lora-mode given without --lora"), std::string::npos) << r.output;
  r = run_tool(base + " --lora-mode fused --lora " + lora_path("lora_kohya"));
  EXPECT_NE(r.status, 0);
  r = run_tool("run --device cpu --part decoder --inputs x --outputs y --lora " +
               lora_path("lora_kohya"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--lora applies to the transformer only"), std::string::npos)
      << r.output;
  // denoise: the 4-step Lightning loop with its LoRA (dit_lora/io_fewstep.safetensors).
  {
    const std::string dir = test::temp_dir();
    auto io = SafetensorsFile::open(fixture("dit_lora/io_fewstep.safetensors"));
    ASSERT_TRUE(io.ok());
    auto t = [&](const char* k) { return *(*io)->tensor(k); };
    ASSERT_TRUE(write_safetensors(dir + "/noise.safetensors", {{"latent", t("noise")}}).ok());
    ASSERT_TRUE(write_safetensors(dir + "/embeds.safetensors",
                                  {{"prompt_embeds", t("prompt_embeds")},
                                   {"prompt_embeds_mask", t("prompt_embeds_mask")},
                                   {"negative_prompt_embeds", t("negative_prompt_embeds")},
                                   {"negative_prompt_embeds_mask",
                                    t("negative_prompt_embeds_mask")}})
                    .ok());
    std::ofstream(dir + "/scheduler_config.json")
        << cases()["schedules"]["configs"]["lightning"].dump();
    r = run_tool("denoise --device cpu --model " + tiny_root() + " --embeds " + dir +
                 "/embeds.safetensors --noise " + dir + "/noise.safetensors --steps 4 " +
                 "--true-cfg-scale 1 --scheduler " + dir + "/scheduler_config.json --lora " +
                 lora_path("lora_lightning") + ":1 --output-latents " + dir + "/lat.safetensors");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("no CFG"), std::string::npos) << r.output;
    auto lat = SafetensorsFile::open(dir + "/lat.safetensors");
    ASSERT_TRUE(lat.ok()) << lat.status().message();
    EXPECT_LT(relative_l2(*(*lat)->tensor("latent"), t("lightning_4_lora.latents")), kTolerance);
  }
  // inspect
  r = run_tool("inspect " + lora_path("lora_lightning"));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* want : {"kind: LoRA", "layout: bare lora_down/lora_up (Qwen-Image-Lightning",
                           "modules: 28", "rank: 4", "alpha: 4 (from .alpha tensors)",
                           "fits: the Qwen-Image family", "inner dim 32, at least 2 blocks"})
    EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  r = run_tool("inspect " + lora_path("lora_diffusers"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("layout: diffusers/PEFT"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("alpha: 2-8 (from adapter metadata)"), std::string::npos) << r.output;
  const std::string flux =
      write_lora("flux_tool", {{"transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight",
                                rnd({4, 32})},
                               {"transformer.single_transformer_blocks.0.attn.to_q.lora_B.weight",
                                rnd({32, 4})}});
  r = run_tool("inspect " + flux);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("are for FLUX.1"), std::string::npos) << r.output;
}

TEST(QwenImageLora, SpecsParse) {
  auto s = parse_lora_spec("style.safetensors:0.8");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->path, "style.safetensors");
  EXPECT_FLOAT_EQ(s->strength, 0.8f);
  s = parse_lora_spec("/a/b.safetensors");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->path, "/a/b.safetensors");
  EXPECT_FLOAT_EQ(s->strength, 1.f);
  s = parse_lora_spec("C:/x.safetensors:-0.5");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->path, "C:/x.safetensors");
  EXPECT_FLOAT_EQ(s->strength, -0.5f);
  EXPECT_FALSE(parse_lora_spec(":0.5").ok());
  EXPECT_FALSE(parse_lora_spec("a.safetensors:nan").ok());
  {  // A strength that is no number, after a file that exists: the strength is named.
    const std::string file = test::temp_dir() + "/spec.safetensors";
    std::ofstream(file) << "x";
    for (const char* bad : {"abc", "0.5x", "", "1e999"}) {
      auto r = parse_lora_spec(file + ":" + bad);
      ASSERT_FALSE(r.ok()) << bad;
      EXPECT_NE(r.status().message().find(std::string("strength '") + bad + "' is not a number"),
                std::string::npos)
          << r.status().message();
    }
    // A ':' that is part of an existing file's name stays in the path.
    const std::string colon = test::temp_dir() + "/style:v2.safetensors";
    std::ofstream(colon) << "x";
    s = parse_lora_spec(colon);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->path, colon);
  }
  auto l = parse_lora_list("style.safetensors:0.8, lightning.safetensors:1.0");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[1].path, "lightning.safetensors");
  EXPECT_EQ(format_lora_list(*l), "style.safetensors:0.8,lightning.safetensors:1");
  l = parse_lora_list("");
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->empty());
  EXPECT_FALSE(parse_lora_list("a.safetensors,,b.safetensors").ok());
  EXPECT_TRUE(parse_lora_mode("runtime").ok());
  EXPECT_FALSE(parse_lora_mode("fused").ok());
}

}  // namespace
}  // namespace latent
