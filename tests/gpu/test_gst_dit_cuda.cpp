// ditdenoise between vaeencode and vaedecode with latents in CUDA memory (elements/gstlatentcuda.h)
// on the Qwen-Image fixture pipeline: the loop runs on the device, latents are read and written in
// place, and the engine's host<->device copies are counted: none for a latent, none at all once
// the first frame has been denoised (frames in CUDA memory too), and the same frames as with
// system-memory latents. Set-up and runs: tests/util/gst_cuda_test_util.h. Exits 77 (skipped)
// without a GPU.
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "engine/core/status.h"
#include "tests/util/gst_cuda_test_util.h"

namespace latent {
namespace {

using test::dit_root;
using test::mean_abs_diff;
using test::PipelineRun;
// Counters reset at `element`.`pad`: enc/sink, before anything of the first frame; dit/src, once
// the first frame is denoised, which also uploaded the prompt, the noise and the loop's tables.
using test::run_counted;
using test::same_frame_sizes;

// The prompt-embeds file (`prefix` "negative_": the negative one, for CFG).
std::string embeds_file(const char* prefix) {
  return test::dit_embeds_file(str_cat("gst_dit_cuda_", prefix, "embeds.safetensors"), prefix);
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

// Neighbours that change state before a stage (downstream ones) ask it for GStreamer's CUDA
// context: every stage, ditdenoise included (it shares the VAE stages' base class), answers before
// start() with the primary context of the device its `device` property names.
TEST(GstDitCuda, EveryStageAnswersContextQueriesForItsPlannedDevice) {
  for (const char* stage : {"vaeencode", "vaedecode", "ditdenoise"}) {
    for (const char* device : {"cuda:0", "auto"}) {
      GstElement* e = gst_element_factory_make(stage, nullptr);
      ASSERT_NE(e, nullptr) << stage;
      g_object_set(e, "device", device, nullptr);
      for (const char* pad_name : {"sink", "src"}) {
        GstPad* pad = gst_element_get_static_pad(e, pad_name);
        GstQuery* q = gst_query_new_context("gst.cuda.context");
        EXPECT_TRUE(gst_pad_query(pad, q)) << stage << " " << device << " " << pad_name;
        GstContext* ctx = nullptr;
        gst_query_parse_context(q, &ctx);
        EXPECT_NE(ctx, nullptr) << stage << " " << device << " " << pad_name;
        gst_query_unref(q);
        gst_object_unref(pad);
      }
      gst_object_unref(e);
    }
  }
}

TEST(GstDitCuda, CudaLatentsGiveTheFramesOfSystemMemoryLatentsWithoutLatentCopies) {
  PipelineRun dev = run_counted(dit_pipeline(false, kCudaLatents, ""), "enc", "sink");
  PipelineRun sys = run_counted(dit_pipeline(false, kSystemLatents, ""), "enc", "sink");
  ASSERT_TRUE(same_frame_sizes(dev, sys, size_t(kFrames)));
  for (int i = 0; i < kFrames; ++i) {
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
    PipelineRun r = run_counted(dit_pipeline(true, kCudaLatents, o), "dit", "src");
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
  PipelineRun r = run_counted(dit_pipeline(true, kCudaLatents, "noise-mode=fresh"), "dit", "src");
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_EQ(r.frames.size(), size_t(kFrames));
  EXPECT_EQ(r.counts.host_to_device, kFrames - 1);  // frames 2.. draw their noise on the host
  EXPECT_EQ(r.counts.host_to_device_bytes, (kFrames - 1) * int64_t(16 * 8 * 12 * 4));
  EXPECT_EQ(r.counts.device_to_host, 0);
}

}  // namespace
}  // namespace latent

int main(int argc, char** argv) {
  return latent::test::gst_gpu_test_main("test_gst_dit_cuda", argc, argv);
}
