// Every element takes a model folder in each form a user has it, through gst-launch syntax:
// here a Qwen-Image pipeline root as a partial download leaves it (vae/, transformer/,
// scheduler/ without model_index.json), for vaeencode, ditdenoise and vaedecode alike.
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "engine/weights/safetensors.h"
#include "tests/elements/gst_test_util.h"

namespace {

namespace fs = std::filesystem;
using gsttest::GstEnvironment;

::testing::Environment* const kEnv = ::testing::AddGlobalTestEnvironment(new GstEnvironment());

const std::string& fixture() {
  static const std::string root = latent::test::fixtures_dir() + "/dit_qwen_image_tiny";
  return root;
}

// A folder holding links to the fixture's `parts` and nothing else.
std::string partial_root(const std::string& name, const std::vector<std::string>& parts) {
  const std::string dir = latent::test::temp_dir() + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& p : parts) fs::create_directory_symlink(fixture() + "/" + p, dir + "/" + p);
  return dir;
}

// Runs `line` to EOS (or the first ERROR, or 120 s) and returns "" or the error.
std::string run_to_end(const std::string& line) {
  GError* error = nullptr;
  GstElement* pipeline = gst_parse_launch(line.c_str(), &error);
  if (!pipeline) {
    std::string e = error ? error->message : "parse failed";
    if (error) g_error_free(error);
    return e;
  }
  std::string err;
  if (gst_element_set_state(pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE)
    err = "cannot go to PLAYING";
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* m = gst_bus_timed_pop_filtered(
      bus, 120 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_ERROR | GST_MESSAGE_EOS));
  if (!m) {
    if (err.empty()) err = "timeout";
  } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
    GError* e = nullptr;
    gst_message_parse_error(m, &e, nullptr);
    err = std::string(GST_OBJECT_NAME(GST_MESSAGE_SRC(m))) + ": " + e->message;
    g_error_free(e);
  }
  if (m) gst_message_unref(m);
  gst_object_unref(bus);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  gst_object_unref(pipeline);
  return err;
}

// The prompt of the fixture's text-to-image case, as compute_prompt_embeds.py writes it.
std::string prompt_file() {
  const std::string path = latent::test::temp_dir() + "/roots_prompt.safetensors";
  auto io = latent::SafetensorsFile::open(fixture() + "/io_denoise.safetensors");
  EXPECT_TRUE(io.ok()) << io.status().message();
  if (!io.ok()) return path;
  auto e = (*io)->tensor("t2i_cfg.prompt_embeds");
  auto m = (*io)->tensor("t2i_cfg.prompt_embeds_mask");
  EXPECT_TRUE(e.ok() && m.ok());
  if (!e.ok() || !m.ok()) return path;
  latent::Status s =
      latent::write_safetensors(path, {{"prompt_embeds", e->to_dtype(latent::DType::kF32)},
                                       {"prompt_embeds_mask", m->to_dtype(latent::DType::kF32)}});
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

TEST(ModelRoots, PartialDownloadIsAPipelineRootForEveryElement) {
  const std::string root = partial_root("roots_partial", {"vae", "transformer", "scheduler"});
  ASSERT_FALSE(fs::exists(root + "/model_index.json"));
  const std::string line =
      "videotestsrc num-buffers=2 ! video/x-raw,width=32,height=32,framerate=10/1 ! "
      "vaeencode device=cpu model=\"" +
      root + "\" ! ditdenoise device=cpu model=\"" + root + "\" prompt-embeds=\"" + prompt_file() +
      "\" steps=2 strength=0.5 ! vaedecode device=cpu "
      "model=\"" +
      root + "\" ! fakesink";
  EXPECT_EQ(run_to_end(line), "");
}

// Only transformer/ and scheduler/ were fetched: vaeencode names the missing vae/.
TEST(ModelRoots, PartialDownloadWithoutVaeIsNamed) {
  const std::string root = partial_root("roots_novae", {"transformer", "scheduler"});
  const std::string err = run_to_end(
      "videotestsrc num-buffers=1 ! video/x-raw,width=32,height=32 ! vaeencode device=cpu "
      "model=\"" +
      root + "\" ! fakesink");
  EXPECT_NE(err.find("without a 'vae' subfolder"), std::string::npos) << err;
}

}  // namespace
