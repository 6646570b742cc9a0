// vaeencode: caps, values against the engine, formats, strides, timestamps, flush/EOS,
// renegotiation and every bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "engine/core/dtype.h"
#include "engine/models/vae/vae.h"
#include "tests/elements/gst_test_util.h"

namespace {

using namespace gsttest;

::testing::Environment* const kEnv = ::testing::AddGlobalTestEnvironment(new GstEnvironment());

// The engine's own encoding of make_frame(w, h, *, seed) under the pad policy, computed here
// from pixel_value() without the element's pixel code: [C * h * w] normalised fp32.
std::vector<float> engine_latent(const std::string& model_path, int w, int h, uint32_t seed) {
  auto backend = latent::get_backend({"cpu", ""});
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return {};
  latent::VaeLoadOptions lo;
  lo.decoder = false;
  auto vae = latent::load_vae(model_path, *backend, lo);
  EXPECT_TRUE(vae.ok()) << vae.status().message();
  if (!vae.ok()) return {};
  const int f = (*vae)->downsample();
  const int mw = (w + f - 1) / f * f, mh = (h + f - 1) / f * f;
  latent::Tensor sample = latent::Tensor::empty({1, 3, mh, mw}, latent::DType::kF32);
  float* p = sample.data_as<float>();
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < mh; ++y)
      for (int x = 0; x < mw; ++x)  // pad = replicate the right and bottom edges
        *p++ = pixel_value(std::min(x, w - 1), std::min(y, h - 1), c, seed) / 127.5f - 1.f;
  auto& b = **backend;
  auto x = b.upload(sample);
  EXPECT_TRUE(x.ok());
  auto raw = (*vae)->encode(*x);
  EXPECT_TRUE(raw.ok()) << raw.status().message();
  if (!raw.ok()) return {};
  auto norm = (*vae)->latent_space().normalize(b, *raw);
  EXPECT_TRUE(norm.ok());
  auto host = b.download(*norm);
  EXPECT_TRUE(host.ok());
  return host->to_floats();
}

std::vector<float> buffer_floats(GstBuffer* b, latent::DType dtype) {
  std::vector<uint8_t> bytes = buffer_bytes(b);
  const size_t n = bytes.size() / latent::dtype_size(dtype);
  std::vector<float> out(n);
  latent::convert_elements(bytes.data(), dtype, out.data(), latent::DType::kF32, n);
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Encodes one w x h frame; returns the output buffer (caps in *caps if given).
GstBuffer* encode_one(const std::string& model, int w, int h, const char* policy = "pad",
                      const char* format = "RGB", GstCaps** caps = nullptr, uint32_t seed = 1,
                      const char* sink_caps = nullptr) {
  GstHarness* hs = harness_for("vaeencode", {{"model", model}, {"size-policy", policy}});
  if (sink_caps) gst_harness_set_sink_caps_str(hs, sink_caps);
  gst_harness_set_src_caps(hs, video_caps(w, h, format));
  GstBuffer* out = nullptr;
  if (gst_harness_push(hs, make_frame(w, h, format, seed)) == GST_FLOW_OK)
    out = gst_harness_pull(hs);
  if (caps) *caps = output_caps(hs);
  gst_harness_teardown(hs);
  return out;
}

TEST(VaeEncode, OutputCapsDescribeTheModelsLatent) {
  GstCaps* caps = nullptr;
  GstBuffer* out = encode_one(taesd_model(), 100, 70, "pad", "RGB", &caps);
  ASSERT_NE(out, nullptr);
  ASSERT_NE(caps, nullptr);
  const GstStructure* s = gst_caps_get_structure(caps, 0);
  EXPECT_TRUE(gst_structure_has_name(s, "application/x-latent"));
  EXPECT_EQ(caps_str(s, "latent-space"), "sd");
  EXPECT_EQ(caps_str(s, "format"), "fp32");
  EXPECT_EQ(caps_str(s, "size-policy"), "pad");
  EXPECT_EQ(caps_int(s, "channels"), 4);
  EXPECT_EQ(caps_int(s, "width"), 13);  // ceil(100 / 8)
  EXPECT_EQ(caps_int(s, "height"), 9);  // ceil(70 / 8)
  EXPECT_EQ(caps_int(s, "frame-width"), 100);
  EXPECT_EQ(caps_int(s, "frame-height"), 70);
  int n = 0, d = 0;
  ASSERT_TRUE(gst_structure_get_fraction(s, "framerate", &n, &d));
  EXPECT_EQ(n, 30);
  EXPECT_EQ(d, 1);
  EXPECT_EQ(gst_buffer_get_size(out), size_t{4 * 13 * 9 * 4});
  gst_buffer_unref(out);
  gst_caps_unref(caps);

  // Another model: another space, channel count and factor (FLUX.1-style, /4 here).
  out = encode_one(flux_model(), 100, 70, "pad", "RGB", &caps);
  ASSERT_NE(out, nullptr);
  s = gst_caps_get_structure(caps, 0);
  EXPECT_EQ(caps_str(s, "latent-space"), "flux1");
  EXPECT_EQ(caps_int(s, "channels"), 16);
  EXPECT_EQ(caps_int(s, "width"), 25);
  EXPECT_EQ(caps_int(s, "height"), 18);
  EXPECT_EQ(gst_buffer_get_size(out), size_t{16 * 25 * 18 * 4});
  gst_buffer_unref(out);
  gst_caps_unref(caps);
}

TEST(VaeEncode, SizePolicyDecidesTheLatentSize) {
  struct Case {
    const char* policy;
    int w, h, lw, lh;
  } cases[] = {{"pad", 100, 70, 13, 9},
               {"crop", 100, 70, 12, 8},
               {"scale", 100, 70, 13, 9},
               {"scale", 99, 67, 12, 8},
               {"crop", 64, 48, 8, 6}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.policy) + " " + std::to_string(c.w) + "x" + std::to_string(c.h));
    GstCaps* caps = nullptr;
    GstBuffer* out = encode_one(taesd_model(), c.w, c.h, c.policy, "RGB", &caps);
    ASSERT_NE(out, nullptr);
    const GstStructure* s = gst_caps_get_structure(caps, 0);
    EXPECT_EQ(caps_str(s, "size-policy"), c.policy);
    EXPECT_EQ(caps_int(s, "width"), c.lw);
    EXPECT_EQ(caps_int(s, "height"), c.lh);
    EXPECT_EQ(caps_int(s, "frame-width"), c.w);
    EXPECT_EQ(caps_int(s, "frame-height"), c.h);
    EXPECT_EQ(gst_buffer_get_size(out), size_t(4 * c.lw * c.lh * 4));
    gst_buffer_unref(out);
    gst_caps_unref(caps);
  }
}

TEST(VaeEncode, LatentIsTheEnginesNormalisedEncoding) {
  for (const std::string& model : {taesd_model(), flux_model()}) {
    SCOPED_TRACE(model);
    GstBuffer* out = encode_one(model, 100, 70, "pad", "RGB", nullptr, /*seed=*/5);
    ASSERT_NE(out, nullptr);
    const std::vector<float> want = engine_latent(model, 100, 70, 5);
    const std::vector<float> got = buffer_floats(out, latent::DType::kF32);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(rel_l2(got, want), 1e-6);
    gst_buffer_unref(out);
  }
}

TEST(VaeEncode, HalfPrecisionOutputsWhenDownstreamAsks) {
  const std::vector<float> want = engine_latent(taesd_model(), 64, 48, 3);
  for (auto [name, dtype] :
       {std::pair{"bf16", latent::DType::kBF16}, std::pair{"fp16", latent::DType::kF16}}) {
    SCOPED_TRACE(name);
    GstCaps* caps = nullptr;
    const std::string sink = std::string("application/x-latent, format=") + name;
    GstBuffer* out = encode_one(taesd_model(), 64, 48, "pad", "RGB", &caps, 3, sink.c_str());
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(caps_str(gst_caps_get_structure(caps, 0), "format"), name);
    EXPECT_EQ(gst_buffer_get_size(out), want.size() * 2);
    EXPECT_LT(rel_l2(buffer_floats(out, dtype), want), 5e-3);
    gst_buffer_unref(out);
    gst_caps_unref(caps);
  }
}

TEST(VaeEncode, EveryPixelFormatGivesTheSameLatent) {
  GstBuffer* ref = encode_one(taesd_model(), 40, 24, "pad", "RGB");
  ASSERT_NE(ref, nullptr);
  const std::vector<uint8_t> want = buffer_bytes(ref);
  gst_buffer_unref(ref);
  for (const char* format :
       {"BGR", "RGBA", "BGRA", "RGBx", "BGRx", "xRGB", "xBGR", "ARGB", "ABGR"}) {
    SCOPED_TRACE(format);
    GstBuffer* out = encode_one(taesd_model(), 40, 24, "pad", format);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(buffer_bytes(out), want);
    gst_buffer_unref(out);
  }
}

// A frame with a padded row stride described by GstVideoMeta encodes like the packed frame.
TEST(VaeEncode, ReadsStridedFramesThroughVideoMeta) {
  const int w = 40, h = 24, stride = w * 3 + 20;
  GstBuffer* packed = make_frame(w, h, "RGB", 9);
  GstBuffer* strided = gst_buffer_new_allocate(nullptr, size_t(stride) * h, nullptr);
  {
    GstMapInfo src, dst;
    gst_buffer_map(packed, &src, GST_MAP_READ);
    gst_buffer_map(strided, &dst, GST_MAP_WRITE);
    memset(dst.data, 0x5A, dst.size);
    for (int y = 0; y < h; ++y) memcpy(dst.data + y * stride, src.data + y * w * 3, w * 3);
    gst_buffer_unmap(strided, &dst);
    gst_buffer_unmap(packed, &src);
  }
  gsize offsets[GST_VIDEO_MAX_PLANES] = {0};
  gint strides[GST_VIDEO_MAX_PLANES] = {stride};
  gst_buffer_add_video_meta_full(strided, GST_VIDEO_FRAME_FLAG_NONE, GST_VIDEO_FORMAT_RGB, w, h, 1,
                                 offsets, strides);

  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  gst_harness_set_src_caps(hs, video_caps(w, h, "RGB"));
  ASSERT_EQ(gst_harness_push(hs, packed), GST_FLOW_OK);
  ASSERT_EQ(gst_harness_push(hs, strided), GST_FLOW_OK);
  GstBuffer* a = gst_harness_pull(hs);
  GstBuffer* b = gst_harness_pull(hs);
  EXPECT_EQ(buffer_bytes(a), buffer_bytes(b));
  gst_buffer_unref(a);
  gst_buffer_unref(b);
  gst_harness_teardown(hs);
}

// Page-locked frames are offered upstream only on a GPU (the default there; the GPU side is
// test_gst_cuda's UpstreamDrawsIntoPageLockedFramesThatUploadInPlace): on the CPU the
// ALLOCATION answer holds no pool and no allocator, only the video meta (strided frames).
TEST(VaeEncode, OffersNoPageLockedFramesOnTheCpu) {
  g_setenv("LATENT_PINNED_INPUT", "1", TRUE);  // the switch on, as by default
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}, {"device", "cpu"}});
  GstCaps* caps = video_caps(64, 64, "RGBA");
  gst_harness_set_src_caps(hs, gst_caps_ref(caps));
  GstQuery* q = gst_query_new_allocation(caps, TRUE);
  ASSERT_TRUE(gst_pad_peer_query(hs->srcpad, q));
  EXPECT_EQ(gst_query_get_n_allocation_pools(q), 0u);
  EXPECT_EQ(gst_query_get_n_allocation_params(q), 0u);
  EXPECT_TRUE(gst_query_find_allocation_meta(q, GST_VIDEO_META_API_TYPE, nullptr));
  gst_query_unref(q);
  gst_caps_unref(caps);
  gst_harness_teardown(hs);
  g_unsetenv("LATENT_PINNED_INPUT");
}

TEST(VaeEncode, KeepsTimestampsDurationsOffsetsAndFlags) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  gst_harness_set_src_caps(hs, video_caps(32, 24, "RGBx", 25, 1));
  const GstBufferFlags flags[3] = {
      GST_BUFFER_FLAG_DISCONT,
      static_cast<GstBufferFlags>(GST_BUFFER_FLAG_DELTA_UNIT | GST_BUFFER_FLAG_MARKER),
      GST_BUFFER_FLAG_DROPPABLE,
  };
  for (int i = 0; i < 3; ++i) {
    GstBuffer* in = make_frame(32, 24, "RGBx", i);
    GST_BUFFER_PTS(in) = 1000 * GST_MSECOND + i * 40 * GST_MSECOND;
    GST_BUFFER_DTS(in) = 990 * GST_MSECOND + i * 40 * GST_MSECOND;
    GST_BUFFER_DURATION(in) = 40 * GST_MSECOND;
    GST_BUFFER_OFFSET(in) = 10 + i;
    GST_BUFFER_OFFSET_END(in) = 11 + i;
    GST_BUFFER_FLAG_SET(in, flags[i]);
    ASSERT_EQ(gst_harness_push(hs, in), GST_FLOW_OK);
  }
  for (int i = 0; i < 3; ++i) {
    GstBuffer* out = gst_harness_pull(hs);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(GST_BUFFER_PTS(out), 1000 * GST_MSECOND + i * 40 * GST_MSECOND);
    EXPECT_EQ(GST_BUFFER_DTS(out), 990 * GST_MSECOND + i * 40 * GST_MSECOND);
    EXPECT_EQ(GST_BUFFER_DURATION(out), 40 * GST_MSECOND);
    EXPECT_EQ(GST_BUFFER_OFFSET(out), guint64(10 + i));
    EXPECT_EQ(GST_BUFFER_OFFSET_END(out), guint64(11 + i));
    EXPECT_TRUE(GST_BUFFER_FLAG_IS_SET(out, flags[i])) << i;
    gst_buffer_unref(out);
  }
  gst_harness_teardown(hs);
}

TEST(VaeEncode, RenegotiatesWhenTheInputSizeChanges) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  gst_harness_set_src_caps(hs, video_caps(100, 70));
  ASSERT_EQ(gst_harness_push(hs, make_frame(100, 70)), GST_FLOW_OK);
  GstBuffer* a = gst_harness_pull(hs);
  EXPECT_EQ(gst_buffer_get_size(a), size_t{4 * 13 * 9 * 4});
  gst_buffer_unref(a);

  gst_harness_set_src_caps(hs, video_caps(64, 48, "BGRA"));
  ASSERT_EQ(gst_harness_push(hs, make_frame(64, 48, "BGRA")), GST_FLOW_OK);
  GstBuffer* b = gst_harness_pull(hs);
  EXPECT_EQ(gst_buffer_get_size(b), size_t{4 * 8 * 6 * 4});
  gst_buffer_unref(b);
  GstCaps* caps = output_caps(hs);
  const GstStructure* s = gst_caps_get_structure(caps, 0);
  EXPECT_EQ(caps_int(s, "width"), 8);
  EXPECT_EQ(caps_int(s, "height"), 6);
  EXPECT_EQ(caps_int(s, "frame-width"), 64);
  EXPECT_EQ(caps_int(s, "frame-height"), 48);
  gst_caps_unref(caps);
  gst_harness_teardown(hs);
}

// Sizes A, B, A again: the plan follows each negotiation and every latent is the engine's.
TEST(VaeEncode, RenegotiationRebuildsThePlanAndStaysCorrect) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}, {"device", "cpu"}});
  const int sizes[][2] = {{100, 70}, {64, 48}, {100, 70}};
  uint32_t seed = 11;
  for (const auto& sz : sizes) {
    SCOPED_TRACE(sz[0]);
    gst_harness_set_src_caps(hs, video_caps(sz[0], sz[1]));
    ASSERT_EQ(gst_harness_push(hs, make_frame(sz[0], sz[1], "RGB", seed)), GST_FLOW_OK);
    GstBuffer* out = gst_harness_pull(hs);
    ASSERT_NE(out, nullptr);
    const auto want = engine_latent(taesd_model(), sz[0], sz[1], seed);
    const auto got = buffer_floats(out, latent::DType::kF32);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(rel_l2(got, want), 1e-5);
    gst_buffer_unref(out);
    ++seed;
  }
  gst_harness_teardown(hs);
}

TEST(VaeEncode, CudaGraphsPropertyDefaultsOnAndChangesNothingOnTheCpu) {
  GstElement* e = gst_element_factory_make("vaeencode", nullptr);
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(bool_property(e, "cuda-graphs"));
  gst_object_unref(e);
  std::vector<float> outs[2];
  for (int on = 0; on < 2; ++on) {
    GstHarness* hs = harness_for(
        "vaeencode",
        {{"model", taesd_model()}, {"device", "cpu"}, {"cuda-graphs", on ? "true" : "false"}});
    gst_harness_set_src_caps(hs, video_caps(100, 70));
    ASSERT_EQ(gst_harness_push(hs, make_frame(100, 70, "RGB", 3)), GST_FLOW_OK);
    GstBuffer* out = gst_harness_pull(hs);
    ASSERT_NE(out, nullptr);
    outs[on] = buffer_floats(out, latent::DType::kF32);
    gst_buffer_unref(out);
    gst_harness_teardown(hs);
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST(VaeEncode, SizePolicyChangeMidStreamRenegotiates) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  gst_harness_set_src_caps(hs, video_caps(100, 70));
  ASSERT_EQ(gst_harness_push(hs, make_frame(100, 70)), GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(hs));
  gst_util_set_object_arg(G_OBJECT(hs->element), "size-policy", "crop");
  ASSERT_EQ(gst_harness_push(hs, make_frame(100, 70)), GST_FLOW_OK);
  GstBuffer* out = gst_harness_pull(hs);
  EXPECT_EQ(gst_buffer_get_size(out), size_t{4 * 12 * 8 * 4});
  gst_buffer_unref(out);
  GstCaps* caps = output_caps(hs);
  EXPECT_EQ(caps_str(gst_caps_get_structure(caps, 0), "size-policy"), "crop");
  gst_caps_unref(caps);
  gst_harness_teardown(hs);
}

TEST(VaeEncode, FlushAndEos) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  gst_harness_set_src_caps(hs, video_caps(32, 32));
  ASSERT_EQ(gst_harness_push(hs, make_frame(32, 32)), GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(hs));

  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_flush_start()));
  EXPECT_EQ(gst_harness_push(hs, make_frame(32, 32)), GST_FLOW_FLUSHING);
  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_flush_stop(TRUE)));
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_segment(&segment)));
  // Streaming resumes with the caps negotiated before the flush.
  ASSERT_EQ(gst_harness_push(hs, make_frame(32, 32)), GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(hs));
  EXPECT_EQ(gst_harness_buffers_in_queue(hs), 0u);

  ASSERT_TRUE(gst_harness_push_event(hs, gst_event_new_eos()));
  bool saw_flush_start = false, saw_flush_stop = false, saw_eos = false;
  while (GstEvent* e = gst_harness_try_pull_event(hs)) {
    saw_flush_start |= GST_EVENT_TYPE(e) == GST_EVENT_FLUSH_START;
    saw_flush_stop |= GST_EVENT_TYPE(e) == GST_EVENT_FLUSH_STOP;
    saw_eos |= GST_EVENT_TYPE(e) == GST_EVENT_EOS;
    gst_event_unref(e);
  }
  EXPECT_TRUE(saw_flush_start);
  EXPECT_TRUE(saw_flush_stop);
  EXPECT_TRUE(saw_eos);
  EXPECT_EQ(gst_harness_push(hs, make_frame(32, 32)), GST_FLOW_EOS);
  gst_harness_teardown(hs);
}

// ---- bad input ----------------------------------------------------------------------------

// Starts a vaeencode with `props`; expects the state change to fail with an error whose text
// contains every `needles` entry. Returns the error text.
std::string expect_start_failure(std::vector<std::pair<const char*, std::string>> props,
                                 std::vector<std::string> needles) {
  GstElement* e = gst_element_factory_make("vaeencode", nullptr);
  for (auto& [k, v] : props) gst_util_set_object_arg(G_OBJECT(e), k, v.c_str());
  std::string err;
  {
    BusWatch bw(e);
    EXPECT_EQ(gst_element_set_state(e, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
    err = bw.pop_error();
    EXPECT_EQ(bw.last_domain(), GST_RESOURCE_ERROR) << err;
  }
  for (const auto& n : needles) EXPECT_TRUE(contains(err, n)) << "'" << n << "' not in: " << err;
  EXPECT_EQ(gst_element_set_state(e, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  gst_object_unref(e);
  return err;
}

TEST(VaeEncode, NonexistentModelIsAnErrorNamingThePath) {
  const std::string path = latent::test::temp_dir() + "/no/such/model";
  expect_start_failure({{"model", path}}, {"vaeencode", path});
}

TEST(VaeEncode, CorruptModelFilesAreErrorsNamingThePath) {
  // Not a safetensors file at all.
  const std::string garbage = latent::test::temp_dir() + "/garbage.safetensors";
  std::ofstream(garbage) << "this is not a safetensors checkpoint";
  expect_start_failure({{"model", garbage}}, {garbage});

  // A diffusers folder whose weights are cut short.
  const std::string folder = latent::test::temp_dir() + "/truncated_vae";
  ASSERT_EQ(g_mkdir_with_parents(folder.c_str(), 0755), 0);
  {
    std::ifstream cfg(taesd_model() + "/config.json", std::ios::binary);
    std::ofstream(folder + "/config.json", std::ios::binary) << cfg.rdbuf();
    std::ifstream w(taesd_model() + "/diffusion_pytorch_model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(w)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 1000u);
    std::ofstream(folder + "/diffusion_pytorch_model.safetensors", std::ios::binary)
        << bytes.substr(0, bytes.size() / 2);
  }
  expect_start_failure({{"model", folder}}, {folder});
}

TEST(VaeEncode, UnusableDeviceOrDtypeIsAnError) {
  if (latent::cuda_device_count() == 0)
    expect_start_failure({{"model", taesd_model()}, {"device", "cuda:3"}}, {"cuda"});
}

// Caps the element cannot take: refused by accept-caps, and a buffer after them is not
// negotiated; nothing crashes and sane caps work afterwards.
TEST(VaeEncode, AbsurdCapsAreRefused) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  const char* bad[] = {
      "video/x-raw, format=RGB, width=0, height=70, framerate=30/1",
      "video/x-raw, format=RGB, width=100000, height=100000, framerate=30/1",
      "video/x-raw, format=YUY2, width=64, height=64, framerate=30/1",
      "application/x-latent, format=fp32, channels=4, width=8, height=8",
  };
  GstSegment segment;
  gst_segment_init(&segment, GST_FORMAT_TIME);
  for (const char* c : bad) {
    SCOPED_TRACE(c);
    GstCaps* caps = gst_caps_from_string(c);
    EXPECT_FALSE(gst_pad_peer_query_accept_caps(hs->srcpad, caps));
    gst_harness_push_event(hs, gst_event_new_caps(caps));
    gst_harness_push_event(hs, gst_event_new_segment(&segment));
    EXPECT_EQ(gst_harness_push(hs, make_frame(64, 64)), GST_FLOW_NOT_NEGOTIATED);
  }
  gst_harness_set_src_caps(hs, video_caps(64, 64));
  EXPECT_EQ(gst_harness_push(hs, make_frame(64, 64)), GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(hs));
  gst_harness_teardown(hs);
}

// A frame of exactly one block still leaves one latent block under crop (smaller ones: see
// test_pipeline's TinyAndOddFramesRoundTrip and CropOfAFrameSmallerThanABlockIsRefusedByName).
TEST(VaeEncode, CropKeepsOneBlockForTheSmallestFrames) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}, {"size-policy", "crop"}});
  gst_harness_set_src_caps(hs, video_caps(8, 15));
  ASSERT_EQ(gst_harness_push(hs, make_frame(8, 15)), GST_FLOW_OK);
  GstBuffer* out = gst_harness_pull(hs);
  EXPECT_EQ(gst_buffer_get_size(out), size_t{4 * 1 * 1 * 4});
  gst_buffer_unref(out);
  gst_harness_teardown(hs);
}

TEST(VaeEncode, WrongBufferSizeIsAStreamError) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  BusWatch bw(hs->element);
  gst_harness_set_src_caps(hs, video_caps(64, 48, "RGBA"));
  GstBuffer* small = gst_buffer_new_allocate(nullptr, 64 * 48 * 4 - 1, nullptr);
  gst_buffer_memset(small, 0, 0, gst_buffer_get_size(small));
  EXPECT_EQ(gst_harness_push(hs, small), GST_FLOW_ERROR);
  const std::string err = bw.pop_error();
  EXPECT_EQ(bw.last_domain(), GST_STREAM_ERROR) << err;
  EXPECT_TRUE(contains(err, "vaeencode")) << err;
  EXPECT_TRUE(contains(err, std::to_string(64 * 48 * 4 - 1))) << err;
  EXPECT_TRUE(contains(err, "64x48")) << err;
  EXPECT_EQ(gst_harness_buffers_in_queue(hs), 0u);
  gst_harness_teardown(hs);
}

}  // namespace
// A YUV frame (I420 or NV12) with deterministic planes, and its RGB conversion by the engine.
GstBuffer* make_yuv_frame(int w, int h, const char* format, std::vector<uint8_t>* rgb) {
  GstVideoInfo info;
  gst_video_info_set_format(&info, gst_video_format_from_string(format), w, h);
  gst_video_colorimetry_from_string(&info.colorimetry, "bt601");
  GstBuffer* buf = gst_buffer_new_allocate(nullptr, GST_VIDEO_INFO_SIZE(&info), nullptr);
  GstVideoFrame frame;
  if (!gst_video_frame_map(&frame, &info, buf, GST_MAP_WRITE)) return buf;
  const bool nv12 = GST_VIDEO_INFO_FORMAT(&info) == GST_VIDEO_FORMAT_NV12;
  auto* y = static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0));
  for (int r = 0; r < h; ++r)
    for (int x = 0; x < w; ++x)
      y[r * GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0) + x] = 16 + pixel_value(x, r, 0, 3) % 220;
  for (int r = 0; r < (h + 1) / 2; ++r)
    for (int x = 0; x < (w + 1) / 2; ++x) {
      const uint8_t u = 60 + pixel_value(x, r, 1, 5) % 140, v = 60 + pixel_value(x, r, 2, 7) % 140;
      if (nv12) {
        auto* uv = static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 1)) +
                   r * GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 1);
        uv[2 * x] = u, uv[2 * x + 1] = v;
      } else {
        static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(
            &frame, 1))[r * GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 1) + x] = u;
        static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(
            &frame, 2))[r * GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 2) + x] = v;
      }
    }
  latent::FrameDesc d;
  d.format = nv12 ? latent::FrameFormat::kNV12 : latent::FrameFormat::kI420;
  d.width = w, d.height = h;
  for (guint i = 0; i < GST_VIDEO_FRAME_N_PLANES(&frame); ++i) {
    d.planes[i] = GST_VIDEO_FRAME_PLANE_DATA(&frame, i);
    d.strides[i] = GST_VIDEO_FRAME_PLANE_STRIDE(&frame, i);
  }
  rgb->assign(static_cast<size_t>(w) * h * 3, 0);
  EXPECT_TRUE(latent::yuv_to_rgb_host(d, rgb->data(), w * 3).ok());
  gst_video_frame_unmap(&frame);
  return buf;
}

// NV12 and I420 input encodes exactly like the RGB frame the engine converts it to.
TEST(VaeEncode, YuvInputEncodesLikeItsRgbConversion) {
  for (const char* format : {"I420", "NV12"}) {
    SCOPED_TRACE(format);
    const int w = 40, h = 30;
    std::vector<uint8_t> rgb;
    GstBuffer* yuv = make_yuv_frame(w, h, format, &rgb);
    GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
    GstCaps* caps = video_caps(w, h, format);
    gst_caps_set_simple(caps, "colorimetry", G_TYPE_STRING, "bt601", nullptr);
    gst_harness_set_src_caps(hs, caps);
    ASSERT_EQ(gst_harness_push(hs, yuv), GST_FLOW_OK);
    GstBuffer* from_yuv = gst_harness_pull(hs);
    gst_harness_teardown(hs);

    GstHarness* hr = harness_for("vaeencode", {{"model", taesd_model()}});
    gst_harness_set_src_caps(hr, video_caps(w, h, "RGB"));
    GstVideoInfo info;
    gst_video_info_set_format(&info, GST_VIDEO_FORMAT_RGB, w, h);
    GstBuffer* rgb_buf = gst_buffer_new_allocate(nullptr, GST_VIDEO_INFO_SIZE(&info), nullptr);
    GstVideoFrame frame;
    ASSERT_TRUE(gst_video_frame_map(&frame, &info, rgb_buf, GST_MAP_WRITE));
    for (int r = 0; r < h; ++r)
      memcpy(static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0)) +
                 r * GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0),
             rgb.data() + r * w * 3, w * 3);
    gst_video_frame_unmap(&frame);
    ASSERT_EQ(gst_harness_push(hr, rgb_buf), GST_FLOW_OK);
    GstBuffer* from_rgb = gst_harness_pull(hr);
    gst_harness_teardown(hr);
    EXPECT_EQ(buffer_bytes(from_yuv), buffer_bytes(from_rgb));
    gst_buffer_unref(from_yuv);
    gst_buffer_unref(from_rgb);
  }
}

// LATENCY: upstream's figure plus this stage's measured processing time.
TEST(VaeEncode, LatencyQueryAddsTheProcessingTime) {
  GstHarness* hs = harness_for("vaeencode", {{"model", taesd_model()}});
  gst_harness_set_upstream_latency(hs, 5 * GST_MSECOND);
  gst_harness_set_src_caps(hs, video_caps(64, 64));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(gst_harness_push(hs, make_frame(64, 64)), GST_FLOW_OK);
    gst_buffer_unref(gst_harness_pull(hs));
  }
  GstQuery* q = gst_query_new_latency();
  ASSERT_TRUE(gst_pad_peer_query(hs->sinkpad, q));
  gboolean live = FALSE;
  GstClockTime min = 0, max = 0;
  gst_query_parse_latency(q, &live, &min, &max);
  gst_query_unref(q);
  EXPECT_TRUE(live);
  // The CPU holds no frames back: upstream + the longest steady frame (> 0, well below 10 s).
  EXPECT_GT(min, 5 * GST_MSECOND);
  EXPECT_LT(min, 5 * GST_MSECOND + 10 * GST_SECOND);
  EXPECT_EQ(max, GST_CLOCK_TIME_NONE);  // the harness reports no upper bound
  gst_harness_teardown(hs);
}
