// QwenImageTransformer2DModel against diffusers fixtures made by scripts/make_dit_fixtures.py:
// dit_qwen_image_tiny (Qwen-Image layout, fp32 weights in two shards + index.json) and
// dit_qwen_image_edit_tiny (zero_cond_t as Qwen-Image-Edit-2511, bf16 weights).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include "engine/backends/registry.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/config.h"
#include "engine/weights/model_source.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

// fp32 on the CPU, as the reference.
constexpr double kTolerance = 1e-3;

std::string root(const std::string& name) { return test::fixtures_dir() + "/" + name; }

using test::cpu_backend;

// The inputs of one io_transformer.safetensors case ("single.hidden_states", ...).
struct Case {
  Tensor hidden_states, encoder_hidden_states, mask, timestep, img_shapes, sample;
};

Case read_case(const SafetensorsFile& f, const std::string& name) {
  Case c;
  auto get = [&](const std::string& key, bool optional = false) {
    auto t = f.tensor(name + "." + key);
    if (!t.ok()) {
      if (!optional) ADD_FAILURE() << t.status().message();
      return Tensor();
    }
    return *t;
  };
  c.hidden_states = get("hidden_states");
  c.encoder_hidden_states = get("encoder_hidden_states");
  c.mask = get("encoder_hidden_states_mask", true);
  c.timestep = get("timestep");
  c.img_shapes = get("img_shapes");
  c.sample = get("sample");
  return c;
}

Result<Tensor> run_case(QwenImageMmdit& model, const Case& c, bool trim = true) {
  Backend& b = model.backend();
  MmditInputs in;
  in.trim_text_padding = trim;
  LATENT_ASSIGN_OR_RETURN(in.hidden_states, b.upload(c.hidden_states));
  LATENT_ASSIGN_OR_RETURN(in.encoder_hidden_states, b.upload(c.encoder_hidden_states));
  if (c.mask.defined()) in.encoder_hidden_states_mask = c.mask.to_floats();
  in.timestep = c.timestep.to_floats();
  std::vector<float> s = c.img_shapes.to_floats();
  for (size_t i = 0; i + 2 < s.size(); i += 3)
    in.img_shapes.push_back({static_cast<int64_t>(s[i]), static_cast<int64_t>(s[i + 1]),
                             static_cast<int64_t>(s[i + 2])});
  LATENT_ASSIGN_OR_RETURN(Tensor y, model.forward(in));
  return b.download(y);
}

void check_root(const std::string& name, const std::vector<std::string>& cases,
                const std::string& dtype = "fp32", double tolerance = kTolerance,
                bool trim = true) {
  auto model = QwenImageMmdit::load(root(name), cpu_backend(dtype));
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(root(name) + "/io_transformer.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  for (const std::string& cname : cases) {
    SCOPED_TRACE(name + " " + cname);
    Case c = read_case(**io, cname);
    ASSERT_TRUE(c.sample.defined());
    auto y = run_case(**model, c, trim);
    ASSERT_TRUE(y.ok()) << y.status().message();
    ASSERT_EQ(y->shape(), c.sample.shape());
    const double err = relative_l2(*y, c.sample);
    EXPECT_LT(err, tolerance) << "relative L2 " << err;
    std::printf("%s %s (%s%s): relative L2 %.2e\n", name.c_str(), cname.c_str(), dtype.c_str(),
                trim ? "" : ", text not trimmed", err);
  }
}

TEST(QwenImageMmdit, TextToImageCasesMatchDiffusers) {
  check_root("dit_qwen_image_tiny", {"single", "masked_batch", "multi_image"});
}

TEST(QwenImageMmdit, ZeroCondTEditCasesMatchDiffusers) {
  check_root("dit_qwen_image_edit_tiny", {"edit", "edit_batch", "edit_single"});
}

// The same cases running every text token with the full mask (MmditInputs::trim_text_padding).
TEST(QwenImageMmdit, CasesMatchDiffusersWithoutTrimming) {
  check_root("dit_qwen_image_tiny", {"single", "masked_batch", "multi_image"}, "fp32", kTolerance,
             false);
  check_root("dit_qwen_image_edit_tiny", {"edit", "edit_batch"}, "fp32", kTolerance, false);
}

// Each block's modulation is kept per timestep vector (QwenImageMmdit::set_modulation_cache):
// taken from the cache or computed in the blocks, the output is the same, byte for byte, with
// and without zero_cond_t's second conditioning group.
TEST(QwenImageMmdit, ModulationCacheChangesNoByte) {
  for (const auto& [name, cname] :
       {std::pair<std::string, std::string>{"dit_qwen_image_tiny", "single"},
        {"dit_qwen_image_edit_tiny", "edit"}}) {
    SCOPED_TRACE(name);
    auto cached = QwenImageMmdit::load(root(name), cpu_backend());
    auto plain = QwenImageMmdit::load(root(name), cpu_backend());
    ASSERT_TRUE(cached.ok() && plain.ok());
    EXPECT_TRUE((*cached)->modulation_cache());  // on by default
    (*plain)->set_modulation_cache(false);
    auto io = SafetensorsFile::open(root(name) + "/io_transformer.safetensors");
    ASSERT_TRUE(io.ok());
    Case c = read_case(**io, cname);
    Case later = c;
    later.timestep =
        Tensor::from_floats({c.timestep.numel()}, std::vector<float>(c.timestep.numel(), 0.25f));
    for (const Case* k : {&c, &c, &later, &c}) {
      auto a = run_case(**cached, *k);
      auto b = run_case(**plain, *k);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(relative_l2(*a, *b), 0.0);
    }
    // c: computed, then from the cache; later: computed; c again: from the cache.
    EXPECT_EQ((*cached)->modulation_cache_hits(), 2);
    EXPECT_EQ((*plain)->modulation_cache_hits(), 0);
  }
}

TEST(QwenImageMmdit, Bf16BackendStaysClose) {
  // bf16 storage rounds every activation: a loose bound that still catches wrong wiring.
  check_root("dit_qwen_image_tiny", {"single", "masked_batch"}, "bf16", 5e-2);
}

TEST(QwenImageMmdit, LoadsFromTransformerFolderAndReportsConfig) {
  auto model = QwenImageMmdit::load(root("dit_qwen_image_tiny") + "/transformer", cpu_backend());
  ASSERT_TRUE(model.ok()) << model.status().message();
  const auto& c = (*model)->config();
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.inner_dim(), 32);
  EXPECT_EQ(c.joint_attention_dim, 24);
  EXPECT_FALSE(c.zero_cond_t);
  EXPECT_GT((*model)->parameters(), 50000);
  EXPECT_NE((*model)->description().find("axes_dims_rope: [4, 6, 6]"), std::string::npos);
  auto edit = QwenImageMmdit::load(root("dit_qwen_image_edit_tiny"), cpu_backend());
  ASSERT_TRUE(edit.ok()) << edit.status().message();
  EXPECT_TRUE((*edit)->config().zero_cond_t);
}

// The fixtures are sensitive to the text mask and the timestep: a model ignoring either would
// fail them.
TEST(QwenImageMmdit, MaskAndTimestepChangeTheOutput) {
  auto model = QwenImageMmdit::load(root("dit_qwen_image_edit_tiny"), cpu_backend());
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(root("dit_qwen_image_edit_tiny") + "/io_transformer.safetensors");
  ASSERT_TRUE(io.ok());
  Case c = read_case(**io, "edit");
  Case unmasked = c;
  unmasked.mask = Tensor();
  auto y = run_case(**model, unmasked);
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_GT(relative_l2(*y, c.sample), 1e-2);
  Case later = c;
  later.timestep = Tensor::from_floats({1}, {0.2f});
  y = run_case(**model, later);
  ASSERT_TRUE(y.ok());
  EXPECT_GT(relative_l2(*y, c.sample), 1e-2);
}

TEST(QwenImageMmdit, RejectsBadInputsWithMessages) {
  auto model = QwenImageMmdit::load(root("dit_qwen_image_tiny"), cpu_backend());
  ASSERT_TRUE(model.ok()) << model.status().message();
  Backend& b = (*model)->backend();
  MmditInputs in;
  in.hidden_states = *b.upload(test::random_tensor({1, 24, 64}, 1));
  in.encoder_hidden_states = *b.upload(test::random_tensor({1, 5, 24}, 2));
  in.timestep = {0.5f};
  in.img_shapes = {{1, 4, 5}};  // 20 tokens, not 24
  auto y = (*model)->forward(in);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("img_shapes describe 20 tokens"), std::string::npos)
      << y.status().message();
  in.img_shapes = {{1, 4, 6}};
  in.timestep = {0.5f, 0.1f};
  y = (*model)->forward(in);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("timestep"), std::string::npos);
  in.timestep = {0.5f};
  in.encoder_hidden_states_mask = {1, 1, 0};
  y = (*model)->forward(in);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("encoder_hidden_states_mask"), std::string::npos);
  in.encoder_hidden_states_mask = {0, 0, 0, 0, 0};  // every text token padding: image keys remain
  y = (*model)->forward(in);
  EXPECT_TRUE(y.ok()) << y.status().message();
  in.encoder_hidden_states_mask.clear();
  in.encoder_hidden_states = *b.upload(test::random_tensor({1, 5, 23}, 2));
  y = (*model)->forward(in);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.status().message().find("encoder_hidden_states must be [1, T_txt, 24]"),
            std::string::npos)
      << y.status().message();
}

// Writes a copy of a fixture's transformer folder with an edited config.json.
std::string edited_copy(const std::string& key, const nlohmann::json& value,
                        const std::string& fixture = "dit_qwen_image_tiny") {
  namespace fs = std::filesystem;
  const std::string dir = test::temp_dir() + "/" + fixture + "_" + key;
  fs::create_directories(dir);
  const std::string src = root(fixture) + "/transformer";
  for (const auto& e : fs::directory_iterator(src))
    fs::copy_file(e.path(), dir + "/" + e.path().filename().string(),
                  fs::copy_options::overwrite_existing);
  auto cfg = Config::load(src + "/config.json");
  EXPECT_TRUE(cfg.ok());
  nlohmann::json j = cfg->json();
  j[key] = value;
  std::ofstream(dir + "/config.json") << j.dump(2);
  return dir;
}

// Without zero_cond_t the same weights give another result on the edit case: the fixture
// does test that reference tokens are modulated at t = 0.
TEST(QwenImageMmdit, ZeroCondTMattersOnTheEditFixture) {
  auto plain = QwenImageMmdit::load(edited_copy("zero_cond_t", false, "dit_qwen_image_edit_tiny"),
                                    cpu_backend());
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  auto io = SafetensorsFile::open(root("dit_qwen_image_edit_tiny") + "/io_transformer.safetensors");
  ASSERT_TRUE(io.ok());
  Case c = read_case(**io, "edit");
  auto y = run_case(**plain, c);
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_GT(relative_l2(*y, c.sample), 1e-2);
  // With a single image zero_cond_t changes nothing (every token is the target).
  Case single = read_case(**io, "edit_single");
  y = run_case(**plain, single);
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_LT(relative_l2(*y, single.sample), kTolerance);
}

TEST(QwenImageMmdit, ConfigErrorsNameFileAndKey) {
  auto expect_error = [](const std::string& key, const nlohmann::json& value,
                         const std::string& words) {
    auto m = QwenImageMmdit::load(edited_copy(key, value), cpu_backend());
    ASSERT_FALSE(m.ok()) << key;
    EXPECT_NE(m.status().message().find(words), std::string::npos) << m.status().message();
    EXPECT_NE(m.status().message().find("config.json"), std::string::npos) << m.status().message();
  };
  expect_error("axes_dims_rope", {4, 6, 8}, "sums to 18");
  expect_error("guidance_embeds", true, "guidance_embeds");
  expect_error("use_layer3d_rope", true, "Qwen-Image-Layered");
  // A size past the bound is named as such, not as "not positive".
  expect_error("num_layers", 1000000000, "'num_layers' is 1000000000, expected a size from 1 to");
  // A config that disagrees with the weights is named before anything is built.
  auto m = QwenImageMmdit::load(edited_copy("joint_attention_dim", 32), cpu_backend());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("txt_in.weight"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("'joint_attention_dim' is 32"), std::string::npos)
      << m.status().message();
  expect_error("num_layers", 1000000, "'num_layers' is 1000000 but the weights");
  expect_error("num_layers", 3, "hold 2 transformer_blocks");
}

TEST(QwenImageTextPadding, CutsRightPaddingOnly) {
  TextPadding p = qwen_image_text_padding({}, 2, 5);
  EXPECT_TRUE(p.prefix);
  EXPECT_EQ(p.kept, 5);
  EXPECT_EQ(p.lengths, (std::vector<int64_t>{5, 5}));
  p = qwen_image_text_padding({1, 1, 1, 0, 0, 1, 1, 1, 1, 0}, 2, 5);
  EXPECT_TRUE(p.prefix);
  EXPECT_EQ(p.kept, 4);
  EXPECT_EQ(p.lengths, (std::vector<int64_t>{3, 4}));
  p = qwen_image_text_padding({1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, 2, 5);
  EXPECT_EQ(p.kept, 5);
  EXPECT_EQ(p.lengths, (std::vector<int64_t>{5, 2}));
  p = qwen_image_text_padding({1, 0, 1, 0, 0, 1, 1, 1, 1, 1}, 2, 5);  // a hole in row 0
  EXPECT_FALSE(p.prefix);
  EXPECT_EQ(p.kept, 5);
  EXPECT_TRUE(p.lengths.empty());
  p = qwen_image_text_padding({0, 0, 0}, 1, 3);  // all padding: one (masked) token stays
  EXPECT_TRUE(p.prefix);
  EXPECT_EQ(p.kept, 1);
  EXPECT_EQ(p.lengths, (std::vector<int64_t>{0}));
  EXPECT_FALSE(qwen_image_text_padding({1, 1}, 1, 3).prefix);  // wrong size: nothing cut
}

// Cutting the text padding and the [image, text] key order change no image token: a batch of
// two prompts with right padding, with equal valid lengths (no mask left) and with holes (the
// full mask), against the same forward with every text token (trim_text_padding = false), and
// row 0 against itself run alone with its prompt cut to its valid tokens and no mask.
TEST(QwenImageMmdit, TrimmedTextPaddingChangesNoImageToken) {
  auto model = QwenImageMmdit::load(root("dit_qwen_image_tiny"), cpu_backend());
  ASSERT_TRUE(model.ok()) << model.status().message();
  QwenImageMmdit& m = **model;
  Backend& b = m.backend();
  const int64_t t_txt = 7, t_img = 24, dim = m.config().joint_attention_dim;
  const Tensor hs = test::random_tensor({2, t_img, m.config().in_channels}, 11);
  const Tensor ehs = test::random_tensor({2, t_txt, dim}, 12);
  auto forward = [&](const Tensor& text, const std::vector<float>& mask, bool trim,
                     int64_t batch = 2) -> Tensor {
    MmditInputs in;
    in.hidden_states = *b.upload(batch == 2 ? hs : *b.slice(hs, 0, 0, 1));
    in.encoder_hidden_states = *b.upload(text);
    in.encoder_hidden_states_mask = mask;
    in.timestep.assign(static_cast<size_t>(batch), 0.6f);
    in.img_shapes = {{1, 4, 6}};
    in.trim_text_padding = trim;
    Result<Tensor> y = m.forward(in);
    EXPECT_TRUE(y.ok()) << y.status().message();
    return y.ok() ? *b.download(*y) : Tensor();
  };
  auto mask_of = [&](int64_t len0, int64_t len1) {
    std::vector<float> v(static_cast<size_t>(2 * t_txt), 0.f);
    for (int64_t j = 0; j < len0; ++j) v[static_cast<size_t>(j)] = 1.f;
    for (int64_t j = 0; j < len1; ++j) v[static_cast<size_t>(t_txt + j)] = 1.f;
    return v;
  };
  const std::vector<float> holes = {1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0, 0};
  for (const auto& [what, mask] :
       std::vector<std::pair<std::string, std::vector<float>>>{{"lengths 3 and 5", mask_of(3, 5)},
                                                               {"lengths 4 and 4", mask_of(4, 4)},
                                                               {"lengths 0 and 2", mask_of(0, 2)},
                                                               {"holes", holes}}) {
    SCOPED_TRACE(what);
    const Tensor trimmed = forward(ehs, mask, true);
    const Tensor full = forward(ehs, mask, false);
    ASSERT_TRUE(trimmed.defined() && full.defined());
    const double err = relative_l2(trimmed, full);
    std::printf("text padding %s: trimmed vs every token, relative L2 %.2e\n", what.c_str(), err);
    EXPECT_LT(err, 1e-5);
    // Whatever the padding tokens hold, nothing changes.
    std::vector<float> noisy = ehs.to_floats();
    const std::vector<float> noise =
        test::random_tensor({2, t_txt, dim}, 13, -5.f, 5.f).to_floats();
    for (size_t i = 0; i < noisy.size(); ++i)
      if (mask[i / static_cast<size_t>(dim)] == 0.f) noisy[i] = noise[i];
    const Tensor other = forward(Tensor::from_floats({2, t_txt, dim}, noisy), mask, true);
    ASSERT_TRUE(other.defined());
    EXPECT_LT(relative_l2(other, trimmed), 1e-6);
  }
  // Row 0 (3 valid tokens) alone, its prompt cut by hand and no mask.
  const Tensor batched = forward(ehs, mask_of(3, 5), true);
  std::vector<float> row0 = ehs.to_floats();
  row0.resize(static_cast<size_t>(3 * dim));
  const Tensor alone = forward(Tensor::from_floats({1, 3, dim}, row0), {}, true, 1);
  ASSERT_TRUE(batched.defined() && alone.defined());
  const std::vector<float> bv = batched.to_floats();
  const Tensor first = Tensor::from_floats(
      alone.shape(), std::vector<float>(bv.begin(), bv.begin() + alone.numel()));
  const double err = relative_l2(first, alone);
  std::printf("text padding: batch row 0 vs alone with its valid tokens, relative L2 %.2e\n", err);
  EXPECT_LT(err, 1e-5);
}

// QwenEmbedRope positions, checked on values computed by hand.
TEST(QwenImageRope, CentredImagePositionsAndTextOffset) {
  // axes (2, 2, 2): one frequency per axis, theta^0 = 1, so the angle is the position itself.
  auto t = qwen_image_rope_table({2, 2, 2}, {{1, 3, 4}, {1, 2, 2}}, 2);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->shape(), (Shape{2 + 12 + 4, 3, 2}));
  const float* p = t->data_as<float>();
  auto angle = [&](int64_t token, int axis) {
    return std::atan2(p[(token * 3 + axis) * 2 + 1], p[(token * 3 + axis) * 2]);
  };
  // Text: max(h/2, w/2) over images = max(1, 2, 1, 1) = 2, so text tokens sit at 2 and 3.
  EXPECT_NEAR(angle(0, 0), 2.0, 1e-6);
  EXPECT_NEAR(angle(1, 2), 3.0, 1e-6);
  // Image 0 (3 x 4): rows -2..0, columns -2..1; token (row 0, col 3) = index 3.
  EXPECT_NEAR(angle(2 + 0, 1), -2.0, 1e-6);
  EXPECT_NEAR(angle(2 + 3, 2), 1.0, 1e-6);
  EXPECT_NEAR(angle(2 + 11, 1), 0.0, 1e-6);
  EXPECT_NEAR(angle(2 + 0, 0), 0.0, 1e-6);  // frame of image 0
  // Image 1 (2 x 2): frame position 1, rows -1..0.
  EXPECT_NEAR(angle(14, 0), 1.0, 1e-6);
  EXPECT_NEAR(angle(14, 1), -1.0, 1e-6);
  EXPECT_NEAR(angle(17, 2), 0.0, 1e-6);
  EXPECT_FALSE(qwen_image_rope_table({2, 2, 2}, {{1, 0, 4}}, 2).ok());
  EXPECT_FALSE(qwen_image_rope_table({2, 2, 2}, {{1, 4, 4}}, 4095).ok());
}

}  // namespace
}  // namespace latent
