// Shared helpers of the element tests (GstHarness + GoogleTest). The plugin is found through
// GST_PLUGIN_PATH_1_0 (set by ctest); models come from tests/fixtures ($LATENT_FIXTURES).
#pragma once

#include <gst/app/gstappsink.h>
#include <gst/check/gstharness.h>
#include <gst/gst.h>
#include <gst/video/video.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/util/test_util.h"

namespace gsttest {

// gst_init before any test; with `leaks_tracer`, also turns the leaks tracer on (it must be
// chosen before gst_init) unless GST_TRACERS is already set.
class GstEnvironment : public ::testing::Environment {
 public:
  explicit GstEnvironment(bool leaks_tracer = false) : leaks_tracer_(leaks_tracer) {}
  void SetUp() override {
    if (leaks_tracer_) g_setenv("GST_TRACERS", "leaks", FALSE);
    gst_init(nullptr, nullptr);
    GstElementFactory* factory = gst_element_factory_find("vaeencode");
    ASSERT_NE(factory, nullptr)
        << "the latent plugin was not found; set GST_PLUGIN_PATH_1_0 to the build's plugin/";
    gst_object_unref(factory);
  }

 private:
  bool leaks_tracer_;
};

// A fixture model folder (tests/fixtures/<name>); a test failure when it is missing.
inline std::string fixture_model(const std::string& name) {
  const std::string path = latent::test::fixtures_dir() + "/" + name;
  EXPECT_TRUE(latent::test::file_exists(path + "/config.json"))
      << "fixture model " << path << " is missing (scripts/make_fixtures.py makes it)";
  return path;
}

// The two fixtures the element tests use: different latent spaces, channels and factors.
inline std::string taesd_model() { return fixture_model("tiny_taesd"); }   // sd, 4 ch, /8
inline std::string flux_model() { return fixture_model("kl_flux_tiny"); }  // flux1, 16 ch, /4

inline GstCaps* video_caps(int w, int h, const char* format = "RGB", int fps_n = 30,
                           int fps_d = 1) {
  return gst_caps_new_simple("video/x-raw", "format", G_TYPE_STRING, format, "width", G_TYPE_INT, w,
                             "height", G_TYPE_INT, h, "framerate", GST_TYPE_FRACTION, fps_n, fps_d,
                             nullptr);
}

// Deterministic frame content: smooth gradients plus a little hashed noise.
inline uint8_t pixel_value(int x, int y, int c, uint32_t seed) {
  uint32_t hsh = (static_cast<uint32_t>(x) * 73856093u) ^ (static_cast<uint32_t>(y) * 19349663u) ^
                 (static_cast<uint32_t>(c) * 83492791u) ^ (seed * 2654435761u);
  hsh ^= hsh >> 13;
  const int base = (c == 0 ? 2 * x : c == 1 ? 3 * y : x + y) + static_cast<int>(seed % 50);
  return static_cast<uint8_t>((base + static_cast<int>(hsh % 16)) & 0xff);
}

// A packed RGB-family frame buffer with default strides (GstVideoInfo's), filled by
// pixel_value() in the format's own channel order.
inline GstBuffer* make_frame(int w, int h, const char* format = "RGB", uint32_t seed = 1) {
  GstVideoInfo info;
  gst_video_info_set_format(&info, gst_video_format_from_string(format), w, h);
  GstBuffer* buf = gst_buffer_new_allocate(nullptr, GST_VIDEO_INFO_SIZE(&info), nullptr);
  GstVideoFrame frame;
  if (!gst_video_frame_map(&frame, &info, buf, GST_MAP_WRITE)) return buf;
  const GstVideoFormatInfo* fi = info.finfo;
  auto* data = static_cast<uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0));
  const int stride = GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0);
  const int pstride = GST_VIDEO_FORMAT_INFO_PSTRIDE(fi, 0);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* px = data + y * stride + x * pstride;
      if (pstride == 4) px[0] = px[1] = px[2] = px[3] = 255;
      for (int c = 0; c < 3; ++c)
        px[GST_VIDEO_FORMAT_INFO_POFFSET(fi, c)] = pixel_value(x, y, c, seed);
    }
  gst_video_frame_unmap(&frame);
  return buf;
}

// An element with string properties set (gst_util_set_object_arg), inside a harness.
inline GstHarness* harness_for(const char* factory,
                               std::vector<std::pair<const char*, std::string>> props) {
  GstElement* e = gst_element_factory_make(factory, nullptr);
  if (!e) return nullptr;
  for (auto& [name, value] : props) gst_util_set_object_arg(G_OBJECT(e), name, value.c_str());
  GstHarness* h = gst_harness_new_with_element(e, "sink", "src");
  gst_object_unref(e);
  return h;
}

// A bus on an element that has none (a harness's element): catches its error messages.
class BusWatch {
 public:
  explicit BusWatch(GstElement* e) : element_(GST_ELEMENT(gst_object_ref(e))) {
    bus_ = gst_bus_new();
    gst_element_set_bus(element_, bus_);
  }
  ~BusWatch() {
    gst_element_set_bus(element_, nullptr);
    gst_object_unref(bus_);
    gst_object_unref(element_);
  }
  // The next error's message text (with the debug detail after " | "), or "" if none arrives.
  std::string pop_error(GstClockTime timeout = 0) {
    GstMessage* m = gst_bus_timed_pop_filtered(bus_, timeout, GST_MESSAGE_ERROR);
    if (!m) return "";
    GError* err = nullptr;
    gchar* dbg = nullptr;
    gst_message_parse_error(m, &err, &dbg);
    std::string out = err ? err->message : "";
    if (err) last_domain_ = err->domain, last_code_ = err->code;
    if (dbg) out += std::string(" | ") + dbg;
    g_clear_error(&err);
    g_free(dbg);
    gst_message_unref(m);
    return out;
  }
  GQuark last_domain() const { return last_domain_; }
  int last_code() const { return last_code_; }
  GstBus* bus() const { return bus_; }

 private:
  GstElement* element_;
  GstBus* bus_;
  GQuark last_domain_ = 0;
  int last_code_ = 0;
};

// A boolean property of an object.
inline bool bool_property(gpointer object, const char* name) {
  gboolean v = FALSE;
  g_object_get(object, name, &v, nullptr);
  return v;
}

// A string property of an object ("" for NULL).
inline std::string string_property(gpointer object, const char* name) {
  gchar* v = nullptr;
  g_object_get(object, name, &v, nullptr);
  std::string out = v ? v : "";
  g_free(v);
  return out;
}

inline std::string caps_str(const GstStructure* s, const char* field) {
  const gchar* v = gst_structure_get_string(s, field);
  return v ? v : "";
}
inline int caps_int(const GstStructure* s, const char* field) {
  int v = -1;
  gst_structure_get_int(s, field, &v);
  return v;
}

// The caps currently on the harness's sink pad (what the element output), or null.
inline GstCaps* output_caps(GstHarness* h) { return gst_pad_get_current_caps(h->sinkpad); }

inline std::vector<uint8_t> buffer_bytes(GstBuffer* b) {
  std::vector<uint8_t> out(gst_buffer_get_size(b));
  gst_buffer_extract(b, 0, out.data(), out.size());
  return out;
}

// Runs a gst-launch `line` to EOS (60 s at most; an ERROR or no EOS fails the test) and returns
// the bytes of each buffer the appsink named "sink" received (none when the line has no such
// sink).
inline std::vector<std::vector<uint8_t>> run_to_eos(const std::string& line) {
  GError* error = nullptr;
  GstElement* pipeline = gst_parse_launch(line.c_str(), &error);
  EXPECT_NE(pipeline, nullptr) << (error ? error->message : "");
  if (error) g_error_free(error);
  if (!pipeline) return {};
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  std::vector<std::vector<uint8_t>> out;
  while (sink) {
    GstSample* s = gst_app_sink_pull_sample(GST_APP_SINK(sink));
    if (!s) break;
    out.push_back(buffer_bytes(gst_sample_get_buffer(s)));
    gst_sample_unref(s);
  }
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* m = gst_bus_timed_pop_filtered(
      bus, 60 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  EXPECT_TRUE(m && GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) << line;
  if (m) gst_message_unref(m);
  gst_object_unref(bus);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  if (sink) gst_object_unref(sink);
  gst_object_unref(pipeline);
  return out;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace gsttest
