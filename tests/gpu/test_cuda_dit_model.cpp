// The Qwen-Image MMDiT on the CUDA backend against the diffusers fixtures of
// scripts/make_dit_fixtures.py (dit_qwen_image_tiny: text-to-image cases incl. a masked batch and
// two images in one sequence; dit_qwen_image_edit_tiny: zero_cond_t edit cases):
// fp32 within 1e-3 (TF32 matrix products: 3e-3), bf16 within 2e-2 relative L2.
// The whole denoising loop on the device (io_denoise.safetensors: t2i with true CFG, seeded t2i,
// img2img, the edit loop with zero_cond_t and two references) against the same diffusers
// latents, the latent packing ops against the host packing, and the loop's host<->device copies:
// none after the first step, none at all in a second loop with the same uploaded inputs.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "engine/models/dit/denoise.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"
#include "tests/util/dit_test_util.h"
#include "tests/util/test_util.h"

#ifdef LATENT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/backends/cuda/sdpa.h"
#endif

namespace latent {
namespace {

const bool kSkipWithoutGpu = (test::exit_without_gpu("test_cuda_dit_model"), true);

using test::case_request;
using LoopFixture = test::DenoiseFixture;

Tensor get(const SafetensorsFile& f, const std::string& name, bool optional = false) {
  return test::fixture_tensor(f, name, optional);
}

void check(const std::string& fixture, const std::vector<std::string>& cases,
           const std::string& dtype, double tolerance) {
  const std::string root = test::fixtures_dir() + "/" + fixture;
  auto backend = get_backend(BackendOptions{"cuda", dtype});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto model = QwenImageMmdit::load(root, *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(root + "/io_transformer.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  Backend& b = **backend;
  for (const std::string& c : cases) {
    SCOPED_TRACE(fixture + " " + c);
    MmditInputs in = test::transformer_case_inputs(b, root + "/io_transformer.safetensors", c);
    ASSERT_TRUE(in.hidden_states.defined());
#ifdef LATENT_HAVE_CUDA
    const cuda::SdpaCounters before = cuda::sdpa_counters();
#endif
    auto y = (*model)->forward(in);
    ASSERT_TRUE(y.ok()) << y.status().message();
#ifdef LATENT_HAVE_CUDA
    // Which attention ran (right-padded text batches: cuDNN's padding mask where it builds).
    const cuda::SdpaCounters after = cuda::sdpa_counters();
    std::printf("%-26s %-13s %s attention: %lld cuDNN (%lld with key lengths), %lld ours\n",
                fixture.c_str(), c.c_str(), dtype.c_str(), (long long)(after.cudnn - before.cudnn),
                (long long)(after.cudnn_padding - before.cudnn_padding),
                (long long)(after.fallback - before.fallback));
#endif
    auto host = b.download(*y);
    ASSERT_TRUE(host.ok()) << host.status().message();
    Tensor want = get(**io, c + ".sample");
    ASSERT_EQ(host->shape(), want.shape());
    const double err = relative_l2(*host, want);
    std::printf("%-26s %-13s %s rel L2 %.3e (tolerance %.0e)\n", fixture.c_str(), c.c_str(),
                dtype.c_str(), err, tolerance);
    EXPECT_LT(err, tolerance);
  }
}

// LoRAs on the CUDA backend (dit_lora fixtures of scripts/make_dit_lora_fixtures.py, diffusers'
// own LoRA loader): merged and at run time (the up projection through linear_add), stacked, and
// a strength change at run time equal to diffusers at that strength.
Tensor lora_forward(QwenImageMmdit& m) {
  const std::string root = test::fixtures_dir() + "/dit_qwen_image_tiny";
  Backend& b = m.backend();
  MmditInputs in =
      test::transformer_case_inputs(b, root + "/io_transformer.safetensors", "masked_batch");
  auto y = m.forward(in);
  EXPECT_TRUE(y.ok()) << y.status().message();
  if (!y.ok()) return Tensor();
  auto host = b.download(*y);
  EXPECT_TRUE(host.ok());
  return host.ok() ? *host : Tensor();
}

void check_loras(const std::string& dtype, double tolerance) {
  const std::string dir = test::fixtures_dir() + "/dit_lora/";
  auto io = SafetensorsFile::open(dir + "io_lora.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  auto backend = get_backend(BackendOptions{"cuda", dtype});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  const std::vector<LoraSpec> stack = {{dir + "lora_comfyui.safetensors", 0.7f},
                                       {dir + "lora_kohya.safetensors", -0.5f}};
  for (LoraMode mode : {LoraMode::kMerged, LoraMode::kRuntime}) {
    auto model = QwenImageMmdit::load(test::fixtures_dir() + "/dit_qwen_image_tiny", *backend,
                                      MmditLoras{stack, mode});
    ASSERT_TRUE(model.ok()) << model.status().message();
    double err = relative_l2(lora_forward(**model), get(**io, "stack.sample"));
    std::printf("LoRA stack %s %s: rel L2 %.3e\n", lora_mode_name(mode), dtype.c_str(), err);
    EXPECT_LT(err, tolerance) << lora_mode_name(mode);
    if (mode == LoraMode::kRuntime) {
      ASSERT_TRUE((*model)->set_lora_strengths({1.5f, 0.f}).ok());
      err = relative_l2(lora_forward(**model), get(**io, "comfyui_s1_5.sample"));
      std::printf("LoRA runtime strengths (1.5, 0) %s: rel L2 %.3e\n", dtype.c_str(), err);
      EXPECT_LT(err, tolerance);
    }
  }
  // Every linear layer of the blocks at run time (the Lightning layout).
  auto model = QwenImageMmdit::load(test::fixtures_dir() + "/dit_qwen_image_tiny", *backend,
                                    MmditLoras{{{dir + "lora_lightning.safetensors", 1.f}},
                                               LoraMode::kRuntime});
  ASSERT_TRUE(model.ok()) << model.status().message();
  const double err = relative_l2(lora_forward(**model), get(**io, "lightning.sample"));
  std::printf("LoRA lightning runtime %s: rel L2 %.3e\n", dtype.c_str(), err);
  EXPECT_LT(err, tolerance);
}

TEST(CudaMmditLora, MergedAndRuntimeFp32) { check_loras("fp32", 3e-3); }
TEST(CudaMmditLora, MergedAndRuntimeBf16) { check_loras("bf16", 3e-2); }

TEST(CudaMmdit, TextToImageFp32) {
  check("dit_qwen_image_tiny", {"single", "masked_batch", "multi_image"}, "fp32", 3e-3);
}
TEST(CudaMmdit, TextToImageBf16) {
  check("dit_qwen_image_tiny", {"single", "masked_batch", "multi_image"}, "bf16", 2e-2);
}
TEST(CudaMmdit, ZeroCondTEditFp32) {
  check("dit_qwen_image_edit_tiny", {"edit", "edit_batch", "edit_single"}, "fp32", 3e-3);
}
TEST(CudaMmdit, ZeroCondTEditBf16) {
  check("dit_qwen_image_edit_tiny", {"edit", "edit_batch", "edit_single"}, "bf16", 2e-2);
}

// Forward graphs (QwenImageMmdit::set_forward_graphs): the first two forwards of a shape run
// plainly, the second is recorded, later ones replay it. Replays equal the plain forward bit for
// bit, take new inputs (another timestep and latent, the CFG pattern of two text inputs
// alternating), and a runtime LoRA strength change drops the graph.
std::vector<float> host_floats(Backend& b, const Result<Tensor>& y) {
  EXPECT_TRUE(y.ok()) << y.status().message();
  if (!y.ok()) return {};
  auto h = b.download(*y);
  EXPECT_TRUE(h.ok());
  return h.ok() ? h->to_floats() : std::vector<float>{};
}

TEST(CudaMmdit, ForwardGraphReplaysEqualThePlainForward) {
  const std::string root = test::fixtures_dir() + "/dit_qwen_image_tiny";
  auto backend = get_backend(BackendOptions{"cuda", "bf16"});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  Backend& b = **backend;
  auto graphed = QwenImageMmdit::load(root, *backend);
  auto plain = QwenImageMmdit::load(root, *backend);
  ASSERT_TRUE(graphed.ok() && plain.ok());
  (*plain)->set_forward_graphs(false);
  ASSERT_TRUE((*graphed)->forward_graphs());
  // Two inputs of one shape (the masked batch and the same with other values), alternating.
  MmditInputs a =
      test::transformer_case_inputs(b, root + "/io_transformer.safetensors", "masked_batch");
  ASSERT_TRUE(a.hidden_states.defined());
  MmditInputs c = a;
  auto hs2 = b.scaled_add(a.hidden_states, a.hidden_states, -0.5f, 0.f);
  auto ehs2 = b.scaled_add(a.encoder_hidden_states, a.encoder_hidden_states, 1.5f, 0.f);
  ASSERT_TRUE(hs2.ok() && ehs2.ok());
  c.hidden_states = *hs2;
  c.encoder_hidden_states = *ehs2;
  for (float& t : c.timestep) t *= 0.25f;
  const std::vector<float> want_a = host_floats(b, (*plain)->forward(a));
  const std::vector<float> want_c = host_floats(b, (*plain)->forward(c));
  ASSERT_FALSE(want_a.empty());
  ASSERT_NE(want_a, want_c);
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(str_cat("forward ", i + 1));
    const bool odd = i % 2 == 1;
    EXPECT_EQ(host_floats(b, (*graphed)->forward(odd ? c : a)), odd ? want_c : want_a);
  }
  EXPECT_EQ((*graphed)->graph_replays(), 4) << "plain, recorded, then 4 replays";
  std::printf("forward graph: %lld replays of 6 forwards, equal to the plain forward\n",
              static_cast<long long>((*graphed)->graph_replays()));
}

TEST(CudaMmditLora, RuntimeStrengthChangeDropsTheForwardGraph) {
  const std::string root = test::fixtures_dir() + "/dit_qwen_image_tiny";
  auto backend = get_backend(BackendOptions{"cuda", "bf16"});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  Backend& b = **backend;
  const MmditLoras loras{
      {{test::fixtures_dir() + "/dit_lora/lora_comfyui.safetensors", 1.0f}}, LoraMode::kRuntime};
  auto graphed = QwenImageMmdit::load(root, *backend, loras);
  auto plain = QwenImageMmdit::load(root, *backend, loras);
  ASSERT_TRUE(graphed.ok()) << graphed.status().message();
  ASSERT_TRUE(plain.ok());
  (*plain)->set_forward_graphs(false);
  MmditInputs in =
      test::transformer_case_inputs(b, root + "/io_transformer.safetensors", "masked_batch");
  ASSERT_TRUE(in.hidden_states.defined());
  for (float strength : {1.0f, 0.25f}) {
    SCOPED_TRACE(str_cat("strength ", strength));
    ASSERT_TRUE((*graphed)->set_lora_strengths({strength}).ok());
    ASSERT_TRUE((*plain)->set_lora_strengths({strength}).ok());
    const std::vector<float> want = host_floats(b, (*plain)->forward(in));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(host_floats(b, (*graphed)->forward(in)), want) << i;
  }
  EXPECT_EQ((*graphed)->graph_replays(), 2) << "one replay per strength";
}

// ---- latent packing on the device ----------------------------------------------------------

TEST(CudaDitOps, PackAndUnpackMatchTheHostPacking) {
  // Latents [1, 16, 6, 8] in NHWC, as device_latent_to_tensor makes them.
  test::check_backend_packing("cuda", /*nhwc=*/true, [](Backend& be, const Tensor& p) {
    EXPECT_FALSE(be.unpack_latents(p, 8, 8).ok());
  });
}

// ---- the whole loop on the device ------------------------------------------------------------

LoopFixture open_loop(const std::string& fixture, const std::string& dtype) {
  auto backend = get_backend(BackendOptions{"cuda", dtype});
  EXPECT_TRUE(backend.ok()) << backend.status().message();
  if (!backend.ok()) return LoopFixture();
  return test::open_denoise_fixture(fixture, *backend);
}

void check_loop(const std::string& fixture, const std::string& c, const std::string& dtype,
                double tolerance) {
  LoopFixture f = open_loop(fixture, dtype);
  ASSERT_TRUE(f.model);
  DenoiseRequest r = case_request(f, c);
  if (c == "t2i_seed") {  // noise from the seed, as the pipeline's generator draws it
    r.noise = Tensor();
    r.height = 8;
    r.width = 12;
    r.seed = f.cases[c]["seed"].get<uint64_t>();
  }
  const Tensor want = get(*f.io, c + ".latents");
  for (bool batch : {true, false}) {
    if (!batch && !r.negative.defined()) continue;
    r.batch_cfg = batch;
    auto out = qwen_image_denoise(*f.model, f.scheduler, r);
    ASSERT_TRUE(out.ok()) << out.status().message();
    ASSERT_EQ(out->latents.shape(), want.shape());
    const double err = relative_l2(out->latents, want);
    std::printf("%-26s %-9s %s %-8s loop rel L2 %.3e (tolerance %.0e)\n", fixture.c_str(),
                c.c_str(), dtype.c_str(), batch ? "batched" : "separate", err, tolerance);
    EXPECT_LT(err, tolerance) << c << (batch ? " batched" : " separate");
  }
}

TEST(CudaDenoiseLoop, TextToImageFp32) {
  check_loop("dit_qwen_image_tiny", "t2i_cfg", "fp32", 3e-3);
  check_loop("dit_qwen_image_tiny", "t2i_seed", "fp32", 3e-3);
}
TEST(CudaDenoiseLoop, TextToImageBf16) {
  check_loop("dit_qwen_image_tiny", "t2i_cfg", "bf16", 2e-2);
  check_loop("dit_qwen_image_tiny", "t2i_seed", "bf16", 2e-2);
}
TEST(CudaDenoiseLoop, Img2ImgFp32) { check_loop("dit_qwen_image_tiny", "img2img", "fp32", 3e-3); }
TEST(CudaDenoiseLoop, Img2ImgBf16) { check_loop("dit_qwen_image_tiny", "img2img", "bf16", 2e-2); }
TEST(CudaDenoiseLoop, ZeroCondTEditFp32) {
  check_loop("dit_qwen_image_edit_tiny", "edit_cfg", "fp32", 3e-3);
}
TEST(CudaDenoiseLoop, ZeroCondTEditBf16) {
  check_loop("dit_qwen_image_edit_tiny", "edit_cfg", "bf16", 2e-2);
}

// Host<->device copies of the loop on the device, inputs uploaded ahead: none after the first
// step (the first uploads the rotary table and the text key mask; the timestep projections go up
// before it), none at all in a second loop with the same inputs, and never a download.
void check_transfers(const std::string& fixture, const std::string& c, bool batch_cfg) {
  SCOPED_TRACE(fixture + " " + c + (batch_cfg ? " batched" : " separate"));
  LoopFixture f = open_loop(fixture, "bf16");
  ASSERT_TRUE(f.model);
  Backend& be = *f.backend;
  DenoiseRequest r = case_request(f, c);
  auto prompts = upload_denoise_prompts(*f.model, r.prompt, r.negative, batch_cfg);
  ASSERT_TRUE(prompts.ok()) << prompts.status().message();
  DeviceDenoiseRequest d;
  d.steps = r.steps;
  d.strength = r.strength;
  d.true_cfg_scale = r.true_cfg_scale;
  d.prompts = &*prompts;
  auto noise = upload_latent(be, r.noise);
  ASSERT_TRUE(noise.ok());
  d.noise = *noise;
  if (r.init_latents.defined()) d.init_latents = *upload_latent(be, r.init_latents);
  for (const Tensor& ref : r.reference_latents)
    d.reference_latents.push_back(*upload_latent(be, ref));
  ASSERT_TRUE(be.synchronize().ok());
  Tensor first_result;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    reset_transfer_counts();
    std::vector<TransferCounts> at_step;
    int total = 0;  // the steps that run (img2img: the last strength x steps of the schedule)
    auto out = qwen_image_denoise_on_backend(*f.model, f.scheduler, d, [&](int, int n) {
      at_step.push_back(transfer_counts());
      total = n;
      return true;
    });
    ASSERT_TRUE(out.ok()) << out.status().message();
    const TransferCounts end = transfer_counts();
    ASSERT_GT(total, 0);
    ASSERT_LE(total, r.steps);
    ASSERT_EQ(at_step.size(), static_cast<size_t>(total));
    std::printf(
        "%s %s run %d: %lld uploads (%lld bytes) before the end of step 1, %lld after; "
        "%lld downloads\n",
        fixture.c_str(), c.c_str(), run, (long long)at_step[0].host_to_device,
        (long long)at_step[0].host_to_device_bytes,
        (long long)(end.host_to_device - at_step[0].host_to_device), (long long)end.device_to_host);
    for (size_t k = 1; k < at_step.size(); ++k) {
      EXPECT_EQ(at_step[k].host_to_device, at_step[0].host_to_device) << "step " << k + 1;
      EXPECT_EQ(at_step[k].device_to_host, 0) << "step " << k + 1;
    }
    EXPECT_EQ(end.host_to_device, at_step[0].host_to_device);
    EXPECT_EQ(end.device_to_host, 0);
    // The timestep projections, then a rotary table and a key mask per text length (two with
    // separate CFG passes; a right-padded prompt alone is cut and needs no mask) and cuDNN's key
    // lengths for a batch of two: only the first time.
    EXPECT_LE(end.host_to_device, run == 0 ? 5 : 0);
    auto host = be.download(out->latents);
    ASSERT_TRUE(host.ok());
    if (run == 0) {
      first_result = *host;
    } else {
      EXPECT_EQ(host->to_floats(), first_result.to_floats()) << "same inputs, same latents";
    }
  }
}

TEST(CudaDenoiseLoop, NoHostDeviceCopiesAfterTheInputsAreUploaded) {
  check_transfers("dit_qwen_image_tiny", "t2i_cfg", true);
  check_transfers("dit_qwen_image_tiny", "img2img", false);
  check_transfers("dit_qwen_image_edit_tiny", "edit_cfg", true);
}

#ifdef LATENT_HAVE_CUDA
// A latent in device memory (as vaeencode leaves it in a CUDA buffer) through the loop and back
// into device memory: the same latents as the host form, with no copy to or from the host.
TEST(CudaDenoiseLoop, DeviceLatentInDeviceLatentOut) {
  LoopFixture f = open_loop("dit_qwen_image_tiny", "bf16");
  ASSERT_TRUE(f.model);
  Backend& be = *f.backend;
  DenoiseRequest r = case_request(f, "img2img");
  auto host = qwen_image_denoise(*f.model, f.scheduler, r);
  ASSERT_TRUE(host.ok()) << host.status().message();
  // The image latent as a bf16 [16, 8, 12] device buffer.
  const Tensor image = r.init_latents.to_dtype(DType::kBF16);
  void* in = nullptr;
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, image.nbytes()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, image.nbytes()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in, image.data(), image.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
  auto prompts = upload_denoise_prompts(*f.model, r.prompt, r.negative);
  ASSERT_TRUE(prompts.ok());
  DeviceDenoiseRequest d;
  d.steps = r.steps;
  d.strength = r.strength;
  d.true_cfg_scale = r.true_cfg_scale;
  d.prompts = &*prompts;
  d.noise = *upload_latent(be, r.noise);
  ASSERT_TRUE(be.synchronize().ok());
  reset_transfer_counts();
  auto x = device_latent_to_tensor(be, in, DType::kBF16, 16, 8, 12);
  ASSERT_TRUE(x.ok()) << x.status().message();
  d.init_latents = *x;
  auto result = qwen_image_denoise_on_backend(*f.model, f.scheduler, d);
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_TRUE(tensor_to_device_latent(be, result->latents, out, DType::kBF16).ok());
  EXPECT_EQ(transfer_counts().device_to_host, 0);
  EXPECT_EQ(transfer_counts().host_to_device, 0) << "the loop's tables went up in the host form";
  Tensor got = Tensor::empty({1, 16, 1, 8, 12}, DType::kBF16);
  ASSERT_EQ(cudaMemcpy(got.data(), out, got.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  const double err = relative_l2(got, host->latents);
  std::printf("device latent in/out vs host form: rel L2 %.3e\n", err);
  EXPECT_LT(err, 1e-3);  // the same bf16 image and noise, the same ops: the same latents
  cudaFree(in);
  cudaFree(out);
}
#endif

}  // namespace
}  // namespace latent
