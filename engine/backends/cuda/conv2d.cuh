// 2-D convolution through cuDNN on NHWC tensors and KRSC filters.
//
// bf16 / fp16 convolutions of 32 channels and more go through cuDNN's graph API with their
// epilogue fused (forward_fused, conv_fused.cpp), the rest through the convolution API:
// a plan (descriptors, algorithm, workspace size) is built once per shape, dtype and padding,
// with cuDNN's heuristic choice of algorithm (LATENT_CUDNN_SEARCH=timed: timing cuDNN's
// candidates on the first call, cudnnFindConvolutionForwardAlgorithmEx), and kept in a map.
// cuDNN only pads symmetrically: the caller zero-pads the input explicitly for the rest.
// video: with kt > 1 the same plans run a 3-D convolution over the frames of one clip (NDHWC
// input [1][d][h][w][c], KTRSC filter, valid in time), for Backend::conv3d_frames().
#pragma once

#include <cudnn.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "engine/backends/backend.h"  // Activation
#include "engine/backends/cuda/memory.h"
#include "engine/core/dtype.h"
#include "engine/core/plan_cache.h"  // plans
#include "engine/core/status.h"

namespace latent::cuda {

struct ConvShape {
  int n = 0, c = 0, h = 0, w = 0;  // input (after any explicit padding)
  int k = 0, r = 0, s = 0;         // output channels, filter height and width
  int pad_h = 0, pad_w = 0;        // symmetric padding cuDNN applies
  // More zero padding at the bottom / right than pad_h / pad_w (diffusers' downsamplers pad
  // (0, 1, 0, 1)): only forward_fused() takes it, as the graph's post-padding (2-D only).
  int extra_b = 0, extra_r = 0;
  int stride = 1;
  DType dtype = DType::kF32;
  int d = 1, kt = 1;  // video: input frames and temporal taps (kt > 1: a 3-D convolution, n = 1)

  int out_h() const { return (h + 2 * pad_h + extra_b - r) / stride + 1; }
  int out_w() const { return (w + 2 * pad_w + extra_r - s) / stride + 1; }
  int out_d() const { return d - kt + 1; }
  auto key() const {
    return std::make_tuple(n, c, h, w, k, r, s, pad_h, pad_w, extra_b, extra_r, stride, dtype, d,
                           kt);
  }
  bool operator<(const ConvShape& o) const { return key() < o.key(); }
};

// "bf16 x[1, 128, 64, 64] * w[128, 128, 3, 3] stride 1 pad 1/1" (with "(3-D)" for video).
std::string describe(const ConvShape& s);

// What a fused convolution adds to conv(x, w) before writing y (conv_fused.cpp):
// y = act(conv(x, w) + bias + residual), each part optional (null: absent).
struct ConvEpilogue {
  const void* bias = nullptr;      // [k], in the convolution's dtype
  const void* residual = nullptr;  // laid out like y
  Activation act = Activation::kNone;
};

class ConvPlanCache {
 public:
  // `tf32`: let fp32 convolutions use TF32 tensor cores. `exhaustive`: time the candidates.
  ConvPlanCache(cudnnHandle_t handle, bool tf32, bool exhaustive);
  ~ConvPlanCache();
  ConvPlanCache(const ConvPlanCache&) = delete;
  ConvPlanCache& operator=(const ConvPlanCache&) = delete;

  // y = conv(x, w): x NHWC [n][h][w][c], w KRSC [k][r][s][c], y NHWC [n][out_h][out_w][k], all in
  // shape.dtype on ctx's device (the cuDNN handle runs on ctx.stream()). cuDNN's workspace, if the
  // plan needs one, is a stream-ordered buffer of ctx's for this call only: a graph capture
  // records it like any other buffer, so a plan's arena lays it out by its lifetime.
  Status forward(const ConvShape& shape, const void* x, const void* w, void* y, DeviceContext& ctx);

  size_t size() const { return plans_.size(); }

  // === conv fusion (conv_fused.cpp) ===
  // y = act(conv(x, w) + bias + residual) as one cuDNN operation graph (cudnn-frontend), built on
  // first use per shape and epilogue from cuDNN's heuristic candidates (deterministic, inputs not
  // down-converted, fp32 sums): the first, or one timed >= 10 % faster on the first call, a
  // choice then kept in the plan cache (conv_fused.cpp, LATENT_CUDNN_FUSED_TUNE). False, with
  // nothing queued, where no graph serves the call: fusion off, fp32, fewer than 32 channels in or
  // out, an activation other than ReLU / SiLU, cuDNN has no engine for it, or the graph was not
  // built before a capture began; the caller then runs forward() and its own epilogue pass. The
  // workspace is a buffer of this call, as in forward().
  Result<bool> forward_fused(const ConvShape& shape, const void* x, const void* w, void* y,
                             const ConvEpilogue& epilogue, DeviceContext& ctx);
  // `runtime_compiled` false: only engines cuDNN ships compiled (no kernel built at plan time).
  // `tune_2d` / `tune_3d`: how many of cuDNN's candidate engines a 2-D / 3-D fused graph builds
  // and times on its first call (0 or 1: the heuristics' first alone; CudaBackend::Options).
  // `keep_compiled`: a fused graph whose engine cuDNN compiled while planning is serialized into
  // the plan cache's blobs, and a later process loads it instead of compiling it again
  // (LATENT_CUDNN_KEEP_COMPILED; needs the disk cache).
  void set_fusion(bool on, bool runtime_compiled = true, int tune_2d = 0, int tune_3d = 4,
                  bool keep_compiled = false) {
    fusion_ = on;
    fusion_runtime_compiled_ = runtime_compiled;
    fusion_tune_2d_ = tune_2d;
    fusion_tune_3d_ = tune_3d;
    fusion_keep_compiled_ = keep_compiled;
  }
  // Whether this build has cuDNN's graph API (cudnn-frontend) to fuse with.
  static bool fusion_available();
  // Fused convolutions queued by every cache of the process so far (tests).
  static int64_t fused_calls();
  // === end conv fusion ===

  // === plans: on-disk algorithm choices and graph capture ===
  // Algorithm choices are looked up in `disk` before searching, and timed choices are added to
  // it (under plan_key(); the fused graphs' engines under "conv fused <shape, epilogue>"); the
  // owner saves it.
  void set_disk_cache(std::shared_ptr<PlanCache> disk) { disk_ = std::move(disk); }
  // While capturing a graph nothing may be timed or synchronised: a shape without a plan is
  // an error instead (run the work once before capturing it).
  void set_capturing(bool capturing) { capturing_ = capturing; }
  // "conv2d bf16 tf32=1 x=1,128,64,64 w=128,3,3 pad=1,1 stride=1"
  std::string plan_key(const ConvShape& shape) const;
  // === end plans ===

 private:
  struct Plan;
  Result<Plan*> plan_for(const ConvShape& shape, const void* x, const void* w, void* y,
                         DeviceContext& ctx);

  struct FusedPlans;  // conv fusion
  struct FusedPlansDeleter {
    void operator()(FusedPlans* p) const;
  };

  cudnnHandle_t handle_;
  bool tf32_;
  bool exhaustive_;
  std::map<ConvShape, std::unique_ptr<Plan>> plans_;
  std::shared_ptr<PlanCache> disk_;  // plans
  bool capturing_ = false;           // plans
  bool fusion_ = false;              // conv fusion
  bool fusion_runtime_compiled_ = true;                   // conv fusion
  int fusion_tune_2d_ = 0, fusion_tune_3d_ = 4;           // conv fusion
  bool fusion_keep_compiled_ = false;                     // conv fusion
  std::unique_ptr<FusedPlans, FusedPlansDeleter> fused_;  // conv fusion
};

}  // namespace latent::cuda
