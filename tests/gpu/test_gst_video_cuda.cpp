// vaeencode / vaedecode in video mode on the GPU: device=cuda against device=cpu (the tiny Wan VAE
// and TAEW2.1, clips that are and are not 1 + 4k frames), frames and latents in CUDA memory
// against system memory, and device memory that does not grow with the clip's length. Exits 77
// (skipped) without a GPU.
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/util/gst_cuda_test_util.h"
#include "tests/util/test_util.h"

#ifdef LATENT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace latent {
namespace {

using test::mean_abs_diff;
using test::PipelineRun;
using test::run_pipeline;
using test::same_frame_sizes;

std::string wan() { return test::fixtures_dir() + "/wan_vae_video_tiny"; }
std::string taew() { return test::fixtures_dir() + "/taew2_1_tiny/taew2_1.safetensors"; }

constexpr int kW = 96, kH = 64;

std::string source(int frames, const char* format = "RGB") {
  return str_cat("videotestsrc num-buffers=", frames, " pattern=ball ! video/x-raw,format=", format,
                 ",width=", kW, ",height=", kH, ",framerate=30/1 ! ");
}

std::string round_trip(const std::string& model, const char* device, int frames) {
  return str_cat(source(frames), "vaeencode model=\"", model, "\" mode=video device=", device,
                 " ! vaedecode name=dec model=\"", model, "\" device=", device,
                 " ! video/x-raw,format=RGB ! fakesink name=out sync=false");
}

// mode=auto streams a causal video VAE in video mode on CUDA too: 5 frames are 1 + 4, two latents.
// (Video mode once stalled here after the first frame: its output pool was never activated.)
TEST(GstCudaVideo, AutoModeStreamsVideoOnCuda) {
  for (const char* latents :
       {"application/x-latent(memory:CUDAMemory)", "application/x-latent(memory:SystemMemory)"}) {
    SCOPED_TRACE(latents);
    PipelineRun r =
        run_pipeline(str_cat(source(5), "vaeencode model=\"", wan(), "\" device=cuda ! ", latents,
                             " ! fakesink name=out sync=false"));
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.frames.size(), 2u);
  }
}

TEST(GstCudaVideo, EncodeDecodeOnTheGpuMatchesTheCpu) {
  for (const std::string& model : {wan(), taew()}) {
    for (int frames : {1, 5, 7}) {
      SCOPED_TRACE(str_cat(model, ", ", frames, " frames"));
      PipelineRun gpu = run_pipeline(round_trip(model, "cuda", frames));
      PipelineRun cpu = run_pipeline(round_trip(model, "cpu", frames));
      ASSERT_TRUE(same_frame_sizes(gpu, cpu, size_t(frames)));
      EXPECT_EQ(gpu.pts, cpu.pts);
      for (int i = 0; i < frames; ++i) {
        // bf16 activations through a whole (tiny) causal VAE against fp32.
        EXPECT_LE(mean_abs_diff(gpu.frames[i], cpu.frames[i]), 6.0) << "frame " << i;
      }
    }
  }
}

TEST(GstCudaVideo, CudaFramesAndLatentsMatchSystemMemory) {
  const int frames = 6;
  const std::string stages = str_cat("vaeencode model=\"", wan(), "\" mode=video device=cuda ! ",
                                     "application/x-latent(memory:CUDAMemory) ! vaedecode model=\"",
                                     wan(), "\" device=cuda ! ");
  PipelineRun dev = run_pipeline(
      source(frames, "NV12") + "cudaupload ! video/x-raw(memory:CUDAMemory) ! " + stages +
      "video/x-raw(memory:CUDAMemory),format=RGBA ! cudadownload ! video/x-raw,format=RGBA ! "
      "fakesink name=out sync=false");
  PipelineRun sys = run_pipeline(
      source(frames, "NV12") +
      str_cat("vaeencode model=\"", wan(), "\" mode=video device=cuda ! ",
              "application/x-latent(memory:SystemMemory) ! vaedecode model=\"", wan(),
              "\" device=cuda ! video/x-raw,format=RGBA ! fakesink name=out sync=false"));
  if (!dev.ok && (dev.error.find("cudaupload") != std::string::npos ||
                  dev.error.find("no element") != std::string::npos))
    GTEST_SKIP() << "GStreamer's CUDA elements are missing: " << dev.error;
  ASSERT_TRUE(same_frame_sizes(dev, sys, size_t(frames)));
  for (int i = 0; i < frames; ++i)
    EXPECT_LE(mean_abs_diff(dev.frames[i], sys.frames[i]), 1.0) << "frame " << i;
}

// Video mode stages each frame (CUDA memory and system memory alike) and converts it at once;
// prefetch-depth=0 reads the frames in turn instead. Both give the same bytes.
TEST(GstCudaVideo, StagedFramesChangeNoByte) {
  const int frames = 9;
  auto line = [&](bool device_frames, const char* depth) {
    return str_cat(source(frames, "NV12"),
                   device_frames ? "cudaupload ! video/x-raw(memory:CUDAMemory) ! " : "",
                   "vaeencode model=\"", wan(), "\" mode=video device=cuda prefetch-depth=", depth,
                   " ! application/x-latent ! fakesink name=out sync=false");
  };
  for (bool device_frames : {false, true}) {
    SCOPED_TRACE(device_frames ? "CUDA memory" : "system memory");
    PipelineRun staged = run_pipeline(line(device_frames, "2"));
    if (device_frames && !staged.ok && (staged.error.find("cudaupload") != std::string::npos ||
                                        staged.error.find("no element") != std::string::npos))
      GTEST_SKIP() << "GStreamer's CUDA elements are missing: " << staged.error;
    PipelineRun in_turn = run_pipeline(line(device_frames, "0"));
    ASSERT_TRUE(staged.ok) << staged.error;
    ASSERT_TRUE(in_turn.ok) << in_turn.error;
    ASSERT_EQ(staged.frames.size(), 3u);  // 1 + 4 + 4 frames
    EXPECT_EQ(staged.frames, in_turn.frames);
    EXPECT_EQ(staged.pts, in_turn.pts);
  }
}

#ifdef LATENT_HAVE_CUDA
// The most device memory in use (cudaMemGetInfo) seen as decoded frames pass.
GstPadProbeReturn track_used(GstPad*, GstPadProbeInfo*, gpointer data) {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    auto* peak = static_cast<size_t*>(data);
    *peak = std::max(*peak, total - free);
  }
  return GST_PAD_PROBE_OK;
}

size_t peak_used(int frames) {
  const std::string line = str_cat(
      "videotestsrc num-buffers=", frames, " ! video/x-raw,format=RGB,width=256,height=256 ! ",
      "vaeencode model=\"", wan(), "\" mode=video device=cuda ! vaedecode name=dec model=\"", wan(),
      "\" device=cuda ! fakesink sync=false");
  GstElement* p = gst_parse_launch(line.c_str(), nullptr);
  EXPECT_NE(p, nullptr);
  if (!p) return 0;
  size_t peak = 0;
  GstElement* dec = gst_bin_get_by_name(GST_BIN(p), "dec");
  GstPad* pad = gst_element_get_static_pad(dec, "src");
  gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, track_used, &peak, nullptr);
  gst_object_unref(pad);
  gst_object_unref(dec);
  EXPECT_EQ(test::play_to_end(p, 300 * GST_SECOND), "");
  gst_object_unref(p);
  return peak;
}

TEST(GstCudaVideo, DeviceMemoryDoesNotGrowWithTheClip) {
  const size_t short_clip = peak_used(50);
  const size_t long_clip = peak_used(500);
  // Caches and one chunk: 450 more 256x256 frames (768 KiB each as fp32) would add > 300 MiB.
  // The allowance is two of the pool's 32 MiB growth steps (cudaMemGetInfo counts what the pool
  // reserves): on an H200 the 500-frame run once ended exactly one step above the 50-frame one.
  EXPECT_LT(long_clip, short_clip + (64u << 20))
      << "peak device memory in use: " << (short_clip >> 20) << " MiB for 50 frames, "
      << (long_clip >> 20) << " MiB for 500";
}
#endif

}  // namespace
}  // namespace latent

int main(int argc, char** argv) {
  return latent::test::gst_gpu_test_main("test_gst_video_cuda", argc, argv);
}
