#include "engine/backends/cuda/conv2d.cuh"

#include <algorithm>
#include <utility>

#include "engine/backends/cuda/check.h"
#include "engine/core/log.h"

namespace latent::cuda {

struct ConvPlanCache::Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t workspace = 0;

  ~Plan() {
    if (x) LATENT_CUDA_WARN(cudnnDestroyTensorDescriptor(x));
    if (y) LATENT_CUDA_WARN(cudnnDestroyTensorDescriptor(y));
    if (w) LATENT_CUDA_WARN(cudnnDestroyFilterDescriptor(w));
    if (conv) LATENT_CUDA_WARN(cudnnDestroyConvolutionDescriptor(conv));
  }
};

namespace {

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kF32:
      break;
  }
  return CUDNN_DATA_FLOAT;
}

const char* algo_name(cudnnConvolutionFwdAlgo_t a) {
  switch (a) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
      return "implicit_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
      return "implicit_precomp_gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
      return "gemm";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT:
      return "direct";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
      return "fft";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING:
      return "fft_tiling";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD:
      return "winograd";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
      return "winograd_nonfused";
    default:
      return "?";
  }
}

// The most workspace an algorithm may ask for: 512 MiB, or half of the free device memory.
size_t workspace_limit() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return size_t{256} << 20;
  }
  return std::min(size_t{512} << 20, free_bytes / 2);
}

}  // namespace

std::string describe(const ConvShape& s) {
  if (s.kt > 1)  // video: a 3-D convolution over the frames of one clip
    return str_cat(dtype_name(s.dtype), " x[", s.c, ", ", s.d, ", ", s.h, ", ", s.w, "] * w[", s.k,
                   ", ", s.c, ", ", s.kt, ", ", s.r, ", ", s.s, "] stride ", s.stride, " pad ",
                   s.pad_h, "/", s.pad_w, " (3-D)");
  return str_cat(dtype_name(s.dtype), " x[", s.n, ", ", s.c, ", ", s.h, ", ", s.w, "] * w[", s.k,
                 ", ", s.c, ", ", s.r, ", ", s.s, "] stride ", s.stride, " pad ", s.pad_h, "/",
                 s.pad_w,
                 s.extra_b || s.extra_r ? str_cat(" (bottom / right ", s.pad_h + s.extra_b, "/",
                                                  s.pad_w + s.extra_r, ")")
                                        : std::string());
}

ConvPlanCache::ConvPlanCache(cudnnHandle_t handle, bool tf32, bool exhaustive)
    : handle_(handle), tf32_(tf32), exhaustive_(exhaustive) {}
ConvPlanCache::~ConvPlanCache() = default;

Result<ConvPlanCache::Plan*> ConvPlanCache::plan_for(const ConvShape& shape, const void* x,
                                                     const void* w, void* y, DeviceContext& ctx) {
  auto it = plans_.find(shape);
  if (it != plans_.end()) return it->second.get();
  if (shape.extra_b || shape.extra_r)  // the legacy API pads symmetrically only
    return Status::errorf("conv2d: ", describe(shape),
                          ": asymmetric padding reached the plain convolution (internal error)");
  // plans: no algorithm search (it synchronises) inside a graph capture.
  if (capturing_)
    return Status::errorf("conv2d: ", describe(shape),
                          " has no plan yet; run it once before capturing a graph");

  auto plan = std::make_unique<Plan>();
  const cudnnDataType_t dt = cudnn_type(shape.dtype);
  LATENT_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  LATENT_CUDA_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  LATENT_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  LATENT_CUDA_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  if (shape.kt > 1) {
    // video: NDHWC [1][d][h][w][c] * KTRSC [k][kt][r][s][c] -> [1][d - kt + 1][oh][ow][k]
    const int xdim[5] = {1, shape.c, shape.d, shape.h, shape.w};
    LATENT_CUDA_CHECK(cudnnSetTensorNdDescriptorEx(plan->x, CUDNN_TENSOR_NHWC, dt, 5, xdim));
    const int wdim[5] = {shape.k, shape.c, shape.kt, shape.r, shape.s};
    LATENT_CUDA_CHECK(cudnnSetFilterNdDescriptor(plan->w, dt, CUDNN_TENSOR_NHWC, 5, wdim));
    const int pad[3] = {0, shape.pad_h, shape.pad_w};
    const int stride[3] = {1, shape.stride, shape.stride};
    const int dilation[3] = {1, 1, 1};
    LATENT_CUDA_CHECK(cudnnSetConvolutionNdDescriptor(plan->conv, 3, pad, stride, dilation,
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  } else {
    LATENT_CUDA_CHECK(cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NHWC, dt, shape.n, shape.c,
                                                 shape.h, shape.w));
    LATENT_CUDA_CHECK(cudnnSetFilter4dDescriptor(plan->w, dt, CUDNN_TENSOR_NHWC, shape.k, shape.c,
                                                 shape.r, shape.s));
    LATENT_CUDA_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, shape.pad_h, shape.pad_w,
                                                      shape.stride, shape.stride, 1, 1,
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  }
  const bool tensor_ops = shape.dtype != DType::kF32 || tf32_;
  LATENT_CUDA_CHECK(
      cudnnSetConvolutionMathType(plan->conv, tensor_ops ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  if (shape.kt > 1) {
    int out[5] = {0, 0, 0, 0, 0};
    LATENT_CUDA_CHECK(cudnnGetConvolutionNdForwardOutputDim(plan->conv, plan->x, plan->w, 5, out));
    if (out[0] != 1 || out[1] != shape.k || out[2] != shape.out_d() || out[3] != shape.out_h() ||
        out[4] != shape.out_w())
      return Status::errorf("conv3d: cuDNN output [", out[0], ", ", out[1], ", ", out[2], ", ",
                            out[3], ", ", out[4], "] differs from the expected [1, ", shape.k, ", ",
                            shape.out_d(), ", ", shape.out_h(), ", ", shape.out_w(), "] for ",
                            describe(shape));
    LATENT_CUDA_CHECK(cudnnSetTensorNdDescriptorEx(plan->y, CUDNN_TENSOR_NHWC, dt, 5, out));
  } else {
    int on = 0, oc = 0, oh = 0, ow = 0;
    LATENT_CUDA_CHECK(
        cudnnGetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &on, &oc, &oh, &ow));
    if (on != shape.n || oc != shape.k || oh != shape.out_h() || ow != shape.out_w())
      return Status::errorf("conv2d: cuDNN output [", on, ", ", oc, ", ", oh, ", ", ow,
                            "] differs from the expected [", shape.n, ", ", shape.k, ", ",
                            shape.out_h(), ", ", shape.out_w(), "] for ", describe(shape));
    LATENT_CUDA_CHECK(
        cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NHWC, dt, shape.n, shape.k, oh, ow));
  }

  const size_t limit = workspace_limit();
  // === plans: a choice saved by an earlier process for this GPU and library versions ===
  const std::string key = plan_key(shape);
  nlohmann::json saved;
  if (disk_ && disk_->lookup(key, &saved)) {
    const bool valid = saved.is_object() && saved.contains("algo") &&
                       saved["algo"].is_number_integer() && saved.contains("math") &&
                       saved["math"].is_number_integer();
    const int a = valid ? saved["algo"].get<int>() : -1;
    const int m = valid ? saved["math"].get<int>() : -1;
    size_t ws = 0;
    if (a >= 0 && a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT &&
        (m == CUDNN_DEFAULT_MATH || m == CUDNN_TENSOR_OP_MATH ||
         m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION || m == CUDNN_FMA_MATH) &&
        cudnnSetConvolutionMathType(plan->conv, static_cast<cudnnMathType_t>(m)) ==
            CUDNN_STATUS_SUCCESS &&
        cudnnGetConvolutionForwardWorkspaceSize(handle_, plan->x, plan->w, plan->conv, plan->y,
                                                static_cast<cudnnConvolutionFwdAlgo_t>(a),
                                                &ws) == CUDNN_STATUS_SUCCESS &&
        ws <= limit) {
      plan->algo = static_cast<cudnnConvolutionFwdAlgo_t>(a);
      plan->workspace = ws;
      LATENT_DEBUG("conv2d plan ", describe(shape), ": ", algo_name(plan->algo), ", ", ws,
                   " bytes of workspace (from ", disk_->path(), ")");
      Plan* raw = plan.get();
      plans_.emplace(shape, std::move(plan));
      return raw;
    }
    LATENT_WARN("conv2d: the saved plan '", key, "' = ", saved.dump(), " in ", disk_->path(),
                " does not apply here; searching again");
    LATENT_CUDA_CHECK(cudnnSetConvolutionMathType(
        plan->conv, tensor_ops ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
  }
  // === end plans ===
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  bool timed = false;
  if (exhaustive_) {
    // Times each candidate on the real buffers (this synchronises, once per shape). Should the
    // search itself fail, cuDNN's heuristic ranking below still gives an answer.
    TempBuffer scratch;
    Status st = scratch.allocate(ctx, limit);
    if (st.ok()) {
      const cudnnStatus_t rc = cudnnFindConvolutionForwardAlgorithmEx(
          handle_, plan->x, x, plan->w, w, plan->conv, plan->y, y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
          &returned, perf, scratch.get(), limit);
      if (rc == CUDNN_STATUS_SUCCESS) {
        timed = true;
      } else {
        returned = 0;
        LATENT_WARN("conv2d: cudnnFindConvolutionForwardAlgorithmEx failed for ", describe(shape),
                    " on ", ctx.label(), ": ", cudnnGetErrorString(rc), "; using heuristics");
      }
    } else {
      LATENT_WARN("conv2d: no memory to time algorithms for ", describe(shape), ": ", st.message());
    }
  }
  bool any = false;
  for (int i = 0; i < returned; ++i) any = any || perf[i].status == CUDNN_STATUS_SUCCESS;
  if (!any) {
    timed = false;
    LATENT_CUDA_CHECK(
        cudnnGetConvolutionForwardAlgorithm_v7(handle_, plan->x, plan->w, plan->conv, plan->y,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
  }
  // The first candidate (fastest timed, or cuDNN's heuristic ranking) whose math keeps the
  // precision asked for (fp32 without TF32: no tensor ops; never ALLOW_CONVERSION, which rounds
  // inputs to fp16) and that is deterministic (the same input gives the same bytes on every
  // run). The candidate lists carry a math type per entry, which is what is checked here (the
  // descriptor's math type is only a request). Relaxed only where nothing qualifies: first
  // determinism, then the math.
  auto math_ok = [&](cudnnMathType_t m) {
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return false;
    return m != CUDNN_TENSOR_OP_MATH || tensor_ops;
  };
  const cudnnConvolutionFwdAlgoPerf_t* chosen = nullptr;
  for (int pass = 0; pass < 3 && !chosen; ++pass)
    for (int i = 0; i < returned && !chosen; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit &&
          (pass == 2 || math_ok(perf[i].mathType)) &&
          (pass >= 1 || perf[i].determinism == CUDNN_DETERMINISTIC))
        chosen = &perf[i];
  if (chosen && !math_ok(chosen->mathType))
    LATENT_WARN("conv2d: ", describe(shape), " runs with math type ", int(chosen->mathType),
                ": cuDNN offers no algorithm with the precision asked for");
  if (!chosen)
    return Status::errorf("conv2d: cuDNN has no algorithm for ", describe(shape), " within ",
                          limit >> 20, " MiB of workspace on ", ctx.label());
  plan->algo = chosen->algo;
  LATENT_CUDA_CHECK(cudnnSetConvolutionMathType(plan->conv, chosen->mathType));
  // The size for the math type finally set (the search may have reported another's).
  LATENT_CUDA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle_, plan->x, plan->w, plan->conv,
                                                            plan->y, plan->algo, &plan->workspace));
  LATENT_DEBUG("conv2d plan ", describe(shape), ": ", algo_name(plan->algo),
               chosen->mathType == CUDNN_TENSOR_OP_MATH ? " (tensor ops)" : "", ", ",
               plan->workspace, " bytes of workspace",
               timed ? str_cat(", ", chosen->time, " ms") : std::string());
  // plans: only measured choices are worth keeping (heuristics cost nothing to ask again).
  if (disk_ && timed)
    disk_->put(key, nlohmann::json{{"algo", static_cast<int>(plan->algo)},
                                   {"math", static_cast<int>(chosen->mathType)},
                                   {"name", algo_name(plan->algo)},
                                   {"workspace", plan->workspace},
                                   {"ms", chosen->time}});
  Plan* raw = plan.get();
  plans_.emplace(shape, std::move(plan));
  return raw;
}

// === plans ===
std::string ConvPlanCache::plan_key(const ConvShape& s) const {
  if (s.kt > 1)  // video
    return str_cat("conv3d ", dtype_name(s.dtype), " tf32=", tf32_ ? 1 : 0, " x=", s.c, ",", s.d,
                   ",", s.h, ",", s.w, " w=", s.k, ",", s.kt, ",", s.r, ",", s.s, " pad=", s.pad_h,
                   ",", s.pad_w, " stride=", s.stride);
  return str_cat("conv2d ", dtype_name(s.dtype), " tf32=", tf32_ ? 1 : 0, " x=", s.n, ",", s.c, ",",
                 s.h, ",", s.w, " w=", s.k, ",", s.r, ",", s.s, " pad=", s.pad_h, ",", s.pad_w,
                 " stride=", s.stride);
}

// === end plans ===

Status ConvPlanCache::forward(const ConvShape& shape, const void* x, const void* w, void* y,
                              DeviceContext& ctx) {
  LATENT_ASSIGN_OR_RETURN(Plan * plan, plan_for(shape, x, w, y, ctx));
  TempBuffer workspace;  // freed in stream order once the convolution is queued
  if (plan->workspace > 0) LATENT_TRY(workspace.allocate(ctx, plan->workspace));
  const float alpha = 1.f, beta = 0.f;
  LATENT_CUDA_CHECK(cudnnConvolutionForward(handle_, &alpha, plan->x, x, plan->w, w, plan->conv,
                                            plan->algo, workspace.get(), plan->workspace, &beta,
                                            plan->y, y));
  return ok_status();
}

}  // namespace latent::cuda
