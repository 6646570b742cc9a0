// AutoencoderTiny (TAESD family) against diffusers, and taef2 against madebyollin's taesd.py:
// the tiny_* fixtures of scripts/make_fixtures.py, in every stored layout the loader accepts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/backends/registry.h"
#include "engine/models/vae/tiny.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"
#include "tests/util/vae_test_util.h"

namespace latent {
namespace {

namespace fs = std::filesystem;

using namespace test;  // cpu(), fixture(), Io, load_io(), new_dir(), folder_with(), ...

// Prefixes every key of `tensors` (the published files' bare "N.*" names).
std::map<std::string, Tensor> prefixed(const std::string& prefix,
                                       const std::map<std::string, Tensor>& tensors) {
  std::map<std::string, Tensor> out;
  for (const auto& [k, v] : tensors) out[prefix + k] = v;
  return out;
}

// ---------------------------------------------------------------------------------------------

TEST(AutoencoderTiny, DiffusersFolderMatchesDiffusers) {
  auto model = load_ok(fixture("tiny_taesd"));
  ASSERT_TRUE(model);
  const ModelInfo& info = model->info();
  EXPECT_EQ(info.architecture, "AutoencoderTiny");
  EXPECT_EQ(info.latent_space.name, "sd");
  EXPECT_EQ(info.latent_space.channels, 4);
  EXPECT_EQ(info.latent_space.downsample, 8);
  EXPECT_FLOAT_EQ(info.latent_space.scale[0], 1.f);  // TAESD latents are SD's normalised ones
  EXPECT_FLOAT_EQ(info.latent_space.shift[0], 0.f);
  ASSERT_EQ(info.parts.size(), 2u);
  expect_matches(*model, load_io(fixture("tiny_taesd")));
}

TEST(AutoencoderTiny, PublishedFilePairMatchesDiffusers) {
  const Io io = load_io(fixture("tiny_taesd_single"));
  // Either half finds the other beside it.
  for (const char* file : {"taesd_decoder.safetensors", "taesd_encoder.safetensors"}) {
    SCOPED_TRACE(file);
    auto model = load_ok(fixture("tiny_taesd_single") + "/" + file);
    ASSERT_TRUE(model);
    EXPECT_TRUE(model->has_encoder());
    EXPECT_TRUE(model->has_decoder());
    EXPECT_EQ(model->latent_space().name, "sd");
    expect_matches(*model, io);
  }
}

TEST(AutoencoderTiny, OneHalfAlone) {
  std::string d = new_dir("taesd_half");
  fs::copy_file(fixture("tiny_taesd_single") + "/taesd_decoder.safetensors",
                d + "/taesd_decoder.safetensors");
  auto model = load_ok(d + "/taesd_decoder.safetensors");
  ASSERT_TRUE(model);
  EXPECT_FALSE(model->has_encoder());
  EXPECT_TRUE(model->has_decoder());
  expect_matches(*model, load_io(fixture("tiny_taesd_single")), /*encoder=*/false);
  auto x = model->backend().upload(test::random_tensor({1, 3, 16, 16}, 1));
  ASSERT_TRUE(x.ok());
  auto r = model->encode(*x);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("encoder"), std::string::npos) << r.status().message();

  VaeLoadOptions enc_only;
  enc_only.decoder = false;
  std::string msg = load_error(d + "/taesd_decoder.safetensors", enc_only);
  EXPECT_NE(msg.find("taesd_encoder.safetensors"), std::string::npos) << msg;
}

TEST(AutoencoderTiny, TaesdPyAndComfyUiLayouts) {
  auto enc = read_all(fixture("tiny_taesd_single") + "/taesd_encoder.safetensors");
  auto dec = read_all(fixture("tiny_taesd_single") + "/taesd_decoder.safetensors");
  const Io io = load_io(fixture("tiny_taesd_single"));
  struct Layout {
    const char* enc;
    const char* dec;
  };
  for (const Layout& l :
       {Layout{"encoder.", "decoder."}, Layout{"taesd_encoder.", "taesd_decoder."}}) {
    SCOPED_TRACE(l.enc);
    auto all = prefixed(l.enc, enc);
    for (auto& [k, v] : prefixed(l.dec, dec)) all[k] = v;
    std::string d = new_dir(std::string("layout_") + l.enc);
    write_all(d + "/my_taesd.safetensors", all);
    auto model = load_ok(d + "/my_taesd.safetensors");
    ASSERT_TRUE(model);
    EXPECT_EQ(model->latent_space().name, "sd");
    expect_matches(*model, io);
  }
}

TEST(AutoencoderTiny, Taef2MatchesTaesdPy) {
  const Io io = load_io(fixture("tiny_taef2"));
  for (const char* file : {"taef2.safetensors", "taef2_decoder.safetensors"}) {
    SCOPED_TRACE(file);
    auto model = load_ok(fixture("tiny_taef2") + "/" + file);
    ASSERT_TRUE(model);
    const ModelInfo& info = model->info();
    EXPECT_EQ(info.latent_space.name, "flux2");
    EXPECT_TRUE(is_known_latent_space(info.latent_space.name));
    EXPECT_EQ(info.latent_space.channels, 32);
    EXPECT_EQ(info.latent_space.downsample, 8);
    EXPECT_NE(info.variant.find("mid-block group norm"), std::string::npos) << info.variant;
    expect_matches(*model, io);
  }
}

TEST(AutoencoderTiny, Taef2AsDiffusersFolder) {
  // An AutoencoderTiny config with taef2's weights: the pool comes from the weights.
  auto sd = read_all(fixture("tiny_taef2") + "/taef2.safetensors");
  auto cfg = read_json(fixture("tiny_taesd") + "/config.json");
  cfg["latent_channels"] = 32;
  auto model = load_ok(folder_with("taef2_folder", sd, cfg));
  ASSERT_TRUE(model);
  EXPECT_NE(model->info().variant.find("mid-block group norm"), std::string::npos);
  expect_matches(*model, load_io(fixture("tiny_taef2")));
}

// --- bad inputs ------------------------------------------------------------------------------

TEST(AutoencoderTiny, MissingPoolTensorIsNamed) {
  auto sd = read_all(fixture("tiny_taef2") + "/taef2.safetensors");
  ASSERT_EQ(sd.erase("encoder.layers.12.pool.1.weight"), 1u);
  std::string d = new_dir("taef2_missing");
  write_all(d + "/taef2.safetensors", sd);
  std::string msg = load_error(d + "/taef2.safetensors");
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("encoder.layers.12.pool.1.weight"), std::string::npos) << msg;
}

TEST(AutoencoderTiny, PoolOutsideTheMidStageIsUnexpected) {
  auto sd = read_all(fixture("tiny_taef2") + "/taef2.safetensors");
  sd["decoder.layers.7.pool.0.weight"] = test::random_tensor({32, 8, 1, 1}, 2);
  std::string d = new_dir("taef2_extra");
  write_all(d + "/taef2.safetensors", sd);
  std::string msg = load_error(d + "/taef2.safetensors");
  EXPECT_NE(msg.find("unexpected"), std::string::npos) << msg;
  EXPECT_NE(msg.find("decoder.layers.7.pool.0.weight"), std::string::npos) << msg;
}

TEST(AutoencoderTiny, MisshapedTensorIsNamed) {
  auto sd = read_all(fixture("tiny_taesd") + "/diffusion_pytorch_model.safetensors");
  sd["decoder.layers.6.weight"] = test::random_tensor({8, 8, 1, 1}, 3);
  std::string msg = load_error(
      folder_with("tiny_misshaped", sd, read_json(fixture("tiny_taesd") + "/config.json")));
  EXPECT_NE(msg.find("decoder.layers.6.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 8, 1, 1]"), std::string::npos) << msg;
}

TEST(AutoencoderTiny, MissingAndExtraTensorsInPublishedFilesAreNamed) {
  auto dec = read_all(fixture("tiny_taesd_single") + "/taesd_decoder.safetensors");
  ASSERT_EQ(dec.erase("4.conv.2.bias"), 1u);
  dec["4.skip.weight"] = test::random_tensor({8, 8, 1, 1}, 4);
  std::string d = new_dir("taesd_bad_pair");
  write_all(d + "/taesd_decoder.safetensors", dec);
  fs::copy_file(fixture("tiny_taesd_single") + "/taesd_encoder.safetensors",
                d + "/taesd_encoder.safetensors");
  std::string msg = load_error(d + "/taesd_encoder.safetensors");
  // Named as the model asks for it and as the file stores it.
  EXPECT_NE(msg.find("decoder.layers.3.conv.2.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("as 4.conv.2.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4.skip.weight"), std::string::npos) << msg;
}

TEST(AutoencoderTiny, UnsupportedConfigValues) {
  std::string msg = config_error("tiny_taesd", "tiny_up3", "upsampling_scaling_factor", 3);
  EXPECT_NE(msg.find("upsampling_scaling_factor"), std::string::npos) << msg;
  msg = config_error("tiny_taesd", "tiny_blocks", "num_encoder_blocks", {1, 3, 3});
  EXPECT_NE(msg.find("num_encoder_blocks"), std::string::npos) << msg;
}

// Every size of a config.json is checked against the weights' shapes before loading.
TEST(AutoencoderTiny, ConfigSizesCheckedAgainstTheWeights) {
  std::string msg = config_error("tiny_taesd", "tiny_lat", "latent_channels", 1000000000);
  EXPECT_NE(msg.find("latent_channels"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("bad_alloc"), std::string::npos) << msg;
  msg = config_error("tiny_taesd", "tiny_lat16", "latent_channels", 16);
  EXPECT_NE(msg.find("'latent_channels' is 16 but the weights"), std::string::npos) << msg;
  msg = config_error("tiny_taesd", "tiny_enc_ch", "encoder_block_out_channels", {32, 32, 32, 32});
  EXPECT_NE(msg.find("'encoder_block_out_channels' is [32, 32, 32, 32]"), std::string::npos) << msg;
}

TEST(AutoencoderTiny, LatentSpaceKey) {
  auto sd = read_all(fixture("tiny_taesd") + "/diffusion_pytorch_model.safetensors");
  auto cfg = read_json(fixture("tiny_taesd") + "/config.json");
  cfg["latent_space"] = "latent-default";
  auto model = load_ok(folder_with("tiny_named", sd, cfg));
  ASSERT_TRUE(model);
  EXPECT_EQ(model->latent_space().name, "latent-default");
  EXPECT_EQ(model->latent_space().channels, 4);
}

TEST(AutoencoderTiny, BadSamplesAndLatents) {
  auto model = load_ok(fixture("tiny_taesd"));
  ASSERT_TRUE(model);
  expect_input_error(*model, /*encode=*/true, {1, 4, 16, 16}, 5, "[1, 4, 16, 16]");
  expect_input_error(*model, /*encode=*/true, {1, 3, 16, 36}, 6, "multiple of 8");
  input_error(*model, /*encode=*/false, {1, 3, 2, 2}, 7);
}

TEST(AutoencoderTiny, LayoutDetection) {
  auto f = WeightStore::open(fixture("tiny_taesd_single") + "/taesd_decoder.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  AutoencoderTinyLayout l;
  ASSERT_TRUE(detect_autoencoder_tiny_layout(*f, &l));
  EXPECT_FALSE(l.encoder.present);
  EXPECT_TRUE(l.decoder.present);
  EXPECT_EQ(l.decoder.offset, 1);
  AutoencoderTinyConfig cfg;
  ASSERT_TRUE(infer_autoencoder_tiny_decoder(*f, l.decoder, &cfg).ok());
  EXPECT_EQ(cfg.num_decoder_blocks, (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(cfg.decoder_block_out_channels, (std::vector<int64_t>{8, 8, 8, 8}));
  EXPECT_EQ(cfg.latent_channels, 4);
  EXPECT_EQ(cfg.out_channels, 3);

  auto kl = WeightStore::open(fixture("kl_tiny") + "/diffusion_pytorch_model.safetensors");
  ASSERT_TRUE(kl.ok()) << kl.status().message();
  EXPECT_FALSE(detect_autoencoder_tiny_layout(*kl, nullptr));
}

}  // namespace
}  // namespace latent
