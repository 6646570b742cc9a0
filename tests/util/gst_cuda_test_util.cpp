#include "tests/util/gst_cuda_test_util.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent::test {

int gst_gpu_test_main(const char* test_name, int argc, char** argv) {
  exit_without_gpu(test_name);
#ifdef LATENT_PLUGIN_DIR
  setenv("GST_PLUGIN_PATH_1_0", LATENT_PLUGIN_DIR, 0);
#endif
  gst_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

namespace {

// The engine's transfer counters as the plugin sees them. The plugin carries its own copy of the
// engine, so its counters are read through its own symbols (plus this binary's, in case the
// dynamic linker bound the plugin's counting calls here).
struct PluginCounters {
  using Get = TransferCounts (*)();
  using Reset = void (*)();
  Get get = nullptr;
  Reset reset = nullptr;
  PluginCounters() {
    GstPlugin* plugin = gst_registry_find_plugin(gst_registry_get(), "latent");
    if (!plugin) return;
    GstPlugin* loaded = gst_plugin_load(plugin);
    const gchar* file = loaded ? gst_plugin_get_filename(loaded) : nullptr;
    void* handle = file ? dlopen(file, RTLD_NOW | RTLD_NOLOAD) : nullptr;
    if (handle) {
      get = reinterpret_cast<Get>(dlsym(handle, "_ZN6latent15transfer_countsEv"));
      reset = reinterpret_cast<Reset>(dlsym(handle, "_ZN6latent21reset_transfer_countsEv"));
    }
    if (loaded) gst_object_unref(loaded);
    gst_object_unref(plugin);
  }
  bool ok() const { return get && reset; }
  void clear() const {
    reset();
    reset_transfer_counts();
  }
  TransferCounts read() const {
    TransferCounts a = get(), b = transfer_counts();
    a.host_to_device += b.host_to_device;
    a.device_to_host += b.device_to_host;
    a.host_to_device_bytes += b.host_to_device_bytes;
    a.device_to_host_bytes += b.device_to_host_bytes;
    return a;
  }
};

void on_handoff(GstElement*, GstBuffer* buf, GstPad*, gpointer data) {
  auto* r = static_cast<PipelineRun*>(data);
  GstMapInfo m;
  if (gst_buffer_map(buf, &m, GST_MAP_READ)) {
    r->frames.emplace_back(m.data, m.data + m.size);
    gst_buffer_unmap(buf, &m);
  }
  r->pts.push_back(GST_BUFFER_PTS(buf));
  GstMemory* mem = gst_buffer_n_memory(buf) > 0 ? gst_buffer_peek_memory(buf, 0) : nullptr;
  r->memory.emplace_back(
      mem && mem->allocator && mem->allocator->mem_type ? mem->allocator->mem_type : "");
}

// Resets `counters` once, at the first buffer through the pad it is attached to.
struct ResetHook {
  const PluginCounters* counters;
  bool armed = true;
};

GstPadProbeReturn reset_at_first_buffer(GstPad*, GstPadProbeInfo*, gpointer data) {
  auto* h = static_cast<ResetHook*>(data);
  if (h->armed) h->counters->clear();
  h->armed = false;
  return GST_PAD_PROBE_OK;
}

// run_pipeline() without `counters`, run_counted() with them.
PipelineRun play(const std::string& description, const PluginCounters* counters,
                 const char* element, const char* pad) {
  PipelineRun r;
  ResetHook hook{counters};
  GError* err = nullptr;
  GstElement* p = gst_parse_launch(description.c_str(), &err);
  if (!p) {
    r.error = err ? err->message : "parse failed";
    g_clear_error(&err);
    return r;
  }
  if (counters) {
    GstElement* e = gst_bin_get_by_name(GST_BIN(p), element);
    GstPad* probe_pad = e ? gst_element_get_static_pad(e, pad) : nullptr;
    EXPECT_TRUE(probe_pad) << element << "." << pad;
    if (probe_pad) {
      gst_pad_add_probe(probe_pad, GST_PAD_PROBE_TYPE_BUFFER, reset_at_first_buffer, &hook,
                        nullptr);
      gst_object_unref(probe_pad);
    }
    if (e) gst_object_unref(e);
  }
  GstElement* sink = gst_bin_get_by_name(GST_BIN(p), "out");
  g_object_set(sink, "signal-handoffs", TRUE, nullptr);
  g_signal_connect(sink, "handoff", G_CALLBACK(on_handoff), &r);
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(p);
  GstMessage* msg = gst_bus_timed_pop_filtered(bus, 120 * GST_SECOND,
                                               GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  if (counters) r.counts = counters->read();
  if (msg && GST_MESSAGE_TYPE(msg) == GST_MESSAGE_EOS) {
    r.ok = true;
    if (!counters) {
      // Asked from the sink's pad: a sink with sync=false would not ask upstream itself.
      GstQuery* q = gst_query_new_latency();
      GstPad* sink_pad = gst_element_get_static_pad(sink, "sink");
      const bool answered = gst_pad_peer_query(sink_pad, q);
      gst_object_unref(sink_pad);
      if (answered) {
        gboolean live;
        GstClockTime max;
        gst_query_parse_latency(q, &live, &r.latency_min, &max);
      }
      gst_query_unref(q);
    }
  } else if (msg) {
    GError* e = nullptr;
    gchar* dbg = nullptr;
    gst_message_parse_error(msg, &e, &dbg);
    r.error = e ? e->message : "error";
    if (counters) r.error = str_cat(r.error, " (", dbg ? dbg : "", ")");
    g_clear_error(&e);
    g_free(dbg);
  } else {
    r.error = "timeout";
  }
  if (msg) gst_message_unref(msg);
  gst_object_unref(bus);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(sink);
  gst_object_unref(p);
  return r;
}

}  // namespace

PipelineRun run_pipeline(const std::string& description) {
  return play(description, nullptr, nullptr, nullptr);
}

std::string play_to_end(GstElement* p, GstClockTime timeout) {
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(p);
  GstMessage* msg =
      gst_bus_timed_pop_filtered(bus, timeout, GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  std::string result = msg ? "" : "timeout";
  if (msg && GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
    GError* e = nullptr;
    gst_message_parse_error(msg, &e, nullptr);
    result = e ? e->message : "error";
    g_clear_error(&e);
  }
  if (msg) gst_message_unref(msg);
  gst_object_unref(bus);
  gst_element_set_state(p, GST_STATE_NULL);
  return result;
}

PipelineRun run_counted(const std::string& description, const char* element, const char* pad) {
  static const PluginCounters counters;
  EXPECT_TRUE(counters.ok()) << "the latent plugin's transfer counters were not found";
  if (!counters.ok()) return PipelineRun();
  return play(description, &counters, element, pad);
}

::testing::AssertionResult same_frame_sizes(const PipelineRun& a, const PipelineRun& b,
                                            size_t frames) {
  for (const PipelineRun* r : {&a, &b}) {
    if (!r->ok) return ::testing::AssertionFailure() << r->error;
    if (r->frames.size() != frames)
      return ::testing::AssertionFailure() << r->frames.size() << " frames, expected " << frames;
  }
  for (size_t i = 0; i < frames; ++i)
    if (a.frames[i].size() != b.frames[i].size())
      return ::testing::AssertionFailure()
             << "frame " << i << ": " << a.frames[i].size() << " bytes vs " << b.frames[i].size();
  return ::testing::AssertionSuccess();
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return s / std::max<size_t>(1, a.size());
}

std::string dit_root() { return fixtures_dir() + "/dit_qwen_image_tiny"; }

std::string dit_embeds_file(const std::string& file_name, const std::string& prefix) {
  const std::string path = temp_dir() + "/" + file_name;
  auto io = SafetensorsFile::open(dit_root() + "/io_denoise.safetensors");
  EXPECT_TRUE(io.ok()) << io.status().message();
  if (!io.ok()) return path;
  std::map<std::string, Tensor> t;
  for (const char* name : {"prompt_embeds", "prompt_embeds_mask"}) {
    auto v = (*io)->tensor(str_cat("t2i_cfg.", prefix, name));
    if (v.ok()) t[name] = v->to_dtype(DType::kF32);
  }
  EXPECT_EQ(t.count("prompt_embeds"), 1u);
  Status st = write_safetensors(path, t);
  EXPECT_TRUE(st.ok()) << st.message();
  return path;
}

}  // namespace latent::test
