// Planned VAE parts on the CUDA backend (engine/models/vae/planned_vae.h): for every fixture
// VAE, both parts, at two input shapes, a plan captured as a CUDA graph gives the same output as
// the plain forward, and new input data replayed through the same graph gives the new output.
// New buffers are poisoned with NaN (LATENT_CUDA_POISON), so an output the graph leaves unwritten
// fails. Also: the cuDNN algorithm and fused-graph engine choices land in the on-disk plan cache
// ($LATENT_PLAN_CACHE, here a temporary folder). Exits 77 (skipped) without a GPU.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#ifdef LATENT_HAVE_CUDA
#include "engine/backends/cuda/conv2d.cuh"
#include "engine/backends/cuda/cuda_backend.h"
#endif
#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "engine/core/log.h"
#include "engine/core/plan_cache.h"
#include "engine/models/vae/planned_vae.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

const std::string& plan_dir() {
  static const std::string dir = test::temp_dir() + "/plan-cache";
  return dir;
}

const bool kSkipWithoutGpu = [] {
  test::exit_without_gpu("test_cuda_graphs");
  // Before any backend exists: both are read when a backend is created.
  setenv("LATENT_CUDA_POISON", "1", 1);
  setenv("LATENT_PLAN_CACHE", plan_dir().c_str(), 1);
  setenv("LATENT_CUDNN_SEARCH", "timed", 1);  // only timed choices go to the plan cache
  // the fused graphs' engines timed for 2-D convolutions too (by default only for 3-D ones)
  setenv("LATENT_CUDNN_FUSED_TUNE", "4", 1);
  return true;
}();

struct Case {
  std::string name;  // fixture folder
  std::string path;  // what to load, relative to the folder ("" = the folder itself)
};

struct Param {
  Case c;
  std::string dtype;
};

std::string param_name(const testing::TestParamInfo<Param>& p) {
  std::string n = p.param.c.name + "_" + p.param.dtype;
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class CudaGraphs : public testing::TestWithParam<Param> {};

TEST_P(CudaGraphs, ReplayMatchesPlainForward) {
  const Param& p = GetParam();
  const std::string dir = test::fixtures_dir() + "/" + p.c.name;
  auto backend = get_backend(BackendOptions{"cuda", p.dtype});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  Backend& b = **backend;
  ASSERT_TRUE(b.supports_capture());
  auto model = load_vae(p.c.path.empty() ? dir : dir + "/" + p.c.path, *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  VaeModel& m = **model;
  auto io = SafetensorsFile::open(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();

  PlanOptions options;
  options.require_graph = true;
  uint64_t seed = 1;
  for (VaePart part : {VaePart::kEncode, VaePart::kDecode}) {
    if (part == VaePart::kEncode ? !m.has_encoder() : !m.has_decoder()) continue;
    auto fixture_in = (*io)->tensor(part == VaePart::kEncode ? "sample" : "latent");
    ASSERT_TRUE(fixture_in.ok()) << fixture_in.status().message();
    const Shape base = fixture_in->shape();
    // The second shape: not square, and larger by whole latent pixels.
    const int64_t step = part == VaePart::kEncode ? m.downsample() : 1;
    const std::vector<Shape> shapes = {base,
                                       {base[0], base[1], base[2] + 2 * step, base[3] + step}};
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(str_cat(vae_part_name(part), " ", shape_str(shape)));
      auto example = b.upload(test::random_tensor(shape, seed++));
      ASSERT_TRUE(example.ok()) << example.status().message();
      auto plan = PlannedPart::build(m, part, *example, options);
      ASSERT_TRUE(plan.ok()) << plan.status().message();
      ASSERT_TRUE((*plan)->uses_graph());
      std::vector<Tensor> outputs;
      for (int run = 0; run < 3; ++run) {
        const Tensor host_in = test::random_tensor(shape, seed++);
        auto x = b.upload(host_in);
        ASSERT_TRUE(x.ok()) << x.status().message();
        auto plain = part == VaePart::kEncode ? m.encode(*x) : m.decode(*x);
        ASSERT_TRUE(plain.ok()) << plain.status().message();
        auto want = b.download(*plain);
        ASSERT_TRUE(want.ok()) << want.status().message();
        auto y = (*plan)->run(*x);
        ASSERT_TRUE(y.ok()) << y.status().message();
        EXPECT_EQ(y->shape(), (*plan)->output_shape());
        auto got = b.download(*y);
        ASSERT_TRUE(got.ok()) << got.status().message();
        ASSERT_EQ(got->shape(), want->shape());
        const double err = relative_l2(*got, *want);
        EXPECT_TRUE(err < 1e-5) << "run " << run << ": graph vs plain forward rel L2 " << err;
        outputs.push_back(*got);
      }
      // Different inputs through the same graph give different outputs.
      for (size_t i = 1; i < outputs.size(); ++i)
        EXPECT_GT(relative_l2(outputs[i], outputs[0]), 1e-3) << "run " << i << " repeats run 0";
      // The wrong shape is refused, not run.
      auto wrong =
          b.upload(test::random_tensor({shape[0], shape[1], shape[2] + 2 * step, shape[3]}, 7));
      ASSERT_TRUE(wrong.ok());
      EXPECT_FALSE((*plan)->run(*wrong).ok());
    }
  }

  // A planner keeps one plan per (part, shape).
  VaePlanner planner(m, options);
  const VaePart part = m.has_decoder() ? VaePart::kDecode : VaePart::kEncode;
  auto fixture_in = (*io)->tensor(part == VaePart::kEncode ? "sample" : "latent");
  ASSERT_TRUE(fixture_in.ok());
  auto x = b.upload(*fixture_in);
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(planner.run(part, *x).ok());
  ASSERT_TRUE(planner.run(part, *x).ok());
  EXPECT_EQ(planner.size(), 1u);
}

// The TAESD-size fixture on a CUDA backend of `dtype` (the plans' frame-loop and memory tests);
// model null (with the failure reported) when it does not load.
struct TinyTaesd {
  std::shared_ptr<Backend> backend;
  std::unique_ptr<VaeModel> model;
};
TinyTaesd tiny_taesd(const char* dtype) {
  TinyTaesd t;
  auto backend = get_backend(BackendOptions{"cuda", dtype});
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return t;
  auto model = load_vae(test::fixtures_dir() + "/tiny_taesd", *backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return t;
  t.backend = *backend;
  t.model = std::move(model).value();
  return t;
}

// The elements' loop with plans: each frame's decoded image is the plan's fixed output buffer,
// consumed by the download stager's conversion kernel (queued on the same stream) before the
// next replay overwrites it. Several frames in flight must each come back as their own frame,
// (to a level) what the plain forward + tensor_to_frame() give, and the zero examples made
// without a host transfer plan both parts.
TEST(CudaGraphsInTheFrameLoop, DownloadsOfReplayedOutputsAreEachTheirOwnFrame) {
  const TinyTaesd t = tiny_taesd("bf16");
  ASSERT_TRUE(t.model);
  Backend& b = *t.backend;
  VaeModel& m = *t.model;
  auto g = plan_frame_geometry(72, 40, m.downsample(), SizePolicy::kPad);
  ASSERT_TRUE(g.ok());
  reset_transfer_counts();
  auto zi = zero_image_tensor(b, *g);
  auto zl = zero_latent_tensor(b, m.latent_space().channels, g->latent_height(), g->latent_width());
  ASSERT_TRUE(zi.ok() && zl.ok());
  EXPECT_EQ(transfer_counts().host_to_device, 0);
  PlanOptions options;
  options.require_graph = true;
  auto enc = PlannedPart::build(m, VaePart::kEncode, *zi, options);
  auto dec = PlannedPart::build(m, VaePart::kDecode, *zl, options);
  ASSERT_TRUE(enc.ok()) << enc.status().message();
  ASSERT_TRUE(dec.ok()) << dec.status().message();
  auto made = create_frame_downloader(b, 3);
  ASSERT_TRUE(made.ok() && *made);
  std::unique_ptr<FrameDownloader> downloader = std::move(*made);
  const size_t row = 72 * 4;
  // A 72x40 RGBA frame in `bytes`.
  auto rgba_frame = [&](std::vector<uint8_t>& bytes) {
    FrameDesc d;
    d.format = FrameFormat::kRGBA;
    d.width = 72;
    d.height = 40;
    d.planes[0] = bytes.data();
    d.strides[0] = row;
    return d;
  };
  std::vector<std::vector<uint8_t>> got, want;
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 4; ++i) {
    const Tensor host_in = test::random_tensor({1, 3, g->model_height(), g->model_width()}, 40 + i);
    auto x = b.upload(host_in);
    ASSERT_TRUE(x.ok());
    auto lat = (*enc)->run(*x);
    ASSERT_TRUE(lat.ok()) << lat.status().message();
    auto y = (*dec)->run(*lat);  // the decoder's fixed output buffer
    ASSERT_TRUE(y.ok()) << y.status().message();
    auto t = downloader->queue(*y, *g, FrameFormat::kRGBA);
    ASSERT_TRUE(t.ok()) << t.status().message();
    tickets.push_back(*t);
    // The reference: the plain forward, written directly.
    auto plain_lat = m.encode(*x);
    ASSERT_TRUE(plain_lat.ok());
    auto plain = m.decode(*plain_lat);
    ASSERT_TRUE(plain.ok());
    want.emplace_back(row * 40);
    ASSERT_TRUE(tensor_to_frame(b, *plain, *g, rgba_frame(want.back())).ok());
  }
  for (size_t i = 0; i < tickets.size(); ++i) {
    got.emplace_back(row * 40);
    ASSERT_TRUE(downloader->fetch(tickets[i], rgba_frame(got.back())).ok());
    int worst = 0;  // identical expected; a rounding edge may flip one level
    for (size_t k = 0; k < got[i].size(); ++k)
      worst = std::max(worst, std::abs(int(got[i][k]) - int(want[i][k])));
    EXPECT_LE(worst, 1) << "frame " << i;
    if (i > 0) {
      EXPECT_NE(got[i], got[i - 1]) << "frame " << i << " repeats the one before";
    }
  }
}

// A plan's memory (issue 13: peak device memory): the pool memory the plain runs before the
// capture used is handed back instead of staying reserved under the graph, the graph's buffers
// come from one arena laid out by their recorded lifetimes, and replays take nothing more.
TEST(CudaGraphsMemory, TheWarmUpsPoolMemoryIsNotKeptUnderTheGraph) {
  const TinyTaesd t = tiny_taesd("fp32");
  ASSERT_TRUE(t.model);
  Backend& b = *t.backend;
  VaeModel& m = *t.model;
  // Large enough that the activations (tens of MB each) dwarf the pool's allocation granularity.
  auto x = b.upload(test::random_tensor({1, 3, 1024, 2048}, 3));
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(b.synchronize().ok());
  b.reset_peak_memory();
  const Backend::MemoryUse before = b.memory_use();
  ASSERT_GE(before.in_use, 0) << "the CUDA backend reports its memory";
  PlanOptions options;
  options.require_graph = true;
  auto plan = PlannedPart::build(m, VaePart::kEncode, *x, options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE(b.synchronize().ok());
  // The warm-up's working set: the most the pool had in use beyond what was there before.
  const int64_t warm_up = b.peak_memory_bytes() - before.in_use;
  const Backend::MemoryUse planned = b.memory_use();
  ASSERT_GT(warm_up, int64_t{64} << 20) << "the input should need more than 64 MB of activations";
  // Held beyond what is in use (the graph's memory and the plan's buffers count as in use): the
  // pool's leftovers. Before the trim this was the whole warm-up working set.
  const int64_t idle = planned.held - planned.in_use;
  EXPECT_LT(idle, warm_up / 4) << "held " << planned.held << ", in use " << planned.in_use
                               << ", warm-up working set " << warm_up;
  // What the plan keeps (the arena its buffers were laid out in by lifetime, the cuDNN workspace,
  // its input and output) is about one plain run's working set, not more (the graph allocator's
  // own layout held ~30 % more for the TAESD-size decoder at 1080p).
  EXPECT_LE(planned.in_use - before.in_use, warm_up + warm_up / 10)
      << "the plan keeps " << (planned.in_use - before.in_use) << " bytes, a plain run needed "
      << warm_up;
  // Replays do not grow: three more have the peak and the held memory of one.
  b.reset_peak_memory();
  ASSERT_TRUE((*plan)->run(*x).ok());
  ASSERT_TRUE(b.synchronize().ok());
  const int64_t one = b.peak_memory_bytes(), held_one = b.memory_use().held;
  b.reset_peak_memory();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*plan)->run(*x).ok());
  ASSERT_TRUE(b.synchronize().ok());
  EXPECT_LE(b.peak_memory_bytes(), one + (int64_t{1} << 20));
  EXPECT_LE(b.memory_use().held, held_one + (int64_t{1} << 20));
}

// cuBLASLt's split-K workspace of the unfused mid-block attention (the FLUX.1 decoder's at 720p:
// 14,400 tokens of d = 512, 12.4 MB on an H200) is a buffer of its call, in a plan's forward
// (allocations recorded, later served from the graph's arena) and outside one: nothing of it
// stays in use after the call. Kept by the backend, it sat under the plan's later peak
// (+11 / +15 MB over torch.compile at 720p / 1088p, issue 13): before the fix this kept
// 12,976,384 bytes outside a plan on an H200.
TEST(CudaGraphsMemory, AttentionWorkspaceIsABufferOfItsCallInAPlan) {
  auto made = get_backend(BackendOptions{"cuda", "bf16"});
  ASSERT_TRUE(made.ok()) << made.status().message();
  Backend& b = **made;
  const Shape shape = {1, 512, 90, 160};
  auto q = b.upload(test::random_tensor(shape, 31));
  auto k = b.upload(test::random_tensor(shape, 32));
  auto v = b.upload(test::random_tensor(shape, 33));
  ASSERT_TRUE(q.ok() && k.ok() && v.ok());
  ASSERT_TRUE(b.synchronize().ok());
  const int64_t out_bytes = shape_numel(shape) * 2;
  // Bytes still in use after one call beyond its output (which is alive here).
  auto kept = [&](bool recorded) -> int64_t {
    const int64_t before = b.memory_use().in_use;
    if (recorded) b.record_allocations(true);
    Result<Tensor> y = b.spatial_attention(*q, *k, *v, 1);
    if (recorded) {
      b.record_allocations(false);
      b.record_allocations(true);  // leave no recording behind
      b.record_allocations(false);
    }
    EXPECT_TRUE(y.ok()) << y.status().message();
    EXPECT_TRUE(b.synchronize().ok());
    return b.memory_use().in_use - before - out_bytes;
  };
  const int64_t plain = kept(false);
  const int64_t in_plan = kept(true);
  std::printf(
      "  attention [1, 512, 90x160] bf16: kept after a call %lld bytes outside a plan, "
      "%lld in a plan's forward\n",
      static_cast<long long>(plain), static_cast<long long>(in_plan));
  EXPECT_LT(plain, int64_t{1} << 20) << "the attention kept its workspace";
  EXPECT_LT(in_plan, int64_t{1} << 20) << "the plan's forward kept its workspace";
}

// PlanOptions::adopt_input: the example is the graph's input buffer. An input written into it
// (on the stream, after the previous run was queued) runs with no copy and gives what the plain
// forward gives; the plan keeps no input-sized buffer of its own, so it holds one input less than
// a plan with a copy of the example.
TEST(CudaGraphsMemory, AnAdoptedInputIsReadInPlace) {
  const TinyTaesd t = tiny_taesd("bf16");
  ASSERT_TRUE(t.model);
  Backend& b = *t.backend;
  VaeModel& m = *t.model;
  const Shape shape = {1, 3, 512, 768};
  auto example = b.upload(test::random_tensor(shape, 11));
  ASSERT_TRUE(example.ok());
  PlanOptions options;
  options.require_graph = true;
  ASSERT_TRUE(b.synchronize().ok());
  const int64_t before_copying = b.memory_use().in_use;
  auto copying = PlannedPart::build(m, VaePart::kEncode, *example, options);
  ASSERT_TRUE(copying.ok()) << copying.status().message();
  ASSERT_TRUE(b.synchronize().ok());
  const int64_t kept_copying = b.memory_use().in_use - before_copying;
  copying->reset();
  ASSERT_TRUE(b.synchronize().ok());
  options.adopt_input = true;
  const int64_t before_adopting = b.memory_use().in_use;
  auto plan = PlannedPart::build(m, VaePart::kEncode, *example, options);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_TRUE((*plan)->uses_graph());
  ASSERT_TRUE(b.synchronize().ok());
  const int64_t kept_adopting = b.memory_use().in_use - before_adopting;
  EXPECT_EQ((*plan)->input().data(), example->data()) << "the example is the input buffer";
  const int64_t input_bytes =
      shape_numel(shape) * static_cast<int64_t>(dtype_size(b.compute_dtype()));
  EXPECT_LE(kept_adopting, kept_copying - input_bytes + (int64_t{1} << 20))
      << "adopting kept " << kept_adopting << " bytes, copying " << kept_copying;
  for (int run = 0; run < 3; ++run) {
    auto x = b.upload(test::random_tensor(shape, 20 + run));
    ASSERT_TRUE(x.ok());
    auto plain = m.encode(*x);
    ASSERT_TRUE(plain.ok()) << plain.status().message();
    auto want = b.download(*plain);
    ASSERT_TRUE(want.ok());
    ASSERT_TRUE(b.copy_into(*x, (*plan)->input()).ok());  // the caller fills the input buffer
    auto y = (*plan)->run((*plan)->input());
    ASSERT_TRUE(y.ok()) << y.status().message();
    auto got = b.download(*y);
    ASSERT_TRUE(got.ok());
    EXPECT_LT(relative_l2(*got, *want), 1e-5) << "run " << run;
  }
}

std::vector<Param> params() {
  const std::vector<Case> cases = {
      {"kl_tiny", ""},
      {"kl_flux_tiny", ""},
      {"tiny_taesd", ""},
      {"tiny_taef2", "taef2.safetensors"},
      {"qwen_image_vae_tiny", ""},
  };
  std::vector<Param> out;
  for (const Case& c : cases) {
    out.push_back({c, "fp32"});
    out.push_back({c, "bf16"});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraphs, testing::ValuesIn(params()), param_name);

// The plan file of this process's GPU and libraries in $LATENT_PLAN_CACHE (there must be one),
// parsed; its path in *path.
nlohmann::json read_plan_file(std::string* path) {
  std::vector<std::string> files;
  if (DIR* d = opendir(plan_dir().c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("cuda-plans-", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json")
        files.push_back(plan_dir() + "/" + n);
    }
    closedir(d);
  }
  EXPECT_EQ(files.size(), 1u) << "one GPU, one cuDNN: one file in " << plan_dir();
  if (files.empty()) return nlohmann::json();
  *path = files[0];
  std::ifstream in(files[0]);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << files[0];
  return j.is_discarded() ? nlohmann::json() : j;
}

// Timed convolution algorithms are written to $LATENT_PLAN_CACHE, under this GPU's and these
// libraries' context, one entry per convolution shape. Self-contained: two shapes no other test
// uses, so the result does not depend on which tests ran before in this process.
TEST(CudaPlanCache, ConvChoicesAreSaved) {
  auto backend = get_backend(BackendOptions{"cuda", "bf16"});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  Backend& b = **backend;
  auto x = b.upload(test::random_tensor({1, 24, 37, 41}, 11));
  auto w = b.upload(test::random_tensor({40, 24, 3, 3}, 12));
  auto x2 = b.upload(test::random_tensor({1, 40, 29, 33}, 13));
  auto w2 = b.upload(test::random_tensor({24, 40, 3, 3}, 14));
  ASSERT_TRUE(x.ok() && w.ok() && x2.ok() && w2.ok());
  auto y = b.conv2d(*x, *w, Tensor(), Conv2dParams::same(3));
  ASSERT_TRUE(y.ok()) << y.status().message();
  auto y2 = b.conv2d(*x2, *w2, Tensor(), Conv2dParams::same(3));
  ASSERT_TRUE(y2.ok()) << y2.status().message();
  Status s = b.save_plans();
  ASSERT_TRUE(s.ok()) << s.message();

  std::string file;
  const nlohmann::json j = read_plan_file(&file);
  ASSERT_TRUE(j.is_object());
  EXPECT_FALSE(j["context"]["gpu"].get<std::string>().empty());
  EXPECT_FALSE(j["context"]["cudnn"].get<std::string>().empty());
  const std::string key = "conv2d bf16 tf32=1 x=1,24,37,41 w=40,3,3 pad=1,1 stride=1";
  ASSERT_TRUE(j["entries"].contains(key)) << j["entries"].dump(1);
  EXPECT_TRUE(j["entries"][key]["algo"].is_number_integer());
  const std::string key2 = "conv2d bf16 tf32=1 x=1,40,29,33 w=24,3,3 pad=1,1 stride=1";
  EXPECT_TRUE(j["entries"].contains(key2)) << j["entries"].dump(1);
  EXPECT_GE(j["entries"].size(), 2u);
  // The file loads back under the same context (what the next process does).
  PlanCache again(file, j["context"].get<PlanCache::Context>());
  EXPECT_EQ(again.load(), j["entries"].size());
}

#ifdef LATENT_HAVE_CUDA
// One 3x3 convolution (+ bias [+ residual `hr`], ReLU) through a fresh backend, as the next
// process would make it (get_backend would return the first again, its plans in memory): it must
// run as a fused graph; its output into *out, the backend's plan choices saved.
void run_fused_on_fresh_backend(const Tensor& hx, const Tensor& hw, const Tensor& hb,
                                const Tensor* hr, Tensor* out) {
  auto backend = create_cuda_backend(0, DType::kBF16);
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  Backend& b = **backend;
  auto x = b.upload(hx);
  auto w = b.upload(hw);
  auto bias = b.upload(hb);
  ASSERT_TRUE(x.ok() && w.ok() && bias.ok());
  Tensor residual;
  if (hr) {
    auto r = b.upload(*hr);
    ASSERT_TRUE(r.ok()) << r.status().message();
    residual = *r;
  }
  const int64_t before = cuda::ConvPlanCache::fused_calls();
  auto y = b.conv2d(*x, *w, *bias, Conv2dParams::same(3), residual, Activation::kReLU);
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_EQ(cuda::ConvPlanCache::fused_calls() - before, 1) << "not run as a fused graph";
  auto host = b.download(*y);
  ASSERT_TRUE(host.ok()) << host.status().message();
  *out = *host;
  Status st = b.save_plans();
  ASSERT_TRUE(st.ok()) << st.message();
}
#endif

// The engine chosen by timing cuDNN's candidates for a fused convolution graph (conv_fused.cpp)
// is saved in the plan cache, and a later backend (the next process) takes it without timing:
// the same engine, so the same bytes. A shape no other test uses.
TEST(CudaPlanCache, FusedEngineChoicesAreSavedAndTakenAgain) {
#ifndef LATENT_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (!cuda::ConvPlanCache::fusion_available())
    GTEST_SKIP() << "built without cudnn-frontend: no fused convolutions";
  // 128 channels: a shape cuDNN's fused graphs serve on every GPU (on a Hopper GPU 64 -> 64 runs on
  // our strip kernel, 96 -> 96 on the halo tile, neither with an engine to choose).
  const Tensor hx = test::random_tensor({1, 128, 45, 52}, 21);
  const Tensor hw = test::random_tensor({128, 128, 3, 3}, 22, -0.05f, 0.05f);
  const Tensor hb = test::random_tensor({128}, 23);
  auto run = [&](Tensor* out) { run_fused_on_fresh_backend(hx, hw, hb, nullptr, out); };
  Tensor first, second;
  ASSERT_NO_FATAL_FAILURE(run(&first));
  std::string file;
  const nlohmann::json j = read_plan_file(&file);
  ASSERT_TRUE(j.is_object());
  const std::string key =
      "conv fused bf16 x[1, 128, 45, 52] * w[128, 128, 3, 3] stride 1 pad 1/1 + "
      "bias, ReLU";
  ASSERT_TRUE(j["entries"].contains(key)) << j["entries"].dump(1);
  const nlohmann::json& e = j["entries"][key];
  ASSERT_TRUE(e["engine"].is_string()) << e.dump();
  EXPECT_GE(e["candidates"].get<int>(), 2) << e.dump();
  EXPECT_GT(e["ms"].get<double>(), 0.0) << e.dump();
  ASSERT_NO_FATAL_FAILURE(run(&second));
  ASSERT_EQ(first.nbytes(), second.nbytes());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.nbytes()), 0)
      << "the second backend's output differs from the first's: not the saved engine (" << e.dump()
      << ")";
#endif
}

// LATENT_CUDNN_KEEP_COMPILED=1: a fused graph whose engine cuDNN compiles while planning (a
// residual add) goes to the plan cache's blobs once its engine is settled, and a later backend
// (a fresh one, as the next process makes) loads it instead of compiling it: the same bytes.
// With the engines timed (this binary's LATENT_CUDNN_FUSED_TUNE=4): backend 1 times and saves
// its choice, backend 2 builds that engine alone and keeps it, backend 3 loads it.
TEST(CudaPlanCache, CompiledFusedPlansAreKeptAndLoaded) {
#ifndef LATENT_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (!cuda::ConvPlanCache::fusion_available())
    GTEST_SKIP() << "built without cudnn-frontend: no fused convolutions";
  // The log's lines and the setting, restored on every way out of the test (an ASSERT returns
  // early; the callback must not outlive `log`).
  struct Log {
    std::vector<std::string> lines;
    Log() {
      setenv("LATENT_CUDNN_KEEP_COMPILED", "1", 1);  // read when a backend is made
      set_log_level(LogLevel::kInfo);
      set_log_callback([](LogLevel, const char*, int, const char* message,
                          void* user) { static_cast<Log*>(user)->lines.push_back(message); },
                       this);
    }
    ~Log() {
      set_log_callback(nullptr, nullptr);
      set_log_level(LogLevel::kWarning);
      unsetenv("LATENT_CUDNN_KEEP_COMPILED");
    }
  } log;
  const Tensor hx = test::random_tensor({1, 128, 37, 41}, 31);
  const Tensor hw = test::random_tensor({128, 128, 3, 3}, 32, -0.05f, 0.05f);
  const Tensor hb = test::random_tensor({128}, 33);
  const Tensor hr = test::random_tensor({1, 128, 37, 41}, 34);
  const std::string what =
      "x[1, 128, 37, 41] * w[128, 128, 3, 3] stride 1 pad 1/1 + bias + residual";
  auto run = [&](Tensor* out) { run_fused_on_fresh_backend(hx, hw, hb, &hr, out); };
  auto said = [&](const std::string& a, const std::string& b) {
    for (const std::string& l : log.lines)
      if (l.find(what) != std::string::npos && l.find(a) != std::string::npos &&
          l.find(b) != std::string::npos)
        return true;
    return false;
  };
  Tensor first, second, third;
  ASSERT_NO_FATAL_FAILURE(run(&first));
  log.lines.clear();
  ASSERT_NO_FATAL_FAILURE(run(&second));
  const bool kept = said("compiled plan kept", "bytes in ");
  log.lines.clear();
  ASSERT_NO_FATAL_FAILURE(run(&third));
  const bool loaded = said(": loaded in ", "the plan kept in");
  std::string all;
  for (const std::string& l : log.lines) all += l + "\n";
  ASSERT_EQ(first.nbytes(), second.nbytes());
  ASSERT_EQ(first.nbytes(), third.nbytes());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.nbytes()), 0);
  EXPECT_EQ(std::memcmp(first.data(), third.data(), first.nbytes()), 0)
      << "the loaded plan's output differs from the compiled one's";
  if (!kept)
    GTEST_SKIP() << "cuDNN's engine for " << what << " is not compiled while planning here: "
                 << "nothing to keep";
  EXPECT_TRUE(loaded) << "the third backend did not load the kept plan; its log:\n" << all;
#endif
}

}  // namespace
}  // namespace latent
