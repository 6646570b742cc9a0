// AutoencoderKLQwenImage (Wan 2.1 VAE, single frames) against diffusers fixtures made by
// scripts/make_fixtures.py: qwen_image_vae_tiny (diffusers folder) and
// qwen_image_vae_tiny_single (the same weights as a Wan-Video / ComfyUI single file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/backends/registry.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/qwen_image.h"
#include "engine/weights/config.h"
#include "engine/weights/model_source.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"
#include "tests/util/vae_test_util.h"

namespace latent {
namespace {

// fp32 on the CPU: the reference ran in fp32 too.
constexpr double kTolerance = 1e-3;

std::string case_dir(const std::string& name) { return test::fixtures_dir() + "/" + name; }
std::string folder_case() { return case_dir("qwen_image_vae_tiny"); }
std::string single_file() {
  return case_dir("qwen_image_vae_tiny_single") + "/vae_single.safetensors";
}

using test::cpu_backend;

// Loads through the same steps as load_vae: resolve, config (if any), weights, architecture.
Result<std::unique_ptr<VaeModel>> load(const std::string& path, VaeLoadOptions options = {}) {
  LATENT_ASSIGN_OR_RETURN(ModelSource src, resolve_model_source(path));
  std::optional<Config> config;
  if (!src.config_path.empty()) {
    LATENT_ASSIGN_OR_RETURN(Config c, Config::load(src.config_path));
    config = std::move(c);
  }
  LATENT_ASSIGN_OR_RETURN(WeightStore weights, WeightStore::open(src.weights_path));
  return load_qwen_image_vae(src, config ? &*config : nullptr, weights, cpu_backend(), options);
}

using test::Io;

Tensor upload(Backend& b, const Tensor& host) {
  auto t = b.upload(host);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : Tensor();
}

// Relative L2 of a backend result against a host reference of the same shape.
void expect_matches(Backend& b, const Result<Tensor>& got, const Tensor& ref, const char* what) {
  ASSERT_TRUE(got.ok()) << what << ": " << got.status().message();
  auto host = b.download(*got);
  ASSERT_TRUE(host.ok()) << host.status().message();
  ASSERT_EQ(shape_str(host->shape()), shape_str(ref.shape())) << what;
  const double err = relative_l2(*host, ref);
  EXPECT_LT(err, kTolerance) << what << ": relative L2 " << err;
}

void check_against_reference(VaeModel& vae, const Io& io) {
  Backend& b = vae.backend();
  expect_matches(b, vae.encode(upload(b, io.sample)), io.latent_mean, "encode");
  expect_matches(b, vae.decode(upload(b, io.latent)), io.decoded, "decode");
}

// All tensors of a store, as host views.
std::map<std::string, Tensor> read_all(const std::string& path) {
  std::map<std::string, Tensor> out;
  auto store = WeightStore::open(path);
  EXPECT_TRUE(store.ok()) << store.status().message();
  if (!store.ok()) return out;
  for (const auto& n : store->names()) out[n] = *store->get(n);
  return out;
}

// A copy of the fixture folder with edited weights (and optionally an edited config).
std::string write_folder_variant(const std::string& name, const std::map<std::string, Tensor>& w,
                                 const std::string& config_text = "") {
  const std::string dir = test::temp_dir() + "/" + name;
  std::filesystem::create_directories(dir);
  EXPECT_TRUE(write_safetensors(dir + "/diffusion_pytorch_model.safetensors", w).ok());
  std::string text = config_text;
  if (text.empty()) {
    std::ifstream in(folder_case() + "/config.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ofstream(dir + "/config.json") << text;
  return dir;
}

std::string write_single_variant(const std::string& name, const std::map<std::string, Tensor>& w) {
  const std::string path = test::temp_dir() + "/" + name + ".safetensors";
  EXPECT_TRUE(write_safetensors(path, w).ok());
  return path;
}

std::string config_with(const std::string& key, const nlohmann::json& value) {
  std::ifstream in(folder_case() + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j[key] = value;
  return j.dump();
}

// ---------------------------------------------------------------------------------------------

TEST(QwenImageVae, DiffusersFolderMatchesReference) {
  auto vae = load(folder_case());
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  check_against_reference(**vae, test::load_io(folder_case()));
}

TEST(QwenImageVae, WanSingleFileMatchesReference) {
  auto vae = load(single_file());
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  check_against_reference(**vae, test::load_io(case_dir("qwen_image_vae_tiny_single")));
}

TEST(QwenImageVae, PrefixedSingleFileMatchesReference) {
  std::map<std::string, Tensor> prefixed;
  for (auto& [n, t] : read_all(single_file())) prefixed["first_stage_model." + n] = t;
  auto vae = load(write_single_variant("prefixed", prefixed));
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  check_against_reference(**vae, test::load_io(folder_case()));
}

TEST(QwenImageVae, DiffusersNamedSingleFileMatchesReference) {
  auto path = write_single_variant(
      "diffusers_names", read_all(folder_case() + "/diffusion_pytorch_model.safetensors"));
  auto vae = load(path);
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  check_against_reference(**vae, test::load_io(folder_case()));
}

TEST(QwenImageVae, ModelInfo) {
  auto vae = load(folder_case());
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  const ModelInfo& info = (*vae)->info();
  EXPECT_EQ(info.architecture, "AutoencoderKLQwenImage");
  EXPECT_TRUE((*vae)->has_encoder());
  EXPECT_TRUE((*vae)->has_decoder());
  const LatentSpace& ls = (*vae)->latent_space();
  EXPECT_EQ(ls.name, "qwen-image");
  EXPECT_EQ(ls.channels, 16);
  EXPECT_EQ(ls.downsample, 8);
  ASSERT_EQ(ls.shift.size(), 16u);
  ASSERT_EQ(ls.scale.size(), 16u);
  // normalised = (raw - mean) / std, as the Qwen-Image pipeline does.
  EXPECT_FLOAT_EQ(ls.shift[0], -0.7571f);
  EXPECT_FLOAT_EQ(ls.scale[0], static_cast<float>(1.0 / 2.8184));
  EXPECT_FLOAT_EQ(ls.shift[15], -0.2921f);
  EXPECT_FLOAT_EQ(ls.scale[15], static_cast<float>(1.0 / 1.9160));
  // Every stored tensor (time_conv included) belongs to a part.
  int64_t stored = 0;
  for (const auto& [n, t] : read_all(folder_case() + "/diffusion_pytorch_model.safetensors"))
    stored += t.numel();
  ASSERT_EQ(info.parts.size(), 2u);
  EXPECT_EQ(info.parts[0].name, "encoder");
  EXPECT_EQ(info.parts[1].name, "decoder");
  EXPECT_EQ(info.parts[0].parameters + info.parts[1].parameters, stored);
  EXPECT_EQ(info.storage_dtypes.count("fp32"), 1u);
  EXPECT_NE(info.description.find("base_dim: 2"), std::string::npos) << info.description;
}

TEST(QwenImageVae, SingleFileConfigIsReadFromShapes) {
  auto store = WeightStore::open(single_file());
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_TRUE(is_qwen_image_vae_checkpoint(*store));
  auto layout = detect_qwen_image_vae_layout(*store);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_TRUE(layout->original);
  EXPECT_EQ(layout->prefix, "");
  auto inferred = infer_qwen_image_vae_config(*store, *layout);
  ASSERT_TRUE(inferred.ok()) << inferred.status().message();

  auto json = Config::load(folder_case() + "/config.json");
  ASSERT_TRUE(json.ok()) << json.status().message();
  auto expected = parse_qwen_image_vae_config(*json);
  ASSERT_TRUE(expected.ok()) << expected.status().message();
  EXPECT_EQ(inferred->base_dim, expected->base_dim);
  EXPECT_EQ(inferred->z_dim, expected->z_dim);
  EXPECT_EQ(inferred->dim_mult, expected->dim_mult);
  EXPECT_EQ(inferred->num_res_blocks, expected->num_res_blocks);
  EXPECT_EQ(inferred->temperal_downsample, expected->temperal_downsample);
  EXPECT_EQ(inferred->attn_scales, expected->attn_scales);
  EXPECT_EQ(inferred->input_channels, expected->input_channels);
  EXPECT_EQ(inferred->latents_mean, expected->latents_mean);
  EXPECT_EQ(inferred->latents_std, expected->latents_std);

  // Without the encoder, the decoder's shapes give the same architecture.
  std::map<std::string, Tensor> decoder_only;
  for (auto& [n, t] : read_all(single_file()))
    if (n.rfind("encoder.", 0) != 0 && n.rfind("conv1.", 0) != 0) decoder_only[n] = t;
  auto dstore = WeightStore::open(write_single_variant("decoder_only", decoder_only));
  ASSERT_TRUE(dstore.ok()) << dstore.status().message();
  auto from_decoder = infer_qwen_image_vae_config(*dstore, *layout);
  ASSERT_TRUE(from_decoder.ok()) << from_decoder.status().message();
  EXPECT_EQ(from_decoder->base_dim * from_decoder->dim_mult[0],
            expected->base_dim * expected->dim_mult[0]);
  EXPECT_EQ(from_decoder->z_dim, expected->z_dim);
  EXPECT_EQ(from_decoder->num_res_blocks, expected->num_res_blocks);
  EXPECT_EQ(from_decoder->temperal_downsample, expected->temperal_downsample);
  VaeLoadOptions dec;
  dec.encoder = false;
  auto vae = load(dstore->path(), dec);
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  const Io io = test::load_io(folder_case());
  expect_matches((*vae)->backend(), (*vae)->decode(upload((*vae)->backend(), io.latent)),
                 io.decoded, "decode (decoder-only single file)");
}

TEST(QwenImageVae, DiffusersFolderLayoutIsDetected) {
  auto store = WeightStore::open(folder_case() + "/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_TRUE(is_qwen_image_vae_checkpoint(*store));
  auto layout = detect_qwen_image_vae_layout(*store);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_FALSE(layout->original);
}

TEST(QwenImageVae, OriginalNames) {
  // As diffusers' convert_wan_vae_to_diffusers maps them (num_res_blocks 2).
  const std::pair<const char*, const char*> cases[] = {
      {"encoder.conv_in.weight", "encoder.conv1.weight"},
      {"encoder.down_blocks.0.norm1.gamma", "encoder.downsamples.0.residual.0.gamma"},
      {"encoder.down_blocks.3.conv1.bias", "encoder.downsamples.3.residual.2.bias"},
      {"encoder.down_blocks.3.norm2.gamma", "encoder.downsamples.3.residual.3.gamma"},
      {"encoder.down_blocks.3.conv2.weight", "encoder.downsamples.3.residual.6.weight"},
      {"encoder.down_blocks.3.conv_shortcut.weight", "encoder.downsamples.3.shortcut.weight"},
      {"encoder.down_blocks.5.time_conv.weight", "encoder.downsamples.5.time_conv.weight"},
      {"encoder.down_blocks.2.resample.1.bias", "encoder.downsamples.2.resample.1.bias"},
      {"encoder.mid_block.resnets.1.conv2.bias", "encoder.middle.2.residual.6.bias"},
      {"encoder.mid_block.attentions.0.to_qkv.weight", "encoder.middle.1.to_qkv.weight"},
      {"encoder.norm_out.gamma", "encoder.head.0.gamma"},
      {"encoder.conv_out.bias", "encoder.head.2.bias"},
      {"quant_conv.weight", "conv1.weight"},
      {"post_quant_conv.bias", "conv2.bias"},
      {"decoder.conv_in.bias", "decoder.conv1.bias"},
      {"decoder.mid_block.resnets.0.norm1.gamma", "decoder.middle.0.residual.0.gamma"},
      {"decoder.mid_block.attentions.0.proj.bias", "decoder.middle.1.proj.bias"},
      {"decoder.up_blocks.0.resnets.2.conv1.weight", "decoder.upsamples.2.residual.2.weight"},
      {"decoder.up_blocks.0.upsamplers.0.time_conv.bias", "decoder.upsamples.3.time_conv.bias"},
      {"decoder.up_blocks.1.resnets.0.conv_shortcut.weight", "decoder.upsamples.4.shortcut.weight"},
      {"decoder.up_blocks.2.upsamplers.0.resample.1.weight",
       "decoder.upsamples.11.resample.1.weight"},
      {"decoder.up_blocks.3.resnets.2.norm2.gamma", "decoder.upsamples.14.residual.3.gamma"},
      {"decoder.norm_out.gamma", "decoder.head.0.gamma"},
      {"decoder.conv_out.weight", "decoder.head.2.weight"},
  };
  for (const auto& [diffusers, original] : cases)
    EXPECT_EQ(qwen_image_vae_original_name(diffusers, 2), original) << diffusers;
  // One resnet fewer per level shifts the flat decoder indices.
  EXPECT_EQ(qwen_image_vae_original_name("decoder.up_blocks.1.upsamplers.0.resample.1.weight", 1),
            "decoder.upsamples.5.resample.1.weight");
}

TEST(QwenImageVae, PartialLoads) {
  const Io io = test::load_io(folder_case());
  VaeLoadOptions dec;
  dec.encoder = false;
  auto d = load(folder_case(), dec);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_FALSE((*d)->has_encoder());
  EXPECT_TRUE((*d)->has_decoder());
  auto e = (*d)->encode(upload((*d)->backend(), io.sample));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("without its encoder"), std::string::npos)
      << e.status().message();
  expect_matches((*d)->backend(), (*d)->decode(upload((*d)->backend(), io.latent)), io.decoded,
                 "decode (decoder only)");

  VaeLoadOptions enc;
  enc.decoder = false;
  auto m = load(single_file(), enc);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE((*m)->has_decoder());
  expect_matches((*m)->backend(), (*m)->encode(upload((*m)->backend(), io.sample)), io.latent_mean,
                 "encode (encoder only)");
  EXPECT_FALSE((*m)->decode(upload((*m)->backend(), io.latent)).ok());
}

TEST(QwenImageVae, BadInputs) {
  auto vae = load(folder_case());
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  Backend& b = (*vae)->backend();
  auto msg = [](const Result<Tensor>& r) {
    return r.ok() ? std::string("ok") : r.status().message();
  };

  auto four = (*vae)->encode(upload(b, test::random_tensor({1, 4, 40, 56}, 1)));
  EXPECT_FALSE(four.ok());
  EXPECT_NE(msg(four).find("[1, 4, 40, 56]"), std::string::npos) << msg(four);
  EXPECT_NE(msg(four).find("[N, 3, H, W]"), std::string::npos) << msg(four);

  auto odd = (*vae)->encode(upload(b, test::random_tensor({1, 3, 44, 56}, 2)));
  EXPECT_FALSE(odd.ok());
  EXPECT_NE(msg(odd).find("not a multiple of 8"), std::string::npos) << msg(odd);

  auto rank3 = (*vae)->encode(upload(b, test::random_tensor({3, 40, 56}, 3)));
  EXPECT_FALSE(rank3.ok());

  auto host = (*vae)->encode(test::random_tensor({1, 3, 40, 56}, 4).to_dtype(DType::kBF16));
  EXPECT_FALSE(host.ok()) << "a bf16 host tensor is not what the fp32 CPU backend computes on";

  auto latent = (*vae)->decode(upload(b, test::random_tensor({1, 4, 5, 7}, 5)));
  EXPECT_FALSE(latent.ok());
  EXPECT_NE(msg(latent).find("[N, 16, h, w]"), std::string::npos) << msg(latent);

  EXPECT_FALSE((*vae)->decode(Tensor()).ok());
}

TEST(QwenImageVae, BatchOfTwoMatchesEachImage) {
  auto vae = load(folder_case());
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  const Io io = test::load_io(folder_case());
  Backend& b = (*vae)->backend();
  // [2, C, H, W]: the fixture image then a second, different one.
  Tensor other = test::random_tensor(io.sample.shape(), 7);
  std::vector<float> both = io.sample.to_floats();
  auto more = other.to_floats();
  both.insert(both.end(), more.begin(), more.end());
  Shape s2 = io.sample.shape();
  s2[0] = 2;
  auto pair = (*vae)->encode(upload(b, Tensor::from_floats(s2, both)));
  ASSERT_TRUE(pair.ok()) << pair.status().message();
  auto single = (*vae)->encode(upload(b, other));
  ASSERT_TRUE(single.ok()) << single.status().message();
  auto p = b.download(*pair), q = b.download(*single);
  ASSERT_TRUE(p.ok() && q.ok());
  const int64_t n = q->numel();
  std::vector<float> pf = p->to_floats();
  Tensor first = Tensor::from_floats(q->shape(), std::vector<float>(pf.begin(), pf.begin() + n));
  Tensor second = Tensor::from_floats(q->shape(), std::vector<float>(pf.begin() + n, pf.end()));
  EXPECT_LT(relative_l2(first, io.latent_mean), kTolerance);
  EXPECT_LT(relative_l2(second, *q), 1e-5);
}

TEST(QwenImageVae, MissingTensorIsNamed) {
  auto w = read_all(folder_case() + "/diffusion_pytorch_model.safetensors");
  ASSERT_EQ(w.erase("decoder.up_blocks.1.resnets.0.conv_shortcut.weight"), 1u);
  auto r = load(write_folder_variant("missing", w));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("decoder.up_blocks.1.resnets.0.conv_shortcut.weight"),
            std::string::npos)
      << r.status().message();

  // The temporal resamplers' convolutions are unused for images but still part of the model.
  auto w2 = read_all(single_file());
  ASSERT_EQ(w2.erase("encoder.downsamples.5.time_conv.weight"), 1u);
  auto r2 = load(write_single_variant("missing_time_conv", w2));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("encoder.downsamples.5.time_conv.weight"), std::string::npos)
      << r2.status().message();
}

TEST(QwenImageVae, MisshapedTensorIsNamed) {
  auto w = read_all(folder_case() + "/diffusion_pytorch_model.safetensors");
  const std::string name = "encoder.mid_block.attentions.0.to_qkv.weight";
  ASSERT_EQ(w.count(name), 1u);
  // The middle blocks have 16 channels here: [48, 16, 1, 1] is the right shape.
  w[name] = test::random_tensor({47, 16, 1, 1}, 9);
  auto r = load(write_folder_variant("misshaped", w));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("[47, 16, 1, 1]"), std::string::npos) << r.status().message();

  auto w2 = read_all(single_file());
  const std::string gamma = "decoder.head.0.gamma";
  ASSERT_EQ(w2.count(gamma), 1u);
  w2[gamma] = test::random_tensor({5, 1, 1, 1}, 10);
  auto r2 = load(write_single_variant("misshaped_gamma", w2));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find(gamma), std::string::npos) << r2.status().message();
}

TEST(QwenImageVae, UnexpectedTensorIsNamed) {
  auto w = read_all(folder_case() + "/diffusion_pytorch_model.safetensors");
  w["decoder.extra_block.weight"] = test::random_tensor({4}, 11);
  auto r = load(write_folder_variant("unexpected", w));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("decoder.extra_block.weight"), std::string::npos)
      << r.status().message();
}

TEST(QwenImageVae, BadConfigValuesAreNamed) {
  const std::string weights = folder_case() + "/diffusion_pytorch_model.safetensors";
  auto w = read_all(weights);
  struct Case {
    const char* key;
    nlohmann::json value;
  } cases[] = {
      {"latents_mean", nlohmann::json::array({0.0, 1.0})},
      {"temperal_downsample", nlohmann::json::array({1, 0, 1})},
      {"dim_mult", nlohmann::json::array({1, -2})},
      {"z_dim", 0},
      {"_class_name", "AutoencoderKL"},
      // diffusers builds attention blocks into down level 1 but cannot run them.
      {"attn_scales", nlohmann::json::array({0.5})},
  };
  int i = 0;
  for (const auto& c : cases) {
    auto r = load(write_folder_variant(str_cat("badcfg", i++), w, config_with(c.key, c.value)));
    ASSERT_FALSE(r.ok()) << c.key;
    EXPECT_NE(r.status().message().find(c.key), std::string::npos) << r.status().message();
  }
  // AutoencoderKLWan is the same network unless it is the Wan 2.2 VAE, whose config does not
  // fit these (Wan 2.1) weights.
  nlohmann::json wan = nlohmann::json::parse(config_with("_class_name", "AutoencoderKLWan"));
  wan["in_channels"] = 3;
  auto wan21 = load(write_folder_variant("wan21", w, wan.dump()));
  EXPECT_TRUE(wan21.ok()) << wan21.status().message();
  wan["is_residual"] = true;
  auto wan22 = load(write_folder_variant("wan22cfg", w, wan.dump()));
  ASSERT_FALSE(wan22.ok());
  EXPECT_NE(wan22.status().message().find("Wan 2.2"), std::string::npos)
      << wan22.status().message();

  // A z_dim in the config that the weights do not have: the tensor shapes say where.
  nlohmann::json j = nlohmann::json::parse(config_with("z_dim", 8));
  j["latents_mean"] = std::vector<double>(8, 0.0);
  j["latents_std"] = std::vector<double>(8, 1.0);
  auto r = load(write_folder_variant("zdim", w, j.dump()));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("post_quant_conv.weight"), std::string::npos)
      << r.status().message();
}

// The Wan 2.2 VAE's nested key names mark the residual layout (tests/model/test_wan_vae_video.cpp
// runs it); a Wan 2.1 file is not.
TEST(QwenImageVae, Wan22IsDetected) {
  auto w = read_all(single_file());
  {
    auto store = WeightStore::open(write_single_variant("wan21", w));
    ASSERT_TRUE(store.ok()) << store.status().message();
    auto layout = detect_qwen_image_vae_layout(*store);
    ASSERT_TRUE(layout.ok()) << layout.status().message();
    EXPECT_FALSE(layout->residual);
  }
  w["encoder.downsamples.0.downsamples.0.residual.0.gamma"] = test::random_tensor({4, 1, 1, 1}, 12);
  auto store = WeightStore::open(write_single_variant("wan22", w));
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto layout = detect_qwen_image_vae_layout(*store);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  EXPECT_TRUE(layout->residual);
  EXPECT_TRUE(layout->original);
}

// A config that contradicts the Wan 2.2 weights, or whose patching does not fit in_channels.
TEST(QwenImageVae, Wan22ConfigMismatchIsNamed) {
  const std::string dir = test::fixtures_dir() + "/wan22_vae_video_tiny";
  auto w = read_all(dir + "/diffusion_pytorch_model.safetensors");
  std::ifstream in(dir + "/config.json");
  const nlohmann::json base = nlohmann::json::parse(in);
  nlohmann::json j = base;
  j["is_residual"] = false;
  auto r = load(write_folder_variant("wan22_not_residual", w, j.dump()));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is_residual"), std::string::npos) << r.status().message();
  j = base;
  j["patch_size"] = 3;
  r = load(write_folder_variant("wan22_patch3", w, j.dump()));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("in_channels"), std::string::npos) << r.status().message();
  j = base;
  j["dim_mult"] = {1, 3, 4, 4};  // AvgDown3D of level 1: 3 * 8 channels do not group into 9
  r = load(write_folder_variant("wan22_dim_mult", w, j.dump()));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("AvgDown3D"), std::string::npos) << r.status().message();
}

TEST(QwenImageVae, Wan22OriginalNames) {
  const std::pair<const char*, const char*> kNames[] = {
      {"encoder.down_blocks.1.resnets.0.conv1.weight",
       "encoder.downsamples.1.downsamples.0.residual.2.weight"},
      {"encoder.down_blocks.1.resnets.0.conv_shortcut.bias",
       "encoder.downsamples.1.downsamples.0.shortcut.bias"},
      {"encoder.down_blocks.2.downsampler.time_conv.weight",
       "encoder.downsamples.2.downsamples.2.time_conv.weight"},
      {"decoder.up_blocks.0.resnets.2.norm2.gamma",
       "decoder.upsamples.0.upsamples.2.residual.3.gamma"},
      {"decoder.up_blocks.1.upsampler.resample.1.bias",
       "decoder.upsamples.1.upsamples.3.resample.1.bias"},
      {"decoder.mid_block.resnets.1.conv2.weight", "decoder.middle.2.residual.6.weight"},
      {"encoder.conv_in.weight", "encoder.conv1.weight"},
      {"post_quant_conv.bias", "conv2.bias"},
  };
  for (const auto& [diffusers, original] : kNames)
    EXPECT_EQ(qwen_image_vae_original_name(diffusers, 2, /*residual=*/true), original) << diffusers;
}

TEST(QwenImageVae, Wan22LatentSpaceName) {
  EXPECT_EQ(wan22_latents_mean().size(), 48u);
  EXPECT_EQ(wan22_latents_std().size(), 48u);
  // The name TAEW2.2 (taehv.cpp) gives the same latents.
  EXPECT_EQ(qwen_image_latent_space_name(wan22_latents_mean(), wan22_latents_std(), true),
            "wan2.2");
  // Latents of a different network are never interchangeable, whatever the statistics.
  EXPECT_EQ(qwen_image_latent_space_name(qwen_image_latents_mean(), qwen_image_latents_std(), true),
            "wan2.2-vae-custom");
  EXPECT_EQ(qwen_image_latent_space_name(wan22_latents_mean(), wan22_latents_std(), false),
            "qwen-image-vae-custom");
  EXPECT_TRUE(is_known_latent_space("wan2.2"));
  EXPECT_FALSE(is_known_latent_space("wan2.2-vae-custom"));
}

TEST(QwenImageVae, OtherCheckpointsAreNotDetected) {
  std::map<std::string, Tensor> kl;
  kl["decoder.mid_block.resnets.0.norm1.weight"] = test::random_tensor({8}, 13);
  kl["encoder.conv_in.weight"] = test::random_tensor({8, 3, 3, 3}, 14);
  auto store = WeightStore::open(write_single_variant("kl_like", kl));
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_FALSE(is_qwen_image_vae_checkpoint(*store));
  EXPECT_FALSE(detect_qwen_image_vae_layout(*store).ok());
}

TEST(QwenImageVae, LatentSpaceNames) {
  EXPECT_EQ(qwen_image_latent_space_name(qwen_image_latents_mean(), qwen_image_latents_std()),
            "qwen-image");
  auto mean = qwen_image_latents_mean();
  mean[3] += 0.01;
  EXPECT_EQ(qwen_image_latent_space_name(mean, qwen_image_latents_std()), "qwen-image-vae-custom");
  EXPECT_TRUE(is_known_latent_space("qwen-image"));
  EXPECT_FALSE(is_known_latent_space("qwen-image-vae-custom"));
}

}  // namespace
}  // namespace latent
