// AutoencoderKL against diffusers: the fixtures of scripts/make_fixtures.py (kl_tiny*,
// kl_flux_tiny*) hold tiny random models and diffusers' outputs for one input each.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/backends/registry.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"
#include "tests/util/vae_test_util.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

using namespace test;  // cpu(), fixture(), Io, load_io(), new_dir(), folder_with(), ...

// A single file with a "x.json" beside it giving what the weights cannot tell
// (norm_num_groups: the fixtures use 4, real checkpoints 32).
std::string single_with_sidecar(const std::string& name, const std::string& src,
                                const nlohmann::json& sidecar) {
  std::string d = new_dir(name);
  fs::copy_file(src, d + "/vae_single.safetensors");
  write_text(d + "/vae_single.json", sidecar.dump());
  return d + "/vae_single.safetensors";
}

// ---------------------------------------------------------------------------------------------

TEST(AutoencoderKL, DiffusersFolderMatchesDiffusers) {
  auto model = load_ok(fixture("kl_tiny"));
  ASSERT_TRUE(model);
  const ModelInfo& info = model->info();
  EXPECT_EQ(info.architecture, "AutoencoderKL");
  EXPECT_EQ(info.latent_space.name, "sd");
  EXPECT_EQ(info.latent_space.channels, 4);
  EXPECT_EQ(model->downsample(), 8);
  EXPECT_FLOAT_EQ(info.latent_space.scale[0], 0.18215f);
  EXPECT_FLOAT_EQ(info.latent_space.shift[0], 0.f);
  ASSERT_EQ(info.parts.size(), 2u);
  EXPECT_GT(info.parts[0].parameters, 0);
  EXPECT_GT(info.parts[1].parameters, 0);
  EXPECT_TRUE(model->has_encoder());
  EXPECT_TRUE(model->has_decoder());
  expect_matches(*model, load_io(fixture("kl_tiny")));
}

TEST(AutoencoderKL, Bf16StoredWeightsMatchDiffusers) {
  auto model = load_ok(fixture("kl_tiny_bf16"));
  ASSERT_TRUE(model);
  EXPECT_GT(model->info().storage_dtypes.count("bf16"), 0u);
  expect_matches(*model, load_io(fixture("kl_tiny_bf16")));
}

TEST(AutoencoderKL, FluxStyleFolderWithoutQuantConvs) {
  auto model = load_ok(fixture("kl_flux_tiny"));
  ASSERT_TRUE(model);
  const LatentSpace& s = model->latent_space();
  EXPECT_EQ(s.name, "flux1");
  EXPECT_EQ(s.channels, 16);
  EXPECT_EQ(s.downsample, 4);  // three levels
  EXPECT_FLOAT_EQ(s.scale[3], 0.3611f);
  EXPECT_FLOAT_EQ(s.shift[3], 0.1159f);
  expect_matches(*model, load_io(fixture("kl_flux_tiny")));
}

TEST(AutoencoderKL, LdmSingleFileMatchesDiffusers) {
  const std::string path = single_with_sidecar(
      "kl_single", fixture("kl_tiny_single") + "/vae_single.safetensors", {{"norm_num_groups", 4}});
  auto model = load_ok(path);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->latent_space().name, "sd");  // 4 channels, no other hint
  EXPECT_EQ(model->downsample(), 8);
  EXPECT_NE(model->info().variant.find("LDM"), std::string::npos) << model->info().variant;
  expect_matches(*model, load_io(fixture("kl_tiny_single")));
}

TEST(AutoencoderKL, LdmSingleFileWithoutGroupsSaysWhy) {
  // The fixture uses 4 groups; a single file cannot say so and 32 do not divide 8 channels.
  std::string msg = load_error(fixture("kl_tiny_single") + "/vae_single.safetensors");
  EXPECT_NE(msg.find("norm_num_groups"), std::string::npos) << msg;
}

TEST(AutoencoderKL, FluxSingleFileIsFlux1) {
  const std::string path = single_with_sidecar(
      "kl_flux_single", fixture("kl_flux_tiny_single") + "/vae_single.safetensors",
      {{"norm_num_groups", 4}});
  auto model = load_ok(path);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->latent_space().name, "flux1");  // 16 channels
  EXPECT_FLOAT_EQ(model->latent_space().scale[0], 0.3611f);
  EXPECT_EQ(model->downsample(), 4);
  expect_matches(*model, load_io(fixture("kl_flux_tiny_single")));
}

TEST(AutoencoderKL, FullCheckpointPrefixesAndFileNameHint) {
  // An SDXL-style full checkpoint: the VAE under first_stage_model., other models beside it.
  auto ldm = read_all(fixture("kl_tiny_single") + "/vae_single.safetensors");
  std::map<std::string, Tensor> full;
  for (auto& [k, v] : ldm) full["first_stage_model." + k] = v;
  full["model.diffusion_model.input_blocks.0.0.weight"] = test::random_tensor({4, 4, 3, 3}, 1);
  full["conditioner.embedders.1.model.ln_final.weight"] = test::random_tensor({8}, 2);
  full["alphas_cumprod"] = test::random_tensor({10}, 3);
  std::string d = new_dir("kl_full");
  write_all(d + "/my_checkpoint.safetensors", full);
  write_text(d + "/my_checkpoint.json", R"({"norm_num_groups": 4})");
  auto model = load_ok(d + "/my_checkpoint.safetensors");
  ASSERT_TRUE(model);
  EXPECT_EQ(model->latent_space().name, "sdxl");  // SDXL's second text encoder is there
  EXPECT_FLOAT_EQ(model->latent_space().scale[0], 0.13025f);
  expect_matches(*model, load_io(fixture("kl_tiny_single")));

  // "vae." prefix, and a file name naming SDXL.
  std::map<std::string, Tensor> vae;
  for (auto& [k, v] : ldm) vae["vae." + k] = v;
  write_all(d + "/sdxl_vae_fp32.safetensors", vae);
  write_text(d + "/sdxl_vae_fp32.json", R"({"norm_num_groups": 4})");
  model = load_ok(d + "/sdxl_vae_fp32.safetensors");
  ASSERT_TRUE(model);
  EXPECT_EQ(model->latent_space().name, "sdxl");
  expect_matches(*model, load_io(fixture("kl_tiny_single")), /*encoder=*/false);
}

TEST(AutoencoderKL, OldDiffusersAttentionNames) {
  // query/key/value/proj_attn: diffusers' names before the Attention rewrite, same [C, C] shapes.
  auto sd = read_all(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors");
  std::map<std::string, Tensor> old;
  const std::pair<std::string, std::string> renames[] = {{".to_q.", ".query."},
                                                         {".to_k.", ".key."},
                                                         {".to_v.", ".value."},
                                                         {".to_out.0.", ".proj_attn."}};
  int renamed = 0;
  for (auto& [k, v] : sd) {
    std::string n = k;
    for (const auto& [from, to] : renames) {
      size_t p = n.find(from);
      if (p != std::string::npos) {
        n = n.substr(0, p) + to + n.substr(p + from.size());
        ++renamed;
      }
    }
    old[n] = v;
  }
  EXPECT_EQ(renamed, 16);  // 4 projections x weight/bias x encoder/decoder
  auto model =
      load_ok(folder_with("kl_old_attn", old, read_json(fixture("kl_tiny") + "/config.json")));
  ASSERT_TRUE(model);
  expect_matches(*model, load_io(fixture("kl_tiny")));
}

TEST(AutoencoderKL, DecoderOnlyLoadIgnoresTheEncoder) {
  VaeLoadOptions opts;
  opts.encoder = false;
  auto model = load_ok(fixture("kl_tiny"), opts);
  ASSERT_TRUE(model);
  EXPECT_FALSE(model->has_encoder());
  EXPECT_TRUE(model->has_decoder());
  ASSERT_EQ(model->info().parts.size(), 1u);
  EXPECT_EQ(model->info().parts[0].name, "decoder");
  auto x = model->backend().upload(test::random_tensor({1, 3, 16, 16}, 5));
  ASSERT_TRUE(x.ok());
  EXPECT_FALSE(model->encode(*x).ok());
  expect_matches(*model, load_io(fixture("kl_tiny")), /*encoder=*/false);

  // An encoder-only load does not check the decoder's tensors either.
  auto sd = read_all(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors");
  sd.erase("decoder.conv_out.weight");
  VaeLoadOptions enc_only;
  enc_only.decoder = false;
  model = load_ok(folder_with("kl_enc_only", sd, read_json(fixture("kl_tiny") + "/config.json")),
                  enc_only);
  ASSERT_TRUE(model);
  expect_matches(*model, load_io(fixture("kl_tiny")), /*encoder=*/true, /*decoder=*/false);
}

// --- bad inputs ------------------------------------------------------------------------------

TEST(AutoencoderKL, MissingTensorIsNamed) {
  auto sd = read_all(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors");
  ASSERT_EQ(sd.erase("decoder.up_blocks.1.resnets.0.norm2.bias"), 1u);
  std::string msg =
      load_error(folder_with("kl_missing", sd, read_json(fixture("kl_tiny") + "/config.json")));
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("decoder.up_blocks.1.resnets.0.norm2.bias"), std::string::npos) << msg;
}

TEST(AutoencoderKL, MisshapedTensorIsNamed) {
  auto sd = read_all(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors");
  sd["encoder.mid_block.attentions.0.to_k.weight"] = test::random_tensor({16, 8}, 7);
  std::string msg =
      load_error(folder_with("kl_misshaped", sd, read_json(fixture("kl_tiny") + "/config.json")));
  EXPECT_NE(msg.find("encoder.mid_block.attentions.0.to_k.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[16, 8]"), std::string::npos) << msg;
}

TEST(AutoencoderKL, ExtraTensorIsNamed) {
  auto sd = read_all(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors");
  sd["encoder.down_blocks.0.resnets.5.conv1.weight"] = test::random_tensor({8, 8, 3, 3}, 8);
  std::string msg =
      load_error(folder_with("kl_extra", sd, read_json(fixture("kl_tiny") + "/config.json")));
  EXPECT_NE(msg.find("unexpected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.down_blocks.0.resnets.5.conv1.weight"), std::string::npos) << msg;
}

TEST(AutoencoderKL, ConfigThatDisagreesWithTheWeights) {
  std::string msg = config_error("kl_tiny", "kl_lpb", "layers_per_block", 2);
  EXPECT_NE(msg.find("'layers_per_block' is 2 but the weights"), std::string::npos) << msg;
  EXPECT_NE(msg.find("have 1"), std::string::npos) << msg;
  msg = config_error("kl_tiny", "kl_lat", "latent_channels", 8);
  EXPECT_NE(msg.find("'latent_channels' is 8 but the weights"), std::string::npos) << msg;
  msg = config_error("kl_tiny", "kl_boc", "block_out_channels", {8, 8, 16, 32});
  EXPECT_NE(msg.find("'block_out_channels' is [8, 8, 16, 32] but the weights"), std::string::npos)
      << msg;
  msg = config_error("kl_tiny", "kl_in", "in_channels", 4);
  EXPECT_NE(msg.find("'in_channels' is 4"), std::string::npos) << msg;
}

// A huge size in config.json is refused before anything is sized from it: under a 4 GiB address
// space limit the load fails with a message (it used to allocate ~16 GB for the latent
// statistics, or die of std::bad_alloc under such a limit).
TEST(AutoencoderKLDeathTest, HugeLatentChannelsRefusedBeforeAllocating) {
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  for (int64_t huge : {int64_t{1000000000}, int64_t{100000}}) {
    auto cfg = read_json(fixture("kl_tiny") + "/config.json");
    cfg["latent_channels"] = huge;
    const std::string dir = folder_with(
        "kl_huge", read_all(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors"), cfg);
    EXPECT_EXIT(
        {
#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer's shadow memory needs terabytes of it
          struct rlimit lim {};
          lim.rlim_cur = lim.rlim_max = rlim_t{4} << 30;
          setrlimit(RLIMIT_AS, &lim);
#endif
          auto vae = load_vae(dir, test::cpu_backend());
          const bool named =
              !vae.ok() && vae.status().message().find("latent_channels") != std::string::npos;
          if (!named)
            std::fprintf(stderr, "%s\n", vae.ok() ? "loaded" : vae.status().message().c_str());
          std::exit(named ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "")
        << "latent_channels " << huge;
  }
}

// A tensor the configuration is read from, stored as I32: named as an unsupported dtype, not as
// a missing tensor.
TEST(AutoencoderKL, UnsupportedDtypeIsNotCalledMissing) {
  std::ifstream in(fixture("kl_tiny_single") + "/vae_single.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = R"("decoder.conv_in.weight":{"dtype":"F32")";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, from.size(), R"("decoder.conv_in.weight":{"dtype":"I32")");
  const std::string path = test::temp_dir() + "/kl_i32.safetensors";
  std::ofstream(path, std::ios::binary) << bytes;
  std::string msg = load_error(path);
  EXPECT_NE(msg.find("unsupported dtype I32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("decoder.conv_in.weight"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("is missing"), std::string::npos) << msg;
}

TEST(AutoencoderKL, UnsupportedClassName) {
  auto sd = read_all(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors");
  auto cfg = read_json(fixture("kl_tiny") + "/config.json");
  cfg["_class_name"] = "VQModel";
  std::string d = folder_with("kl_vq", sd, cfg);
  std::string msg = load_error(d);
  EXPECT_NE(msg.find("unsupported architecture 'VQModel'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d + "/config.json"), std::string::npos) << msg;
  // The message lists every supported architecture.
  for (const char* arch : {"AutoencoderKL,", "AutoencoderKLQwenImage", "AutoencoderKLWan", "AutoencoderTiny",
                           "TAEHV"})
    EXPECT_NE(msg.find(arch), std::string::npos) << arch << " missing from: " << msg;
}

TEST(AutoencoderKL, BadConfigValues) {
  std::string msg = config_error("kl_tiny", "kl_gelu", "act_fn", "gelu");
  EXPECT_NE(msg.find("act_fn"), std::string::npos) << msg;
  msg = config_error("kl_tiny", "kl_boc", "block_out_channels", "wide");
  EXPECT_NE(msg.find("block_out_channels"), std::string::npos) << msg;
}

TEST(AutoencoderKL, BadSamplesAndLatents) {
  auto model = load_ok(fixture("kl_tiny"));
  ASSERT_TRUE(model);
  expect_input_error(*model, /*encode=*/true, {1, 2, 16, 16}, 9, "[1, 2, 16, 16]");
  // 20 is not a multiple of 8
  expect_input_error(*model, /*encode=*/true, {1, 3, 20, 40}, 10, "multiple of 8");
  expect_input_error(*model, /*encode=*/false, {1, 16, 3, 5}, 11, "[1, 16, 3, 5]");
  EXPECT_FALSE(model->decode(Tensor()).ok());
}

TEST(AutoencoderKL, NotAVae) {
  std::string d = new_dir("kl_not_vae");
  write_all(d + "/model.safetensors",
            {{"text_model.embeddings.weight", test::random_tensor({4, 4}, 12)}});
  std::string msg = load_error(d + "/model.safetensors");
  EXPECT_NE(msg.find("not a recognised VAE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("text_model.embeddings.weight"), std::string::npos) << msg;
}

// --- pieces ----------------------------------------------------------------------------------

TEST(AutoencoderKL, LdmNames) {
  AutoencoderKLLayout ldm{true, "first_stage_model."};
  EXPECT_EQ(autoencoder_kl_store_name("decoder.up_blocks.0.upsamplers.0.conv.weight", ldm, 4),
            "first_stage_model.decoder.up.3.upsample.conv.weight");
  EXPECT_EQ(autoencoder_kl_store_name("decoder.up_blocks.3.resnets.0.conv_shortcut.bias", ldm, 4),
            "first_stage_model.decoder.up.0.block.0.nin_shortcut.bias");
  EXPECT_EQ(autoencoder_kl_store_name("encoder.down_blocks.2.downsamplers.0.conv.bias", ldm, 4),
            "first_stage_model.encoder.down.2.downsample.conv.bias");
  EXPECT_EQ(autoencoder_kl_store_name("encoder.mid_block.resnets.1.norm2.weight", ldm, 4),
            "first_stage_model.encoder.mid.block_2.norm2.weight");
  EXPECT_EQ(autoencoder_kl_store_name("decoder.mid_block.attentions.0.to_out.0.weight", ldm, 4),
            "first_stage_model.decoder.mid.attn_1.proj_out.weight");
  EXPECT_EQ(autoencoder_kl_store_name("decoder.mid_block.attentions.0.group_norm.bias", ldm, 4),
            "first_stage_model.decoder.mid.attn_1.norm.bias");
  EXPECT_EQ(autoencoder_kl_store_name("encoder.conv_norm_out.weight", ldm, 4),
            "first_stage_model.encoder.norm_out.weight");
  EXPECT_EQ(autoencoder_kl_store_name("post_quant_conv.bias", ldm, 4),
            "first_stage_model.post_quant_conv.bias");
}

TEST(AutoencoderKL, LatentSpaceNames) {
  EXPECT_EQ(autoencoder_kl_latent_space_name(4, 0.18215, 0), "sd");
  EXPECT_EQ(autoencoder_kl_latent_space_name(4, 0.13025, 0), "sdxl");
  EXPECT_EQ(autoencoder_kl_latent_space_name(16, 1.5305, 0.0609), "sd3");
  EXPECT_EQ(autoencoder_kl_latent_space_name(16, 0.3611, 0.1159), "flux1");
  EXPECT_EQ(autoencoder_kl_latent_space_name(16, 0.18215, 0), "autoencoder-kl-16ch-s0.18215-t0");
  EXPECT_EQ(autoencoder_kl_latent_space_name(4, 0.5, 0.25), "autoencoder-kl-4ch-s0.5-t0.25");
  // The recognised names are the engine's known spaces (the pad templates list them); the
  // generated ones never are.
  for (const char* name : {"sd", "sdxl", "sd3", "flux1"}) EXPECT_TRUE(is_known_latent_space(name));
  EXPECT_FALSE(is_known_latent_space(autoencoder_kl_latent_space_name(4, 0.5, 0.25)));
  for (const char* file : {"taesdxl.safetensors", "taesd3.safetensors", "taef1.safetensors",
                           "taef2.safetensors", "ae.safetensors", "flux.2-vae.safetensors"})
    EXPECT_TRUE(is_known_latent_space(latent_space_from_name(file))) << file;
}

TEST(LatentSpace, KnownNamesAreUniqueAndPlain) {
  const auto& names = known_latent_spaces();
  ASSERT_FALSE(names.empty());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_FALSE(names[i].empty());
    // Caps-safe: lower-case letters, digits, '.', '-'.
    for (char ch : names[i])
      EXPECT_TRUE((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '-')
          << names[i];
    for (size_t j = i + 1; j < names.size(); ++j) EXPECT_NE(names[i], names[j]);
  }
  EXPECT_FALSE(is_known_latent_space(""));
  EXPECT_FALSE(is_known_latent_space("SD"));
}

TEST(LatentSpace, NormalizeAndDenormalize) {
  auto b = cpu();
  ASSERT_TRUE(b);
  LatentSpace s = LatentSpace::from_scalars("flux1", 16, 8, 0.3611, 0.1159);
  Tensor raw = test::random_tensor({1, 16, 2, 3}, 13, -3.f, 3.f);
  auto n = s.normalize(*b, *b->upload(raw));
  ASSERT_TRUE(n.ok()) << n.status().message();
  auto host = b->download(*n);
  ASSERT_TRUE(host.ok());
  std::vector<float> want = raw.to_floats(), got = host->to_floats();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], (want[i] - 0.1159f) * 0.3611f, 1e-5f) << i;
  auto back = s.denormalize(*b, *n);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_LT(relative_l2(*b->download(*back), raw), 1e-6);

  LatentSpace q = LatentSpace::from_mean_std("q", 2, 8, {1.0, -2.0}, {2.0, 0.5});
  Tensor r2 = Tensor::from_floats({1, 2, 1, 1}, {3.f, 0.f});
  auto n2 = b->download(*q.normalize(*b, *b->upload(r2)));
  ASSERT_TRUE(n2.ok());
  EXPECT_NEAR(n2->to_floats()[0], 1.f, 1e-6f);  // (3 - 1) / 2
  EXPECT_NEAR(n2->to_floats()[1], 4.f, 1e-6f);  // (0 + 2) / 0.5

  auto wrong = s.normalize(*b, *b->upload(test::random_tensor({1, 4, 2, 2}, 14)));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("flux1"), std::string::npos);
}

}  // namespace
}  // namespace latent
