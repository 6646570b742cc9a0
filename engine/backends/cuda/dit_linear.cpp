// cuBLASLt is column-major; a row-major [R, C] matrix reads as its column-major transpose.
// So y^T [N, M] = w [N, K] . x^T [K, M]: A = w (stored as col-major [K, N], op T), B = x
// (col-major [K, M], op N), D = y (col-major [N, M]); the bias then runs along D's rows (N),
// as the epilogue wants.
#include "engine/backends/cuda/dit_linear.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "engine/backends/cuda/check.h"
#include "engine/core/env.h"
#include "engine/core/log.h"

namespace latent::cuda {
namespace {

// Workspace offered to cuBLASLt's heuristic (what NVIDIA recommends for Hopper).
constexpr size_t kWorkspaceBytes = 32u << 20;

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF32:
      break;
  }
  return CUDA_R_32F;
}

// The largest power of two up to 256 dividing the address.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align >>= 1;
  return align;
}

}  // namespace

struct DitLinear::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  // FP8 with LATENT_FP8_GEMM_TUNE: the heuristic's other candidates, until tune() chose.
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  bool tuned = false;
  ~Plan() {
    if (a) LATENT_CUDA_WARN(cublasLtMatrixLayoutDestroy(a));
    if (b) LATENT_CUDA_WARN(cublasLtMatrixLayoutDestroy(b));
    if (c) LATENT_CUDA_WARN(cublasLtMatrixLayoutDestroy(c));
    if (desc) LATENT_CUDA_WARN(cublasLtMatmulDescDestroy(desc));
  }
};

DitLinear::DitLinear(bool tf32) : tf32_(tf32) {
  // FP8 accumulation: cuBLASLt's fast accumulation (the tensor cores' own, as PyTorch's
  // _scaled_mm(use_fast_accum=True) and Transformer Engine's forward pass use) unless
  // LATENT_FP8_FAST_ACCUM=0 asks for periodic promotion to fp32 (slower, closer to exact).
  fp8_fast_accum_ = env_choice("LATENT_FP8_FAST_ACCUM", {{"1"}, {"0"}}, 0) == 0;
  fp8_tune_ = env_choice("LATENT_FP8_GEMM_TUNE", {{"0"}, {"1"}}, 0) == 1;
}

DitLinear::~DitLinear() {
  plans_.clear();
  if (handle_) LATENT_CUDA_WARN(cublasLtDestroy(handle_));
}

Result<DitLinear::Plan*> DitLinear::plan(DeviceContext& ctx, int64_t m, int64_t n, int64_t k,
                                         DType dtype, bool bias, bool gelu, uint32_t align_x,
                                         uint32_t align_w, uint32_t align_y, bool accumulate,
                                         const float* fp8_w_scales, const float* fp8_x_scales,
                                         bool f32_out, int64_t ldx, int64_t ldy) {
  // FP8 plans carry the scale vectors of their first call: cuBLASLt's heuristic refuses
  // outer-vector scaling (CUBLAS_STATUS_INVALID_VALUE) while they are unset. run_fp8 sets each
  // call's own.
  const bool fp8 = fp8_w_scales != nullptr;
  // With `accumulate` the heuristic is asked for beta = 1 (C read): align_y covers C and D.
  const std::string key = str_cat(m, 'x', n, 'x', k, ':', dtype_name(dtype), ':', bias, gelu, ':',
                                  align_x, ',', align_w, ',', align_y, accumulate ? ":acc" : "",
                                  fp8 ? ":fp8" : "", f32_out ? ":f32out" : "",
                                  ldx ? str_cat(":ldx", ldx) : "", ldy ? str_cat(":ldy", ldy) : "");
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();

  if (!handle_) LATENT_CUDA_CHECK(cublasLtCreate(&handle_));
  auto p = std::make_unique<Plan>();
  const cudaDataType_t type = cuda_type(dtype);
  const cublasComputeType_t compute = fp8 || dtype != DType::kF32 ? CUBLAS_COMPUTE_32F
                                      : tf32_              ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                           : CUBLAS_COMPUTE_32F;
  LATENT_CUDA_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  LATENT_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  LATENT_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  const cublasLtEpilogue_t epilogue =
      gelu ? (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU)
           : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &epilogue, sizeof(epilogue)));
  if (fp8) {
    // e4m3 A (w) and B (x), each with one fp32 scale per row (cuBLASLt's M = n, N = m); bias
    // and D in the output dtype.
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                     &outer, sizeof(outer)));
    LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                     &outer, sizeof(outer)));
    LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &fp8_w_scales, sizeof(fp8_w_scales)));
    LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &fp8_x_scales, sizeof(fp8_x_scales)));
    const int8_t fast = fp8_fast_accum_ ? 1 : 0;
    LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                     &fast, sizeof(fast)));
    if (bias) {
      const int32_t bias_type = type;
      LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
          p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
  }
  const cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : type;
  LATENT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->a, in_type, k, n, k));  // w
  LATENT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&p->b, in_type, k, m, ldx ? ldx : k));  // x
  LATENT_CUDA_CHECK(
      cublasLtMatrixLayoutCreate(&p->c, f32_out ? CUDA_R_32F : type, n, m, ldy ? ldy : n));  // y

  cublasLtMatmulPreference_t pref = nullptr;
  LATENT_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {  // released however this function returns
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { LATENT_CUDA_WARN(cublasLtMatmulPreferenceDestroy(p)); }
  } pref_guard{pref};
  const size_t ws = kWorkspaceBytes;
  LATENT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  LATENT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w)));
  LATENT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x)));
  LATENT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof(align_y)));
  LATENT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof(align_y)));

  const int want = fp8 && fp8_tune_ ? 16 : 1;
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(want));
  int found = 0;
  // Not LATENT_CUDA_CHECK: "no kernel for this epilogue" is an answer here (run_fp8 then runs
  // the epilogue apart), not an error to log.
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c,
                                                           pref, want, results.data(), &found);
  const cublasLtMatmulHeuristicResult_t result = results[0];
  if (st != CUBLAS_STATUS_SUCCESS || found < 1 || result.state != CUBLAS_STATUS_SUCCESS)
    return Status::errorf("cuBLASLt has no algorithm for x [", m, ", ", k, "] . w^T [", k, ", ", n,
                          "] in ", fp8 ? "fp8 e4m3 (row scales) -> " : "", dtype_name(dtype),
                          bias ? " with bias" : "", gelu ? " and GELU" : "", " (",
                          cublasLtGetStatusName(st), ")");
  p->algo = result.algo;
  p->workspace = result.workspaceSize;
  for (int i = 1; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(results[i]);
  if (!p->candidates.empty()) p->candidates.insert(p->candidates.begin(), result);
  p->tuned = p->candidates.empty();
  LATENT_DEBUG("dit linear plan ", key, ": workspace ", p->workspace, " bytes");
  (void)ctx;
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Status DitLinear::run(DeviceContext& ctx, const void* x, const void* w, const void* bias, void* y,
                      int64_t m, int64_t n, int64_t k, DType dtype, bool gelu,
                      const void* accumulate, int64_t ldx, int64_t ldy) {
  if (m <= 0 || n <= 0 || k <= 0) return ok_status();
  if ((ldx && ldx < k) || (ldy && ldy < n))
    return Status::errorf("DitLinear::run: rows of x ", ldx, " apart (", k, " read) or of y ", ldy,
                          " apart (", n, " written) overlap");
  if (ldx == k) ldx = 0;  // the plain layout: one plan
  if (ldy == n) ldy = 0;
  const uint32_t align_y =
      accumulate ? std::min(alignment_of(y), alignment_of(accumulate)) : alignment_of(y);
  LATENT_ASSIGN_OR_RETURN(
      Plan * p, plan(ctx, m, n, k, dtype, bias != nullptr, gelu, alignment_of(x), alignment_of(w),
                     align_y, accumulate != nullptr, nullptr, nullptr, false, ldx, ldy));
  if (bias)
    LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
  return matmul(ctx, *p, w, x, accumulate, y);
}

Status DitLinear::matmul(DeviceContext& ctx, Plan& p, const void* w, const void* x,
                         const void* accumulate, void* y) {
  void* workspace = nullptr;
  // For the VAEs' attention (set_workspace_per_call: the only products a VAE's plan records)
  // the workspace is a buffer of this call, freed in stream order after it, as cuDNN's are.
  // Kept for good, it sat on top of every later peak: the FLUX.1 decoder's mid-block attention
  // left 12.4 MB (720p) / 16 MB (1088p) of split-K workspace under the last up block's peak
  // (issue 13, session 27).
  TempBuffer call_workspace;
  if (p.workspace) {
    if (workspace_per_call_) {
      LATENT_TRY(call_workspace.allocate(ctx, p.workspace));
      workspace = call_workspace.get();
    } else {
      LATENT_ASSIGN_OR_RETURN(workspace, workspace_.ensure(ctx, p.workspace));
    }
  }
  LATENT_CUDA_CHECK(launch(ctx, p, p.algo, workspace, p.workspace, w, x, accumulate, y));
  return ok_status();
}

cublasStatus_t DitLinear::launch(DeviceContext& ctx, const Plan& p,
                                 const cublasLtMatmulAlgo_t& algo, void* workspace,
                                 size_t workspace_size, const void* w, const void* x,
                                 const void* accumulate, void* y) {
  const float one = 1.f, zero = 0.f;
  return cublasLtMatmul(handle_, p.desc, &one, w, p.a, x, p.b, accumulate ? &one : &zero,
                        accumulate ? accumulate : y, p.c, y, p.c, &algo, workspace, workspace_size,
                        ctx.stream());
}

Status DitLinear::run_f32_out(DeviceContext& ctx, const void* x, const void* w, float* y, int64_t m,
                              int64_t n, int64_t k, DType dtype) {
  if (m <= 0 || n <= 0 || k <= 0) return ok_status();
  if (dtype == DType::kF32) return Status::error("DitLinear::run_f32_out: bf16 / fp16 inputs only");
  LATENT_ASSIGN_OR_RETURN(Plan * p,
                          plan(ctx, m, n, k, dtype, false, false, alignment_of(x), alignment_of(w),
                               alignment_of(y), false, nullptr, nullptr, true));
  return matmul(ctx, *p, w, x, nullptr, y);
}

Status DitLinear::run_fp8(DeviceContext& ctx, const void* xq, const float* x_scales, const void* wq,
                          const float* w_scales, const void* bias, void* y, int64_t m, int64_t n,
                          int64_t k, DType out, bool gelu, bool* fused, const void* accumulate) {
  *fused = true;
  if (m <= 0 || n <= 0 || k <= 0) return ok_status();
  const uint32_t ax = alignment_of(xq), aw = alignment_of(wq);
  const uint32_t ay =
      accumulate ? std::min(alignment_of(y), alignment_of(accumulate)) : alignment_of(y);
  const bool acc = accumulate != nullptr;
  const bool want_epilogue = bias != nullptr || gelu;
  const std::string key = str_cat(m, 'x', n, 'x', k, ':', dtype_name(out), ':', bias != nullptr,
                                  gelu, ':', ax, ',', aw, ',', ay, acc ? ":acc" : "");
  Plan* p = nullptr;
  auto known = fp8_fused_.find(key);
  if (want_epilogue && (known == fp8_fused_.end() || known->second)) {
    Result<Plan*> r =
        plan(ctx, m, n, k, out, bias != nullptr, gelu, ax, aw, ay, acc, w_scales, x_scales);
    fp8_fused_[key] = r.ok();
    if (r.ok()) {
      p = r.value();
    } else {
      LATENT_DEBUG("fp8 linear ", key, ": ", r.status().message(), "; epilogue run apart");
    }
  }
  if (!p) {
    LATENT_ASSIGN_OR_RETURN(
        p, plan(ctx, m, n, k, out, false, false, ax, aw, ay, acc, w_scales, x_scales));
    *fused = !want_epilogue;
  }
  if (*fused && bias)
    LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
  LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                   &w_scales, sizeof(w_scales)));
  LATENT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                   &x_scales, sizeof(x_scales)));
  if (!p->tuned && accumulate != y) LATENT_TRY(tune(ctx, *p, wq, xq, accumulate, y));
  return matmul(ctx, *p, wq, xq, accumulate, y);
}

Status DitLinear::tune(DeviceContext& ctx, Plan& p, const void* w, const void* x,
                       const void* accumulate, void* y) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LATENT_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return ok_status();  // a later call, outside
  TimingEvents events;
  LATENT_TRY(events.create());
  float best_ms = 0.f;
  size_t best = 0;  // the heuristic's first unless another ran faster
  bool timed = false;
  std::string times;
  for (size_t i = 0; i < p.candidates.size(); ++i) {
    const cublasLtMatmulHeuristicResult_t& r = p.candidates[i];
    void* workspace = nullptr;
    if (r.workspaceSize) {
      LATENT_ASSIGN_OR_RETURN(workspace, workspace_.ensure(ctx, r.workspaceSize));
    }
    auto run_once = [&] {
      return launch(ctx, p, r.algo, workspace, r.workspaceSize, w, x, accumulate, y);
    };
    if (run_once() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a refusal drops the candidate
    constexpr int kRuns = 5;
    LATENT_CUDA_CHECK(events.start(ctx.stream()));
    for (int run = 0; run < kRuns; ++run) run_once();
    LATENT_CUDA_CHECK(events.stop(ctx.stream()));
    float ms = events.elapsed_ms();
    if (ms < 0.f)
      return Status::errorf("fp8 GEMM tuning: timing candidate ", i,
                            " failed: ", cudaGetErrorString(cudaGetLastError()));
    ms /= kRuns;
    times += str_cat(i ? " " : "", static_cast<int>(ms * 1000.f));
    if (!timed || ms < best_ms) best_ms = ms, best = i;
    timed = true;
  }
  LATENT_DEBUG("fp8 GEMM tuned: candidate ", best, " of ", p.candidates.size(), " (us: ", times,
               ")");
  p.algo = p.candidates[best].algo;
  p.workspace = p.candidates[best].workspaceSize;
  p.candidates.clear();
  p.tuned = true;
  return ok_status();
}

}  // namespace latent::cuda
