// ditdenoise: output against diffusers' img2img loop (fixture) and the engine's loop run
// directly, caps refusal, property changes while playing, noise modes, edit mode, QoS drops,
// state cycling and every bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include "engine/backends/registry.h"
#include "engine/core/dtype.h"
#include "engine/models/dit/denoise.h"
#include "engine/models/dit/flow_match_scheduler.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"
#include "tests/elements/gst_test_util.h"

namespace {

using namespace gsttest;
using latent::Tensor;

::testing::Environment* const kEnv = ::testing::AddGlobalTestEnvironment(new GstEnvironment());

constexpr int kH = 8, kW = 12, kC = 16;  // the fixtures' latent: 64 x 96 pixels

std::string tiny_root() { return latent::test::fixtures_dir() + "/dit_qwen_image_tiny"; }
std::string edit_root() { return latent::test::fixtures_dir() + "/dit_qwen_image_edit_tiny"; }

std::shared_ptr<latent::SafetensorsFile> io_file(const std::string& root) {
  auto f = latent::SafetensorsFile::open(root + "/io_denoise.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : nullptr;
}

Tensor io_tensor(const std::string& root, const std::string& name) {
  auto f = io_file(root);
  if (!f) return Tensor();
  auto t = f->tensor(name);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? t->to_dtype(latent::DType::kF32) : Tensor();
}

// Writes `prefix`prompt_embeds(_mask) of a fixture case as a prompt-embeds file; returns its path.
std::string embeds_file(const std::string& root, const std::string& prefix,
                        const std::string& file_name) {
  const std::string path = latent::test::temp_dir() + "/" + file_name;
  std::map<std::string, Tensor> t = {{"prompt_embeds", io_tensor(root, prefix + "prompt_embeds")}};
  Tensor mask = io_tensor(root, prefix + "prompt_embeds_mask");
  if (mask.defined()) t["prompt_embeds_mask"] = mask;
  latent::Status s = latent::write_safetensors(path, t);
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

std::string prompt_file() { return embeds_file(tiny_root(), "t2i_cfg.", "dit_prompt.safetensors"); }
std::string negative_file() {
  return embeds_file(tiny_root(), "t2i_cfg.negative_", "dit_negative.safetensors");
}

latent::PromptEmbeds read_embeds(const std::string& path) {
  latent::PromptEmbeds p;
  auto f = latent::SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok());
  if (!f.ok()) return p;
  p.embeds = (*f)->tensor("prompt_embeds")->to_dtype(latent::DType::kF32);
  if ((*f)->find("prompt_embeds_mask")) p.mask = (*f)->tensor("prompt_embeds_mask")->to_floats();
  return p;
}

GstCaps* latent_caps(int w = kW, int h = kH, const char* space = "qwen-image", int channels = kC,
                     const char* format = "fp32") {
  return gst_caps_new_simple("application/x-latent", "format", G_TYPE_STRING, format, "channels",
                             G_TYPE_INT, channels, "width", G_TYPE_INT, w, "height", G_TYPE_INT, h,
                             "latent-space", G_TYPE_STRING, space, "frame-width", G_TYPE_INT, w * 8,
                             "frame-height", G_TYPE_INT, h * 8, "size-policy", G_TYPE_STRING, "pad",
                             "framerate", GST_TYPE_FRACTION, 30, 1, nullptr);
}

std::vector<float> random_latent(uint64_t seed, size_t n = size_t(kC) * kH * kW) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

GstBuffer* latent_buffer(const std::vector<float>& values, GstClockTime pts = 0,
                         latent::DType dtype = latent::DType::kF32) {
  GstBuffer* b =
      gst_buffer_new_allocate(nullptr, values.size() * latent::dtype_size(dtype), nullptr);
  GstMapInfo map;
  gst_buffer_map(b, &map, GST_MAP_WRITE);
  latent::convert_elements(values.data(), latent::DType::kF32, map.data, dtype, values.size());
  gst_buffer_unmap(b, &map);
  GST_BUFFER_PTS(b) = pts;
  GST_BUFFER_DURATION(b) = GST_SECOND / 30;
  return b;
}

std::vector<float> floats_of(GstBuffer* b) {
  std::vector<float> v(gst_buffer_get_size(b) / sizeof(float));
  gst_buffer_extract(b, 0, v.data(), v.size() * sizeof(float));
  return v;
}

// Pushes one frame and pulls its output ({} when the push fails).
std::vector<float> denoise_frame(GstHarness* h, const std::vector<float>& in, GstClockTime pts) {
  if (gst_harness_push(h, latent_buffer(in, pts)) != GST_FLOW_OK) return {};
  GstBuffer* out = gst_harness_pull(h);
  if (!out) return {};
  EXPECT_EQ(GST_BUFFER_PTS(out), pts);
  auto v = floats_of(out);
  gst_buffer_unref(out);
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return 1e30;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

struct Settings {
  std::string root = tiny_root();
  std::string prompt;
  std::string negative;
  int steps = 4;
  double strength = 0.6;
  double guidance = 4.0;
  uint64_t seed = 0;
  bool edit = false;
};

// The engine's loop run directly on the same input and settings.
std::vector<float> engine_run(const Settings& r, const std::vector<float>& in) {
  auto backend = latent::get_backend({"cpu", ""});
  EXPECT_TRUE(backend.ok());
  auto model = latent::QwenImageMmdit::load(r.root, *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  auto cfg = latent::Config::load(r.root + "/scheduler/scheduler_config.json");
  EXPECT_TRUE(cfg.ok());
  auto sched = latent::parse_flow_match_scheduler_config(*cfg);
  EXPECT_TRUE(sched.ok());
  if (!model.ok() || !sched.ok()) return {};
  latent::DenoiseRequest req;
  req.steps = r.steps;
  req.strength = r.strength;
  req.true_cfg_scale = float(r.guidance);
  req.seed = r.seed;
  req.prompt = read_embeds(r.prompt);
  if (!r.negative.empty()) req.negative = read_embeds(r.negative);
  Tensor x = Tensor::from_floats({1, kC, 1, kH, kW}, in);
  if (r.edit) {
    req.reference_latents = {x};
    req.height = kH;
    req.width = kW;
    req.strength = 1.0;
  } else {
    req.init_latents = x;
  }
  auto res = latent::qwen_image_denoise(**model, *sched, req);
  EXPECT_TRUE(res.ok()) << res.status().message();
  return res.ok() ? res->latents.to_floats() : std::vector<float>{};
}

GstHarness* harness_of(const Settings& r, const char* noise_mode = "fixed") {
  std::vector<std::pair<const char*, std::string>> props = {
      {"model", r.root},
      {"prompt-embeds", r.prompt},
      {"steps", std::to_string(r.steps)},
      {"strength", std::to_string(r.strength)},
      {"guidance-scale", std::to_string(r.guidance)},
      {"seed", std::to_string(r.seed)},
      {"noise-mode", noise_mode},
      {"mode", r.edit ? "edit" : "img2img"},
      {"device", "cpu"}};
  if (!r.negative.empty()) props.push_back({"negative-prompt-embeds", r.negative});
  GstHarness* h = harness_for("ditdenoise", props);
  if (h) gst_harness_set_src_caps(h, latent_caps());
  return h;
}

// --- against the references ----------------------------------------------------------------

TEST(DitDenoise, Img2ImgMatchesDiffusers) {
  // QwenImageImg2ImgPipeline: 5 steps, strength 0.6, true CFG 2.5, generator seeded 77.
  const std::string root = tiny_root();
  Settings r;
  r.prompt = embeds_file(root, "img2img.", "dit_img2img_prompt.safetensors");
  r.negative = embeds_file(root, "img2img.negative_", "dit_img2img_negative.safetensors");
  r.steps = 5;
  r.strength = 0.6;
  r.guidance = 2.5;
  r.seed = 77;
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  const std::vector<float> image = io_tensor(root, "img2img.image_latents").to_floats();
  const std::vector<float> want = io_tensor(root, "img2img.latents").to_floats();
  ASSERT_EQ(image.size(), size_t(kC) * kH * kW);
  const std::vector<float> got = denoise_frame(h, image, 0);
  float ref_max = 0;
  for (float v : want) ref_max = std::max(ref_max, std::fabs(v));
  EXPECT_LE(max_abs_diff(got, want), 1e-4 * std::max(1.f, ref_max));
  gst_harness_teardown(h);
}

TEST(DitDenoise, OutputIsTheEnginesLoop) {
  Settings r;
  r.prompt = prompt_file();
  r.negative = negative_file();
  r.steps = 4;
  r.strength = 0.75;
  r.seed = 5;
  const auto in = random_latent(1);
  const auto want = engine_run(r, in);
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want), 1e-6);
  gst_harness_teardown(h);
}

TEST(DitDenoise, Bf16LatentsRoundTripThroughFp32) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 2;
  std::vector<float> in = random_latent(2);
  for (float& v : in) v = latent::bf16_to_f32(latent::f32_to_bf16(v));
  const auto want = engine_run(r, in);
  GstHarness* h = harness_for("ditdenoise", {{"model", r.root},
                                             {"prompt-embeds", r.prompt},
                                             {"steps", "2"},
                                             {"strength", "0.6"},
                                             {"device", "cpu"}});
  ASSERT_NE(h, nullptr);
  gst_harness_set_src_caps(h, latent_caps(kW, kH, "qwen-image", kC, "bf16"));
  ASSERT_EQ(gst_harness_push(h, latent_buffer(in, 0, latent::DType::kBF16)), GST_FLOW_OK);
  GstBuffer* out = gst_harness_pull(h);
  ASSERT_NE(out, nullptr);
  ASSERT_EQ(gst_buffer_get_size(out), size_t(kC) * kH * kW * 2);
  std::vector<uint16_t> raw(size_t(kC) * kH * kW);
  gst_buffer_extract(out, 0, raw.data(), raw.size() * 2);
  double m = 0;
  for (size_t i = 0; i < raw.size(); ++i)
    m = std::max(m, double(std::fabs(latent::bf16_to_f32(raw[i]) - want[i])));
  EXPECT_LE(m, 0.02);  // bf16 rounding of values of order 1
  gst_buffer_unref(out);
  gst_harness_teardown(h);
}

// --- settings between frames -----------------------------------------------------------------

TEST(DitDenoise, PropertyChangesTakeEffectAtTheNextFrame) {
  Settings a;
  a.prompt = prompt_file();
  a.steps = 3;
  a.strength = 0.6;
  a.seed = 1;
  Settings b = a;
  b.strength = 0.9;
  b.seed = 9;
  b.prompt = negative_file();  // another prompt of the same width
  const auto in = random_latent(3);
  const auto want_a = engine_run(a, in), want_b = engine_run(b, in);
  ASSERT_GT(max_abs_diff(want_a, want_b), 1e-3);

  GstHarness* h = harness_of(a);
  ASSERT_NE(h, nullptr);
  BusWatch bw(h->element);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want_a), 1e-6);
  g_object_set(h->element, "strength", b.strength, "seed", guint64(b.seed), "prompt-embeds",
               b.prompt.c_str(), nullptr);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, GST_SECOND / 30), want_b), 1e-6);
  // Back again.
  g_object_set(h->element, "strength", a.strength, "seed", guint64(a.seed), "prompt-embeds",
               a.prompt.c_str(), nullptr);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 2 * GST_SECOND / 30), want_a), 1e-6);
  EXPECT_EQ(bw.pop_error(), "");
  gst_harness_teardown(h);
}

TEST(DitDenoise, ABadPromptFileWhilePlayingWarnsAndKeepsThePrompt) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 2;
  const auto in = random_latent(4);
  const auto want = engine_run(r, in);
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  BusWatch bw(h->element);
  const std::string missing = latent::test::temp_dir() + "/no_such_embeds.safetensors";
  g_object_set(h->element, "prompt-embeds", missing.c_str(), nullptr);
  GstMessage* m = gst_bus_timed_pop_filtered(bw.bus(), 0, GST_MESSAGE_WARNING);
  ASSERT_NE(m, nullptr);
  GError* err = nullptr;
  gst_message_parse_warning(m, &err, nullptr);
  EXPECT_TRUE(contains(err->message, missing)) << err->message;
  g_clear_error(&err);
  gst_message_unref(m);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want), 1e-6);
  gst_harness_teardown(h);
}

TEST(DitDenoise, FixedNoiseRepeatsFreshNoiseDiffers) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 2;
  r.strength = 0.8;
  r.seed = 11;
  const auto in = random_latent(5);
  {
    GstHarness* h = harness_of(r, "fixed");
    ASSERT_NE(h, nullptr);
    const auto f0 = denoise_frame(h, in, 0);
    const auto f1 = denoise_frame(h, in, GST_SECOND / 30);
    ASSERT_FALSE(f0.empty());
    EXPECT_EQ(f0, f1);
    gst_harness_teardown(h);
  }
  {
    GstHarness* h = harness_of(r, "fresh");
    ASSERT_NE(h, nullptr);
    const auto f0 = denoise_frame(h, in, 0);
    const auto f1 = denoise_frame(h, in, GST_SECOND / 30);
    EXPECT_GT(max_abs_diff(f0, f1), 1e-3);
    // Frame n draws the noise of seed + n.
    EXPECT_LE(max_abs_diff(f0, engine_run(r, in)), 1e-6);
    Settings next = r;
    next.seed = r.seed + 1;
    EXPECT_LE(max_abs_diff(f1, engine_run(next, in)), 1e-6);
    // The next frame's noise is drawn ahead (seed + 2); a new seed drops it: frame 2 draws 50 + 2.
    g_object_set(h->element, "seed", static_cast<guint64>(50), nullptr);
    const auto f2 = denoise_frame(h, in, 2 * GST_SECOND / 30);
    Settings changed = r;
    changed.seed = 52;
    EXPECT_LE(max_abs_diff(f2, engine_run(changed, in)), 1e-6);
    gst_harness_teardown(h);
  }
}

TEST(DitDenoise, StrengthZeroPassesThrough) {
  Settings r;
  r.prompt = prompt_file();
  r.strength = 0.0;
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  const auto in = random_latent(6);
  EXPECT_EQ(denoise_frame(h, in, 0), in);
  gst_harness_teardown(h);
}

// --- edit mode ------------------------------------------------------------------------------

TEST(DitDenoise, EditModeGeneratesAFrameFromTheReference) {
  Settings r;
  r.root = edit_root();
  r.prompt = embeds_file(edit_root(), "edit_cfg.", "dit_edit_prompt.safetensors");
  r.negative = embeds_file(edit_root(), "edit_cfg.negative_", "dit_edit_negative.safetensors");
  r.steps = 3;
  r.strength = 1.0;
  r.seed = 3;
  r.edit = true;
  const auto in = random_latent(7);
  const auto want = engine_run(r, in);
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  const auto got = denoise_frame(h, in, 0);
  ASSERT_EQ(got.size(), in.size());
  EXPECT_LE(max_abs_diff(got, want), 1e-6);
  // The reference matters: another frame gives another result.
  EXPECT_GT(max_abs_diff(denoise_frame(h, random_latent(8), GST_SECOND / 30), got), 1e-4);
  GstCaps* caps = output_caps(h);
  EXPECT_EQ(caps_int(gst_caps_get_structure(caps, 0), "width"), kW);
  EXPECT_EQ(caps_int(gst_caps_get_structure(caps, 0), "height"), kH);
  gst_caps_unref(caps);
  gst_harness_teardown(h);
}

TEST(DitDenoise, EditModeWithStrengthStartsFromTheFrame) {
  Settings r;
  r.root = edit_root();
  r.prompt = embeds_file(edit_root(), "edit_cfg.", "dit_edit_prompt.safetensors");
  r.steps = 4;
  r.strength = 0.5;
  r.seed = 4;
  r.edit = true;
  const auto in = random_latent(12);
  // The engine with the frame as reference and as init latents.
  auto backend = latent::get_backend({"cpu", ""});
  ASSERT_TRUE(backend.ok());
  auto model = latent::QwenImageMmdit::load(r.root, *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto cfg = latent::Config::load(r.root + "/scheduler/scheduler_config.json");
  ASSERT_TRUE(cfg.ok());
  auto sched = latent::parse_flow_match_scheduler_config(*cfg);
  ASSERT_TRUE(sched.ok());
  latent::DenoiseRequest req;
  req.steps = r.steps;
  req.strength = r.strength;
  req.seed = r.seed;
  req.prompt = read_embeds(r.prompt);
  Tensor x = Tensor::from_floats({1, kC, 1, kH, kW}, in);
  req.reference_latents = {x};
  req.init_latents = x;
  auto want = latent::qwen_image_denoise(**model, *sched, req);
  ASSERT_TRUE(want.ok()) << want.status().message();
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want->latents.to_floats()), 1e-6);
  gst_harness_teardown(h);
}

TEST(DitDenoise, ATransformerFolderFindsItsScheduler) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 3;
  const auto in = random_latent(13);
  const auto want = engine_run(r, in);
  // transformer/ of the pipeline root (scheduler/ beside it), and a copy-by-link of the
  // transformer folder alone (Qwen-Image's default scheduler config, which the fixture ships).
  const std::string alone = latent::test::temp_dir() + "/dit_transformer_alone";
  const std::string link = alone + "/transformer";
  g_mkdir_with_parents(alone.c_str(), 0755);
  unlink(link.c_str());
  ASSERT_EQ(symlink((tiny_root() + "/transformer").c_str(), link.c_str()), 0);
  for (const std::string& model : {tiny_root() + "/transformer", link}) {
    SCOPED_TRACE(model);
    Settings t = r;
    t.root = model;
    GstHarness* h = harness_of(t);
    ASSERT_NE(h, nullptr);
    EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want), 1e-6);
    gst_harness_teardown(h);
  }
}

// --- QoS -------------------------------------------------------------------------------------

TEST(DitDenoise, DropsFramesThatQosSaysAreLate) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 2;
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  BusWatch bw(h->element);
  EXPECT_TRUE(bool_property(h->element, "qos"));
  const auto in = random_latent(9);
  ASSERT_FALSE(denoise_frame(h, in, 0).empty());
  // Downstream: the frame at 1 s was 1 s late, so nothing before 2 s is worth rendering.
  ASSERT_TRUE(gst_harness_push_upstream_event(
      h, gst_event_new_qos(GST_QOS_TYPE_UNDERFLOW, 2.0, GST_SECOND, GST_SECOND)));
  EXPECT_EQ(gst_harness_push(h, latent_buffer(in, GST_SECOND + GST_SECOND / 2)), GST_FLOW_OK);
  EXPECT_EQ(gst_harness_buffers_in_queue(h), 0u) << "a late frame was denoised";
  GstMessage* m = gst_bus_timed_pop_filtered(bw.bus(), 0, GST_MESSAGE_QOS);
  ASSERT_NE(m, nullptr) << "no QoS message for the dropped frame";
  guint64 processed = 0, dropped = 0;
  GstFormat fmt;
  gst_message_parse_qos_stats(m, &fmt, &processed, &dropped);
  EXPECT_EQ(dropped, 1u);
  gst_message_unref(m);
  // A frame in time is denoised again.
  EXPECT_FALSE(denoise_frame(h, in, 3 * GST_SECOND).empty());
  gst_harness_teardown(h);
}

// --- caps and bad inputs -----------------------------------------------------------------------

TEST(DitDenoise, RefusesAnotherLatentSpace) {
  struct Case {
    const char* space;
    int channels;
  } cases[] = {{"flux1", 16}, {"sd", 4}, {"qwen-image", 4}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.space);
    Settings r;
    r.prompt = prompt_file();
    GstHarness* h = harness_for("ditdenoise", {{"model", r.root}, {"prompt-embeds", r.prompt}});
    ASSERT_NE(h, nullptr);
    BusWatch bw(h->element);
    gst_harness_set_src_caps(h, latent_caps(kW, kH, c.space, c.channels));
    // Upstream resends the refused caps with every buffer: the error is posted once.
    for (int i = 0; i < 4; ++i)
      EXPECT_NE(
          gst_harness_push(h, latent_buffer(random_latent(1, size_t(c.channels) * kH * kW))),
          GST_FLOW_OK);
    const std::string err = bw.pop_error();
    EXPECT_EQ(bw.last_domain(), GST_CORE_ERROR) << err;
    EXPECT_EQ(bw.last_code(), GST_CORE_ERROR_NEGOTIATION) << err;
    EXPECT_TRUE(contains(err, std::string("'") + c.space + "'")) << err;
    EXPECT_TRUE(contains(err, "'qwen-image'")) << err;
    EXPECT_EQ(bw.pop_error(), "") << "the refusal was posted more than once";
    gst_harness_teardown(h);
  }
}

TEST(DitDenoise, RefusesOddLatentSides) {
  Settings r;
  r.prompt = prompt_file();
  GstHarness* h = harness_for("ditdenoise", {{"model", r.root}, {"prompt-embeds", r.prompt}});
  ASSERT_NE(h, nullptr);
  BusWatch bw(h->element);
  gst_harness_set_src_caps(h, latent_caps(13, 9));
  EXPECT_NE(gst_harness_push(h, latent_buffer(random_latent(1, size_t(kC) * 13 * 9))), GST_FLOW_OK);
  const std::string err = bw.pop_error();
  EXPECT_TRUE(contains(err, "13 x 9")) << err;
  EXPECT_TRUE(contains(err, "even")) << err;
  gst_harness_teardown(h);
}

TEST(DitDenoise, ABufferOfTheWrongSizeIsAnError) {
  Settings r;
  r.prompt = prompt_file();
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  BusWatch bw(h->element);
  EXPECT_EQ(gst_harness_push(h, latent_buffer(random_latent(1, 100))), GST_FLOW_ERROR);
  const std::string err = bw.pop_error();
  EXPECT_TRUE(contains(err, "400 bytes")) << err;
  EXPECT_TRUE(contains(err, "[16, 8, 12]")) << err;
  gst_harness_teardown(h);
}

// Starts a ditdenoise with `props`; expects a resource error and returns its text.
std::string start_error(std::vector<std::pair<const char*, std::string>> props) {
  GstElement* e = gst_element_factory_make("ditdenoise", nullptr);
  for (auto& [name, value] : props) gst_util_set_object_arg(G_OBJECT(e), name, value.c_str());
  std::string err;
  {
    BusWatch bw(e);
    EXPECT_EQ(gst_element_set_state(e, GST_STATE_PLAYING), GST_STATE_CHANGE_FAILURE);
    err = bw.pop_error();
    EXPECT_EQ(bw.last_domain(), GST_RESOURCE_ERROR) << err;
  }
  EXPECT_EQ(gst_element_set_state(e, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
  gst_object_unref(e);
  return err;
}

TEST(DitDenoise, MissingModelIsAnErrorNamingThePath) {
  const std::string path = latent::test::temp_dir() + "/missing_dit";
  std::string err = start_error({{"model", path}, {"prompt-embeds", prompt_file()}});
  EXPECT_TRUE(contains(err, "ditdenoise")) << err;
  EXPECT_TRUE(contains(err, path)) << err;
  err = start_error({{"prompt-embeds", prompt_file()}});
  EXPECT_TRUE(contains(err, "no model")) << err;
  err = start_error({{"model", tiny_root()}});
  EXPECT_TRUE(contains(err, "prompt-embeds")) << err;
}

TEST(DitDenoise, BadPromptEmbedsAreErrorsNamingTheTensor) {
  const std::string dir = latent::test::temp_dir();
  // No prompt_embeds at all.
  const std::string wrong_name = dir + "/dit_wrong_name.safetensors";
  ASSERT_TRUE(
      latent::write_safetensors(
          wrong_name, {{"text_embeds", Tensor::from_floats({1, 2, 24}, std::vector<float>(48))}})
          .ok());
  std::string err = start_error({{"model", tiny_root()}, {"prompt-embeds", wrong_name}});
  EXPECT_TRUE(contains(err, "'prompt_embeds'")) << err;
  EXPECT_TRUE(contains(err, wrong_name)) << err;
  // The wrong width for this transformer (joint_attention_dim 24).
  const std::string wrong_width = dir + "/dit_wrong_width.safetensors";
  ASSERT_TRUE(
      latent::write_safetensors(
          wrong_width, {{"prompt_embeds", Tensor::from_floats({1, 2, 10}, std::vector<float>(20))}})
          .ok());
  err = start_error({{"model", tiny_root()}, {"prompt-embeds", wrong_width}});
  EXPECT_TRUE(contains(err, "joint_attention_dim")) << err;
  EXPECT_TRUE(contains(err, "[1, 2, 10]")) << err;
  // A mask that does not match.
  const std::string bad_mask = dir + "/dit_bad_mask.safetensors";
  ASSERT_TRUE(
      latent::write_safetensors(
          bad_mask, {{"prompt_embeds", Tensor::from_floats({1, 2, 24}, std::vector<float>(48))},
                     {"prompt_embeds_mask", Tensor::from_floats({1, 3}, {1, 1, 0})}})
          .ok());
  err = start_error({{"model", tiny_root()}, {"prompt-embeds", bad_mask}});
  EXPECT_TRUE(contains(err, "'prompt_embeds_mask'")) << err;
  // An integer mask (diffusers' int64) is named, not silently ignored.
  const std::string int_mask = dir + "/dit_int_mask.safetensors";
  {
    ASSERT_TRUE(
        latent::write_safetensors(
            int_mask, {{"prompt_embeds", Tensor::from_floats({1, 2, 24}, std::vector<float>(48))},
                       {"prompt_embeds_mask", Tensor::from_floats({1, 4}, {1, 0, 1, 0})}})
            .ok());
    // Same byte length: 4 fp32 = 2 int64; patch the header's dtype and shape in place.
    FILE* f = fopen(int_mask.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::string bytes(4096, '\0');
    bytes.resize(fread(&bytes[0], 1, bytes.size(), f));
    const std::string from = "\"dtype\":\"F32\",\"shape\":[1,4]";  // only the mask
    const std::string to = "\"dtype\":\"I64\",\"shape\":[1,2]";
    const size_t at = bytes.find(from);
    ASSERT_NE(at, std::string::npos) << bytes.substr(0, 200);
    fseek(f, long(at), SEEK_SET);
    fwrite(to.data(), 1, to.size(), f);
    fclose(f);
  }
  err = start_error({{"model", tiny_root()}, {"prompt-embeds", int_mask}});
  EXPECT_TRUE(contains(err, "'prompt_embeds_mask'")) << err;
  EXPECT_TRUE(contains(err, "I64")) << err;
  // Not a file; and a bad negative prompt file.
  err = start_error({{"model", tiny_root()}, {"prompt-embeds", dir + "/dit_nothing.safetensors"}});
  EXPECT_TRUE(contains(err, "dit_nothing.safetensors")) << err;
  err = start_error({{"model", tiny_root()},
                     {"prompt-embeds", prompt_file()},
                     {"negative-prompt-embeds", wrong_name}});
  EXPECT_TRUE(contains(err, "negative-prompt-embeds")) << err;
  EXPECT_TRUE(contains(err, "'prompt_embeds'")) << err;
}

TEST(DitDenoise, StateCyclingGivesTheSameFrames) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 2;
  const auto in = random_latent(10);
  GstHarness* h = harness_of(r);
  ASSERT_NE(h, nullptr);
  const auto first = denoise_frame(h, in, 0);
  ASSERT_FALSE(first.empty());
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(gst_element_set_state(h->element, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
    ASSERT_EQ(gst_element_set_state(h->element, GST_STATE_PLAYING), GST_STATE_CHANGE_SUCCESS);
    gst_harness_set_src_caps(h, latent_caps());
    EXPECT_EQ(denoise_frame(h, in, 0), first);
  }
  gst_harness_teardown(h);
}

// --- LoRAs (lora, lora-mode) -----------------------------------------------------------------

std::string lora_file(const std::string& name) {
  return latent::test::fixtures_dir() + "/dit_lora/" + name + ".safetensors";
}

// The engine's loop with LoRAs loaded (`mode` as the element's lora-mode).
std::vector<float> engine_run_lora(
    const Settings& r, const std::vector<float>& in, const std::vector<latent::LoraSpec>& loras,
    latent::LoraMode mode, const std::string& scheduler_file = "",
    latent::LinearFormat linears = latent::LinearFormat::kComputeDtype) {
  auto backend = latent::get_backend({"cpu", ""});
  EXPECT_TRUE(backend.ok());
  auto model =
      latent::QwenImageMmdit::load(r.root, *backend, latent::MmditLoras{loras, mode}, linears);
  EXPECT_TRUE(model.ok()) << model.status().message();
  auto cfg = latent::Config::load(scheduler_file.empty()
                                      ? r.root + "/scheduler/scheduler_config.json"
                                      : scheduler_file);
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  if (!cfg.ok()) return {};
  auto sched = latent::parse_flow_match_scheduler_config(*cfg);
  if (!model.ok() || !sched.ok()) return {};
  latent::DenoiseRequest req;
  req.steps = r.steps;
  req.strength = r.strength;
  req.true_cfg_scale = float(r.guidance);
  req.seed = r.seed;
  req.prompt = read_embeds(r.prompt);
  req.init_latents = Tensor::from_floats({1, kC, 1, kH, kW}, in);
  auto res = latent::qwen_image_denoise(**model, *sched, req);
  EXPECT_TRUE(res.ok()) << res.status().message();
  return res.ok() ? res->latents.to_floats() : std::vector<float>{};
}

GstHarness* lora_harness(const Settings& r, const std::string& lora, const char* mode) {
  GstHarness* h = harness_for("ditdenoise", {{"model", r.root},
                                             {"prompt-embeds", r.prompt},
                                             {"steps", std::to_string(r.steps)},
                                             {"strength", std::to_string(r.strength)},
                                             {"guidance-scale", "1"},
                                             {"lora", lora},
                                             {"lora-mode", mode},
                                             {"device", "cpu"}});
  if (h) gst_harness_set_src_caps(h, latent_caps());
  return h;
}

std::string pop_warning(BusWatch& bw) {
  GstMessage* m = gst_bus_timed_pop_filtered(bw.bus(), 0, GST_MESSAGE_WARNING);
  if (!m) return "";
  GError* err = nullptr;
  gst_message_parse_warning(m, &err, nullptr);
  std::string text = err ? err->message : "";
  g_clear_error(&err);
  gst_message_unref(m);
  return text;
}

TEST(DitDenoise, LorasMergedAndAtRunTimeAreTheEnginesLoop) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 3;
  r.guidance = 1.0;
  const auto in = random_latent(21);
  const std::vector<latent::LoraSpec> loras = {{lora_file("lora_comfyui"), 0.7f},
                                               {lora_file("lora_kohya"), -0.5f}};
  const auto want = engine_run_lora(r, in, loras, latent::LoraMode::kMerged);
  ASSERT_GT(max_abs_diff(want, engine_run(r, in)), 1e-3);  // the LoRAs matter
  const std::string text = lora_file("lora_comfyui") + ":0.7," + lora_file("lora_kohya") + ":-0.5";
  for (const char* mode : {"merged", "runtime"}) {
    SCOPED_TRACE(mode);
    GstHarness* h = lora_harness(r, text, mode);
    ASSERT_NE(h, nullptr);
    BusWatch bw(h->element);
    EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want), 1e-4);
    gchar* back = nullptr;
    g_object_get(h->element, "lora", &back, nullptr);
    EXPECT_EQ(std::string(back), lora_file("lora_comfyui") + ":0.7," + lora_file("lora_kohya") +
                                     ":-0.5");
    g_free(back);
    EXPECT_EQ(bw.pop_error(), "");
    gst_harness_teardown(h);
  }
}

TEST(DitDenoise, RuntimeLoraStrengthsChangeWhilePlaying) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 2;
  r.guidance = 1.0;
  const auto in = random_latent(22);
  const std::string comfy = lora_file("lora_comfyui");
  const auto at07 = engine_run_lora(r, in, {{comfy, 0.7f}}, latent::LoraMode::kMerged);
  const auto at15 = engine_run_lora(r, in, {{comfy, 1.5f}}, latent::LoraMode::kMerged);
  ASSERT_GT(max_abs_diff(at07, at15), 1e-3);
  GstHarness* h = lora_harness(r, comfy + ":0.7", "runtime");
  ASSERT_NE(h, nullptr);
  BusWatch bw(h->element);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), at07), 1e-4);
  g_object_set(h->element, "lora", (comfy + ":1.5").c_str(), nullptr);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, GST_SECOND / 30), at15), 1e-4);
  EXPECT_EQ(pop_warning(bw), "");
  // Another file while playing: refused with a warning, the loaded LoRA stays.
  g_object_set(h->element, "lora", (lora_file("lora_kohya") + ":1").c_str(), nullptr);
  EXPECT_TRUE(contains(pop_warning(bw), "LoRA files are loaded at start"));
  // The mode too.
  g_object_set(h->element, "lora-mode", 0, nullptr);
  EXPECT_TRUE(contains(pop_warning(bw), "lora-mode changes only in the NULL or READY state"));
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 2 * GST_SECOND / 30), at15), 1e-4);
  EXPECT_EQ(bw.pop_error(), "");
  gst_harness_teardown(h);

  // Merged: strengths are fixed while playing.
  h = lora_harness(r, comfy + ":0.7", "merged");
  ASSERT_NE(h, nullptr);
  BusWatch bw2(h->element);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), at07), 1e-4);
  g_object_set(h->element, "lora", (comfy + ":1.5").c_str(), nullptr);
  EXPECT_TRUE(contains(pop_warning(bw2), "lora-mode=merged fixes the LoRA strengths"));
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, GST_SECOND / 30), at07), 1e-4);
  gst_harness_teardown(h);
}

// A few-step schedule from `scheduler` (Qwen-Image-Lightning's config) with a Lightning LoRA.
TEST(DitDenoise, SchedulerPropertyRunsAFewStepConfig) {
  const std::string dir = latent::test::temp_dir();
  const std::string sched = dir + "/lightning_scheduler_config.json";
  {
    FILE* f = std::fopen(sched.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"base_image_seq_len": 256, "base_shift": 1.0986122886681098,
      "max_image_seq_len": 8192, "max_shift": 1.0986122886681098, "num_train_timesteps": 1000,
      "shift": 1.0, "shift_terminal": null, "time_shift_type": "exponential",
      "use_dynamic_shifting": true})",
               f);
    std::fclose(f);
  }
  Settings r;
  r.prompt = prompt_file();
  r.steps = 4;
  r.strength = 0.9;
  r.guidance = 1.0;
  const auto in = random_latent(23);
  const std::string lightning = lora_file("lora_lightning");
  const auto want =
      engine_run_lora(r, in, {{lightning, 1.f}}, latent::LoraMode::kMerged, sched);
  ASSERT_GT(max_abs_diff(want, engine_run_lora(r, in, {{lightning, 1.f}},
                                               latent::LoraMode::kMerged)),
            1e-4);  // the schedule matters
  GstHarness* h = harness_for("ditdenoise", {{"model", r.root},
                                             {"prompt-embeds", r.prompt},
                                             {"steps", "4"},
                                             {"strength", "0.9"},
                                             {"guidance-scale", "1"},
                                             {"lora", lightning},
                                             {"scheduler", sched},
                                             {"device", "cpu"}});
  ASSERT_NE(h, nullptr);
  gst_harness_set_src_caps(h, latent_caps());
  BusWatch bw(h->element);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want), 1e-4);
  EXPECT_EQ(bw.pop_error(), "");
  gst_harness_teardown(h);
  const std::string err = start_error({{"model", tiny_root()},
                                       {"prompt-embeds", prompt_file()},
                                       {"scheduler", dir + "/no_scheduler.json"},
                                       {"device", "cpu"}});
  EXPECT_TRUE(contains(err, "no_scheduler.json")) << err;
}

TEST(DitDenoise, BadLorasAreErrorsAtStart) {
  const std::string dir = latent::test::temp_dir();
  // Another model's LoRA (FLUX keys).
  const std::string flux = dir + "/flux_lora.safetensors";
  ASSERT_TRUE(latent::write_safetensors(
                  flux, {{"transformer.single_transformer_blocks.0.attn.to_q.lora_A.weight",
                          latent::test::random_tensor({4, 32}, 1)},
                         {"transformer.single_transformer_blocks.0.attn.to_q.lora_B.weight",
                          latent::test::random_tensor({32, 4}, 2)}})
                  .ok());
  std::string err = start_error({{"model", tiny_root()},
                                 {"prompt-embeds", prompt_file()},
                                 {"lora", flux + ":0.8"},
                                 {"device", "cpu"}});
  EXPECT_TRUE(contains(err, "is not a LoRA for Qwen-Image")) << err;
  EXPECT_TRUE(contains(err, "FLUX.1")) << err;
  err = start_error({{"model", tiny_root()},
                     {"prompt-embeds", prompt_file()},
                     {"lora", lora_file("lora_kohya") + ",,"},
                     {"device", "cpu"}});
  EXPECT_TRUE(contains(err, "ditdenoise: lora:")) << err;
  err = start_error({{"model", tiny_root()},
                     {"prompt-embeds", prompt_file()},
                     {"lora", dir + "/absent.safetensors"},
                     {"device", "cpu"}});
  EXPECT_TRUE(contains(err, "absent.safetensors")) << err;
}

}  // namespace

// --- dtype fp8 -------------------------------------------------------------------------------

TEST(DitDenoise, Fp8DtypeIsTheEnginesFp8LoopAndOnlyDitdenoiseTakesIt) {
  Settings r;
  r.prompt = prompt_file();
  r.steps = 2;
  r.guidance = 1.0;
  const auto in = random_latent(31);
  const auto want = engine_run_lora(r, in, {}, latent::LoraMode::kMerged, "",
                                    latent::LinearFormat::kFp8);
  ASSERT_FALSE(want.empty());
  ASSERT_GT(max_abs_diff(want, engine_run(r, in)), 1e-4);  // quantised for real
  GstHarness* h = harness_for("ditdenoise", {{"model", r.root},
                                             {"prompt-embeds", r.prompt},
                                             {"steps", "2"},
                                             {"guidance-scale", "1"},
                                             {"dtype", "fp8"},
                                             {"device", "cpu"}});
  ASSERT_NE(h, nullptr);
  gst_harness_set_src_caps(h, latent_caps());
  BusWatch bw(h->element);
  EXPECT_LE(max_abs_diff(denoise_frame(h, in, 0), want), 1e-4);
  EXPECT_EQ(bw.pop_error(), "");
  gint dtype = 0;
  g_object_get(h->element, "dtype", &dtype, nullptr);
  GEnumClass* dtypes = G_ENUM_CLASS(g_type_class_ref(g_type_from_name("GstLatentDtype")));
  GEnumValue* v = g_enum_get_value(dtypes, dtype);
  ASSERT_NE(v, nullptr);
  EXPECT_STREQ(v->value_nick, "fp8");
  g_type_class_unref(dtypes);
  gst_harness_teardown(h);

  // The VAE stages refuse it at start, naming the stage.
  GstElement* enc = gst_element_factory_make("vaeencode", nullptr);
  ASSERT_NE(enc, nullptr);
  gst_util_set_object_arg(G_OBJECT(enc), "dtype", "fp8");
  gst_util_set_object_arg(G_OBJECT(enc), "device", "cpu");
  BusWatch ebw(enc);
  EXPECT_EQ(gst_element_set_state(enc, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  const std::string err = ebw.pop_error();
  EXPECT_NE(err.find("vaeencode: dtype fp8 applies to ditdenoise"), std::string::npos) << err;
  gst_element_set_state(enc, GST_STATE_NULL);
  gst_object_unref(enc);
}

