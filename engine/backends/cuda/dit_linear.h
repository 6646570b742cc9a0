// DiT linear layers on cuBLASLt: y = epilogue(x w^T) with x [M, K], w [N, K] (nn.Linear's
// layout), y [M, N], all row-major in one dtype (bf16/fp16 with fp32 accumulation; fp32 on TF32
// tensor cores unless disabled). Bias and the tanh-GELU run in cuBLASLt's epilogue
// (CUBLASLT_EPILOGUE_BIAS / GELU / GELU_BIAS), so the output is written once.
//
// Plans (matmul descriptor, layouts, the heuristic's algorithm) are cached per shape, dtype,
// epilogue and operand alignment; the first call of a shape asks the heuristic (host only, no
// synchronisation), later calls only launch.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "engine/backends/cuda/memory.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

class DitLinear {
 public:
  explicit DitLinear(bool tf32);
  // Destroys the plans and the handle: the device must be current and its stream idle.
  ~DitLinear();
  DitLinear(const DitLinear&) = delete;
  DitLinear& operator=(const DitLinear&) = delete;

  // y = (gelu_tanh if `gelu`)(x w^T + bias + accumulate); bias [n] or null (16-byte aligned
  // when given); accumulate [m, n] like y, or null (read as cuBLASLt's C with beta 1).
  // ldx / ldy: elements from one row of x / y (and accumulate) to the next, 0 for k / n (rows
  // of a wider matrix: Backend::linear_wide, linear_into_columns).
  Status run(DeviceContext& ctx, const void* x, const void* w, const void* bias, void* y, int64_t m,
             int64_t n, int64_t k, DType dtype, bool gelu, const void* accumulate = nullptr,
             int64_t ldx = 0, int64_t ldy = 0);

  // y = x w^T with x, w in `dtype` (bf16 / fp16) and y [m, n] in fp32 (fp32 accumulation, no
  // epilogue): the logits of the unfused attention (CudaBackend::spatial_attention).
  Status run_f32_out(DeviceContext& ctx, const void* x, const void* w, float* y, int64_t m,
                     int64_t n, int64_t k, DType dtype);

  // FP8: y = epilogue((xq wq^T) * x_scales[m] * w_scales[n] + bias) from e4m3 codes xq [m, k]
  // and wq [n, k] (row-major, one byte each) with one fp32 scale per row each (cuBLASLt's
  // outer-vector scaling), fp32 accumulation, y [m, n] in `out` (bf16 / fp16 / fp32), bias [n]
  // in `out` or null. Where cuBLASLt has no kernel with the bias / GELU epilogue for a shape,
  // the plain product is written and *fused comes back false: the caller applies bias and
  // GELU (else true). Per-row scaling of FP8 needs Hopper (compute capability 9.0); elsewhere
  // the heuristic finds nothing and this fails, naming the shape.
  // With `accumulate` ([m, n] in `out`, may equal y): y = accumulate + that (beta = 1, C read
  // in the epilogue), the residual of a gated add (dit_linear_fp8_gated_add).
  Status run_fp8(DeviceContext& ctx, const void* xq, const float* x_scales, const void* wq,
                 const float* w_scales, const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                 DType out, bool gelu, bool* fused, const void* accumulate = nullptr);

  // Plans built so far (tests: a repeated shape reuses its plan).
  size_t plan_count() const { return plans_.size(); }

  // While on (CudaBackend::spatial_attention_gemm: the VAEs' mid-block attention), each
  // product's workspace is a buffer of its call, freed in stream order after it, instead of the
  // one this object keeps for later calls: a VAE's forward then holds it only while the
  // attention runs, and in a plan's arena only during it (the kept one sat under the FLUX.1
  // decoder's last up block: +12 MB at 720p, issue 13). Callers hold the backend's lock.
  void set_workspace_per_call(bool on) { workspace_per_call_ = on; }

 private:
  struct Plan;
  Result<Plan*> plan(DeviceContext& ctx, int64_t m, int64_t n, int64_t k, DType dtype, bool bias,
                     bool gelu, uint32_t align_x, uint32_t align_w, uint32_t align_y,
                     bool accumulate, const float* fp8_w_scales = nullptr,
                     const float* fp8_x_scales = nullptr, bool f32_out = false, int64_t ldx = 0,
                     int64_t ldy = 0);

  // LATENT_FP8_GEMM_TUNE=1: the FP8 plan's first call outside a graph capture times each of the
  // heuristic's candidates (up to 16) on its own operands and keeps the fastest.
  Status tune(DeviceContext& ctx, Plan& p, const void* w, const void* x, const void* accumulate,
              void* y);

  // y = w-x product of plan p on ctx's stream (alpha 1; beta 1 reading `accumulate` as C when
  // given, else 0), the workspace grown to what p asks.
  Status matmul(DeviceContext& ctx, Plan& p, const void* w, const void* x, const void* accumulate,
                void* y);
  // The one cublasLtMatmul call of matmul() and tune(): plan p's product by `algo` with
  // `workspace` (`workspace_size` bytes).
  cublasStatus_t launch(DeviceContext& ctx, const Plan& p, const cublasLtMatmulAlgo_t& algo,
                        void* workspace, size_t workspace_size, const void* w, const void* x,
                        const void* accumulate, void* y);

  bool tf32_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<std::string, std::unique_ptr<Plan>> plans_;
  std::map<std::string, bool> fp8_fused_;  // FP8 shape + epilogue -> whether a fused plan exists
  bool fp8_fast_accum_ = true;             // LATENT_FP8_FAST_ACCUM (dit_linear.cpp)
  bool fp8_tune_ = false;                  // LATENT_FP8_GEMM_TUNE (tune())
  GrowableBuffer workspace_;
  bool workspace_per_call_ = false;
};

}  // namespace latent::cuda
