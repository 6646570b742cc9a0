// ditdenoise between vaeencode and vaedecode with latents in CUDA memory (elements/gstlatentcuda.h)
// on the Qwen-Image fixture pipeline: the loop runs on the device, latents are read and written in
// place, and the engine's host<->device copies are counted: none for a latent, none at all once
// the first frame has been denoised (frames in CUDA memory too), and the same frames as with
// system-memory latents. Set-up follows tests/gpu/test_gst_cuda.cpp. Exits 77 (skipped) without a
// GPU.
#include <dlfcn.h>
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace {

// Skip the whole binary without a GPU, before gtest starts.
const bool kHaveGpu = [] {
  if (latent::cuda_device_count() == 0) {
    std::fprintf(stderr, "test_gst_dit_cuda: no CUDA device, skipping\n");
    std::exit(77);
  }
#ifdef LATENT_PLUGIN_DIR
  setenv("GST_PLUGIN_PATH_1_0", LATENT_PLUGIN_DIR, 0);  // ctest runs; the device sets its own
#endif
  return true;
}();

}  // namespace

namespace latent {
namespace {

// The engine's transfer counters as the plugin sees them (the plugin carries its own copy of the
// engine: read through its symbols, plus this binary's).
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

struct CountedRun {
  bool ok = false;
  std::string error;
  std::vector<std::vector<uint8_t>> frames;
  TransferCounts counts;  // from the reset to EOS
};

void on_handoff(GstElement*, GstBuffer* buf, GstPad*, gpointer data) {
  auto* r = static_cast<CountedRun*>(data);
  GstMapInfo m;
  if (gst_buffer_map(buf, &m, GST_MAP_READ)) {
    r->frames.emplace_back(m.data, m.data + m.size);
    gst_buffer_unmap(buf, &m);
  }
}

// Runs `description` with the counters reset when the first buffer passes pad `pad` of element
// `element` (enc/sink: before anything of the first frame; dit/src: once the first frame is
// denoised, which also uploaded the prompt, the noise and the loop's tables). Without queues the
// whole pipeline runs on one streaming thread, so nothing of a later frame has run by then.
CountedRun run_counted(const std::string& description, const char* element, const char* pad) {
  CountedRun r;
  static const PluginCounters counters;
  EXPECT_TRUE(counters.ok()) << "the latent plugin's transfer counters were not found";
  if (!counters.ok()) return r;
  struct Hook {
    const PluginCounters* c;
    bool armed = true;
  } hook{&counters};
  GError* err = nullptr;
  GstElement* p = gst_parse_launch(description.c_str(), &err);
  if (!p) {
    r.error = err ? err->message : "parse failed";
    g_clear_error(&err);
    return r;
  }
  GstElement* e = gst_bin_get_by_name(GST_BIN(p), element);
  GstPad* probe_pad = e ? gst_element_get_static_pad(e, pad) : nullptr;
  EXPECT_TRUE(probe_pad) << element << "." << pad;
  if (probe_pad) {
    gst_pad_add_probe(
        probe_pad, GST_PAD_PROBE_TYPE_BUFFER,
        [](GstPad*, GstPadProbeInfo*, gpointer data) -> GstPadProbeReturn {
          auto* h = static_cast<Hook*>(data);
          if (h->armed) h->c->clear();
          h->armed = false;
          return GST_PAD_PROBE_OK;
        },
        &hook, nullptr);
    gst_object_unref(probe_pad);
  }
  if (e) gst_object_unref(e);
  GstElement* sink = gst_bin_get_by_name(GST_BIN(p), "out");
  g_object_set(sink, "signal-handoffs", TRUE, nullptr);
  g_signal_connect(sink, "handoff", G_CALLBACK(on_handoff), &r);
  gst_element_set_state(p, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(p);
  GstMessage* msg = gst_bus_timed_pop_filtered(bus, 120 * GST_SECOND,
                                               GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  r.counts = counters.read();
  if (msg && GST_MESSAGE_TYPE(msg) == GST_MESSAGE_EOS) {
    r.ok = true;
  } else if (msg) {
    GError* ge = nullptr;
    gchar* dbg = nullptr;
    gst_message_parse_error(msg, &ge, &dbg);
    r.error = str_cat(ge ? ge->message : "error", " (", dbg ? dbg : "", ")");
    g_clear_error(&ge);
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

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return s / std::max<size_t>(1, a.size());
}

// The Qwen-Image fixture pipeline (VAE, transformer) and a prompt-embeds file (with a negative
// one for CFG) written from its reference inputs.
std::string dit_root() { return test::fixtures_dir() + "/dit_qwen_image_tiny"; }
std::string embeds_file(const char* prefix) {
  const std::string path =
      str_cat(test::temp_dir(), "/gst_dit_cuda_", prefix, "embeds.safetensors");
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

constexpr int kFrames = 3;

// videotestsrc ! [cudaupload] ! vaeencode ! <latent caps> ! ditdenoise ! <latent caps> !
// vaedecode ! [cudadownload] ! fakesink, all stages on the GPU (64x96: an 8x12 latent).
std::string dit_pipeline(bool cuda_frames, const char* latent_caps, const std::string& options) {
  const std::string vae = dit_root() + "/vae";
  return str_cat("videotestsrc num-buffers=", kFrames,
                 " pattern=smpte ! video/x-raw,format=RGBA,width=96,height=64,framerate=30/1 ! ",
                 cuda_frames ? "cudaupload ! video/x-raw(memory:CUDAMemory) ! " : "",
                 "vaeencode name=enc model=", vae, " device=cuda ! ", latent_caps,
                 " ! ditdenoise name=dit model=", dit_root(), " prompt-embeds=", embeds_file(""),
                 " steps=2 strength=0.6 seed=7 device=cuda ", options, " ! ", latent_caps,
                 " ! vaedecode model=", vae, " device=cuda ! ",
                 cuda_frames ? "video/x-raw(memory:CUDAMemory),format=RGBA ! cudadownload ! " : "",
                 "video/x-raw,format=RGBA ! fakesink name=out sync=false");
}

constexpr const char* kCudaLatents = "application/x-latent(memory:CUDAMemory)";
constexpr const char* kSystemLatents = "application/x-latent(memory:SystemMemory)";

TEST(GstDitCuda, CudaLatentsGiveTheFramesOfSystemMemoryLatentsWithoutLatentCopies) {
  CountedRun dev = run_counted(dit_pipeline(false, kCudaLatents, ""), "enc", "sink");
  CountedRun sys = run_counted(dit_pipeline(false, kSystemLatents, ""), "enc", "sink");
  ASSERT_TRUE(dev.ok) << dev.error;
  ASSERT_TRUE(sys.ok) << sys.error;
  ASSERT_EQ(dev.frames.size(), size_t(kFrames));
  ASSERT_EQ(sys.frames.size(), size_t(kFrames));
  for (int i = 0; i < kFrames; ++i) {
    ASSERT_EQ(dev.frames[i].size(), sys.frames[i].size());
    // bf16 latents either way, read and written exactly: the same loop on the same values.
    const double d = mean_abs_diff(dev.frames[i], sys.frames[i]);
    std::printf("frame %d: mean |cuda latents - system latents| = %.3f levels\n", i, d);
    EXPECT_LE(d, 1.0) << "frame " << i;
  }
  std::printf("cuda latents: %lld uploads, %lld downloads; system latents: %lld, %lld\n",
              (long long)dev.counts.host_to_device, (long long)dev.counts.device_to_host,
              (long long)sys.counts.host_to_device, (long long)sys.counts.device_to_host);
  // With CUDA latents the only downloads are vaedecode's frames to system memory.
  EXPECT_EQ(dev.counts.device_to_host, kFrames);
  const int64_t frame_bytes = int64_t(96) * 64 * 4;
  EXPECT_EQ(dev.counts.device_to_host_bytes, kFrames * frame_bytes);
  // System-memory latents: each latent leaves the GPU after vaeencode and after ditdenoise.
  EXPECT_EQ(sys.counts.device_to_host, 3 * kFrames);
  // Uploads: each frame, then (first frame only) the prompt, the fixed noise, the timestep
  // projections, the rotary table and at most a key mask; system-memory latents add two a frame.
  EXPECT_LE(dev.counts.host_to_device, kFrames + 5);
  EXPECT_EQ(sys.counts.host_to_device - dev.counts.host_to_device, 2 * kFrames);
}

TEST(GstDitCuda, NothingCrossesAfterTheFirstFrameWithFramesInCudaMemory) {
  for (const char* options :
       {"", "mode=edit strength=1", "negative-prompt-embeds=NEG guidance-scale=3"}) {
    SCOPED_TRACE(options);
    std::string o = options;
    const size_t neg = o.find("NEG");
    if (neg != std::string::npos) o.replace(neg, 3, embeds_file("negative_"));
    CountedRun r = run_counted(dit_pipeline(true, kCudaLatents, o), "dit", "src");
    ASSERT_TRUE(r.ok) << r.error;
    ASSERT_EQ(r.frames.size(), size_t(kFrames));
    std::printf("%s: %lld uploads, %lld downloads after the first frame\n", options,
                (long long)r.counts.host_to_device, (long long)r.counts.device_to_host);
    // Frames, latents, prompt, noise, schedule tables: all on the GPU already.
    EXPECT_EQ(r.counts.host_to_device, 0);
    EXPECT_EQ(r.counts.device_to_host, 0);
  }
}

TEST(GstDitCuda, FreshNoiseUploadsOneNoiseAFrameAndNothingElse) {
  CountedRun r = run_counted(dit_pipeline(true, kCudaLatents, "noise-mode=fresh"), "dit", "src");
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.frames.size(), size_t(kFrames));
  EXPECT_EQ(r.counts.host_to_device, kFrames - 1);  // frames 2.. draw their noise on the host
  EXPECT_EQ(r.counts.host_to_device_bytes, (kFrames - 1) * int64_t(16 * 8 * 12 * 4));
  EXPECT_EQ(r.counts.device_to_host, 0);
}

}  // namespace
}  // namespace latent

int main(int argc, char** argv) {
  (void)kHaveGpu;
  gst_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
