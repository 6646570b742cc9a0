// vaedecode: output size and pixels against the engine, dtypes, formats, size policies,
// refusal of other models' latents, and every bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/backends/registry.h"
#include "engine/core/dtype.h"
#include "engine/models/vae/vae.h"
#include "tests/elements/gst_test_util.h"

namespace {

using namespace gsttest;

::testing::Environment* const kEnv = ::testing::AddGlobalTestEnvironment(new GstEnvironment());

struct LatentDesc {
  const char* format = "fp32";
  int channels = 4;
  int width = 13, height = 9;
  const char* space = "sd";
  int frame_width = 100, frame_height = 70;
  const char* policy = "pad";
};

GstCaps* latent_caps(const LatentDesc& d) {
  return gst_caps_new_simple(
      "application/x-latent", "format", G_TYPE_STRING, d.format, "channels", G_TYPE_INT, d.channels,
      "width", G_TYPE_INT, d.width, "height", G_TYPE_INT, d.height, "latent-space", G_TYPE_STRING,
      d.space, "frame-width", G_TYPE_INT, d.frame_width, "frame-height", G_TYPE_INT, d.frame_height,
      "size-policy", G_TYPE_STRING, d.policy, "framerate", GST_TYPE_FRACTION, 30, 1, nullptr);
}

// Normalised latent values, rounded to bf16 so fp32, bf16 and fp16 all hold them exactly.
std::vector<float> random_latent(int c, int h, int w, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> v(size_t(c) * h * w);
  for (float& x : v) x = latent::bf16_to_f32(latent::f32_to_bf16(dist(gen)));
  return v;
}

GstBuffer* latent_buffer(const std::vector<float>& values, latent::DType dtype) {
  GstBuffer* b =
      gst_buffer_new_allocate(nullptr, values.size() * latent::dtype_size(dtype), nullptr);
  GstMapInfo map;
  gst_buffer_map(b, &map, GST_MAP_WRITE);
  latent::convert_elements(values.data(), latent::DType::kF32, map.data, dtype, values.size());
  gst_buffer_unmap(b, &map);
  return b;
}

// The engine's decoding of `values` (normalised), as RGB bytes of the top-left w x h pixels
// (the pad policy's inverse), computed here without the element's pixel code.
std::vector<uint8_t> engine_rgb(const std::string& model_path, const std::vector<float>& values,
                                int c, int lh, int lw, int w, int h) {
  auto backend = latent::get_backend({"cpu", ""});
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return {};
  latent::VaeLoadOptions lo;
  lo.encoder = false;
  auto vae = latent::load_vae(model_path, *backend, lo);
  EXPECT_TRUE(vae.ok()) << vae.status().message();
  if (!vae.ok()) return {};
  auto& b = **backend;
  auto x = b.upload(latent::Tensor::from_floats({1, c, lh, lw}, values));
  auto raw = (*vae)->latent_space().denormalize(b, *x);
  auto img = (*vae)->decode(*raw);
  EXPECT_TRUE(img.ok()) << img.status().message();
  if (!img.ok()) return {};
  auto host = b.download(*img);
  const int mh = int(host->dim(2)), mw = int(host->dim(3));
  const float* p = host->data_as<float>();
  std::vector<uint8_t> out(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int xx = 0; xx < w; ++xx)
      for (int ch = 0; ch < 3; ++ch) {
        const float v = (p[(size_t(ch) * mh + y) * mw + xx] + 1.f) * 127.5f;
        out[(size_t(y) * w + xx) * 3 + ch] =
            static_cast<uint8_t>(std::lround(std::min(255.f, std::max(0.f, v))));
      }
  return out;
}

// Decodes one latent with `d`'s caps; returns the output (caps in *caps if given).
GstBuffer* decode_one(const std::string& model, const LatentDesc& d,
                      const std::vector<float>& values, latent::DType dtype,
                      GstCaps** caps = nullptr, const char* sink_caps = "video/x-raw, format=RGB") {
  GstHarness* hs = harness_for("vaedecode", {{"model", model}});
  if (sink_caps) gst_harness_set_sink_caps_str(hs, sink_caps);
  gst_harness_set_src_caps(hs, latent_caps(d));
  GstBuffer* out = nullptr;
  if (gst_harness_push(hs, latent_buffer(values, dtype)) == GST_FLOW_OK) out = gst_harness_pull(hs);
  if (caps) *caps = output_caps(hs);
  gst_harness_teardown(hs);
  return out;
}

int max_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 1000;
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

TEST(VaeDecode, OutputsTheOriginalFrameSize) {
  LatentDesc d;  // sd, 13x9 latent of a 100x70 frame, pad
  GstCaps* caps = nullptr;
  GstBuffer* out =
      decode_one(taesd_model(), d, random_latent(4, 9, 13, 1), latent::DType::kF32, &caps);
  ASSERT_NE(out, nullptr);
  const GstStructure* s = gst_caps_get_structure(caps, 0);
  EXPECT_TRUE(gst_structure_has_name(s, "video/x-raw"));
  EXPECT_EQ(caps_str(s, "format"), "RGB");
  EXPECT_EQ(caps_int(s, "width"), 100);
  EXPECT_EQ(caps_int(s, "height"), 70);
  int n = 0, den = 0;
  ASSERT_TRUE(gst_structure_get_fraction(s, "framerate", &n, &den));
  EXPECT_EQ(n, 30);
  EXPECT_EQ(den, 1);
  EXPECT_EQ(gst_buffer_get_size(out), size_t{100 * 3 * 70});
  gst_buffer_unref(out);
  gst_caps_unref(caps);
}

TEST(VaeDecode, PixelsAreTheEnginesDecoding) {
  struct Case {
    std::string model;
    LatentDesc d;
  } cases[] = {{taesd_model(), LatentDesc{}},
               {flux_model(), LatentDesc{"fp32", 16, 25, 18, "flux1", 100, 70, "pad"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    const auto values = random_latent(c.d.channels, c.d.height, c.d.width, 2);
    GstBuffer* out = decode_one(c.model, c.d, values, latent::DType::kF32);
    ASSERT_NE(out, nullptr);
    const auto want = engine_rgb(c.model, values, c.d.channels, c.d.height, c.d.width,
                                 c.d.frame_width, c.d.frame_height);
    EXPECT_LE(max_diff(buffer_bytes(out), want), 1);
    gst_buffer_unref(out);
  }
}

TEST(VaeDecode, EveryLatentDtypeDecodesTheSame) {
  const auto values = random_latent(4, 6, 8, 3);
  LatentDesc d{"fp32", 4, 8, 6, "sd", 64, 48, "pad"};
  GstBuffer* ref = decode_one(taesd_model(), d, values, latent::DType::kF32);
  ASSERT_NE(ref, nullptr);
  for (auto [name, dtype] :
       {std::pair{"bf16", latent::DType::kBF16}, std::pair{"fp16", latent::DType::kF16}}) {
    SCOPED_TRACE(name);
    d.format = name;
    GstBuffer* out = decode_one(taesd_model(), d, values, dtype);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(buffer_bytes(out), buffer_bytes(ref));
    gst_buffer_unref(out);
  }
  gst_buffer_unref(ref);
}

TEST(VaeDecode, WritesTheFormatDownstreamAsksFor) {
  const auto values = random_latent(4, 6, 8, 4);
  LatentDesc d{"fp32", 4, 8, 6, "sd", 64, 48, "pad"};
  GstBuffer* rgb = decode_one(taesd_model(), d, values, latent::DType::kF32);
  ASSERT_NE(rgb, nullptr);
  const auto want = buffer_bytes(rgb);
  gst_buffer_unref(rgb);
  GstCaps* caps = nullptr;
  GstBuffer* xbgr =
      decode_one(taesd_model(), d, values, latent::DType::kF32, &caps, "video/x-raw, format=xBGR");
  ASSERT_NE(xbgr, nullptr);
  EXPECT_EQ(caps_str(gst_caps_get_structure(caps, 0), "format"), "xBGR");
  const auto got = buffer_bytes(xbgr);
  ASSERT_EQ(got.size(), size_t{64 * 48 * 4});
  for (size_t i = 0; i < size_t{64 * 48}; ++i) {
    ASSERT_EQ(got[i * 4 + 0], 255) << "x byte at pixel " << i;
    ASSERT_EQ(got[i * 4 + 3], want[i * 3 + 0]) << "R at pixel " << i;
    ASSERT_EQ(got[i * 4 + 2], want[i * 3 + 1]) << "G at pixel " << i;
    ASSERT_EQ(got[i * 4 + 1], want[i * 3 + 2]) << "B at pixel " << i;
  }
  gst_buffer_unref(xbgr);
  gst_caps_unref(caps);
}

TEST(VaeDecode, EverySizePolicyRestoresTheFrameSize) {
  struct Case {
    const char* policy;
    int lw, lh;
  } cases[] = {{"pad", 13, 9}, {"crop", 12, 8}, {"scale", 13, 9}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.policy);
    LatentDesc d{"fp32", 4, c.lw, c.lh, "sd", 100, 70, c.policy};
    GstCaps* caps = nullptr;
    GstBuffer* out =
        decode_one(taesd_model(), d, random_latent(4, c.lh, c.lw, 5), latent::DType::kF32, &caps);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(caps_int(gst_caps_get_structure(caps, 0), "width"), 100);
    EXPECT_EQ(caps_int(gst_caps_get_structure(caps, 0), "height"), 70);
    EXPECT_EQ(gst_buffer_get_size(out), size_t{100 * 3 * 70});
    gst_buffer_unref(out);
    gst_caps_unref(caps);
  }
}

TEST(VaeDecode, KeepsTimestampsAndFlags) {
  GstHarness* hs = harness_for("vaedecode", {{"model", taesd_model()}});
  LatentDesc d{"fp32", 4, 4, 4, "sd", 32, 32, "pad"};
  gst_harness_set_src_caps(hs, latent_caps(d));
  for (int i = 0; i < 2; ++i) {
    GstBuffer* in = latent_buffer(random_latent(4, 4, 4, i), latent::DType::kF32);
    GST_BUFFER_PTS(in) = i * 33 * GST_MSECOND;
    GST_BUFFER_DURATION(in) = 33 * GST_MSECOND;
    GST_BUFFER_OFFSET(in) = i;
    if (i == 0) GST_BUFFER_FLAG_SET(in, GST_BUFFER_FLAG_DISCONT);
    ASSERT_EQ(gst_harness_push(hs, in), GST_FLOW_OK);
  }
  for (int i = 0; i < 2; ++i) {
    GstBuffer* out = gst_harness_pull(hs);
    EXPECT_EQ(GST_BUFFER_PTS(out), i * 33 * GST_MSECOND);
    EXPECT_EQ(GST_BUFFER_DURATION(out), 33 * GST_MSECOND);
    EXPECT_EQ(GST_BUFFER_OFFSET(out), guint64(i));
    EXPECT_EQ(GST_BUFFER_FLAG_IS_SET(out, GST_BUFFER_FLAG_DISCONT), i == 0);
    gst_buffer_unref(out);
  }
  gst_harness_teardown(hs);
}

TEST(VaeDecode, FlushAndEos) {
  GstHarness* hs = harness_for("vaedecode", {{"model", taesd_model()}});
  LatentDesc d{"fp32", 4, 4, 4, "sd", 32, 32, "pad"};
  gst_harness_set_src_caps(hs, latent_caps(d));
  ASSERT_EQ(gst_harness_push(hs, latent_buffer(random_latent(4, 4, 4, 1), latent::DType::kF32)),
            GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(hs));
  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_flush_start()));
  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_flush_stop(TRUE)));
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_segment(&segment)));
  ASSERT_EQ(gst_harness_push(hs, latent_buffer(random_latent(4, 4, 4, 2), latent::DType::kF32)),
            GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(hs));
  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_eos()));
  bool saw_eos = false;
  while (GstEvent* e = gst_harness_try_pull_event(hs)) {
    saw_eos |= GST_EVENT_TYPE(e) == GST_EVENT_EOS;
    gst_event_unref(e);
  }
  EXPECT_TRUE(saw_eos);
  gst_harness_teardown(hs);
}

// ---- plans, CUDA graphs and output staging (no-ops on the CPU) ----------------------------

TEST(VaeDecode, CudaGraphsPropertyDefaultsOnAndChangesNothingOnTheCpu) {
  GstElement* e = gst_element_factory_make("vaedecode", nullptr);
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(bool_property(e, "cuda-graphs"));
  g_object_set(e, "cuda-graphs", FALSE, nullptr);
  EXPECT_FALSE(bool_property(e, "cuda-graphs"));
  gst_object_unref(e);

  LatentDesc d;
  const auto values = random_latent(4, 9, 13, 7);
  std::vector<uint8_t> outs[2];
  for (int on = 0; on < 2; ++on) {
    GstHarness* hs = harness_for(
        "vaedecode",
        {{"model", taesd_model()}, {"device", "cpu"}, {"cuda-graphs", on ? "true" : "false"}});
    gst_harness_set_sink_caps_str(hs, "video/x-raw, format=RGB");
    gst_harness_set_src_caps(hs, latent_caps(d));
    ASSERT_EQ(gst_harness_push(hs, latent_buffer(values, latent::DType::kF32)), GST_FLOW_OK);
    GstBuffer* out = gst_harness_pull(hs);
    ASSERT_NE(out, nullptr);
    outs[on] = buffer_bytes(out);
    gst_buffer_unref(out);
    gst_harness_teardown(hs);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_LE(max_diff(outs[1], engine_rgb(taesd_model(), values, 4, 9, 13, 100, 70)), 1);
}

// prefetch-depth stages decoded frames only on a GPU: on the CPU every frame comes out at once,
// with the same bytes and timestamps, and LATENCY adds no held frames.
TEST(VaeDecode, PrefetchDepthIsANoOpOnTheCpu) {
  LatentDesc d{"fp32", 4, 4, 4, "sd", 32, 32, "pad"};
  std::vector<std::vector<uint8_t>> outs[2];
  for (int k = 0; k < 2; ++k) {
    GstHarness* hs = harness_for(
        "vaedecode",
        {{"model", taesd_model()}, {"device", "cpu"}, {"prefetch-depth", k ? "4" : "0"}});
    gst_harness_set_src_caps(hs, latent_caps(d));
    for (int i = 0; i < 3; ++i) {
      GstBuffer* in = latent_buffer(random_latent(4, 4, 4, 30 + i), latent::DType::kF32);
      GST_BUFFER_PTS(in) = i * 40 * GST_MSECOND;
      GST_BUFFER_DURATION(in) = 40 * GST_MSECOND;
      ASSERT_EQ(gst_harness_push(hs, in), GST_FLOW_OK);
      // Out at once: nothing is held back on the CPU.
      EXPECT_EQ(gst_harness_buffers_received(hs), guint(i + 1));
    }
    for (int i = 0; i < 3; ++i) {
      GstBuffer* out = gst_harness_pull(hs);
      ASSERT_NE(out, nullptr);
      EXPECT_EQ(GST_BUFFER_PTS(out), i * 40 * GST_MSECOND);
      outs[k].push_back(buffer_bytes(out));
      gst_buffer_unref(out);
    }
    GstClockTime min = 0, max = 0;
    gboolean live = FALSE;
    GstQuery* q = gst_query_new_latency();
    if (gst_pad_peer_query(hs->srcpad, q)) {
      gst_query_parse_latency(q, &live, &min, &max);
      EXPECT_LT(min, 40 * GST_MSECOND * 4) << "no prefetch frames on the CPU";
    }
    gst_query_unref(q);
    ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_eos()));
    EXPECT_EQ(gst_harness_buffers_received(hs), 3u);
    gst_harness_teardown(hs);
  }
  EXPECT_EQ(outs[0], outs[1]);
}

// New latent caps mid-stream: the plan is rebuilt for the new size and frames stay correct.
TEST(VaeDecode, RenegotiationRebuildsThePlanAndStaysCorrect) {
  GstHarness* hs = harness_for("vaedecode", {{"model", taesd_model()}, {"device", "cpu"}});
  const LatentDesc sizes[] = {LatentDesc{"fp32", 4, 4, 4, "sd", 32, 32, "pad"},
                              LatentDesc{"fp32", 4, 13, 9, "sd", 100, 70, "pad"},
                              LatentDesc{"fp32", 4, 4, 4, "sd", 32, 32, "pad"}};
  int seed = 50;
  for (const LatentDesc& d : sizes) {
    SCOPED_TRACE(d.frame_width);
    gst_harness_set_src_caps(hs, latent_caps(d));
    const auto values = random_latent(4, d.height, d.width, seed++);
    ASSERT_EQ(gst_harness_push(hs, latent_buffer(values, latent::DType::kF32)), GST_FLOW_OK);
    GstBuffer* out = gst_harness_pull(hs);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(gst_buffer_get_size(out), size_t(d.frame_width) * d.frame_height * 3);
    EXPECT_LE(max_diff(buffer_bytes(out), engine_rgb(taesd_model(), values, 4, d.height, d.width,
                                                     d.frame_width, d.frame_height)),
              1);
    gst_buffer_unref(out);
  }
  gst_harness_teardown(hs);
}

// ---- refusals and bad input ---------------------------------------------------------------

// Pushes `caps` (+ segment) and buffers of `bytes`; expects not-negotiated. Returns the error
// posted on the element's bus ("" if none), which is posted once however often upstream retries.
std::string push_refused_caps(GstCaps* caps, size_t bytes) {
  GstHarness* hs = harness_for("vaedecode", {{"model", taesd_model()}});
  BusWatch bw(hs->element);
  gst_harness_push_event(hs, gst_event_new_caps(gst_caps_ref(caps)));
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  gst_harness_push_event(hs, gst_event_new_segment(&segment));
  GstBuffer* b = gst_buffer_new_allocate(nullptr, bytes, nullptr);
  gst_buffer_memset(b, 0, 0, bytes);
  EXPECT_EQ(gst_harness_push(hs, b), GST_FLOW_NOT_NEGOTIATED);
  // A caps event that failed is sent again with the next buffer.
  gst_harness_push_event(hs, gst_event_new_caps(caps));
  GstBuffer* again = gst_buffer_new_allocate(nullptr, bytes, nullptr);
  gst_buffer_memset(again, 0, 0, bytes);
  EXPECT_EQ(gst_harness_push(hs, again), GST_FLOW_NOT_NEGOTIATED);
  EXPECT_EQ(gst_harness_buffers_in_queue(hs), 0u);
  std::string err = bw.pop_error();
  if (!err.empty()) {
    EXPECT_EQ(bw.last_domain(), GST_CORE_ERROR) << err;
    EXPECT_EQ(bw.last_code(), GST_CORE_ERROR_NEGOTIATION) << err;
  }
  EXPECT_EQ(bw.pop_error(), "") << "the refusal was posted more than once";
  gst_harness_teardown(hs);
  return err;
}

TEST(VaeDecode, RefusesAnotherLatentSpaceNamingBoth) {
  LatentDesc d;
  d.space = "flux1";
  const std::string err = push_refused_caps(latent_caps(d), 4 * 13 * 9 * 4);
  EXPECT_TRUE(
      contains(err, "vaedecode: latent space 'flux1' from upstream does not match model 'sd'"))
      << err;
  EXPECT_TRUE(contains(err, taesd_model())) << err;
}

TEST(VaeDecode, RefusesAnotherChannelCount) {
  LatentDesc d;
  d.channels = 16;
  const std::string err = push_refused_caps(latent_caps(d), 16 * 13 * 9 * 4);
  EXPECT_TRUE(contains(err, "16-channel")) << err;
  EXPECT_TRUE(contains(err, "'sd'")) << err;
}

TEST(VaeDecode, RefusesALatentThatDoesNotFitTheFrame) {
  LatentDesc d;
  d.frame_width = 200;
  d.frame_height = 200;  // 13x9 cannot be a 200x200 frame under pad
  const std::string err = push_refused_caps(latent_caps(d), 4 * 13 * 9 * 4);
  EXPECT_TRUE(contains(err, "13x9")) << err;
  EXPECT_TRUE(contains(err, "200x200")) << err;
  EXPECT_TRUE(contains(err, "25x25")) << err;  // what it should have been
}

TEST(VaeDecode, RefusesAbsurdCaps) {
  const char* bad[] = {
      "application/x-latent, format=fp32, channels=4, width=0, height=9, latent-space=sd, "
      "frame-width=100, frame-height=70, size-policy=pad",
      "application/x-latent, format=fp32, channels=4, width=100000, height=100000, "
      "latent-space=sd, frame-width=100000, frame-height=100000, size-policy=pad",
      "application/x-latent, format=fp32, channels=0, width=13, height=9, latent-space=sd, "
      "frame-width=100, frame-height=70, size-policy=pad",
      "application/x-latent, format=int8, channels=4, width=13, height=9, latent-space=sd, "
      "frame-width=100, frame-height=70, size-policy=pad",
      "application/x-latent, format=fp32, channels=4, width=13, height=9, latent-space=sd, "
      "frame-width=100, frame-height=70, size-policy=stretch",
      "application/x-latent, format=fp32, channels=4, width=13, height=9, latent-space=sd, "
      "frame-width=0, frame-height=70, size-policy=pad",
      "video/x-raw, format=RGB, width=64, height=64, framerate=30/1",
  };
  for (const char* c : bad) {
    SCOPED_TRACE(c);
    push_refused_caps(gst_caps_from_string(c), 4 * 13 * 9 * 4);
  }
}

// Caps the template allows but that lack a field the element needs: refused, naming it.
TEST(VaeDecode, RefusesIncompleteCaps) {
  const std::string err = push_refused_caps(
      gst_caps_from_string("application/x-latent, format=fp32, channels=4, width=13, height=9, "
                           "frame-width=100, frame-height=70, size-policy=pad"),
      4 * 13 * 9 * 4);
  EXPECT_TRUE(contains(err, "latent-space")) << err;
}

TEST(VaeDecode, WrongBufferSizeIsAStreamError) {
  GstHarness* hs = harness_for("vaedecode", {{"model", taesd_model()}});
  BusWatch bw(hs->element);
  gst_harness_set_src_caps(hs, latent_caps(LatentDesc{}));
  const size_t want = 4 * 13 * 9 * 4;
  for (size_t bytes : {want - 4, want + 4}) {
    GstBuffer* b = gst_buffer_new_allocate(nullptr, bytes, nullptr);
    gst_buffer_memset(b, 0, 0, bytes);
    EXPECT_EQ(gst_harness_push(hs, b), GST_FLOW_ERROR);
    const std::string err = bw.pop_error();
    EXPECT_EQ(bw.last_domain(), GST_STREAM_ERROR) << err;
    EXPECT_TRUE(contains(err, std::to_string(bytes) + " bytes, expected " + std::to_string(want)))
        << err;
  }
  gst_harness_teardown(hs);
}

TEST(VaeDecode, NonexistentModelIsAnErrorNamingThePath) {
  const std::string path = latent::test::temp_dir() + "/missing_decoder";
  GstElement* e = gst_element_factory_make("vaedecode", nullptr);
  g_object_set(e, "model", path.c_str(), nullptr);
  {
    BusWatch bw(e);
    EXPECT_EQ(gst_element_set_state(e, GST_STATE_PLAYING), GST_STATE_CHANGE_FAILURE);
    const std::string err = bw.pop_error();
    EXPECT_EQ(bw.last_domain(), GST_RESOURCE_ERROR) << err;
    EXPECT_TRUE(contains(err, "vaedecode")) << err;
    EXPECT_TRUE(contains(err, path)) << err;
  }
  EXPECT_EQ(gst_element_set_state(e, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  gst_object_unref(e);
}

}  // namespace
