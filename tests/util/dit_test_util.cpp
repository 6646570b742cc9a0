#include "tests/util/dit_test_util.h"

#include <gtest/gtest.h>

#include <utility>

#include "engine/backends/registry.h"
#include "engine/weights/config.h"
#include "tests/util/test_util.h"

namespace latent::test {

Tensor fixture_tensor(const SafetensorsFile& f, const std::string& name, bool optional) {
  auto t = f.tensor(name);
  if (!t.ok()) {
    if (!optional) ADD_FAILURE() << t.status().message();
    return Tensor();
  }
  return *t;
}

MmditInputs transformer_case_inputs(Backend& backend, const std::string& path,
                                    const std::string& case_name) {
  auto f = SafetensorsFile::open(path);
  MmditInputs in;
  if (!f.ok()) {  // a test failure, not a crash
    ADD_FAILURE() << f.status().message();
    return in;
  }
  // A missing tensor is a test failure (the mask is optional: cases without padding have none).
  auto get = [&](const char* k, bool optional = false) {
    return fixture_tensor(**f, case_name + "." + k, optional);
  };
  Tensor hs = get("hidden_states"), ehs = get("encoder_hidden_states"), t = get("timestep");
  Tensor shapes = get("img_shapes"), mask = get("encoder_hidden_states_mask", true);
  if (!hs.defined() || !ehs.defined() || !t.defined() || !shapes.defined()) return in;
  auto up_hs = backend.upload(hs), up_ehs = backend.upload(ehs);
  if (!up_hs.ok() || !up_ehs.ok()) {
    ADD_FAILURE() << (up_hs.ok() ? up_ehs.status() : up_hs.status()).message();
    return in;
  }
  in.hidden_states = *up_hs;
  in.encoder_hidden_states = *up_ehs;
  if (mask.defined()) in.encoder_hidden_states_mask = mask.to_floats();
  in.timestep = t.to_floats();
  std::vector<float> s = shapes.to_floats();
  for (size_t i = 0; i + 2 < s.size(); i += 3)
    in.img_shapes.push_back({static_cast<int64_t>(s[i]), static_cast<int64_t>(s[i + 1]),
                             static_cast<int64_t>(s[i + 2])});
  return in;
}

Tensor transformer_case_sample(const std::string& path, const std::string& case_name) {
  auto f = SafetensorsFile::open(path);
  if (!f.ok()) {
    ADD_FAILURE() << f.status().message();
    return Tensor();
  }
  auto t = (*f)->tensor(case_name + ".sample");
  if (!t.ok()) {
    ADD_FAILURE() << t.status().message();
    return Tensor();
  }
  return *t;
}

DenoiseFixture open_denoise_fixture(const std::string& name, std::shared_ptr<Backend> backend) {
  DenoiseFixture f;
  const std::string root = fixtures_dir() + "/" + name;
  f.backend = std::move(backend);
  auto io = SafetensorsFile::open(root + "/io_denoise.safetensors");
  EXPECT_TRUE(io.ok()) << io.status().message();
  if (!io.ok()) return f;
  f.io = *io;
  f.cases = nlohmann::json::parse(f.io->metadata().at("cases"));
  auto model = QwenImageMmdit::load(root, f.backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (model.ok()) f.model = std::move(model).value();
  auto cfg = Config::load(root + "/scheduler/scheduler_config.json");
  EXPECT_TRUE(cfg.ok());
  auto sched = cfg.ok() ? parse_flow_match_scheduler_config(*cfg)
                        : Result<FlowMatchSchedulerConfig>(cfg.status());
  EXPECT_TRUE(sched.ok()) << sched.status().message();
  if (sched.ok()) f.scheduler = *sched;
  return f;
}

PromptEmbeds case_embeds(const DenoiseFixture& f, const std::string& c, const std::string& prefix) {
  PromptEmbeds p;
  p.embeds = fixture_tensor(*f.io, c + "." + prefix + "prompt_embeds", true);
  Tensor m = fixture_tensor(*f.io, c + "." + prefix + "prompt_embeds_mask", true);
  if (m.defined()) p.mask = m.to_floats();
  return p;
}

DenoiseRequest case_request(const DenoiseFixture& f, const std::string& c) {
  const nlohmann::json& meta = f.cases[c];
  DenoiseRequest r;
  r.steps = meta["steps"].get<int>();
  r.true_cfg_scale = meta["true_cfg_scale"].get<float>();
  r.strength = meta["strength"].get<double>();
  r.noise = fixture_tensor(*f.io, c + ".noise");
  r.init_latents = fixture_tensor(*f.io, c + ".image_latents", true);
  for (int i = 0;; ++i) {
    Tensor ref = fixture_tensor(*f.io, str_cat(c, ".reference_latents_", i), true);
    if (!ref.defined()) break;
    r.reference_latents.push_back(ref);
  }
  r.prompt = case_embeds(f, c, "");
  r.negative = case_embeds(f, c, "negative_");
  return r;
}

namespace {

// check_backend_packing() on one backend; the packed tensor in *packed.
void pack_and_unpack(Backend& be, bool nhwc, Tensor* packed) {
  const Tensor lat = random_tensor({1, 16, 1, 6, 8}, 5);
  auto up = upload_latent(be, lat);  // as device_latent_to_tensor makes it, in the backend's dtype
  ASSERT_TRUE(up.ok()) << up.status().message();
  EXPECT_EQ(up->shape(), (Shape{1, 16, 6, 8}));
  if (nhwc) {
    EXPECT_EQ(up->layout(), Layout::kNHWC);
  }
  auto stored = be.download(*up);  // the values as the backend holds them
  ASSERT_TRUE(stored.ok());
  auto want = pack_latents(*stored);
  ASSERT_TRUE(want.ok());
  auto p = be.pack_latents(*up);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->shape(), (Shape{1, 12, 64}));
  auto got = be.download(*p);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->to_floats(), want->to_floats());
  // A row-major [1, C, 1, h, w] packs the same.
  auto up5 = be.upload(lat);
  ASSERT_TRUE(up5.ok());
  auto p5 = be.pack_latents(*up5);
  ASSERT_TRUE(p5.ok()) << p5.status().message();
  EXPECT_EQ(be.download(*p5)->to_floats(), want->to_floats());
  auto u = be.unpack_latents(*p, 6, 8);
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->shape(), (Shape{1, 16, 6, 8}));
  if (nhwc) {
    EXPECT_EQ(u->layout(), Layout::kNHWC);
  }
  EXPECT_EQ(be.download(*u)->to_floats(), stored->to_floats());
  *packed = *p;
}

}  // namespace

void check_backend_packing(const char* device, bool nhwc,
                           const std::function<void(Backend&, const Tensor&)>& more) {
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    auto b = get_backend(BackendOptions{device, dtype});
    ASSERT_TRUE(b.ok()) << b.status().message();
    Backend& be = **b;
    ASSERT_TRUE(be.supports_dit(DitOp::kPackLatents, be.compute_dtype()));
    ASSERT_TRUE(be.supports_dit(DitOp::kUnpackLatents, be.compute_dtype()));
    Tensor p;
    ASSERT_NO_FATAL_FAILURE(pack_and_unpack(be, nhwc, &p));
    more(be, p);
  }
}

}  // namespace latent::test
