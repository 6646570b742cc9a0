// 2-D convolution through cuDNN's convolution API on NHWC tensors and KRSC filters.
//
// A plan (descriptors, algorithm, workspace size) is built once per shape, dtype and padding,
// with the algorithm chosen by timing cuDNN's candidates on the first call
// (cudnnFindConvolutionForwardAlgorithmEx; LATENT_CUDNN_SEARCH=heuristic takes cuDNN's
// heuristic choice instead, without running anything), and kept in a map for later calls.
// cuDNN only pads symmetrically: the caller zero-pads the input explicitly for the rest.
// video: with kt > 1 the same plans run a 3-D convolution over the frames of one clip (NDHWC
// input [1][d][h][w][c], KTRSC filter, valid in time), for Backend::conv3d_frames().
#pragma once

#include <cudnn.h>

#include <map>
#include <memory>
#include <tuple>

#include "engine/backends/cuda/memory.h"
#include "engine/core/dtype.h"
#include "engine/core/plan_cache.h"  // plans
#include "engine/core/status.h"

namespace latent::cuda {

struct ConvShape {
  int n = 0, c = 0, h = 0, w = 0;  // input (after any explicit padding)
  int k = 0, r = 0, s = 0;         // output channels, filter height and width
  int pad_h = 0, pad_w = 0;        // symmetric padding cuDNN applies
  int stride = 1;
  DType dtype = DType::kF32;
  int d = 1, kt = 1;  // video: input frames and temporal taps (kt > 1: a 3-D convolution, n = 1)

  int out_h() const { return (h + 2 * pad_h - r) / stride + 1; }
  int out_w() const { return (w + 2 * pad_w - s) / stride + 1; }
  int out_d() const { return d - kt + 1; }
  auto key() const {
    return std::make_tuple(n, c, h, w, k, r, s, pad_h, pad_w, stride, dtype, d, kt);
  }
  bool operator<(const ConvShape& o) const { return key() < o.key(); }
};

class ConvPlanCache {
 public:
  // `tf32`: let fp32 convolutions use TF32 tensor cores. `exhaustive`: time the candidates.
  ConvPlanCache(cudnnHandle_t handle, bool tf32, bool exhaustive);
  ~ConvPlanCache();
  ConvPlanCache(const ConvPlanCache&) = delete;
  ConvPlanCache& operator=(const ConvPlanCache&) = delete;

  // y = conv(x, w): x NHWC [n][h][w][c], w KRSC [k][r][s][c], y NHWC [n][out_h][out_w][k], all in
  // shape.dtype on ctx's device (the cuDNN handle runs on ctx.stream()).
  Status forward(const ConvShape& shape, const void* x, const void* w, void* y, DeviceContext& ctx,
                 GrowableBuffer& workspace);

  size_t size() const { return plans_.size(); }

  // === plans: on-disk algorithm choices and graph capture ===
  // Algorithm choices are looked up in `disk` before searching, and timed choices are added to
  // it (under plan_key()); the owner saves it.
  void set_disk_cache(std::shared_ptr<PlanCache> disk) { disk_ = std::move(disk); }
  // While capturing a graph nothing may be timed or synchronised: a shape without a plan is
  // an error instead (run the work once before capturing it).
  void set_capturing(bool capturing) { capturing_ = capturing; }
  // forward() with a caller-owned workspace of `workspace_bytes` (too small: an error).
  Status forward_in(const ConvShape& shape, const void* x, const void* w, void* y,
                    DeviceContext& ctx, void* workspace, size_t workspace_bytes);
  // "conv2d bf16 tf32=1 x=1,128,64,64 w=128,3,3 pad=1,1 stride=1"
  std::string plan_key(const ConvShape& shape) const;
  // === end plans ===

 private:
  struct Plan;
  Result<Plan*> plan_for(const ConvShape& shape, const void* x, const void* w, void* y,
                         DeviceContext& ctx);

  cudnnHandle_t handle_;
  bool tf32_;
  bool exhaustive_;
  std::map<ConvShape, std::unique_ptr<Plan>> plans_;
  std::shared_ptr<PlanCache> disk_;  // plans
  bool capturing_ = false;           // plans
};

}  // namespace latent::cuda
