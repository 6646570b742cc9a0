// vaeencode ! vaedecode together: round trips under every size policy, whole pipelines to EOS,
// renegotiation, mismatched models, model sharing, state cycling without leaks, and the
// built-in default model.
#include <gst/app/gstappsink.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <map>
#include <mutex>

#include "engine/weights/model_source.h"
#include "tests/elements/gst_test_util.h"

namespace {

using namespace gsttest;

// The leaks tracer must be chosen before gst_init.
::testing::Environment* const kEnv =
    ::testing::AddGlobalTestEnvironment(new GstEnvironment(/*leaks_tracer=*/true));

GstHarness* round_trip_harness(const std::string& model, const char* policy) {
  const std::string line = "vaeencode model=\"" + model + "\" size-policy=" + policy +
                           " ! vaedecode model=\"" + model + "\"";
  return gst_harness_new_parse(line.c_str());
}

TEST(Pipeline, RoundTripRestoresTheFrameSizeUnderEveryPolicy) {
  for (const char* policy : {"pad", "crop", "scale"}) {
    SCOPED_TRACE(policy);
    GstHarness* hs = round_trip_harness(taesd_model(), policy);
    ASSERT_NE(hs, nullptr);
    gst_harness_set_sink_caps_str(hs, "video/x-raw, format=RGB");
    gst_harness_set_src_caps(hs, video_caps(100, 70, "BGRx"));
    for (int i = 0; i < 2; ++i) {
      GstBuffer* in = make_frame(100, 70, "BGRx", i);
      GST_BUFFER_PTS(in) = i * 40 * GST_MSECOND;
      GST_BUFFER_DURATION(in) = 40 * GST_MSECOND;
      ASSERT_EQ(gst_harness_push(hs, in), GST_FLOW_OK);
      GstBuffer* out = gst_harness_pull(hs);
      ASSERT_NE(out, nullptr);
      EXPECT_EQ(gst_buffer_get_size(out), size_t{100 * 3 * 70});
      EXPECT_EQ(GST_BUFFER_PTS(out), i * 40 * GST_MSECOND);
      EXPECT_EQ(GST_BUFFER_DURATION(out), 40 * GST_MSECOND);
      gst_buffer_unref(out);
    }
    GstCaps* caps = output_caps(hs);
    const GstStructure* s = gst_caps_get_structure(caps, 0);
    EXPECT_EQ(caps_int(s, "width"), 100);
    EXPECT_EQ(caps_int(s, "height"), 70);
    EXPECT_EQ(caps_str(s, "format"), "RGB");
    gst_caps_unref(caps);
    gst_harness_teardown(hs);
  }
}

// Frames smaller than the model's downsampling factor (8 here) and of odd sizes: padded (or
// scaled) up to one block and restored exactly, in packed RGB and in I420.
TEST(Pipeline, TinyAndOddFramesRoundTrip) {
  struct Case {
    int w, h;
    const char* format;
    const char* policy;
  } cases[] = {{1, 1, "RGB", "pad"},  {7, 5, "RGB", "pad"},   {7, 5, "I420", "pad"},
               {1, 1, "RGBx", "scale"}, {7, 5, "BGR", "scale"}, {9, 3, "I420", "scale"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.w) + "x" + std::to_string(c.h) + " " + c.format + " " +
                 c.policy);
    GstHarness* hs = round_trip_harness(taesd_model(), c.policy);
    ASSERT_NE(hs, nullptr);
    gst_harness_set_sink_caps_str(hs, "video/x-raw, format=RGB");
    gst_harness_set_src_caps(hs, video_caps(c.w, c.h, c.format));
    GstVideoInfo info;
    gst_video_info_set_format(&info, gst_video_format_from_string(c.format), c.w, c.h);
    GstBuffer* in = gst_buffer_new_allocate(nullptr, GST_VIDEO_INFO_SIZE(&info), nullptr);
    gst_buffer_memset(in, 0, 128, GST_VIDEO_INFO_SIZE(&info));
    ASSERT_EQ(gst_harness_push(hs, in), GST_FLOW_OK);
    GstBuffer* out = gst_harness_pull(hs);
    ASSERT_NE(out, nullptr);
    GstVideoInfo out_info;
    gst_video_info_set_format(&out_info, GST_VIDEO_FORMAT_RGB, c.w, c.h);
    EXPECT_EQ(gst_buffer_get_size(out), GST_VIDEO_INFO_SIZE(&out_info));
    gst_buffer_unref(out);
    GstCaps* caps = output_caps(hs);
    ASSERT_NE(caps, nullptr);
    EXPECT_EQ(caps_int(gst_caps_get_structure(caps, 0), "width"), c.w);
    EXPECT_EQ(caps_int(gst_caps_get_structure(caps, 0), "height"), c.h);
    gst_caps_unref(caps);
    gst_harness_teardown(hs);
  }
}

// Cropping needs one block per side: a smaller frame is refused with one error saying so and
// naming the way out, not a bare not-negotiated.
TEST(Pipeline, CropOfAFrameSmallerThanABlockIsRefusedByName) {
  GstHarness* hs = round_trip_harness(taesd_model(), "crop");
  ASSERT_NE(hs, nullptr);
  GstElement* enc = gst_bin_get_by_name(GST_BIN(hs->element), "vaeencode0");
  if (!enc) {
    GstIterator* it = gst_bin_iterate_elements(GST_BIN(hs->element));
    GValue v = G_VALUE_INIT;
    while (gst_iterator_next(it, &v) == GST_ITERATOR_OK) {
      GstElement* e = GST_ELEMENT(g_value_get_object(&v));
      if (g_str_has_prefix(GST_OBJECT_NAME(e), "vaeencode")) enc = GST_ELEMENT(gst_object_ref(e));
      g_value_reset(&v);
    }
    g_value_unset(&v);
    gst_iterator_free(it);
  }
  ASSERT_NE(enc, nullptr);
  BusWatch bw(enc);
  gst_harness_set_sink_caps_str(hs, "video/x-raw, format=RGB");
  gst_harness_set_src_caps(hs, video_caps(7, 5));
  for (int i = 0; i < 3; ++i) EXPECT_NE(gst_harness_push(hs, make_frame(7, 5)), GST_FLOW_OK);
  const std::string err = bw.pop_error();
  EXPECT_TRUE(contains(err, "vaeencode: ")) << err;
  EXPECT_TRUE(contains(err, "cannot crop a side of 7 pixels")) << err;
  EXPECT_TRUE(contains(err, "pad or scale")) << err;
  EXPECT_EQ(bw.pop_error(), "");
  gst_object_unref(enc);
  gst_harness_teardown(hs);
}

TEST(Pipeline, RenegotiatesThroughBothStages) {
  GstHarness* hs = round_trip_harness(flux_model(), "pad");
  gst_harness_set_src_caps(hs, video_caps(100, 70));
  ASSERT_EQ(gst_harness_push(hs, make_frame(100, 70)), GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(hs));
  for (auto [w, h] : {std::pair{37, 53}, std::pair{64, 48}}) {
    gst_harness_set_src_caps(hs, video_caps(w, h));
    ASSERT_EQ(gst_harness_push(hs, make_frame(w, h)), GST_FLOW_OK);
    GstBuffer* out = gst_harness_pull(hs);
    GstCaps* caps = output_caps(hs);
    const GstStructure* s = gst_caps_get_structure(caps, 0);
    EXPECT_EQ(caps_int(s, "width"), w);
    EXPECT_EQ(caps_int(s, "height"), h);
    GstVideoInfo info;
    ASSERT_TRUE(gst_video_info_from_caps(&info, caps));
    EXPECT_EQ(gst_buffer_get_size(out), GST_VIDEO_INFO_SIZE(&info));
    gst_caps_unref(caps);
    gst_buffer_unref(out);
  }
  gst_harness_teardown(hs);
}

// Runs `pipeline` to EOS or error; returns the error text ("" on EOS) and counts the buffers
// an appsink named "sink" (if any) received.
std::string run_to_end(GstElement* pipeline, int* buffers = nullptr,
                       std::vector<GstClockTime>* pts = nullptr) {
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  if (gst_element_set_state(pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE) {
    // The error that made it fail is on the bus.
  }
  int n = 0;
  if (sink && GST_IS_APP_SINK(sink)) {
    while (GstSample* sample = gst_app_sink_pull_sample(GST_APP_SINK(sink))) {
      ++n;
      if (pts) pts->push_back(GST_BUFFER_PTS(gst_sample_get_buffer(sample)));
      gst_sample_unref(sample);
    }
  }
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* m = gst_bus_timed_pop_filtered(
      bus, 60 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  std::string err;
  if (!m) {
    err = "timeout";
  } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
    GError* e = nullptr;
    gst_message_parse_error(m, &e, nullptr);
    err = std::string(GST_OBJECT_NAME(GST_MESSAGE_SRC(m))) + ": " + e->message;
    g_error_free(e);
  }
  if (m) gst_message_unref(m);
  gst_object_unref(bus);
  if (sink) gst_object_unref(sink);
  if (buffers) *buffers = n;
  return err;
}

TEST(Pipeline, WholePipelineRunsToEos) {
  const std::string line =
      "videotestsrc num-buffers=5 ! video/x-raw,width=100,height=70,framerate=25/1 ! "
      "vaeencode model=\"" +
      taesd_model() + "\" ! vaedecode model=\"" + taesd_model() +
      "\" ! video/x-raw,format=RGBA ! appsink name=sink sync=false";
  GError* error = nullptr;
  GstElement* pipeline = gst_parse_launch(line.c_str(), &error);
  ASSERT_NE(pipeline, nullptr) << (error ? error->message : "");
  int buffers = 0;
  std::vector<GstClockTime> pts;
  EXPECT_EQ(run_to_end(pipeline, &buffers, &pts), "");
  EXPECT_EQ(buffers, 5);
  for (size_t i = 0; i < pts.size(); ++i) EXPECT_EQ(pts[i], i * GST_SECOND / 25);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(pipeline);
}

TEST(Pipeline, MismatchedModelsFailWithAnErrorNamingBoth) {
  const std::string line =
      "videotestsrc num-buffers=3 ! video/x-raw,width=64,height=64 ! "
      "vaeencode model=\"" +
      flux_model() + "\" ! vaedecode name=dec model=\"" + taesd_model() + "\" ! fakesink";
  GstElement* pipeline = gst_parse_launch(line.c_str(), nullptr);
  ASSERT_NE(pipeline, nullptr);
  const std::string err = run_to_end(pipeline);
  EXPECT_TRUE(contains(err,
                       "dec: vaedecode: latent space 'flux1' from upstream does not "
                       "match model 'sd' in " +
                           taesd_model()))
      << err;
  EXPECT_EQ(gst_element_set_state(pipeline, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  gst_object_unref(pipeline);
}

// ---- model sharing ------------------------------------------------------------------------

struct LogCapture {
  std::mutex lock;
  std::vector<std::string> lines;
};

void capture_log(GstDebugCategory* category, GstDebugLevel, const gchar*, const gchar*, gint,
                 GObject*, GstDebugMessage* message, gpointer user_data) {
  // What the base class logs for a stage goes to the stage's own category.
  const std::string name = gst_debug_category_get_name(category);
  if (name != "vaeencode" && name != "vaedecode") return;
  auto* cap = static_cast<LogCapture*>(user_data);
  std::lock_guard<std::mutex> lock(cap->lock);
  cap->lines.push_back(gst_debug_message_get(message));
}

int count_lines(LogCapture& cap, const std::string& prefix) {
  std::lock_guard<std::mutex> lock(cap.lock);
  int n = 0;
  for (const auto& l : cap.lines) n += l.rfind(prefix, 0) == 0;
  return n;
}

TEST(Pipeline, ElementsOfOneModelShareItsWeights) {
  LogCapture cap;
  const gboolean was_active = gst_debug_is_active();
  gst_debug_set_active(TRUE);
  gst_debug_set_threshold_for_name("vaeencode", GST_LEVEL_INFO);
  gst_debug_set_threshold_for_name("vaedecode", GST_LEVEL_INFO);
  gst_debug_add_log_function(capture_log, &cap, nullptr);

  GstHarness* a = harness_for("vaeencode", {{"model", taesd_model()}});
  GstHarness* b = harness_for("vaeencode", {{"model", taesd_model()}});
  EXPECT_EQ(count_lines(cap, "loaded "), 1);
  EXPECT_EQ(count_lines(cap, "sharing the loaded "), 1);
  // Both work on the one instance.
  for (GstHarness* h : {a, b}) {
    gst_harness_set_src_caps(h, video_caps(32, 32));
    ASSERT_EQ(gst_harness_push(h, make_frame(32, 32)), GST_FLOW_OK);
    gst_buffer_unref(gst_harness_pull(h));
  }
  gst_harness_teardown(a);
  gst_harness_teardown(b);
  // With no user left the weights were released: the next start loads again.
  GstHarness* c = harness_for("vaeencode", {{"model", taesd_model()}});
  EXPECT_EQ(count_lines(cap, "loaded "), 2);
  gst_harness_teardown(c);

  gst_debug_remove_log_function(capture_log);
  gst_debug_set_threshold_for_name("vaeencode", GST_LEVEL_WARNING);
  gst_debug_set_threshold_for_name("vaedecode", GST_LEVEL_WARNING);
  gst_debug_set_active(was_active);
}

// ---- state cycling ------------------------------------------------------------------------

GstObject* find_leaks_tracer() {
  GstObject* found = nullptr;
  GList* tracers = gst_tracing_get_active_tracers();
  for (GList* l = tracers; l; l = l->next)
    if (!found && std::string(G_OBJECT_TYPE_NAME(l->data)) == "GstLeaksTracer")
      found = GST_OBJECT(gst_object_ref(l->data));
  g_list_free_full(tracers, gst_object_unref);
  return found;
}

// Objects a leaks-tracer checkpoint saw created but not destroyed, matched by type and address
// (an address reused after a free appears in both lists equally often).
std::vector<std::string> still_alive(const GstStructure* checkpoint) {
  std::map<std::string, int> net;
  auto tally = [&](const char* field, int delta) {
    const GValue* list = gst_structure_get_value(checkpoint, field);
    for (guint i = 0; list && i < gst_value_list_get_size(list); ++i) {
      const GstStructure* o = gst_value_get_structure(gst_value_list_get_value(list, i));
      net[caps_str(o, "type-name") + "@" + caps_str(o, "address")] += delta;
    }
  };
  tally("objects-created-list", 1);
  tally("objects-removed-list", -1);
  std::vector<std::string> out;
  for (const auto& [object, n] : net)
    if (n > 0) out.push_back(object);
  return out;
}

void cycle(GstElement* pipeline) {
  ASSERT_EQ(run_to_end(pipeline), "");
  ASSERT_EQ(gst_element_set_state(pipeline, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
}

TEST(Pipeline, StateCyclesLeakNothing) {
  const std::string line =
      "videotestsrc num-buffers=2 ! video/x-raw,width=128,height=96 ! "
      "vaeencode name=enc model=\"" +
      taesd_model() + "\" ! vaedecode name=dec model=\"" + taesd_model() + "\" ! fakesink";
  GstElement* pipeline = gst_parse_launch(line.c_str(), nullptr);
  ASSERT_NE(pipeline, nullptr);
  GstElement* enc = gst_bin_get_by_name(GST_BIN(pipeline), "enc");
  GstElement* dec = gst_bin_get_by_name(GST_BIN(pipeline), "dec");
  g_object_add_weak_pointer(G_OBJECT(enc), reinterpret_cast<gpointer*>(&enc));
  g_object_add_weak_pointer(G_OBJECT(dec), reinterpret_cast<gpointer*>(&dec));
  gst_object_unref(enc);  // the pipeline holds them; the weak pointers watch
  gst_object_unref(dec);

  // Warm up (first-use allocations: clocks, thread pools, oneDNN primitive caches).
  for (int i = 0; i < 2; ++i) cycle(pipeline);

  // 1. The heap. GStreamer alone drifts by some 100 KiB over such cycles (allocator caches);
  // a leaked frame tensor (147 KB here, two a cycle) or a model that is reloaded without the
  // old one being freed (170 KB of weights) adds megabytes. (A model that is never released
  // is caught by ElementsOfOneModelShareItsWeights.)
  malloc_trim(0);
  const size_t heap_before = mallinfo2().uordblks;
  for (int i = 0; i < 20; ++i) {
    SCOPED_TRACE(i);
    cycle(pipeline);
    if (HasFatalFailure()) return;
  }
  for (int i = 0; i < 5; ++i) {  // NULL <-> PAUSED without data too
    ASSERT_NE(gst_element_set_state(pipeline, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
    ASSERT_EQ(gst_element_set_state(pipeline, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  }
  gst_task_cleanup_all();
  malloc_trim(0);
  const size_t heap_after = mallinfo2().uordblks;
  EXPECT_LT(heap_after, heap_before + 1024 * 1024)
      << "heap grew by " << (long(heap_after) - long(heap_before)) << " bytes over 25 cycles";

  // 2. GStreamer objects (buffers, caps, pads, pools, ...): none created in a cycle survives.
  GstObject* tracer = find_leaks_tracer();
  if (!tracer) {
    ADD_FAILURE() << "the leaks tracer is not active (GST_TRACERS is set to something else?)";
  } else {
    g_signal_emit_by_name(tracer, "activity-start-tracking");
    for (int i = 0; i < 5; ++i) cycle(pipeline);
    gst_task_cleanup_all();
    GstStructure* checkpoint = nullptr;
    g_signal_emit_by_name(tracer, "activity-get-checkpoint", &checkpoint);
    g_signal_emit_by_name(tracer, "activity-stop-tracking");
    ASSERT_NE(checkpoint, nullptr);
    std::string alive;
    for (const auto& o : still_alive(checkpoint)) alive += o + " ";
    EXPECT_TRUE(alive.empty()) << "objects created during the cycles are still alive: " << alive;
    gst_structure_free(checkpoint);
    gst_object_unref(tracer);
  }

  gst_object_unref(pipeline);
  EXPECT_EQ(enc, nullptr) << "vaeencode was not finalized with its pipeline";
  EXPECT_EQ(dec, nullptr) << "vaedecode was not finalized with its pipeline";
}

// ---- the built-in default model -----------------------------------------------------------

// model="" means the built-in default model ($LATENT_DEFAULT_MODEL in ctest). Where it has not
// been installed yet, the element must say where it looked.
TEST(Pipeline, EmptyModelMeansTheBuiltInDefault) {
  const std::string dir = latent::default_model_dir();
  if (latent::test::file_exists(dir + "/config.json")) {
    GstHarness* hs = harness_for("vaeencode", {});
    gst_harness_set_src_caps(hs, video_caps(64, 64));
    ASSERT_EQ(gst_harness_push(hs, make_frame(64, 64)), GST_FLOW_OK);
    gst_buffer_unref(gst_harness_pull(hs));
    GstCaps* caps = output_caps(hs);
    EXPECT_EQ(caps_str(gst_caps_get_structure(caps, 0), "latent-space"), "latent-default");
    gst_caps_unref(caps);
    gst_harness_teardown(hs);
  } else {
    GstElement* e = gst_element_factory_make("vaeencode", nullptr);
    BusWatch bw(e);
    EXPECT_EQ(gst_element_set_state(e, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
    const std::string err = bw.pop_error();
    EXPECT_TRUE(contains(err, dir)) << err;
    gst_element_set_state(e, GST_STATE_NULL);
    gst_object_unref(e);
  }
}

}  // namespace
