// FP8 checkpoints of the Qwen-Image transformer on the CPU (dequantised at load) against
// diffusers running the dequantised fp32 weights (scripts/make_dit_fp8_fixtures.py:
// tests/fixtures/dit_fp8): ComfyUI's scaled F8_E4M3 single file and an unscaled F8_E5M2 one,
// the config of a ComfyUI single file from its shapes, and latent-tool inspect.
// And dtype fp8 (LinearFormat::kFp8: the blocks' linear layers quantised to e4m3) on the CPU,
// which emulates the GPU's arithmetic: it is the reference tests/gpu/test_cuda_fp8.cpp holds
// the FP8 tensor-core path to.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/fp8.h"
#include "engine/weights/safetensors.h"
#include "tests/util/dit_test_util.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

// Relative L2 vs diffusers with the same (dequantised) weights, fp32 on the CPU: what the fp32
// checkpoint itself reaches (test_qwen_image_mmdit.cpp), far below the FP8 rounding (~1e-2).
constexpr double kTolerance = 1e-5;

std::string fixture(const std::string& name) { return test::fixtures_dir() + "/" + name; }
std::string fp8_file(const std::string& name) {
  return fixture("dit_fp8/" + name + ".safetensors");
}

Tensor io(const std::string& name) {
  auto f = SafetensorsFile::open(fixture("dit_fp8/io_fp8.safetensors"));
  EXPECT_TRUE(f.ok()) << f.status().message();
  auto t = (*f)->tensor(name);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : Tensor();
}

// The "masked_batch" transformer case (B = 2, padded text) and its fp32 checkpoint's output.
std::string tiny_io() { return fixture("dit_qwen_image_tiny/io_transformer.safetensors"); }
MmditInputs inputs(Backend& b) {
  return test::transformer_case_inputs(b, tiny_io(), "masked_batch");
}
Tensor fp32_sample() { return test::transformer_case_sample(tiny_io(), "masked_batch"); }

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != DType::kF32 || b.dtype() != DType::kF32) return false;
  return std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(QwenImageFp8, SingleFilesMatchDiffusersWithDequantisedWeights) {
  struct Case {
    const char* file;
    const char* prefix;
    const char* dtype;  // as the model reports it
  };
  for (const Case& c : {Case{"comfyui_scaled", "model.diffusion_model.", "fp8_e4m3 scaled"},
                        Case{"e5m2", "diffusion_model.", "fp8_e5m2"}}) {
    SCOPED_TRACE(c.file);
    // The dequantised weights: bit for bit what PyTorch computes (fp8 -> fp32, x scale).
    auto store = WeightStore::open(fp8_file(c.file));
    ASSERT_TRUE(store.ok()) << store.status().message();
    EXPECT_EQ(qwen_image_mmdit_key_prefix(*store), c.prefix);
    for (const char* w : {"transformer_blocks.0.attn.to_q.weight",
                          "transformer_blocks.1.img_mlp.net.2.weight",  // per-row scales
                          "transformer_blocks.0.img_mod.1.weight"}) {
      auto got = store->get(c.prefix + std::string(w));
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_TRUE(same_bits(*got, io(str_cat(c.file, ".dequant.", w)))) << w;
    }

    // The whole transformer: a single file with its config beside it as <stem>.json.
    auto m = QwenImageMmdit::load(fp8_file(c.file), test::cpu_backend());
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ((*m)->source().form, "single file");
    EXPECT_EQ((*m)->config().num_layers, 2);
    EXPECT_NE((*m)->description().find(c.dtype), std::string::npos) << (*m)->description();
    auto y = (*m)->forward(inputs((*m)->backend()));
    ASSERT_TRUE(y.ok()) << y.status().message();
    const Tensor out = *(*m)->backend().download(*y);
    const Tensor ref = io(str_cat(c.file, ".sample"));
    ASSERT_EQ(out.shape(), ref.shape());
    const double err = relative_l2(out, ref);
    EXPECT_LT(err, kTolerance) << "relative L2 " << err;
    // FP8 moved the output off the fp32 checkpoint's: the reference is the FP8 model's own.
    const double quantisation = relative_l2(ref, fp32_sample());
    EXPECT_GT(quantisation, 100 * kTolerance);
    std::printf("%s: relative L2 %.2e vs diffusers (dequantised), FP8 vs fp32 weights %.2e\n",
                c.file, err, quantisation);
  }
}

// The tiny fixture's heads have 16 dims: without its <stem>.json the rotary axes cannot be told.
TEST(QwenImageFp8, SingleFileWithoutConfigNeedsQwenImageHeads) {
  const std::string dir = test::temp_dir() + "/noconfig";
  std::filesystem::create_directories(dir);
  const std::string copy = dir + "/qwen_image_fp8_e4m3fn.safetensors";
  std::filesystem::copy_file(fp8_file("comfyui_scaled"), copy,
                             std::filesystem::copy_options::overwrite_existing);
  auto m = QwenImageMmdit::load(copy, test::cpu_backend());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("heads of 16 dims need their axes_dims_rope"),
            std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("x.safetensors -> x.json"), std::string::npos);
}

// Every tensor of a Qwen-Image transformer with 128-dim heads (zeros, BF16), keys `prefix<m>`.
std::map<std::string, Tensor> transformer_tensors(const std::string& prefix, int64_t heads,
                                                  int64_t layers, int64_t joint) {
  const int64_t d = heads * 128;
  std::map<std::string, Tensor> t;
  auto linear = [&](const std::string& m, int64_t in, int64_t out) {
    t[prefix + m + ".weight"] = Tensor::zeros({out, in}, DType::kBF16);
    t[prefix + m + ".bias"] = Tensor::zeros({out}, DType::kBF16);
  };
  linear("img_in", 64, d);
  t[prefix + "txt_norm.weight"] = Tensor::zeros({joint}, DType::kBF16);
  linear("txt_in", joint, d);
  linear("time_text_embed.timestep_embedder.linear_1", 256, d);
  linear("time_text_embed.timestep_embedder.linear_2", d, d);
  linear("norm_out.linear", d, 2 * d);
  linear("proj_out", d, 64);
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = str_cat("transformer_blocks.", i, ".");
    linear(b + "img_mod.1", d, 6 * d);
    linear(b + "txt_mod.1", d, 6 * d);
    for (const char* p : {"to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj",
                          "add_v_proj", "to_add_out"})
      linear(b + "attn." + p, d, d);
    for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"})
      t[prefix + b + "attn." + n + ".weight"] = Tensor::zeros({128}, DType::kBF16);
    linear(b + "img_mlp.net.0.proj", d, 4 * d);
    linear(b + "img_mlp.net.2", 4 * d, d);
    linear(b + "txt_mlp.net.0.proj", d, 4 * d);
    linear(b + "txt_mlp.net.2", 4 * d, d);
  }
  return t;
}

TEST(QwenImageFp8, ConfigOfAComfyUiSingleFileFromItsShapes) {
  for (const char* prefix : {"model.diffusion_model.", "diffusion_model.", ""}) {
    SCOPED_TRACE(prefix);
    const std::string path = test::temp_dir() + "/shapes.safetensors";
    ASSERT_TRUE(write_safetensors(path, transformer_tensors(prefix, 1, 2, 24)).ok());
    auto store = WeightStore::open(path);
    ASSERT_TRUE(store.ok());
    ASSERT_EQ(qwen_image_mmdit_key_prefix(*store), prefix);
    auto cfg = infer_qwen_image_mmdit_config(*store, prefix);
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    EXPECT_EQ(cfg->num_layers, 2);
    EXPECT_EQ(cfg->num_attention_heads, 1);
    EXPECT_EQ(cfg->attention_head_dim, 128);
    EXPECT_EQ(cfg->joint_attention_dim, 24);
    EXPECT_EQ(cfg->in_channels, 64);
    EXPECT_EQ(cfg->out_channels, 16);
    EXPECT_EQ(cfg->patch_size, 2);
    EXPECT_EQ(cfg->axes_dims_rope, std::vector<int64_t>({16, 56, 56}));
    EXPECT_FALSE(cfg->zero_cond_t);
    // The whole load: every tensor found under the prefix, nothing left over.
    auto m = QwenImageMmdit::load(path, test::cpu_backend());
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_NE((*m)->description().find("config: from the weights' shapes"), std::string::npos);
  }
  // Not a transformer, and a transformer whose blocks lack their norms.
  const std::string path = test::temp_dir() + "/other.safetensors";
  ASSERT_TRUE(
      write_safetensors(path, {{"decoder.conv_in.weight", Tensor::zeros({4}, DType::kF32)}}).ok());
  auto m = QwenImageMmdit::load(path, test::cpu_backend());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("has no 'img_in.weight': not a Qwen-Image transformer"),
            std::string::npos)
      << m.status().message();
  auto t = transformer_tensors("diffusion_model.", 1, 1, 8);
  t.erase("diffusion_model.transformer_blocks.0.attn.norm_q.weight");
  ASSERT_TRUE(write_safetensors(path, t).ok());
  m = QwenImageMmdit::load(path, test::cpu_backend());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(
      m.status().message().find("has no 'diffusion_model.transformer_blocks.0.attn.norm_q.weight'"),
      std::string::npos)
      << m.status().message();
}

// An FP8 weight whose scale is misshaped fails the whole load, naming the key.
TEST(QwenImageFp8, BadScaleFailsTheLoadNamingTheKey) {
  auto t = transformer_tensors("model.diffusion_model.", 1, 1, 8);
  t["model.diffusion_model.transformer_blocks.0.attn.to_q.scale_weight"] =
      Tensor::from_floats({3}, {1.f, 2.f, 3.f});
  const std::string path = test::temp_dir() + "/badscale.safetensors";
  ASSERT_TRUE(write_safetensors(path, t).ok());
  auto m = QwenImageMmdit::load(path, test::cpu_backend());
  ASSERT_FALSE(m.ok());
  // The weight is BF16 here: a scale beside it is an error of its own.
  EXPECT_NE(m.status().message().find("'model.diffusion_model.transformer_blocks.0.attn.to_q."
                                      "scale_weight' in " +
                                      path + " scales"),
            std::string::npos)
      << m.status().message();
}

struct ToolRun {
  int status = -1;
  std::string output;
};

ToolRun run_tool(const std::string& args) {
  const std::string cmd = std::string(std::getenv("LATENT_TOOL")) + " " + args + " 2>&1";
  ToolRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(QwenImageFp8, LatentToolInspectsAndRunsFp8Files) {
  if (!std::getenv("LATENT_TOOL")) GTEST_SKIP() << "LATENT_TOOL is not set (run through ctest)";
  ToolRun r = run_tool("inspect " + fp8_file("comfyui_scaled"));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* part : {"Qwen-Image transformer", "model.diffusion_model. (ComfyUI)",
                           "fp8_e4m3 ", "scaled: ", "1 per row", "scale_input (ignored)",
                           "scaled_fp8 marker (fp8_e4m3)", "comfyui_scaled.json"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  r = run_tool("inspect " + fp8_file("e5m2"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("unscaled (cast to FP8)"), std::string::npos) << r.output;
  // A forward through the tool.
  const std::string out = test::temp_dir() + "/fp8_sample.safetensors";
  r = run_tool("run --device cpu --part transformer --model " + fp8_file("comfyui_scaled") +
               " --inputs " + fixture("dit_qwen_image_tiny/io_transformer.safetensors") +
               " --case masked_batch --outputs " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  auto f = SafetensorsFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_LT(relative_l2(*(*f)->tensor("sample"), io("comfyui_scaled.sample")), kTolerance);
}

// --- dtype fp8: the blocks' linear layers in e4m3 (emulated on the CPU) -----------------------

std::string tiny_root() { return fixture("dit_qwen_image_tiny"); }

Tensor run_model(QwenImageMmdit& m) {
  auto y = m.forward(inputs(m.backend()));
  EXPECT_TRUE(y.ok()) << y.status().message();
  if (!y.ok()) return Tensor();
  return *m.backend().download(*y);
}

Tensor lora_reference(const std::string& c) {
  auto f = SafetensorsFile::open(fixture("dit_lora/io_lora.safetensors"));
  EXPECT_TRUE(f.ok()) << f.status().message();
  auto t = (*f)->tensor(c + ".sample");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : Tensor();
}

TEST(QwenImageFp8, QuantizeRowsDefaultIsTheHostQuantisation) {
  auto be = test::cpu_backend();
  Tensor x = test::random_tensor({3, 32}, 5, -2.f, 2.f);
  auto q = be->fp8_quantize_rows(*be->upload(x));
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->shape, Shape({3, 32}));
  ASSERT_TRUE(q->dequant.defined());
  const std::vector<float> got = be->download(q->dequant)->to_floats();
  std::vector<uint8_t> codes(32);
  for (int r = 0; r < 3; ++r) {
    const float scale = fp8_e4m3_quantize_row(x.data_as<float>() + r * 32, 32, codes.data());
    for (int k = 0; k < 32; ++k)
      EXPECT_EQ(got[r * 32 + k], fp8_e4m3_to_f32(codes[k]) * scale) << r << ", " << k;
  }
  EXPECT_FALSE(be->fp8_quantize_rows(Tensor()).ok());
}

TEST(QwenImageFp8, Fp8LinearsRunEmulatedOnTheCpu) {
  auto m = QwenImageMmdit::load(tiny_root(), test::cpu_backend(), {}, LinearFormat::kFp8);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->linear_format(), LinearFormat::kFp8);
  const std::string d = (*m)->description();
  EXPECT_NE(d.find("linear layers: 28 in fp8 e4m3"), std::string::npos) << d;
  EXPECT_NE(d.find("emulated"), std::string::npos) << d;
  const Tensor y = run_model(**m);
  // e4m3 weights and activations: ~1 % from the fp32 model; more than the fp32 path's 1e-6,
  // so the layers really ran quantised.
  const double err = relative_l2(y, fp32_sample());
  std::printf("fp8 (emulated) vs diffusers fp32: relative L2 %.2e\n", err);
  EXPECT_GT(err, 1e-3);
  EXPECT_LT(err, 5e-2);
}

// One batch row: the attention's output reaches to_out / to_add_out as Backend::attention_fp8's
// quantised rows (on the CPU the default: attention, then its rows quantised), the image and text
// rows as views of them. The same input as a batch of two takes the old path (each output
// layer quantising its own slice): both rows must give the one-row output exactly, so a view at a
// wrong offset (the text rows reach the image only through the next block) fails here.
TEST(QwenImageFp8, OneBatchRowTakesTheAttentionOutputQuantised) {
  setenv("LATENT_FP8_ATTENTION", "1", 1);  // q and k as they are (the default codes them: below)
  auto m = QwenImageMmdit::load(tiny_root(), test::cpu_backend(), {}, LinearFormat::kFp8);
  unsetenv("LATENT_FP8_ATTENTION");
  ASSERT_TRUE(m.ok()) << m.status().message();
  Backend& be = (*m)->backend();
  EXPECT_NE((*m)->description().find("attention: its output quantised for to_out"),
            std::string::npos)
      << (*m)->description();
  const MmditInputs one = test::transformer_case_inputs(be, tiny_io(), "single");
  ASSERT_EQ(one.hidden_states.dim(0), 1);
  auto y = (*m)->forward(one);
  ASSERT_TRUE(y.ok()) << y.status().message();
  const Tensor out = *be.download(*y);
  const Tensor ref = test::transformer_case_sample(tiny_io(), "single");
  ASSERT_EQ(out.shape(), ref.shape());
  const double err = relative_l2(out, ref);
  std::printf("fp8 (emulated), one batch row, vs diffusers fp32: relative L2 %.2e\n", err);
  EXPECT_GT(err, 1e-3);
  EXPECT_LT(err, 5e-2);

  MmditInputs two = one;
  two.hidden_states = *be.concat({one.hidden_states, one.hidden_states}, 0);
  two.encoder_hidden_states = *be.concat({one.encoder_hidden_states, one.encoder_hidden_states}, 0);
  for (auto* v : {&two.encoder_hidden_states_mask, &two.timestep}) {
    const std::vector<float> first = *v;  // (a vector's own range may not be inserted into it)
    v->insert(v->end(), first.begin(), first.end());
  }
  two.timestep_proj = Tensor();
  auto y2 = (*m)->forward(two);
  ASSERT_TRUE(y2.ok()) << y2.status().message();
  const Tensor both = *be.download(*y2);
  ASSERT_EQ(both.dim(0), 2);
  const int64_t n = out.numel();
  for (int64_t row = 0; row < 2; ++row) {
    const Tensor part = Tensor::from_floats(
        out.shape(),
        std::vector<float>(both.data_as<float>() + row * n, both.data_as<float>() + (row + 1) * n));
    EXPECT_LT(relative_l2(part, out), 1e-6) << "batch row " << row;
  }
}

// Backend::joint_qk_fp8's default: joint_qk's values coded in e4m3 with the one scale bound / 448,
// each within e4m3's rounding of the value; a bound that is not a positive number is refused.
TEST(QwenImageFp8, JointQkCodesWithOneStaticScale) {
  auto be = test::cpu_backend();
  const int heads = 2, d = 16;
  auto up = [&](const Tensor& t) { return *be->upload(t); };
  const Tensor img = up(test::random_tensor({1, 5, heads * d}, 71, -3.f, 3.f));
  const Tensor txt = up(test::random_tensor({1, 3, heads * d}, 72, -3.f, 3.f));
  const Tensor gi = up(test::random_tensor({d}, 73, 0.5f, 2.f));
  const Tensor gt = up(test::random_tensor({d}, 74, -2.f, 1.f));
  std::vector<float> f;
  for (int t = 0; t < 8; ++t)
    for (int i = 0; i < d / 2; ++i) {
      f.push_back(std::cos(0.3f * t * (i + 1)));
      f.push_back(std::sin(0.3f * t * (i + 1)));
    }
  const Tensor freqs = up(Tensor::from_floats({8, d / 2, 2}, f));
  const float bound = std::sqrt(static_cast<float>(d)) * 2.f;
  auto y = be->joint_qk(img, txt, gi, gt, freqs, heads, 1e-6f);
  auto q = be->joint_qk_fp8(img, txt, gi, gt, freqs, heads, 1e-6f, bound);
  ASSERT_TRUE(y.ok() && q.ok()) << q.status().message();
  ASSERT_EQ(q->shape, y->shape());
  const std::vector<float> a = be->download(*y)->to_floats(),
                           b = be->download(q->dequant)->to_floats();
  const float step = bound / 448.f;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::fabs(a[i]), bound);  // the bound holds
    // e4m3: 3 mantissa bits, so within 1/16 of the value, or of the subnormal step near zero
    EXPECT_LE(std::fabs(a[i] - b[i]), std::max(std::fabs(a[i]) / 16.f, step / 16.f)) << i;
  }
  for (float bad : {0.f, -1.f, std::nanf("")}) {
    auto r = be->joint_qk_fp8(img, txt, gi, gt, freqs, heads, 1e-6f, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("is not a positive number"), std::string::npos);
  }
}

// LATENT_FP8_ATTENTION=codes (the default with FP8 layers): q and k coded by joint_qk with the
// blocks' static bounds; the output stays near diffusers and near LATENT_FP8_ATTENTION=1's
// (q, k and v scaled by their amax), and unset means codes.
// The FP8 model at `root` loaded with LATENT_FP8_ATTENTION=mode (unset for null), run on the
// tiny fixture's one-batch-row case: its output on the host (undefined after a failure).
Tensor run_fp8_attention_mode(const std::string& root, const char* mode) {
  if (mode)
    setenv("LATENT_FP8_ATTENTION", mode, 1);
  else
    unsetenv("LATENT_FP8_ATTENTION");
  auto m = QwenImageMmdit::load(root, test::cpu_backend(), {}, LinearFormat::kFp8);
  unsetenv("LATENT_FP8_ATTENTION");
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return Tensor();
  auto y = (*m)->forward(test::transformer_case_inputs((*m)->backend(), tiny_io(), "single"));
  EXPECT_TRUE(y.ok()) << y.status().message();
  return y.ok() ? *(*m)->backend().download(*y) : Tensor();
}

TEST(QwenImageFp8, CodesModeCodesQueriesAndKeysWithStaticBounds) {
  auto run_single = [](const char* mode) { return run_fp8_attention_mode(tiny_root(), mode); };
  const Tensor plain = run_single("1"), codes = run_single("codes"), unset = run_single(nullptr);
  ASSERT_TRUE(plain.defined() && codes.defined() && unset.defined());
  EXPECT_EQ(relative_l2(unset, codes), 0.0);
  const Tensor ref = test::transformer_case_sample(tiny_io(), "single");
  const double vs_ref = relative_l2(codes, ref), vs_plain = relative_l2(codes, plain);
  std::printf(
      "fp8 codes mode (emulated), one batch row: vs diffusers fp32 %.2e, vs "
      "LATENT_FP8_ATTENTION=1 %.2e\n",
      vs_ref, vs_plain);
  EXPECT_LT(vs_ref, 5e-2);
  EXPECT_GT(vs_plain, 0.0);   // q and k really coded
  EXPECT_LT(vs_plain, 3e-2);  // ... with e4m3's error only
}

// A block whose QK-norm gamma is all zeros has no static bound: the model still loads in codes
// mode (the default), that block scaling q and k by their amax, and its output is the amax
// mode's in that block (the same as LATENT_FP8_ATTENTION=1 on a model whose every block is so).
TEST(QwenImageFp8, AGammaWithoutABoundFallsBackToAmaxScaling) {
  namespace fs = std::filesystem;
  const std::string root = test::temp_dir() + "/dit_zero_gamma";
  fs::remove_all(root);
  fs::copy(tiny_root() + "/transformer", root, fs::copy_options::recursive);
  int zeroed = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.path().extension() != ".safetensors") continue;
    auto f = SafetensorsFile::open(entry.path().string());
    ASSERT_TRUE(f.ok()) << f.status().message();
    std::map<std::string, Tensor> all;
    for (const TensorRecord& r : (*f)->records()) {
      auto t = (*f)->tensor(r.name);
      ASSERT_TRUE(t.ok()) << t.status().message();
      if (r.name.find("norm_q.weight") != std::string::npos ||
          r.name.find("norm_added_q.weight") != std::string::npos) {
        *t = Tensor::from_floats(t->shape(), std::vector<float>(t->numel(), 0.f));
        ++zeroed;
      }
      all[r.name] = *t;
    }
    f = Result<std::shared_ptr<SafetensorsFile>>(Status::error("closed"));
    ASSERT_TRUE(write_safetensors(entry.path().string(), all).ok());
  }
  ASSERT_GT(zeroed, 0);
  auto run = [&](const char* mode) { return run_fp8_attention_mode(root, mode); };
  const Tensor codes = run(nullptr), amax = run("1");
  ASSERT_TRUE(codes.defined() && amax.defined());
  for (float v : codes.to_floats()) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(relative_l2(codes, amax), 0.0);  // every block's q gamma zeroed: all fell back
  fs::remove_all(root);
}

TEST(QwenImageFp8, Fp8WithLorasMergedBeforeTheQuantisationOrAtRunTime) {
  const std::string lora = fixture("dit_lora/lora_comfyui.safetensors");
  const Tensor ref = lora_reference("comfyui");  // strength 0.7, fp32 diffusers
  ASSERT_TRUE(ref.defined());
  auto base = QwenImageMmdit::load(tiny_root(), test::cpu_backend(), {}, LinearFormat::kFp8);
  ASSERT_TRUE(base.ok()) << base.status().message();
  const Tensor base_y = run_model(**base);
  for (LoraMode mode : {LoraMode::kMerged, LoraMode::kRuntime}) {
    SCOPED_TRACE(lora_mode_name(mode));
    auto m = QwenImageMmdit::load(tiny_root(), test::cpu_backend(), {{{lora, 0.7f}}, mode},
                                  LinearFormat::kFp8);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const Tensor y = run_model(**m);
    const double err = relative_l2(y, ref);
    std::printf("fp8 + LoRA (%s) vs diffusers fp32: relative L2 %.2e\n", lora_mode_name(mode),
                err);
    EXPECT_LT(err, 5e-2);
    EXPECT_GT(relative_l2(y, base_y), 5e-2);  // the LoRA moved the output
    if (mode == LoraMode::kRuntime) {
      // Strength 0 at run time: exactly the FP8 base model.
      ASSERT_TRUE((*m)->set_lora_strengths({0.f}).ok());
      const Tensor y0 = run_model(**m);
      ASSERT_EQ(y0.shape(), base_y.shape());
      EXPECT_EQ(relative_l2(y0, base_y), 0.0);
    }
  }
}

TEST(QwenImageFp8, LatentToolRunsTheTransformerInFp8AndRefusesItForVaes) {
  if (!std::getenv("LATENT_TOOL")) GTEST_SKIP() << "LATENT_TOOL is not set (run through ctest)";
  const std::string out = test::temp_dir() + "/fp8_linears.safetensors";
  ToolRun r = run_tool("run --device cpu --dtype fp8 --part transformer --model " + tiny_root() +
                       " --inputs " + tiny_io() + " --case masked_batch --outputs " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("on cpu (fp8)"), std::string::npos) << r.output;
  auto f = SafetensorsFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const double err = relative_l2(*(*f)->tensor("sample"), fp32_sample());
  EXPECT_GT(err, 1e-3);
  EXPECT_LT(err, 5e-2);
  r = run_tool("run --device cpu --dtype fp8 --model " + fixture("kl_tiny") +
               " --part encoder --inputs " + out + " --outputs " + test::temp_dir() +
               "/never_written.safetensors");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--dtype fp8 applies to the transformer"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace latent
