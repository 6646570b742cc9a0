// latentsink / latentsrc: the file's tensor and metadata from a harness stream (timestamps,
// offsets, video mode), latentsrc pushing it back (caps, timestamps, offsets, seeks),
// latentsrc ! vaedecode against vaeencode ! vaedecode, and every bad input.
#include <gst/app/gstappsink.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "engine/weights/latent_file.h"
#include "tests/elements/gst_test_util.h"

namespace {

using namespace gsttest;

::testing::Environment* const kEnv = ::testing::AddGlobalTestEnvironment(new GstEnvironment());

std::string tmp(const std::string& name) { return latent::test::temp_dir() + "/" + name; }

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

GstCaps* latent_caps(int temporal_factor, const char* format = "bf16") {
  GstCaps* caps = gst_caps_new_simple(
      "application/x-latent", "format", G_TYPE_STRING, format, "channels", G_TYPE_INT, 4, "width",
      G_TYPE_INT, 5, "height", G_TYPE_INT, 3, "latent-space", G_TYPE_STRING, "sd", "frame-width",
      G_TYPE_INT, 40, "frame-height", G_TYPE_INT, 24, "size-policy", G_TYPE_STRING, "crop",
      "framerate", GST_TYPE_FRACTION, 25, 1, nullptr);
  if (temporal_factor > 1)
    gst_caps_set_simple(caps, "temporal-factor", G_TYPE_INT, temporal_factor, nullptr);
  return caps;
}

constexpr size_t kFrameBytes = 4 * 3 * 5 * 2;  // bf16 [4, 3, 5]
constexpr GstClockTime kFrame = GST_SECOND / 25;

GstBuffer* frame_buffer(int index, GstClockTime pts, GstClockTime dur, guint64 off,
                        guint64 off_end) {
  GstBuffer* b = gst_buffer_new_allocate(nullptr, kFrameBytes, nullptr);
  GstMapInfo map;
  gst_buffer_map(b, &map, GST_MAP_WRITE);
  for (size_t i = 0; i < kFrameBytes; ++i) map.data[i] = static_cast<guint8>(index * 31 + i);
  gst_buffer_unmap(b, &map);
  GST_BUFFER_PTS(b) = pts;
  GST_BUFFER_DURATION(b) = dur;
  GST_BUFFER_OFFSET(b) = off;
  GST_BUFFER_OFFSET_END(b) = off_end;
  return b;
}

// The error (or warning) messages posted on `el`'s bus, joined.
std::string bus_messages(GstElement* el, GstMessageType type) {
  std::string out;
  GstBus* bus = gst_element_get_bus(el);
  if (!bus) return out;
  while (GstMessage* m = gst_bus_pop_filtered(bus, type)) {
    GError* e = nullptr;
    if (type == GST_MESSAGE_ERROR)
      gst_message_parse_error(m, &e, nullptr);
    else
      gst_message_parse_warning(m, &e, nullptr);
    out += std::string(e->message) + "\n";
    g_error_free(e);
    gst_message_unref(m);
  }
  gst_object_unref(bus);
  return out;
}
std::string bus_errors(GstHarness* h) { return bus_messages(h->element, GST_MESSAGE_ERROR); }

GstElement* element_with_bus(const char* factory, const std::string& location) {
  GstElement* el = gst_element_factory_make(factory, nullptr);
  GstBus* bus = gst_bus_new();
  gst_element_set_bus(el, bus);
  gst_object_unref(bus);
  g_object_set(el, "location", location.c_str(), nullptr);
  return el;
}

GstHarness* sink_harness(const std::string& location) {
  GstElement* el = element_with_bus("latentsink", location);
  g_object_set(el, "source", "clips/a.mp4", "model", taesd_model().c_str(), nullptr);
  GstHarness* h = gst_harness_new_with_element(el, "sink", nullptr);
  gst_object_unref(el);
  return h;
}

// The errors an element posts when started (its start() failing) for `location`.
std::string start_errors(const char* factory, const std::string& location) {
  GstElement* el = element_with_bus(factory, location);
  EXPECT_EQ(gst_element_set_state(el, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  const std::string out = bus_messages(el, GST_MESSAGE_ERROR);
  gst_element_set_state(el, GST_STATE_NULL);
  gst_object_unref(el);
  return out;
}

// A video-mode clip of 10 frames at 25 fps in latent frames of 4: [0,4) [4,8) [8,10) (padded).
void write_video_clip(const std::string& path) {
  GstHarness* h = sink_harness(path);
  gst_harness_set_src_caps(h, latent_caps(4));
  ASSERT_EQ(gst_harness_push(h, frame_buffer(0, 0, 4 * kFrame, 0, 4)), GST_FLOW_OK);
  ASSERT_EQ(gst_harness_push(h, frame_buffer(1, 4 * kFrame, 4 * kFrame, 4, 8)), GST_FLOW_OK);
  EXPECT_TRUE(exists(path + ".partial"));
  EXPECT_FALSE(exists(path));
  ASSERT_EQ(gst_harness_push(h, frame_buffer(2, 8 * kFrame, 2 * kFrame, 8, 10)), GST_FLOW_OK);
  EXPECT_TRUE(gst_harness_push_event(h, gst_event_new_eos()));
  EXPECT_EQ(bus_errors(h), "");
  gst_harness_teardown(h);
}

TEST(LatentSink, WritesTheTensorAndTheMetadata) {
  const std::string path = tmp("video.safetensors");
  write_video_clip(path);
  ASSERT_TRUE(exists(path));
  EXPECT_FALSE(exists(path + ".partial"));
  auto f = latent::open_latent_file(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->latents.shape(), (latent::Shape{3, 4, 3, 5}));
  EXPECT_EQ(f->latents.dtype(), latent::DType::kBF16);
  for (int i = 0; i < 3; ++i)
    for (size_t k = 0; k < kFrameBytes; ++k)
      ASSERT_EQ(f->frame_data(i)[k], static_cast<uint8_t>(i * 31 + k));
  const auto& info = f->info;
  EXPECT_EQ(info.latent_space, "sd");
  EXPECT_EQ(info.size_policy, "crop");
  EXPECT_EQ(info.frame_width, 40);
  EXPECT_EQ(info.frame_height, 24);
  EXPECT_EQ(info.fps_n, 25);
  EXPECT_EQ(info.temporal_factor, 4);
  EXPECT_TRUE(info.video_mode());
  EXPECT_EQ(info.frame_count, 10);
  EXPECT_EQ(info.source, "clips/a.mp4");
  EXPECT_EQ(info.model, taesd_model());
  EXPECT_EQ(info.model_config_sha256.size(), 64u);
  EXPECT_EQ(info.pts, (std::vector<int64_t>{0, int64_t(4 * kFrame), int64_t(8 * kFrame)}));
  EXPECT_EQ(info.durations,
            (std::vector<int64_t>{int64_t(4 * kFrame), int64_t(4 * kFrame), int64_t(2 * kFrame)}));
  EXPECT_EQ(info.offsets, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(info.offset_ends, (std::vector<int64_t>{4, 8, 10}));
  EXPECT_EQ(f->file->metadata().at("video_mode"), "true");
}

TEST(LatentSink, TheSameStreamGivesTheSameBytes) {
  write_video_clip(tmp("same1.safetensors"));
  write_video_clip(tmp("same2.safetensors"));
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(slurp(tmp("same1.safetensors")), slurp(tmp("same2.safetensors")));
}

TEST(LatentSink, StoppingBeforeEosLeavesNoFile) {
  const std::string path = tmp("interrupted.safetensors");
  GstHarness* h = sink_harness(path);
  gst_harness_set_src_caps(h, latent_caps(1));
  ASSERT_EQ(gst_harness_push(h, frame_buffer(0, 0, kFrame, 0, 1)), GST_FLOW_OK);
  EXPECT_TRUE(exists(path + ".partial"));
  gst_harness_teardown(h);
  EXPECT_FALSE(exists(path));
  EXPECT_FALSE(exists(path + ".partial"));
}

TEST(LatentSink, BadInputIsAnErrorNamingIt) {
  {  // an output folder that is not a folder
    const std::string file = tmp("plain-file");
    std::ofstream(file) << "x";
    const std::string err = start_errors("latentsink", file + "/out.safetensors");
    EXPECT_TRUE(contains(err, "plain-file' does not exist or is not a folder")) << err;
  }
  {  // a buffer of the wrong size
    const std::string path = tmp("short.safetensors");
    GstHarness* h = sink_harness(path);
    gst_harness_set_src_caps(h, latent_caps(1));
    GstBuffer* b = gst_buffer_new_allocate(nullptr, 7, nullptr);
    EXPECT_EQ(gst_harness_push(h, b), GST_FLOW_ERROR);
    EXPECT_TRUE(contains(bus_errors(h), "a latent buffer of 7 bytes, the caps describe 120"));
    gst_harness_teardown(h);
    EXPECT_FALSE(exists(path));
  }
  {  // EOS without data
    const std::string path = tmp("empty.safetensors");
    GstHarness* h = sink_harness(path);
    gst_harness_set_src_caps(h, latent_caps(1));
    gst_harness_push_event(h, gst_event_new_eos());
    EXPECT_TRUE(contains(bus_errors(h), "without any latent frame"));
    gst_harness_teardown(h);
    EXPECT_FALSE(exists(path));
  }
  {  // the format changing mid-file
    const std::string path = tmp("changed.safetensors");
    GstHarness* h = sink_harness(path);
    gst_harness_set_src_caps(h, latent_caps(1));
    ASSERT_EQ(gst_harness_push(h, frame_buffer(0, 0, kFrame, 0, 1)), GST_FLOW_OK);
    gst_harness_set_src_caps(h, latent_caps(1, "fp32"));
    gst_harness_push(h, frame_buffer(1, kFrame, kFrame, 1, 2));
    EXPECT_TRUE(contains(bus_errors(h), "the latent format changed mid-stream"));
    gst_harness_teardown(h);
    EXPECT_FALSE(exists(path));
  }
  {  // a location that is a folder (with or without a trailing slash): refused before any data
    const std::string dir = tmp("a-folder");
    ::mkdir(dir.c_str(), 0755);
    for (const std::string& location : {dir, dir + "/"}) {
      const std::string err = start_errors("latentsink", location);
      EXPECT_TRUE(contains(err, "cannot write " + location + ": it is a folder")) << err;
    }
  }
  {  // no location
    const std::string err = start_errors("latentsink", "");
    EXPECT_TRUE(contains(err, "no file name given")) << err;
  }
}

// ---- latentsrc ------------------------------------------------------------------------------

GstHarness* src_harness(const std::string& location) {
  GstElement* el = element_with_bus("latentsrc", location);
  GstHarness* h = gst_harness_new_with_element(el, nullptr, "src");
  gst_object_unref(el);
  return h;
}

TEST(LatentSrc, PushesTheRecordedFramesWithCapsAndTimes) {
  const std::string path = tmp("play.safetensors");
  write_video_clip(path);
  GstHarness* h = src_harness(path);
  gst_harness_play(h);
  const guint64 offs[3][2] = {{0, 4}, {4, 8}, {8, 10}};
  const GstClockTime durs[3] = {4 * kFrame, 4 * kFrame, 2 * kFrame};
  for (int i = 0; i < 3; ++i) {
    GstBuffer* b = gst_harness_pull(h);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(gst_buffer_get_size(b), kFrameBytes);
    GstMapInfo map;
    gst_buffer_map(b, &map, GST_MAP_READ);
    for (size_t k = 0; k < kFrameBytes; ++k)
      ASSERT_EQ(map.data[k], static_cast<uint8_t>(i * 31 + k));
    gst_buffer_unmap(b, &map);
    EXPECT_EQ(GST_BUFFER_PTS(b), GstClockTime(4 * i) * kFrame);
    EXPECT_EQ(GST_BUFFER_DURATION(b), durs[i]);
    EXPECT_EQ(GST_BUFFER_OFFSET(b), offs[i][0]);
    EXPECT_EQ(GST_BUFFER_OFFSET_END(b), offs[i][1]);
    EXPECT_EQ(GST_BUFFER_FLAG_IS_SET(b, GST_BUFFER_FLAG_DISCONT), i == 0);
    gst_buffer_unref(b);
  }
  GstCaps* caps = gst_pad_get_current_caps(h->sinkpad);
  ASSERT_NE(caps, nullptr);
  GstCaps* want = latent_caps(4);
  EXPECT_TRUE(gst_caps_is_equal(caps, want)) << gst_caps_to_string(caps);
  gst_caps_unref(want);
  gst_caps_unref(caps);
  // Then EOS.
  GstEvent* ev;
  bool eos = false;
  while ((ev = gst_harness_pull_event(h))) {
    eos = eos || GST_EVENT_TYPE(ev) == GST_EVENT_EOS;
    gst_event_unref(ev);
    if (eos) break;
  }
  EXPECT_TRUE(eos);
  gint64 duration = 0;
  EXPECT_TRUE(gst_element_query_duration(h->element, GST_FORMAT_TIME, &duration));
  EXPECT_EQ(duration, gint64(10 * kFrame));
  gst_harness_teardown(h);
}

TEST(LatentSrc, SeeksToTheLatentFrameCoveringThePosition) {
  const std::string path = tmp("seek.safetensors");
  write_video_clip(path);
  GError* error = nullptr;
  GstElement* pipeline = gst_parse_launch(
      ("latentsrc location=\"" + path + "\" ! appsink name=sink sync=false").c_str(), &error);
  ASSERT_NE(pipeline, nullptr) << (error ? error->message : "");
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  ASSERT_EQ(gst_element_set_state(pipeline, GST_STATE_PAUSED), GST_STATE_CHANGE_ASYNC);
  ASSERT_EQ(gst_element_get_state(pipeline, nullptr, nullptr, 10 * GST_SECOND),
            GST_STATE_CHANGE_SUCCESS);
  // 5 frames in lies in the second latent frame [4, 8).
  ASSERT_TRUE(gst_element_seek_simple(pipeline, GST_FORMAT_TIME,
                                      static_cast<GstSeekFlags>(GST_SEEK_FLAG_FLUSH), 5 * kFrame));
  gst_element_get_state(pipeline, nullptr, nullptr, 10 * GST_SECOND);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  std::vector<guint64> offsets;
  while (GstSample* s = gst_app_sink_pull_sample(GST_APP_SINK(sink))) {
    offsets.push_back(GST_BUFFER_OFFSET(gst_sample_get_buffer(s)));
    gst_sample_unref(s);
  }
  EXPECT_EQ(offsets, (std::vector<guint64>{4, 8}));
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
}

TEST(LatentSrc, StopsAtTheSegmentStop) {
  const std::string path = tmp("seek_stop.safetensors");
  write_video_clip(path);
  GstElement* pipeline = gst_parse_launch(
      ("latentsrc location=\"" + path + "\" ! appsink name=sink sync=false").c_str(), nullptr);
  ASSERT_NE(pipeline, nullptr);
  GstElement* sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
  gst_element_set_state(pipeline, GST_STATE_PAUSED);
  ASSERT_EQ(gst_element_get_state(pipeline, nullptr, nullptr, 10 * GST_SECOND),
            GST_STATE_CHANGE_SUCCESS);
  // [0, 5 frames): the latent frames starting before the stop, [0,4) and [4,8).
  ASSERT_TRUE(gst_element_seek(pipeline, 1.0, GST_FORMAT_TIME, GST_SEEK_FLAG_FLUSH,
                               GST_SEEK_TYPE_SET, 0, GST_SEEK_TYPE_SET, 5 * kFrame));
  gst_element_get_state(pipeline, nullptr, nullptr, 10 * GST_SECOND);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  std::vector<guint64> offsets;
  while (GstSample* smp = gst_app_sink_pull_sample(GST_APP_SINK(sink))) {
    offsets.push_back(GST_BUFFER_OFFSET(gst_sample_get_buffer(smp)));
    gst_sample_unref(smp);
  }
  EXPECT_EQ(offsets, (std::vector<guint64>{0, 4}));
  // Reverse playback is refused.
  EXPECT_FALSE(gst_element_seek(pipeline, -1.0, GST_FORMAT_TIME, GST_SEEK_FLAG_FLUSH,
                                GST_SEEK_TYPE_SET, 0, GST_SEEK_TYPE_SET, 5 * kFrame));
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(pipeline);
}

// latentsink takes model and source from latentsrc's read-only properties.
TEST(LatentSrc, LatentsrcToLatentsinkCopiesTheFileExactlyAcrossStateCycles) {
  const std::string a = tmp("copy_a.safetensors"), b = tmp("copy_b.safetensors");
  write_video_clip(a);
  GstElement* pipeline = gst_parse_launch(
      ("latentsrc location=\"" + a + "\" ! latentsink location=\"" + b + "\"").c_str(), nullptr);
  ASSERT_NE(pipeline, nullptr);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  for (int round = 0; round < 2; ++round) {
    std::remove(b.c_str());
    ASSERT_NE(gst_element_set_state(pipeline, GST_STATE_PLAYING), GST_STATE_CHANGE_FAILURE);
    GstBus* bus = gst_element_get_bus(pipeline);
    GstMessage* m = gst_bus_timed_pop_filtered(
        bus, 30 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
    ASSERT_TRUE(m && GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS) << "round " << round;
    gst_message_unref(m);
    gst_object_unref(bus);
    EXPECT_EQ(gst_element_set_state(pipeline, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
    EXPECT_TRUE(slurp(a) == slurp(b)) << "round " << round;
  }
  gst_object_unref(pipeline);
}

std::string src_error(const std::string& path) { return start_errors("latentsrc", path); }

TEST(LatentSrc, BadFilesAreErrorsNamingTheFileAndTheProblem) {
  const std::string good = tmp("good.safetensors");
  write_video_clip(good);
  std::ifstream in(good, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();

  const std::string truncated = tmp("truncated.safetensors");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() - 50);
  std::string err = src_error(truncated);
  EXPECT_TRUE(contains(err, truncated) && contains(err, "past the end")) << err;

  const std::string foreign = tmp("foreign.safetensors");
  ASSERT_TRUE(
      latent::write_safetensors(foreign, {{"x", latent::Tensor::from_floats({2}, {1.f, 2.f})}})
          .ok());
  err = src_error(foreign);
  EXPECT_TRUE(contains(err, foreign) && contains(err, "not a latent file written by latentsink"))
      << err;

  // The tensor there in a dtype no latent file has (I16: the same bytes as the BF16 it was).
  {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[i])) << (8 * i);
    std::string header = bytes.substr(8, n);
    const size_t at = header.find("\"BF16\"");
    ASSERT_NE(at, std::string::npos) << header;
    header.replace(at, 6, "\"I16\"");
    std::string len(8, '\0');
    for (int i = 0; i < 8; ++i) len[i] = char((header.size() >> (8 * i)) & 0xff);
    const std::string i16 = tmp("i16.safetensors");
    std::ofstream(i16, std::ios::binary) << len << header << bytes.substr(8 + n);
    err = src_error(i16);
    EXPECT_TRUE(contains(err, "unsupported dtype I16 for tensor 'latents' in " + i16)) << err;
  }

  // Metadata that contradicts itself: a video-mode temporal factor with video_mode false.
  {
    auto f = latent::open_latent_file(good);
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto meta = latent::latent_file_metadata(f->info);
    meta["video_mode"] = "false";
    const std::string flipped = tmp("flipped.safetensors");
    ASSERT_TRUE(latent::write_safetensors(flipped, {{"latents", f->latents}}, meta).ok());
    err = src_error(flipped);
    EXPECT_TRUE(contains(err, flipped + ": __metadata__ 'video_mode' is 'false' but "
                                        "'temporal_factor' is 4"))
        << err;
  }

  err = src_error(tmp("missing.safetensors"));
  EXPECT_TRUE(contains(err, "missing.safetensors")) << err;

  err = src_error("");
  EXPECT_TRUE(contains(err, "no file name given")) << err;
}

// A file truncated in place while it plays (another program rewriting it): latentsrc reads each
// latent frame with pread as it pushes it, so the frame already read arrives intact and the next
// read is an error naming the file; buffers that pointed into the mapping (as before) crashed the
// process with SIGBUS when an element read them.
TEST(LatentSrc, AFileTruncatedWhilePlayingIsAnErrorNotACrash) {
  const std::string path = tmp("truncated-while-playing.safetensors");
  write_video_clip(path);
  GstHarness* h = src_harness(path);
  // Hold the streaming thread at its first push (frame 0 read), truncate, then let it go.
  struct Gate {
    GMutex lock;
    GCond cond;
    bool reached = false, open = false;
  } gate;
  g_mutex_init(&gate.lock);
  g_cond_init(&gate.cond);
  GstPad* pad = gst_element_get_static_pad(h->element, "src");
  const gulong probe = gst_pad_add_probe(
      pad, GST_PAD_PROBE_TYPE_BUFFER,
      [](GstPad*, GstPadProbeInfo*, gpointer data) -> GstPadProbeReturn {
        auto* g = static_cast<Gate*>(data);
        g_mutex_lock(&g->lock);
        g->reached = true;
        g_cond_broadcast(&g->cond);
        while (!g->open) g_cond_wait(&g->cond, &g->lock);
        g_mutex_unlock(&g->lock);
        return GST_PAD_PROBE_REMOVE;
      },
      &gate, nullptr);
  gst_harness_play(h);
  g_mutex_lock(&gate.lock);
  const gint64 until = g_get_monotonic_time() + 10 * G_TIME_SPAN_SECOND;
  while (!gate.reached && g_cond_wait_until(&gate.cond, &gate.lock, until)) {
  }
  const bool reached = gate.reached;
  const int truncated = ::truncate(path.c_str(), 0);
  gate.open = true;
  g_cond_broadcast(&gate.cond);
  g_mutex_unlock(&gate.lock);
  ASSERT_TRUE(reached) << "the first latent frame never came";
  ASSERT_EQ(truncated, 0) << g_strerror(errno);
  GstBuffer* b = gst_harness_pull(h);
  ASSERT_NE(b, nullptr);
  GstMapInfo map;
  gst_buffer_map(b, &map, GST_MAP_READ);
  ASSERT_EQ(map.size, kFrameBytes);
  for (size_t k = 0; k < kFrameBytes; ++k) ASSERT_EQ(map.data[k], static_cast<uint8_t>(k));
  gst_buffer_unmap(b, &map);
  gst_buffer_unref(b);
  // The next frame's read comes up short: an error, then no more buffers.
  std::string err;
  for (int i = 0; i < 100 && err.empty(); ++i) {
    err = bus_errors(h);
    if (err.empty()) g_usleep(20000);
  }
  EXPECT_TRUE(contains(err, path)) << err;
  EXPECT_TRUE(contains(err, "latent frame 1 of 3")) << err;
  EXPECT_TRUE(contains(err, "truncated while playing")) << err;
  EXPECT_EQ(gst_harness_buffers_in_queue(h), 0u);
  EXPECT_NE(probe, 0u);  // (removed itself: GST_PAD_PROBE_REMOVE)
  gst_object_unref(pad);
  gst_harness_teardown(h);
  g_cond_clear(&gate.cond);
  g_mutex_clear(&gate.lock);
}

std::string bus_warnings(GstElement* el) { return bus_messages(el, GST_MESSAGE_WARNING); }

// Both read their settings when the file opens: a change while PAUSED or PLAYING is refused
// with a warning naming the value that stays (the property never shows a file not in use).
TEST(LatentFile, SettingsCannotChangeWhileRunning) {
  const std::string clip = tmp("running.safetensors");
  write_video_clip(clip);
  GstHarness* src = src_harness(clip);
  gst_harness_play(src);
  g_object_set(src->element, "location", tmp("other.safetensors").c_str(), nullptr);
  EXPECT_EQ(string_property(src->element, "location"), clip);
  std::string w = bus_warnings(src->element);
  EXPECT_TRUE(contains(w, "`location` cannot change while PAUSED or PLAYING; it stays '" + clip))
      << w;
  gst_harness_teardown(src);

  const std::string out = tmp("running-out.safetensors");
  GstHarness* sink = sink_harness(out);
  gst_harness_set_src_caps(sink, latent_caps(1));
  ASSERT_EQ(gst_harness_push(sink, frame_buffer(0, 0, kFrame, 0, 1)), GST_FLOW_OK);
  g_object_set(sink->element, "location", tmp("moved.safetensors").c_str(), "source", "b.mp4",
               nullptr);
  EXPECT_EQ(string_property(sink->element, "location"), out);
  EXPECT_EQ(string_property(sink->element, "source"), "clips/a.mp4");
  w = bus_warnings(sink->element);
  EXPECT_TRUE(contains(w, "`location` cannot change while PAUSED or PLAYING; it stays '" + out))
      << w;
  EXPECT_TRUE(contains(w, "`source` cannot change")) << w;
  EXPECT_TRUE(gst_harness_push_event(sink, gst_event_new_eos()));
  EXPECT_EQ(bus_errors(sink), "");
  gst_harness_teardown(sink);
  EXPECT_TRUE(exists(out));
  EXPECT_FALSE(exists(tmp("moved.safetensors")));
}

// Downstream that takes none of the file's (fixed) caps: one error naming the file and both
// sides, not GstBaseSrc's bare "Internal data stream error".
TEST(LatentSrc, CapsDownstreamRefusesAreNamed) {
  const std::string clip = tmp("refused.safetensors");
  write_video_clip(clip);
  const std::string launch =
      "latentsrc location=\"" + clip + "\" ! application/x-latent,frame-width=100 ! fakesink";
  GstElement* p = gst_parse_launch(launch.c_str(), nullptr);
  ASSERT_NE(p, nullptr);
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(p);
  GstMessage* m = gst_bus_timed_pop_filtered(
      bus, 30 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(GST_MESSAGE_TYPE(m), GST_MESSAGE_ERROR);
  GError* e = nullptr;
  gst_message_parse_error(m, &e, nullptr);
  const std::string err = e->message;
  g_error_free(e);
  gst_message_unref(m);
  EXPECT_TRUE(contains(err, "downstream takes none of the caps of " + clip)) << err;
  EXPECT_TRUE(contains(err, "frame-width=(int)40")) << err;
  EXPECT_TRUE(contains(err, "it takes application/x-latent, frame-width=(int)100")) << err;
  gst_object_unref(bus);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
}

// ---- through the stages -----------------------------------------------------------------

TEST(LatentFile, LatentsrcVaedecodeReproducesVaeencodeVaedecode) {
  const std::string model = taesd_model();
  const std::string path = tmp("through.safetensors");
  const std::string src =
      "videotestsrc num-buffers=4 pattern=ball ! "
      "video/x-raw,format=RGB,width=60,height=44,framerate=25/1 ! ";
  const std::string enc = "vaeencode model=\"" + model + "\" dtype=fp32 ! ";
  const std::string dec =
      "vaedecode model=\"" + model + "\" ! video/x-raw,format=RGB ! appsink name=sink sync=false";
  const auto direct = run_to_eos(src + enc + dec);
  ASSERT_EQ(direct.size(), 4u);
  // Written through latentsink (an appsink-free pipeline), then played back.
  const std::string write = src + enc + "latentsink location=\"" + path + "\"";
  GstElement* p = gst_parse_launch(write.c_str(), nullptr);
  ASSERT_NE(p, nullptr);
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(p);
  GstMessage* m = gst_bus_timed_pop_filtered(
      bus, 60 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  ASSERT_TRUE(m && GST_MESSAGE_TYPE(m) == GST_MESSAGE_EOS);
  gst_message_unref(m);
  gst_object_unref(bus);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
  auto f = latent::open_latent_file(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->info.model, model);  // found on vaeencode upstream
  EXPECT_EQ(f->info.model_config_sha256.size(), 64u);
  EXPECT_EQ(f->info.frame_width, 60);
  const auto played = run_to_eos("latentsrc location=\"" + path + "\" ! " + dec);
  ASSERT_EQ(played.size(), direct.size());
  for (size_t i = 0; i < direct.size(); ++i) EXPECT_TRUE(played[i] == direct[i]) << "frame " << i;
}

}  // namespace
