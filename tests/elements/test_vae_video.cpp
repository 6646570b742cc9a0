// vaeencode / vaedecode in video mode (causal video VAEs): caps, timestamps, offsets and durations
// of the latents, their values against the engine's encode_video, frame counts and timestamps of
// the decoded frames, EOS padding, flush / DISCONT resets, the `mode` property per model,
// latentsink / latentsrc files in video mode, latency and bounded memory.
#include <gst/app/gstappsink.h>
#include <gst/video/video.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/backends/registry.h"
#include "engine/core/dtype.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/latent_file.h"
#include "tests/elements/gst_test_util.h"

namespace {

using namespace gsttest;

::testing::Environment* const kEnv = ::testing::AddGlobalTestEnvironment(new GstEnvironment());

constexpr int kW = 32, kH = 32;  // multiples of 16: every fixture's grid, no padding
constexpr int kF = 4;            // temporal factor of the Wan family and TAEW

std::string wan_model() { return fixture_model("wan_vae_video_tiny"); }  // AutoencoderKLWan
std::string qwen_video_model() { return fixture_model("qwen_image_vae_video_tiny"); }
std::string taew_model() {
  return latent::test::fixtures_dir() + "/taew2_1_tiny/taew2_1.safetensors";
}

GstClockTime frame_pts(int64_t i) { return gst_util_uint64_scale(i, GST_SECOND, 30); }

// Frame i of a clip: distinct content per frame (seed), 30 fps timestamps.
GstBuffer* clip_frame(int64_t i, uint32_t seed_base = 1) {
  GstBuffer* b = make_frame(kW, kH, "RGB", static_cast<uint32_t>(seed_base + i));
  GST_BUFFER_PTS(b) = frame_pts(i);
  GST_BUFFER_DURATION(b) = frame_pts(i + 1) - frame_pts(i);
  return b;
}

struct Out {
  std::vector<uint8_t> bytes;
  GstClockTime pts, duration;
  guint64 offset, offset_end;
  bool discont;
};

Out take(GstBuffer* b) {
  Out o{buffer_bytes(b),      GST_BUFFER_PTS(b),        GST_BUFFER_DURATION(b),
        GST_BUFFER_OFFSET(b), GST_BUFFER_OFFSET_END(b), GST_BUFFER_IS_DISCONT(b) != FALSE};
  gst_buffer_unref(b);
  return o;
}

std::vector<Out> pull_all(GstHarness* h) {
  std::vector<Out> out;
  while (GstBuffer* b = gst_harness_try_pull(h)) out.push_back(take(b));
  return out;
}

std::vector<float> floats(const std::vector<uint8_t>& bytes) {
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The engine's encode_video of frames seed_base .. seed_base + n - 1 (as clip_frame makes them),
// normalised on the host: one [C * h * w] vector per latent frame.
std::vector<std::vector<float>> engine_latents(const std::string& model, int n,
                                               uint32_t seed_base = 1) {
  auto backend = latent::get_backend({"cpu", ""});
  EXPECT_TRUE(backend.ok());
  latent::VaeLoadOptions lo;
  lo.decoder = false;
  auto vae = latent::load_vae(model, *backend, lo);
  EXPECT_TRUE(vae.ok()) << vae.status().message();
  if (!vae.ok()) return {};
  latent::Tensor sample = latent::Tensor::empty({1, 3, n, kH, kW}, latent::DType::kF32);
  float* p = sample.data_as<float>();
  for (int c = 0; c < 3; ++c)
    for (int t = 0; t < n; ++t)
      for (int y = 0; y < kH; ++y)
        for (int x = 0; x < kW; ++x) *p++ = pixel_value(x, y, c, seed_base + t) / 127.5f - 1.f;
  auto& b = **backend;
  auto up = b.upload(sample);
  EXPECT_TRUE(up.ok());
  auto raw = (*vae)->encode_video(*up);
  EXPECT_TRUE(raw.ok()) << raw.status().message();
  if (!raw.ok()) return {};
  auto host = b.download(*raw);  // [1, C, t, h, w]
  EXPECT_TRUE(host.ok());
  const std::vector<float> all = host->to_floats();
  const latent::LatentSpace& space = (*vae)->latent_space();
  const int64_t C = host->dim(1), T = host->dim(2), hw = host->dim(3) * host->dim(4);
  std::vector<std::vector<float>> out(T, std::vector<float>(C * hw));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < hw; ++i)
        out[t][c * hw + i] = (all[(c * T + t) * hw + i] - space.shift[c]) * space.scale[c];
  return out;
}

// vaeencode with `props` in a harness at 32x32 RGB 30 fps.
GstHarness* encoder(const std::string& model, const char* mode = "video") {
  GstHarness* h = harness_for("vaeencode", {{"model", model}, {"mode", mode}});
  gst_harness_set_src_caps(h, video_caps(kW, kH, "RGB", 30, 1));
  return h;
}

// Encodes frames 0 .. n-1 then EOS; returns the latents.
std::vector<Out> encode_clip(const std::string& model, int n, GstCaps** caps = nullptr) {
  GstHarness* h = encoder(model);
  for (int i = 0; i < n; ++i) EXPECT_EQ(gst_harness_push(h, clip_frame(i)), GST_FLOW_OK);
  EXPECT_TRUE(gst_harness_push_event(h, gst_event_new_eos()));
  std::vector<Out> out = pull_all(h);
  if (caps) *caps = output_caps(h);
  gst_harness_teardown(h);
  return out;
}

// The latent frames a clip of n frames gives, and what latent j covers: frame 0 alone, then 4.
int64_t latent_count(int64_t n) { return 1 + (n - 1 + kF - 1) / kF; }
int64_t first_covered(int64_t j) { return j == 0 ? 0 : kF * (j - 1) + 1; }
int64_t end_covered(int64_t j, int64_t n) { return std::min<int64_t>(kF * j + 1, n); }

void expect_encoded_clip(const std::string& model, int n) {
  SCOPED_TRACE("clip of " + std::to_string(n) + " frames through " + model);
  GstCaps* caps = nullptr;
  const std::vector<Out> got = encode_clip(model, n, &caps);
  ASSERT_NE(caps, nullptr);
  EXPECT_EQ(caps_int(gst_caps_get_structure(caps, 0), "temporal-factor"), kF);
  gst_caps_unref(caps);
  ASSERT_EQ(static_cast<int64_t>(got.size()), latent_count(n));
  const auto want = engine_latents(model, n);
  ASSERT_EQ(want.size(), got.size());
  for (size_t j = 0; j < got.size(); ++j) {
    const int64_t first = first_covered(j), end = end_covered(j, n);
    EXPECT_EQ(got[j].offset, static_cast<guint64>(first)) << "latent " << j;
    EXPECT_EQ(got[j].offset_end, static_cast<guint64>(end)) << "latent " << j;
    EXPECT_EQ(got[j].pts, frame_pts(first)) << "latent " << j;
    EXPECT_EQ(got[j].duration, frame_pts(end) - frame_pts(first)) << "latent " << j;
    EXPECT_EQ(got[j].discont, j == 0) << "latent " << j;
    EXPECT_LT(rel_l2(floats(got[j].bytes), want[j]), 1e-4) << "latent " << j;
  }
}

TEST(VaeVideo, EncoderLatentsTimestampsOffsetsAndValuesMatchTheEngine) {
  for (int n : {1, 5, 7, 9}) expect_encoded_clip(wan_model(), n);
}

TEST(VaeVideo, TaewEncoderFollowsTheSameConvention) {
  // TAEW completes latent j three frames later than Wan's VAE; the buffers say the same.
  for (int n : {1, 4, 6, 9}) expect_encoded_clip(taew_model(), n);
}

TEST(VaeVideo, EosPadsThePartialChunkAndCountsOnlyRealFrames) {
  const std::vector<Out> got = encode_clip(wan_model(), 7);
  ASSERT_EQ(got.size(), 3u);
  // Frames 5 and 6 are real; the chunk was completed with two copies of frame 6.
  EXPECT_EQ(got[2].offset, 5u);
  EXPECT_EQ(got[2].offset_end - got[2].offset, 2u);
}

// ---- decoder ----

// `vaeencode ! vaedecode` in one harness: frames 0 .. n-1 (seeds from seed_base) then EOS.
std::vector<Out> round_trip(const std::string& model, int n) {
  const std::string line = "vaeencode model=\"" + model + "\" ! vaedecode model=\"" + model + "\"";
  GstHarness* h = gst_harness_new_parse(line.c_str());
  gst_harness_set_src_caps(h, video_caps(kW, kH, "RGB", 30, 1));
  gst_harness_set_sink_caps_str(h, "video/x-raw,format=RGB");
  for (int i = 0; i < n; ++i) EXPECT_EQ(gst_harness_push(h, clip_frame(i)), GST_FLOW_OK);
  EXPECT_TRUE(gst_harness_push_event(h, gst_event_new_eos()));
  std::vector<Out> out = pull_all(h);
  gst_harness_teardown(h);
  return out;
}

void expect_round_trip(const std::string& model, const std::vector<int>& lengths) {
  for (int n : lengths) {
    SCOPED_TRACE(model + ": " + std::to_string(n) + " frames");
    const std::vector<Out> got = round_trip(model, n);
    ASSERT_EQ(static_cast<int>(got.size()), n);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(got[i].bytes.size(), static_cast<size_t>(kW * kH * 3));
      // Spread over the latent's pts and duration: within a nanosecond of the source frame's.
      EXPECT_LE(
          std::llabs(static_cast<long long>(got[i].pts) - static_cast<long long>(frame_pts(i))), 1)
          << "frame " << i;
      EXPECT_LE(std::llabs(static_cast<long long>(got[i].duration) -
                           static_cast<long long>(frame_pts(i + 1) - frame_pts(i))),
                1)
          << "frame " << i;
      EXPECT_EQ(got[i].offset, static_cast<guint64>(i));
      EXPECT_EQ(got[i].offset_end, static_cast<guint64>(i + 1));
      EXPECT_EQ(got[i].discont, i == 0) << "frame " << i;
    }
  }
}

TEST(VaeVideo, RoundTripGivesAsManyFramesAsWentInWithTheirTimestamps) {
  expect_round_trip(wan_model(), {1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST(VaeVideo, TaewRoundTripGivesAsManyFramesAsWentIn) {
  // Every remainder of T mod 4 (TAEW's finish() gives 1 or 2 latent frames).
  expect_round_trip(taew_model(), {1, 4, 5, 6, 7});
  // TAEW2.2: 2x2 pixel patches, 48 channels, /16.
  expect_round_trip(latent::test::fixtures_dir() + "/taew2_2_tiny/taew2_2.safetensors", {1, 6});
}

// The engine's decode_video(encode_video(clip)) of frames 1 .. n (as clip_frame makes them) as
// RGB bytes, padded frames dropped: one [H * W * 3] vector per frame.
std::vector<std::vector<uint8_t>> engine_round_trip(const std::string& model, int n) {
  auto backend = latent::get_backend({"cpu", ""});
  EXPECT_TRUE(backend.ok());
  auto vae = latent::load_vae(model, *backend);
  EXPECT_TRUE(vae.ok()) << vae.status().message();
  if (!vae.ok()) return {};
  latent::Tensor sample = latent::Tensor::empty({1, 3, n, kH, kW}, latent::DType::kF32);
  float* p = sample.data_as<float>();
  for (int c = 0; c < 3; ++c)
    for (int t = 0; t < n; ++t)
      for (int y = 0; y < kH; ++y)
        for (int x = 0; x < kW; ++x) *p++ = pixel_value(x, y, c, 1 + t) / 127.5f - 1.f;
  auto& b = **backend;
  auto up = b.upload(sample);
  auto raw = up.ok() ? (*vae)->encode_video(*up) : up;
  auto frames = raw.ok() ? (*vae)->decode_video(*raw) : raw;  // [1, 3, T', H, W]
  EXPECT_TRUE(frames.ok()) << frames.status().message();
  if (!frames.ok()) return {};
  auto host = b.download(*frames);
  EXPECT_TRUE(host.ok());
  const std::vector<float> v = host->to_floats();
  const int64_t T = host->dim(2);
  EXPECT_GE(T, n);
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(kW * kH * 3));
  for (int t = 0; t < n && t < T; ++t)
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < kW * kH; ++i) {
        const float x = (v[(c * T + t) * kW * kH + i] + 1.f) * 127.5f;
        out[t][i * 3 + c] = static_cast<uint8_t>(std::clamp(std::lround(x), 0L, 255L));
      }
  return out;
}

TEST(VaeVideo, DecodedFramesMatchTheEngine) {
  for (int n : {1, 6, 9}) {
    SCOPED_TRACE(std::to_string(n) + " frames");
    const std::vector<Out> got = round_trip(wan_model(), n);
    const auto want = engine_round_trip(wan_model(), n);
    ASSERT_EQ(got.size(), want.size());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(got[i].bytes.size(), want[i].size());
      int worst = 0;
      for (size_t k = 0; k < want[i].size(); ++k)
        worst = std::max(worst, std::abs(int(got[i].bytes[k]) - int(want[i][k])));
      EXPECT_LE(worst, 1) << "frame " << i;  // rounding of values a hair from .5
    }
  }
}

TEST(VaeVideo, DecoderMakesOneThenFourFramesALatentAndSpreadsTheDuration) {
  // Latents from the encoder, their offsets removed: no padding is known, so every latent after
  // the first gives 4 frames sharing its duration.
  std::vector<Out> latents = encode_clip(wan_model(), 5);
  ASSERT_EQ(latents.size(), 2u);
  GstHarness* h = harness_for("vaedecode", {{"model", wan_model()}});
  GstCaps* caps = nullptr;
  {
    GstHarness* e = encoder(wan_model());
    gst_harness_push(e, clip_frame(0));
    caps = output_caps(e);
    gst_harness_teardown(e);
  }
  ASSERT_NE(caps, nullptr);
  gst_harness_set_src_caps(h, caps);
  gst_harness_set_sink_caps_str(h, "video/x-raw,format=RGB");
  const GstClockTime t0 = 10 * GST_SECOND;
  for (size_t j = 0; j < latents.size(); ++j) {
    GstBuffer* b = gst_buffer_new_memdup(latents[j].bytes.data(), latents[j].bytes.size());
    GST_BUFFER_PTS(b) = t0 + j * 100 * GST_MSECOND;
    GST_BUFFER_DURATION(b) = j == 0 ? 100 * GST_MSECOND : 400 * GST_MSECOND;
    ASSERT_EQ(gst_harness_push(h, b), GST_FLOW_OK);
  }
  const std::vector<Out> got = pull_all(h);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].pts, t0);
  EXPECT_EQ(got[0].duration, 100 * GST_MSECOND);
  for (int i = 1; i < 5; ++i) {
    EXPECT_EQ(got[i].pts, t0 + 100 * GST_MSECOND + (i - 1) * 100 * GST_MSECOND) << i;
    EXPECT_EQ(got[i].duration, 100 * GST_MSECOND) << i;
    EXPECT_EQ(got[i].offset, GST_BUFFER_OFFSET_NONE);
  }
  gst_harness_teardown(h);
}

// ---- resets ----

TEST(VaeVideo, AFlushStartsANewClip) {
  const std::vector<Out> fresh = [] {
    GstHarness* h = encoder(wan_model());
    for (int i = 0; i < 5; ++i) gst_harness_push(h, clip_frame(i, 100));
    gst_harness_push_event(h, gst_event_new_eos());
    auto out = pull_all(h);
    gst_harness_teardown(h);
    return out;
  }();
  ASSERT_EQ(fresh.size(), 2u);

  GstHarness* h = encoder(wan_model());
  for (int i = 0; i < 7; ++i) gst_harness_push(h, clip_frame(i, 1));  // 2 latents, 2 frames held
  EXPECT_EQ(pull_all(h).size(), 2u);
  ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_flush_start()));
  ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_flush_stop(TRUE)));
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_segment(&segment)));
  EXPECT_EQ(pull_all(h).size(), 0u);  // the held frames were dropped, not finished
  for (int i = 0; i < 5; ++i) gst_harness_push(h, clip_frame(i, 100));
  gst_harness_push_event(h, gst_event_new_eos());
  const std::vector<Out> after = pull_all(h);
  gst_harness_teardown(h);
  ASSERT_EQ(after.size(), fresh.size());
  for (size_t j = 0; j < after.size(); ++j) {
    EXPECT_EQ(after[j].bytes, fresh[j].bytes) << "latent " << j;
    EXPECT_EQ(after[j].offset, fresh[j].offset);
    EXPECT_EQ(after[j].offset_end, fresh[j].offset_end);
  }
}

TEST(VaeVideo, ADiscontinuityFinishesTheClipAndStartsANewOne) {
  const std::vector<Out> fresh = [] {
    GstHarness* h = encoder(wan_model());
    for (int i = 0; i < 5; ++i) gst_harness_push(h, clip_frame(i, 100));
    gst_harness_push_event(h, gst_event_new_eos());
    auto out = pull_all(h);
    gst_harness_teardown(h);
    return out;
  }();
  GstHarness* h = encoder(wan_model());
  for (int i = 0; i < 3; ++i) gst_harness_push(h, clip_frame(i, 1));
  for (int i = 0; i < 5; ++i) {
    GstBuffer* b = clip_frame(i, 100);
    GST_BUFFER_PTS(b) += GST_SECOND;
    if (i == 0) GST_BUFFER_FLAG_SET(b, GST_BUFFER_FLAG_DISCONT);
    gst_harness_push(h, b);
  }
  gst_harness_push_event(h, gst_event_new_eos());
  const std::vector<Out> got = pull_all(h);
  gst_harness_teardown(h);
  // The 3-frame clip: latent 0 (frame 0), latent 1 (frames 1, 2 and two repeats).
  ASSERT_EQ(got.size(), 2u + fresh.size());
  EXPECT_EQ(got[1].offset, 1u);
  EXPECT_EQ(got[1].offset_end, 3u);
  for (size_t j = 0; j < fresh.size(); ++j) {
    const Out& a = got[2 + j];
    EXPECT_EQ(a.bytes, fresh[j].bytes) << "latent " << j;
    EXPECT_EQ(a.offset, fresh[j].offset);
    EXPECT_EQ(a.offset_end, fresh[j].offset_end);
    EXPECT_EQ(a.pts, fresh[j].pts + GST_SECOND);
    EXPECT_EQ(a.discont, j == 0);
  }
}

TEST(VaeVideo, TheSameCapsAgainContinueTheClipNewCapsStartANewOne) {
  GstHarness* h = encoder(wan_model());
  for (int i = 0; i < 3; ++i) gst_harness_push(h, clip_frame(i));
  ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_caps(video_caps(kW, kH, "RGB", 30, 1))));
  for (int i = 3; i < 5; ++i) gst_harness_push(h, clip_frame(i));
  std::vector<Out> got = pull_all(h);
  ASSERT_EQ(got.size(), 2u);  // one clip: frame 0, then frames 1 .. 4
  EXPECT_EQ(got[1].offset, 1u);
  EXPECT_EQ(got[1].offset_end, 5u);
  // Another frame rate: the clip so far ends (frame 5 alone, padded) and a new one starts.
  gst_harness_push(h, clip_frame(5));
  gst_harness_set_src_caps(h, video_caps(kW, kH, "RGB", 25, 1));
  got = pull_all(h);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].offset, 5u);
  EXPECT_EQ(got[0].offset_end, 6u);
  gst_harness_push(h, clip_frame(6));
  got = pull_all(h);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].offset, 0u);
  EXPECT_TRUE(got[0].discont);
  gst_harness_teardown(h);
}

TEST(VaeVideo, StateCyclesMidClipLeakNothingAndRestartTheClip) {
  GstHarness* h = encoder(wan_model());
  GstElement* e = h->element;
  for (int cycle = 0; cycle < 3; ++cycle) {
    for (int i = 0; i < 6; ++i) gst_harness_push(h, clip_frame(i));  // frame 5 held at the end
    auto got = pull_all(h);
    EXPECT_EQ(got.size(), 2u) << "cycle " << cycle;
    if (!got.empty()) {
      EXPECT_TRUE(got[0].discont);
    }
    ASSERT_EQ(gst_element_set_state(e, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
    ASSERT_EQ(gst_element_set_state(e, GST_STATE_PLAYING), GST_STATE_CHANGE_SUCCESS);
    gst_harness_set_src_caps(h, video_caps(kW, kH, "RGB", 30, 1));
  }
  gst_harness_teardown(h);
}

// ---- mode ----

std::string start_error(const char* factory, const std::string& model, const char* mode) {
  GstElement* e = gst_element_factory_make(factory, nullptr);
  g_object_set(e, "model", model.c_str(), nullptr);
  gst_util_set_object_arg(G_OBJECT(e), "mode", mode);
  std::string err;
  {
    BusWatch bw(e);
    EXPECT_EQ(gst_element_set_state(e, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
    err = bw.pop_error();
  }
  gst_element_set_state(e, GST_STATE_NULL);
  gst_object_unref(e);
  return err;
}

TEST(VaeVideo, VideoModeIsRefusedForAnImageModel) {
  for (const char* factory : {"vaeencode", "vaedecode"}) {
    const std::string err = start_error(factory, taesd_model(), "video");
    EXPECT_TRUE(contains(err, std::string(factory) + ": mode=video")) << err;
    EXPECT_TRUE(contains(err, "image model")) << err;
    EXPECT_TRUE(contains(err, taesd_model())) << err;
  }
}

TEST(VaeVideo, ModeCannotChangeWhilePlaying) {
  GstHarness* h = encoder(wan_model());
  std::string warning;
  {
    BusWatch bw(h->element);
    gst_util_set_object_arg(G_OBJECT(h->element), "mode", "image");
    GstMessage* m = gst_bus_timed_pop_filtered(bw.bus(), 0, GST_MESSAGE_WARNING);
    ASSERT_NE(m, nullptr);
    GError* err = nullptr;
    gst_message_parse_warning(m, &err, nullptr);
    warning = err ? err->message : "";
    g_clear_error(&err);
    gst_message_unref(m);
  }
  EXPECT_TRUE(contains(warning, "`mode` cannot change while PAUSED or PLAYING")) << warning;
  gint mode = -1;
  g_object_get(h->element, "mode", &mode, nullptr);
  EXPECT_EQ(mode, 2);  // video, as set before start
  gst_harness_teardown(h);
}

// The temporal-factor of the encoder's caps for `model` and `mode` (-1: absent, image mode).
int encoder_factor(const std::string& model, const char* mode) {
  GstHarness* h = encoder(model, mode);
  gst_harness_push(h, clip_frame(0));
  gst_harness_push_event(h, gst_event_new_eos());
  GstCaps* caps = output_caps(h);
  int factor = -2;
  if (caps) {
    factor = caps_int(gst_caps_get_structure(caps, 0), "temporal-factor");
    gst_caps_unref(caps);
  }
  gst_harness_teardown(h);
  return factor;
}

TEST(VaeVideo, AutoModeIsVideoForWanAndTaewModelsAndImageOtherwise) {
  EXPECT_EQ(encoder_factor(wan_model(), "auto"), 4);
  EXPECT_EQ(encoder_factor(taew_model(), "auto"), 4);
  // AutoencoderKLQwenImage: the video architecture of an image model; video only when asked.
  EXPECT_EQ(encoder_factor(qwen_video_model(), "auto"), -1);
  EXPECT_EQ(encoder_factor(qwen_video_model(), "video"), 4);
  EXPECT_EQ(encoder_factor(wan_model(), "image"), -1);
  EXPECT_EQ(encoder_factor(taesd_model(), "auto"), -1);
  GstElement* e = gst_element_factory_make("vaeencode", nullptr);
  gint mode = -1;
  g_object_get(e, "mode", &mode, nullptr);
  EXPECT_EQ(mode, 0);  // auto
  gst_object_unref(e);
}

TEST(VaeVideo, DecoderRefusesVideoLatentsInImageMode) {
  GstHarness* e = encoder(wan_model());
  gst_harness_push(e, clip_frame(0));
  GstCaps* caps = output_caps(e);
  GstBuffer* latent = gst_harness_pull(e);
  gst_harness_teardown(e);
  ASSERT_NE(caps, nullptr);
  GstHarness* h = harness_for("vaedecode", {{"model", wan_model()}, {"mode", "image"}});
  std::string err;
  {
    BusWatch bw(h->element);
    gst_harness_set_src_caps(h, caps);
    gst_harness_push(h, latent);
    err = bw.pop_error();
  }
  EXPECT_TRUE(contains(err, "temporal-factor=4")) << err;
  EXPECT_TRUE(contains(err, "mode=image")) << err;
  gst_harness_teardown(h);
}

// ---- latency ----

TEST(VaeVideo, LatencyIncludesTheFramesHeldForAChunk) {
  const GstClockTime frame = frame_pts(1);
  for (auto [model, held] : {std::pair<std::string, int>{wan_model(), 3}, {taew_model(), 6}}) {
    GstHarness* h = encoder(model);
    gst_harness_set_upstream_latency(h, 0);
    gst_harness_push(h, clip_frame(0));
    const GstClockTime latency = gst_harness_query_latency(h);
    EXPECT_GE(latency, held * frame) << model;
    EXPECT_LT(latency, (held + 1) * frame + 5 * GST_SECOND) << model;
    gst_harness_teardown(h);
  }
}

// ---- latent files ----

TEST(VaeVideo, LatentsinkWritesVideoModeFilesThatLatentsrcDecodesToTheSameFrames) {
  const std::string model = wan_model();
  const std::string path = latent::test::temp_dir() + "/video_mode.safetensors";
  const std::string src =
      "videotestsrc num-buffers=7 pattern=ball ! "
      "video/x-raw,format=RGB,width=32,height=32,framerate=25/1 ! ";
  const std::string enc = "vaeencode model=\"" + model + "\" mode=video ! ";
  const std::string dec =
      "vaedecode model=\"" + model + "\" ! video/x-raw,format=RGB ! appsink name=sink sync=false";
  const auto direct = run_to_eos(src + enc + dec);
  ASSERT_EQ(direct.size(), 7u);
  run_to_eos(src + enc + "latentsink location=\"" + path + "\"");
  auto f = latent::open_latent_file(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->info.video_mode());
  EXPECT_EQ(f->info.temporal_factor, 4);
  EXPECT_EQ(f->info.latent_frames(), 3);
  EXPECT_EQ(f->info.frame_count, 7);
  EXPECT_EQ(f->info.offsets, (std::vector<int64_t>{0, 1, 5}));
  EXPECT_EQ(f->info.offset_ends, (std::vector<int64_t>{1, 5, 7}));
  EXPECT_EQ(f->info.pts, (std::vector<int64_t>{0, 40000000, 200000000}));
  EXPECT_EQ(f->info.durations, (std::vector<int64_t>{40000000, 160000000, 80000000}));
  const auto played = run_to_eos("latentsrc location=\"" + path + "\" ! " + dec);
  ASSERT_EQ(played.size(), direct.size());
  for (size_t i = 0; i < direct.size(); ++i) EXPECT_TRUE(played[i] == direct[i]) << "frame " << i;
}

// ---- output buffer pools ----

// Runs `line` (ending in "appsink name=sink") with the appsink offering a buffer pool in its
// ALLOCATION answer, as video sinks and encoders do. Returns how many buffers arrived, and how
// many of them came from a pool; a stage that stalls fails after 30 s instead of hanging.
struct PooledRun {
  int buffers = 0;
  int pooled = 0;
  bool eos = false;
};

PooledRun run_with_downstream_pool(const std::string& line) {
  PooledRun r;
  GError* error = nullptr;
  GstElement* pipeline = gst_parse_launch(line.c_str(), &error);
  EXPECT_NE(pipeline, nullptr) << (error ? error->message : "");
  if (!pipeline) return r;
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  GstPad* pad = gst_element_get_static_pad(sink, "sink");
  gst_pad_add_probe(
      pad, GST_PAD_PROBE_TYPE_QUERY_DOWNSTREAM,
      [](GstPad*, GstPadProbeInfo* info, gpointer) {
        GstQuery* q = GST_PAD_PROBE_INFO_QUERY(info);
        if (GST_QUERY_TYPE(q) != GST_QUERY_ALLOCATION) return GST_PAD_PROBE_OK;
        GstCaps* caps = nullptr;
        gst_query_parse_allocation(q, &caps, nullptr);
        GstVideoInfo vinfo;
        const bool video = caps && gst_video_info_from_caps(&vinfo, caps);
        GstBufferPool* pool = video ? gst_video_buffer_pool_new() : gst_buffer_pool_new();
        gst_query_add_allocation_pool(q, pool, video ? GST_VIDEO_INFO_SIZE(&vinfo) : 1 << 20, 0, 0);
        gst_object_unref(pool);
        return GST_PAD_PROBE_OK;
      },
      nullptr, nullptr);
  gst_object_unref(pad);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  while (GstSample* s = gst_app_sink_try_pull_sample(GST_APP_SINK(sink), 30 * GST_SECOND)) {
    ++r.buffers;
    if (gst_sample_get_buffer(s)->pool) ++r.pooled;
    gst_sample_unref(s);
  }
  r.eos = gst_app_sink_is_eos(GST_APP_SINK(sink));
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
  return r;
}

// Video mode hands out results outside GstBaseTransform's generate_output; a pool negotiated
// with downstream starts inactive, and acquiring from it answered FLUSHING, which paused the
// source's task without an error: the pipeline hung after the first frame (seen on CUDA, where
// latents always go to a pool).
TEST(VaeVideo, PoolsOfferedDownstreamAreActivatedAndUsed) {
  const std::string src =
      "videotestsrc num-buffers=7 ! video/x-raw,format=RGB,width=32,height=32 ! ";
  const std::string enc = "vaeencode model=\"" + wan_model() + "\" mode=video ! ";
  PooledRun latents = run_with_downstream_pool(src + enc + "appsink name=sink sync=false");
  EXPECT_TRUE(latents.eos);
  EXPECT_EQ(latents.buffers, 3);  // 1 + 4 + (2 padded to 4) frames
  EXPECT_EQ(latents.pooled, latents.buffers);
  PooledRun frames =
      run_with_downstream_pool(src + enc + "vaedecode model=\"" + wan_model() +
                               "\" ! video/x-raw,format=RGB ! appsink name=sink sync=false");
  EXPECT_TRUE(frames.eos);
  EXPECT_EQ(frames.buffers, 7);
  EXPECT_EQ(frames.pooled, frames.buffers);
}

// ---- bounded memory ----

// Heap bytes in use now (all arenas, small blocks and mmapped ones). Unlike peak RSS this does
// not depend on when a transient allocation happened to land, so it can be sampled mid-stream.
size_t heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#else
  return 0;
#endif
}

TEST(VaeVideo, MemoryDoesNotGrowWithTheLengthOfTheClip) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator is not glibc's malloc";
#endif
  if (heap_in_use() == 0) GTEST_SKIP() << "needs glibc's mallinfo2";
  // One clip of 700 frames; the heap in use is sampled at frames 100, 400 and 700 as they reach
  // the sink, inside the same streaming run (the causal caches and one chunk are all that is held).
  struct Samples {
    int frames = 0;
    std::vector<size_t> at;
  } samples;
  const std::string line =
      "videotestsrc num-buffers=700 ! video/x-raw,format=RGB,width=64,height=64 "
      "! vaeencode model=\"" +
      wan_model() + "\" mode=video ! vaedecode model=\"" + wan_model() + "\" ! fakesink name=sink";
  GError* error = nullptr;
  GstElement* pipeline = gst_parse_launch(line.c_str(), &error);
  ASSERT_NE(pipeline, nullptr) << (error ? error->message : "");
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  GstPad* pad = gst_element_get_static_pad(sink, "sink");
  gst_pad_add_probe(
      pad, GST_PAD_PROBE_TYPE_BUFFER,
      [](GstPad*, GstPadProbeInfo*, gpointer data) {
        auto* s = static_cast<Samples*>(data);
        if (++s->frames % 300 == 100) s->at.push_back(heap_in_use());
        return GST_PAD_PROBE_OK;
      },
      &samples, nullptr);
  gst_object_unref(pad);
  gst_object_unref(sink);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* m = gst_bus_timed_pop_filtered(
      bus, 120 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  EXPECT_TRUE(m && GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS);
  if (m) gst_message_unref(m);
  gst_object_unref(bus);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(pipeline);
  EXPECT_EQ(samples.frames, 700);
  ASSERT_EQ(samples.at.size(), 3u);
  // 600 more frames would hold > 7 MiB if each kept its 12 KiB RGB frame (> 28 MiB as the fp32
  // model input); the heap may move by what one chunk in flight holds, never by that.
  const long grew = static_cast<long>(samples.at[2]) - static_cast<long>(samples.at[0]);
  EXPECT_LT(grew, 1024 * 1024) << "heap in use " << samples.at[0] << " B at frame 100, "
                               << samples.at[1] << " at 400, " << samples.at[2] << " at 700";
}

}  // namespace
