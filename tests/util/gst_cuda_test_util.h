// Helpers shared by the GPU tests that drive the elements through GStreamer
// (tests/gpu/test_gst_cuda.cpp, test_gst_dit_cuda.cpp): the set-up before gtest, pipelines played
// to EOS with the frames of their sink collected, the engine's host<->device copies counted as
// the plugin sees them, and the Qwen-Image fixture's prompt embeddings as a file.
#pragma once

#include <gst/gst.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backends/frames.h"

namespace latent::test {

// The main() of such a test. Before gtest starts: exits 77 (skipped) without a GPU, and points
// GStreamer at the built plugin (LATENT_PLUGIN_DIR) unless GST_PLUGIN_PATH_1_0 is set already
// (ctest runs; the device sets its own). Then gst_init and the tests.
int gst_gpu_test_main(const char* test_name, int argc, char** argv);

// What reached the fakesink named "out" of a pipeline played to EOS.
struct PipelineRun {
  bool ok = false;  // EOS within two minutes
  std::string error;
  std::vector<std::vector<uint8_t>> frames;
  std::vector<GstClockTime> pts;
  std::vector<std::string> memory;  // each buffer's first memory's type ("SystemMemory", ...)
  GstClockTime latency_min = GST_CLOCK_TIME_NONE;  // run_pipeline() only
  TransferCounts counts;                           // run_counted() only: from the reset to EOS
};

// Plays `description` and asks the sink's peer for its latency at EOS.
PipelineRun run_pipeline(const std::string& description);

// Plays `p` (made by the caller, who keeps it) until EOS or an ERROR, at most `timeout`, then
// sets it back to NULL: "" at EOS, else the error's message or "timeout".
std::string play_to_end(GstElement* p, GstClockTime timeout);

// Plays `description` with the engine's transfer counters (the plugin's and this binary's)
// reset when the first buffer passes pad `pad` of element `element`. Without queues the whole
// pipeline runs on one streaming thread, so nothing of a later frame has run by then.
PipelineRun run_counted(const std::string& description, const char* element, const char* pad);

// Both runs reached EOS with `frames` frames each, frame i of the same size in both.
::testing::AssertionResult same_frame_sizes(const PipelineRun& a, const PipelineRun& b,
                                            size_t frames);

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);

// The Qwen-Image fixture pipeline (VAE, transformer): tests/fixtures/dit_qwen_image_tiny.
std::string dit_root();
// A prompt-embeds file <temp dir>/<file_name> written from the fixture's reference inputs of
// case t2i_cfg: `prefix` "" for the prompt, "negative_" for the negative one (for CFG).
std::string dit_embeds_file(const std::string& file_name, const std::string& prefix);

}  // namespace latent::test
