// Every VAE architecture on the CUDA backend against the diffusers fixtures
// (scripts/make_fixtures.py): fp32 within 1e-3 relative L2; bf16 within 1e-2, or, where the
// reference itself run in bf16 (`*_bf16` in the fixture) is further than that from its fp32
// output — the tiny random configurations amplify rounding (Qwen tiny decode: 0.18 in
// diffusers) — within 1.25x of the reference's own bf16 error.
// Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backends/registry.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

const bool kSkipWithoutGpu = (test::exit_without_gpu("test_cuda_models"), true);
// fp32 against diffusers' fp32 at 1e-3: exact convolutions (read when a backend is created).
// With TF32 on (the default, as in PyTorch) and cuDNN's heuristic choice, the Qwen-Image tiny
// decoder ended 1.3e-2 away on the H100 (within 1e-3 with TF32 off); the timed choice had
// passed with TF32 on, presumably by picking non-tensor-core algorithms at these tiny shapes.
const bool kNoTf32 = (setenv("LATENT_CUDA_TF32", "0", 1), true);

struct Case {
  std::string name;  // fixture folder
  std::string path;  // what to load, relative to the folder ("" = the folder itself)
};

struct Param {
  Case c;
  std::string dtype;
  double tol;
};

std::string param_name(const testing::TestParamInfo<Param>& p) {
  std::string n =
      p.param.c.name + "_" + (p.param.c.path.empty() ? "folder" : "file") + "_" + p.param.dtype;
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class CudaModel : public testing::TestWithParam<Param> {};

TEST_P(CudaModel, MatchesDiffusers) {
  const Param& p = GetParam();
  const std::string dir = test::fixtures_dir() + "/" + p.c.name;
  auto backend = get_backend(BackendOptions{"cuda", p.dtype});
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto model = load_vae(p.c.path.empty() ? dir : dir + "/" + p.c.path, *backend);
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto io = SafetensorsFile::open(dir + "/io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status().message();
  Backend& b = **backend;
  struct Dir {
    const char* in;
    const char* out;
    bool enc;
  };
  for (Dir d : {Dir{"sample", "latent_mean", true}, Dir{"latent", "decoded", false}}) {
    if (d.enc ? !(*model)->has_encoder() : !(*model)->has_decoder()) continue;
    auto in = (*io)->tensor(d.in);
    auto want = (*io)->tensor(d.out);
    ASSERT_TRUE(in.ok() && want.ok());
    auto x = b.upload(*in);
    ASSERT_TRUE(x.ok()) << x.status().message();
    auto y = d.enc ? (*model)->encode(*x) : (*model)->decode(*x);
    ASSERT_TRUE(y.ok()) << y.status().message();
    auto host = b.download(*y);
    ASSERT_TRUE(host.ok()) << host.status().message();
    ASSERT_EQ(host->shape(), want->shape());
    double err = relative_l2(*host, *want);
    double tol = p.tol;
    if (p.dtype == "bf16") {
      auto ref_bf16 = (*io)->tensor(std::string(d.out) + "_bf16");
      ASSERT_TRUE(ref_bf16.ok()) << ref_bf16.status().message()
                                 << " (regenerate the fixtures with scripts/make_fixtures.py)";
      const double ref_err = relative_l2(*ref_bf16, *want);
      tol = std::max(tol, 1.25 * ref_err);
      std::printf("%-28s %-12s bf16 rel L2 %.3e (diffusers bf16 %.3e, tolerance %.3e)\n",
                  p.c.name.c_str(), d.out, err, ref_err, tol);
    } else {
      std::printf("%-28s %-12s %-4s rel L2 %.3e\n", p.c.name.c_str(), d.out, p.dtype.c_str(), err);
    }
    EXPECT_LT(err, tol) << d.out;
  }
}

std::vector<Param> params() {
  const std::vector<Case> cases = {
      {"kl_tiny", ""},
      {"kl_tiny_bf16", ""},
      {"kl_flux_tiny", ""},
      {"tiny_taesd", ""},
      {"tiny_taesd_single", "taesd_decoder.safetensors"},
      {"tiny_taef2", "taef2.safetensors"},
      {"qwen_image_vae_tiny", ""},
      {"qwen_image_vae_tiny_single", "vae_single.safetensors"},
  };
  std::vector<Param> out;
  for (const Case& c : cases) {
    out.push_back({c, "fp32", 1e-3});
    out.push_back({c, "bf16", 1e-2});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel, testing::ValuesIn(params()), param_name);

}  // namespace
}  // namespace latent
