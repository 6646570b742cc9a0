// The TAEHV family (TAEW2.1, TAEW2.2) against madebyollin's taehv.py: the taew2_*_tiny fixtures
// of scripts/make_taehv_fixtures.py (narrowed random models in the published single-file
// layout), whole clips, streams fed in chunks, constant memory, image mode and the published
// full-size key layout (tests/fixtures/taehv_published_shapes.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "engine/backends/registry.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tests/util/taehv_test_util.h"
#include "tests/util/test_util.h"
#include "tests/util/vae_test_util.h"

namespace latent {
namespace {

using namespace test;

struct Case {
  const char* dir;
  const char* file;
  const char* variant;
  const char* space;
  int channels;
  int downsample;
};

const Case kCases[] = {
    {"taew2_1_tiny", "taew2_1.safetensors", "taew2.1", "qwen-image", 16, 8},
    {"taew2_2_tiny", "taew2_2.safetensors", "taew2.2", "wan2.2", 48, 16},
};

std::map<std::string, Tensor> io_of(const Case& c) {
  return read_all(fixture(c.dir) + "/io.safetensors");
}

std::unique_ptr<VaeModel> load_case(const Case& c, std::shared_ptr<Backend> backend = nullptr) {
  auto m = load_vae(fixture(c.dir) + "/" + c.file, backend ? backend : cpu());
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

Tensor whole(VaeModel& model, const Tensor& host, bool encoder) {
  auto x = model.backend().upload(host);
  EXPECT_TRUE(x.ok()) << x.status().message();
  auto y = encoder ? model.encode_video(*x) : model.decode_video(*x);
  EXPECT_TRUE(y.ok()) << y.status().message();
  if (!y.ok()) return Tensor();
  return *model.backend().download(*y);
}

class Taehv : public testing::TestWithParam<Case> {};

TEST_P(Taehv, LoadsAsPublishedFile) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  const ModelInfo& info = model->info();
  EXPECT_EQ(info.architecture, "TAEHV");
  EXPECT_EQ(info.variant, c.variant);
  EXPECT_EQ(info.latent_space.name, c.space);
  EXPECT_TRUE(is_known_latent_space(info.latent_space.name)) << info.latent_space.name;
  EXPECT_EQ(info.latent_space.channels, c.channels);
  EXPECT_EQ(info.latent_space.downsample, c.downsample);
  EXPECT_FLOAT_EQ(info.latent_space.scale[0], 1.f);  // taehv latents are the normalised ones
  EXPECT_FLOAT_EQ(info.latent_space.shift[0], 0.f);
  EXPECT_EQ(model->temporal_factor(), 4);
  EXPECT_TRUE(model->supports_video());
  ASSERT_EQ(info.parts.size(), 2u);
}

TEST_P(Taehv, WholeClipMatchesTaehvPy) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  auto io = io_of(c);
  Tensor enc = whole(*model, io["sample"], true);
  ASSERT_TRUE(enc.defined());
  ASSERT_EQ(enc.shape(), io["latent_mean"].shape());
  EXPECT_LT(relative_l2(enc, io["latent_mean"]), 1e-3);
  Tensor dec = whole(*model, io["latent"], false);
  ASSERT_TRUE(dec.defined());
  ASSERT_EQ(dec.shape(), io["decoded"].shape());  // 3 latent frames -> 1 + 4 * 2 frames
  EXPECT_LT(relative_l2(dec, io["decoded"]), 1e-3);
}

// The CPU backend storing bf16 / fp16 (fp32 math, outputs rounded) against taehv.py run in that
// dtype: within 1.5x taehv.py's own error (or 1e-2).
TEST_P(Taehv, CpuHalfPrecisionWithinTaehvPysOwnError) {
  const Case& c = GetParam();
  auto io = io_of(c);
  for (const char* dtype : {"bf16", "fp16"}) {
    SCOPED_TRACE(dtype);
    auto model = load_case(c, cpu_backend(dtype));
    ASSERT_TRUE(model);
    for (bool enc : {true, false}) {
      const std::string out = enc ? "latent_mean" : "decoded";
      Tensor got = whole(*model, io[enc ? "sample" : "latent"], enc);
      ASSERT_TRUE(got.defined());
      const double ref = relative_l2(io[out + "_" + dtype], io[out]);
      const double err = relative_l2(got, io[out]);
      EXPECT_LT(err, std::max(1e-2, 1.5 * ref))
          << out << " (taehv.py " << dtype << ": " << ref << ")";
    }
  }
}

TEST_P(Taehv, StreamsInAnyChunksEqualTheWholeClip) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  auto io = io_of(c);
  Tensor enc_whole = whole(*model, io["sample"], true);
  Tensor dec_whole = whole(*model, io["latent"], false);
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{1}, {2, 3}, {4}, {5, 1, 3}, {9}}) {
    SCOPED_TRACE(testing::Message() << "chunk lengths " << chunks[0] << "...");
    auto enc = model->open_stream(true);
    ASSERT_TRUE(enc.ok()) << enc.status().message();
    int padded = -1;
    Tensor e = run_chunked(*model, **enc, io["sample"], chunks, &padded);
    ASSERT_TRUE(e.defined());
    EXPECT_EQ(padded, 0);  // 9 = 1 + 4 * 2 frames
    EXPECT_EQ(relative_l2(e, enc_whole), 0.0);
    auto dec = model->open_stream(false);
    ASSERT_TRUE(dec.ok());
    Tensor d = run_chunked(*model, **dec, io["latent"], {chunks[0] > 3 ? 3 : chunks[0]});
    ASSERT_TRUE(d.defined());
    EXPECT_EQ(relative_l2(d, dec_whole), 0.0);
  }
}

TEST_P(Taehv, StreamFrameCounts) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  auto io = io_of(c);
  Backend& be = model->backend();
  auto enc = model->open_stream(true);
  ASSERT_TRUE(enc.ok());
  // taehv.py pools 4 frames into every latent frame, the first one included.
  for (int t = 0; t < 9; ++t) {
    auto y = (*enc)->push(*be.upload(host_frames(io["sample"], t, 1)));
    ASSERT_TRUE(y.ok()) << y.status().message();
    EXPECT_EQ(y->defined(), t % 4 == 3) << "frame " << t;
    if (y->defined()) {
      EXPECT_EQ(y->dim(2), 1);
    }
    EXPECT_EQ((*enc)->frames_seen(), t + 1);
    EXPECT_EQ((*enc)->frames_buffered(), (t + 1) % 4);
  }
  int padded = -1;
  auto tail = (*enc)->finish(&padded);
  ASSERT_TRUE(tail.ok());
  ASSERT_TRUE(tail->defined());
  EXPECT_EQ(tail->dim(2), 1);
  EXPECT_EQ(padded, 0);
  EXPECT_EQ((*enc)->frames_seen(), 0);  // finish() resets

  auto dec = model->open_stream(false);
  ASSERT_TRUE(dec.ok());
  for (int t = 0; t < 3; ++t) {
    auto y = (*dec)->push(*be.upload(host_frames(io["latent"], t, 1)));
    ASSERT_TRUE(y.ok()) << y.status().message();
    ASSERT_TRUE(y->defined());
    EXPECT_EQ(y->dim(2), t == 0 ? 1 : 4);  // the clip's first 3 frames are trimmed
    EXPECT_EQ((*dec)->frames_seen(), t + 1);
    EXPECT_EQ((*dec)->frames_buffered(), 0);
  }
  auto none = (*dec)->finish();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->defined());
}

// A clip of 6 frames: finish() pads it to 9 (= 1 + 4 * 2) by repeating its last frame, which is
// taehv.py's encode_video of that padded clip; a decoder gives 9 frames, 3 of them padding.
TEST_P(Taehv, ClipOfOtherLengthIsPaddedToOnePlusFourK) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  auto io = io_of(c);
  auto enc = model->open_stream(true);
  ASSERT_TRUE(enc.ok());
  int padded = -1;
  Tensor e = run_chunked(*model, **enc, host_frames(io["sample"], 0, 6), {6}, &padded);
  ASSERT_TRUE(e.defined());
  EXPECT_EQ(padded, 3);
  ASSERT_EQ(e.shape(), io["latent_mean_t6"].shape());
  EXPECT_LT(relative_l2(e, io["latent_mean_t6"]), 1e-3);
  // The same through encode_video (which pads the same way).
  Tensor w = whole(*model, host_frames(io["sample"], 0, 6), true);
  EXPECT_EQ(relative_l2(w, e), 0.0);
  // Other lengths: latent frames = 1 + ceil((T - 1) / 4), padded = that * 4 - 3 - T.
  for (int64_t t : {1, 2, 3, 4, 5, 7, 8}) {
    auto s = model->open_stream(true);
    int p = -1;
    Tensor l = run_chunked(*model, **s, host_frames(io["sample"], 0, t), {1}, &p);
    ASSERT_TRUE(l.defined()) << t;
    const int64_t k = (t - 1 + 3) / 4;
    EXPECT_EQ(l.dim(2), 1 + k) << t;
    EXPECT_EQ(p, 1 + 4 * k - t) << t;
  }
}

TEST_P(Taehv, MemoryIsConstantWithClipLength) {
  const Case& c = GetParam();
  auto counting = std::make_shared<CountingBackend>(cpu());
  auto model = load_case(c, counting);
  ASSERT_TRUE(model);
  auto io = io_of(c);
  const Tensor frame = host_frames(io["sample"], 0, 1);
  const Tensor latent = host_frames(io["latent"], 0, 1);
  for (bool encoder : {true, false}) {
    SCOPED_TRACE(encoder ? "encoder" : "decoder");
    std::vector<int64_t> peaks;
    for (int frames : {8, 40}) {
      auto s = model->open_stream(encoder);
      ASSERT_TRUE(s.ok());
      counting->reset_peak();
      const int64_t base = counting->live_bytes();
      for (int i = 0; i < frames; ++i) {
        auto x = counting->upload(encoder ? frame : latent);
        ASSERT_TRUE(x.ok());
        auto y = (*s)->push(*x);  // outputs dropped at once, as an element pushes them on
        ASSERT_TRUE(y.ok()) << y.status().message();
      }
      ASSERT_TRUE((*s)->finish().ok());
      peaks.push_back(counting->peak_bytes() - base);
      EXPECT_EQ(counting->live_bytes(), base);  // finish() leaves nothing behind
    }
    EXPECT_GT(peaks[0], 0);
    EXPECT_EQ(peaks[1], peaks[0]) << "peak live bytes grew with the clip's length";
  }
}

// The clip's history matters in these fixtures: decoding each latent frame alone differs from
// decoding the clip (a model that ignored the MemBlocks' memory would fail the tests above).
TEST_P(Taehv, HistoryMatters) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  auto io = io_of(c);
  Tensor clip = whole(*model, io["latent"], false);
  Tensor last_alone = whole(*model, host_frames(io["latent"], 2, 1), false);  // 1 frame
  Tensor last_in_clip = host_frames(clip, 8, 1);
  EXPECT_GT(relative_l2(last_alone, last_in_clip), 1e-2);
}

TEST_P(Taehv, ImageModeIsAOneFrameClip) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  auto io = io_of(c);
  Backend& be = model->backend();
  // decode(latent frame 0) is frame 0 of the clip's decode (the decoder is causal).
  Tensor l0 = host_frames(io["latent"], 0, 1);
  const Shape& s = l0.shape();
  auto l4 = l0.reshape({s[0], s[1], s[3], s[4]});
  auto img = model->decode(*be.upload(*l4));
  ASSERT_TRUE(img.ok()) << img.status().message();
  Tensor want = host_frames(io["decoded"], 0, 1);
  EXPECT_LT(relative_l2(*be.download(*img), want), 1e-3);
  // encode(frame) is encode_video of the one-frame clip.
  Tensor f0 = host_frames(io["sample"], 0, 1);
  auto f4 = f0.reshape({f0.dim(0), 3, f0.dim(3), f0.dim(4)});
  auto lat = model->encode(*be.upload(*f4));
  ASSERT_TRUE(lat.ok()) << lat.status().message();
  Tensor clip = whole(*model, f0, true);
  ASSERT_EQ(clip.dim(2), 1);
  EXPECT_EQ(relative_l2(*be.download(*lat), clip), 0.0);
}

TEST_P(Taehv, BadInputsAreErrors) {
  const Case& c = GetParam();
  auto model = load_case(c);
  ASSERT_TRUE(model);
  Backend& be = model->backend();
  const int f = c.downsample;
  auto enc = model->open_stream(true);
  ASSERT_TRUE(enc.ok());
  auto expect_error = [](const Result<Tensor>& r, const std::string& needle) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expect_error((*enc)->push(*be.upload(random_tensor({1, 3, f, f}, 1))), "[N, 3, T, H, W]");
  expect_error((*enc)->push(*be.upload(random_tensor({1, 4, 1, f, f}, 1))), "[N, 3, T, H, W]");
  expect_error((*enc)->push(*be.upload(random_tensor({1, 3, 1, f + 2, f}, 1))), "multiple of");
  ASSERT_TRUE((*enc)->push(*be.upload(random_tensor({1, 3, 1, f, f}, 1))).ok());
  expect_error((*enc)->push(*be.upload(random_tensor({1, 3, 1, 2 * f, f}, 1))),
               "does not continue");
  (*enc)->reset();
  EXPECT_EQ((*enc)->frames_seen(), 0);
  EXPECT_TRUE((*enc)->push(*be.upload(random_tensor({1, 3, 1, 2 * f, f}, 1))).ok());
  auto dec = model->open_stream(false);
  ASSERT_TRUE(dec.ok());
  expect_error((*dec)->push(*be.upload(random_tensor({1, 3, 1, 2, 2}, 1))), "latents");
  expect_error(model->encode_video(*be.upload(random_tensor({1, 3, f, f}, 1))), "5-D");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Taehv, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& p) {
                           return std::string(p.param.dir);
                         });

// ---- The published files' layout (full size, no weights committed) --------------------------

std::map<std::string, Tensor> random_weights(const nlohmann::json& shapes, uint64_t seed) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, shape] : shapes.items()) {
    Shape s = shape.get<Shape>();
    int64_t fan_in = 1;
    for (size_t i = 1; i < s.size(); ++i) fan_in *= s[i];
    const float a = s.size() == 4 ? 1.f / std::sqrt(static_cast<float>(fan_in)) : 0.1f;
    out[name] = random_tensor(s, seed++, -a, a).to_dtype(DType::kF16);  // as published: fp16
  }
  return out;
}

TEST(TaehvPublished, FullSizeLayoutsLoadAndRun) {
  const nlohmann::json j = read_json(fixtures_dir() + "/taehv_published_shapes.json");
  struct P {
    const char* name;
    const char* variant;
    int64_t channels, f;
  };
  for (P p : {P{"taew2_1", "taew2.1", 16, 8}, P{"taew2_2", "taew2.2", 48, 16}}) {
    SCOPED_TRACE(p.name);
    const std::string dir = new_dir(std::string("published_") + p.name);
    const std::string file = dir + "/" + p.name + ".safetensors";
    write_all(file, random_weights(j["models"][p.name], 7));
    auto model = load_ok(file);
    ASSERT_TRUE(model);
    EXPECT_EQ(model->info().variant, p.variant);
    EXPECT_EQ(model->latent_space().channels, p.channels);
    EXPECT_EQ(model->downsample(), p.f);
    int64_t params = 0;
    for (const auto& part : model->info().parts) params += part.parameters;
    int64_t want = 0;
    for (const auto& [name, shape] : j["models"][p.name].items())
      want += shape_numel(shape.get<Shape>());
    EXPECT_EQ(params, want);
    Backend& be = model->backend();
    auto x = be.upload(random_tensor({1, 3, 5, 2 * p.f, 3 * p.f}, 3));
    auto lat = model->encode_video(*x);
    ASSERT_TRUE(lat.ok()) << lat.status().message();
    EXPECT_EQ(lat->shape(), (Shape{1, p.channels, 2, 2, 3}));
    auto y = model->decode_video(*lat);
    ASSERT_TRUE(y.ok()) << y.status().message();
    EXPECT_EQ(y->shape(), (Shape{1, 3, 5, 2 * p.f, 3 * p.f}));
  }
}

TEST(TaehvPublished, LargerStoredTGrowKeepsItsLastChannels) {
  // taehv.py's patch_tgrow_layers: decoder.7 (stride 1 by default) stored with 2x the channels.
  const std::string src = fixture("taew2_1_tiny") + "/taew2_1.safetensors";
  auto tensors = read_all(src);
  Tensor w = tensors["decoder.7.conv.weight"].to_dtype(DType::kF32);  // [c, c, 1, 1]
  const int64_t c = w.dim(0);
  Tensor big = Tensor::empty({2 * c, c, 1, 1}, DType::kF32);
  auto* d = big.data_as<float>();
  for (int64_t i = 0; i < c * c; ++i) d[i] = 1000.f;  // the first rows: dropped
  std::memcpy(d + c * c, w.data_as<float>(), static_cast<size_t>(c * c) * sizeof(float));
  tensors["decoder.7.conv.weight"] = big;
  const std::string dir = new_dir("tgrow_patch");
  write_all(dir + "/taew2_1.safetensors", tensors);
  auto model = load_ok(dir + "/taew2_1.safetensors");
  ASSERT_TRUE(model);
  auto io = io_of(kCases[0]);
  EXPECT_LT(relative_l2(whole(*model, io["latent"], false), io["decoded"]), 1e-3);
}

TEST(TaehvPublished, UnsupportedVariantsAreRefused) {
  auto tensors = read_all(fixture("taew2_1_tiny") + "/taew2_1.safetensors");
  // A "super" decoder: decoder.0 a 1x1 conv, decoder.1 a SuperMemBlock.
  auto sup = tensors;
  sup["decoder.0.weight"] = random_tensor({32, 16, 1, 1}, 1);
  sup["decoder.1.conv.0.weight"] = random_tensor({64, 1, 7, 7}, 2);
  std::string dir = new_dir("taehv_super");
  write_all(dir + "/taew2_2_super.safetensors", sup);
  std::string msg = load_error(dir + "/taew2_2_super.safetensors");
  EXPECT_NE(msg.find("super"), std::string::npos) << msg;
  // taecvx: another frame trim.
  dir = new_dir("taehv_cvx");
  write_all(dir + "/taecvx.safetensors", tensors);
  msg = load_error(dir + "/taecvx.safetensors");
  EXPECT_NE(msg.find("not supported"), std::string::npos) << msg;
  // A missing tensor is named.
  auto missing = tensors;
  missing.erase("decoder.9.conv.2.weight");
  dir = new_dir("taehv_missing");
  write_all(dir + "/taew2_1.safetensors", missing);
  msg = load_error(dir + "/taew2_1.safetensors");
  EXPECT_NE(msg.find("decoder.9.conv.2.weight"), std::string::npos) << msg;
}

}  // namespace
}  // namespace latent
