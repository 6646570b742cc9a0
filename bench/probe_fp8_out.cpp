// Probe (issue 12): can cuBLASLt write an e4m3 D from e4m3 x e4m3 with one fp32 scale per row of
// A and of B (outer-vector mode, what our FP8 linear layers use), with a per-tensor D_SCALE? If
// so, fc1 could write fc2's FP8 input itself (no bf16 write + quantisation pass). Asks the
// heuristic for fc1's shape (M tokens x K 3072 -> N 12288) in several variants (D type, C type,
// epilogue, scale modes) and, for those it answers, runs the GEMM once and checks D against a
// CPU reference on a small shape. Prints one line a variant; --json for a machine-readable list.
//
//   nvcc -O2 -std=c++17 bench/probe_fp8_out.cpp -lcublasLt -o probe_fp8_out && ./probe_fp8_out
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Variant {
  const char* name;
  cudaDataType_t c_type, d_type;
  int32_t scale_mode;  // A and B
  cublasLtEpilogue_t epilogue;
};

const char* status_name(cublasStatus_t s) { return cublasLtGetStatusName(s); }

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// Returns the heuristic's status and count; when `run`, also runs the first algorithm on
// random data of this shape and returns the max relative error of D against the CPU.
struct Answer {
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  int found = 0;
  double err = -1;
  double ms = -1;
};

Answer ask(cublasLtHandle_t h, const Variant& v, int64_t m, int64_t n, int64_t k, bool run) {
  Answer a;
  const bool gelu =
      v.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS || v.epilogue == CUBLASLT_EPILOGUE_GELU;
  const bool bias =
      v.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS || v.epilogue == CUBLASLT_EPILOGUE_BIAS;
  // cuBLASLt column-major: A = w [k, n] (transposed), B = x [k, m], D [n, m].
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(n * k), x(m * k), bvec(n), ws(n), xs(m);
  for (auto& f : w) f = nd(rng);
  for (auto& f : x) f = nd(rng);
  for (auto& f : bvec) f = 0.1f * nd(rng);
  std::vector<__nv_fp8_e4m3> w8(n * k), x8(m * k);
  // Per-row scales: amax / 448.
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::fmax(amax, std::fabs(w[r * k + c]));
    ws[r] = amax / 448.f;
    for (int64_t c = 0; c < k; ++c) w8[r * k + c] = __nv_fp8_e4m3(w[r * k + c] / ws[r]);
  }
  for (int64_t r = 0; r < m; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < k; ++c) amax = std::fmax(amax, std::fabs(x[r * k + c]));
    xs[r] = amax / 448.f;
    for (int64_t c = 0; c < k; ++c) x8[r * k + c] = __nv_fp8_e4m3(x[r * k + c] / xs[r]);
  }
  const bool outer = v.scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  if (!outer) {  // scalar: one scale each (the max of the rows')
    float mw = 0, mx = 0;
    for (float s : ws) mw = std::fmax(mw, s);
    for (float s : xs) mx = std::fmax(mx, s);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) w8[r * k + c] = __nv_fp8_e4m3(w[r * k + c] / mw);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c) x8[r * k + c] = __nv_fp8_e4m3(x[r * k + c] / mx);
    ws.assign(1, mw);
    xs.assign(1, mx);
  }
  // The reference from the quantised operands, and a D scale from its amax.
  std::vector<double> ref(run ? n * m : 0);
  double amax_ref = run ? 0 : 8.0;  // (timing only: any scale)
  for (int64_t i = 0; run && i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c)
        s += double(float(w8[j * k + c])) * double(float(x8[i * k + c]));
      s *= double(outer ? ws[j] : ws[0]) * double(outer ? xs[i] : xs[0]);
      if (bias) s += bvec[j];
      if (gelu) s = 0.5 * s * (1 + std::tanh(0.7978845608 * (s + 0.044715 * s * s * s)));
      ref[i * n + j] = s;
      amax_ref = std::fmax(amax_ref, std::fabs(s));
    }
  const float d_scale = float(448.0 / amax_ref);  // D = round(result * d_scale)

  void *dw, *dx, *dd, *dc, *dws, *dxs, *dds, *db, *dwork;
  const size_t d_elem = v.d_type == CUDA_R_8F_E4M3 ? 1 : (v.d_type == CUDA_R_32F ? 4 : 2);
  const size_t c_elem = v.c_type == CUDA_R_8F_E4M3 ? 1 : (v.c_type == CUDA_R_32F ? 4 : 2);
  CK(cudaMalloc(&dw, n * k));
  CK(cudaMalloc(&dx, m * k));
  CK(cudaMalloc(&dd, n * m * d_elem));
  CK(cudaMalloc(&dc, n * m * c_elem));
  CK(cudaMalloc(&dws, ws.size() * 4));
  CK(cudaMalloc(&dxs, xs.size() * 4));
  CK(cudaMalloc(&dds, 4));
  CK(cudaMalloc(&db, n * 2));
  const size_t work = 32 << 20;
  CK(cudaMalloc(&dwork, work));
  CK(cudaMemcpy(dw, w8.data(), n * k, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, x8.data(), m * k, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dws, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dxs, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dds, &d_scale, 4, cudaMemcpyHostToDevice));
  std::vector<__nv_bfloat16> bb(n);
  for (int64_t j = 0; j < n; ++j) bb[j] = __float2bfloat16(bvec[j]);
  CK(cudaMemcpy(db, bb.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dc, 0, n * m * c_elem));

  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof(nn));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &v.epilogue,
                                 sizeof(v.epilogue));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &v.scale_mode,
                                 sizeof(int32_t));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &v.scale_mode,
                                 sizeof(int32_t));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dws, sizeof(dws));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dxs, sizeof(dxs));
  if (v.d_type == CUDA_R_8F_E4M3)
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &dds, sizeof(dds));
  const int8_t fast = 1;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
  if (bias) {
    const int32_t bt = CUDA_R_16BF;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &db, sizeof(db));
  }
  cublasLtMatrixLayout_t la, lb, lc, ld;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, n, k);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, m, k);
  cublasLtMatrixLayoutCreate(&lc, v.c_type, n, m, n);
  cublasLtMatrixLayoutCreate(&ld, v.d_type, n, m, n);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &work,
                                       sizeof(work));
  cublasLtMatmulHeuristicResult_t res[4];
  a.st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 4, res, &a.found);
  if (a.st == CUBLAS_STATUS_SUCCESS && a.found > 0 && run) {
    const float one = 1.f, zero = 0.f;
    cublasStatus_t s = cublasLtMatmul(h, desc, &one, dw, la, dx, lb, &zero, dc, lc, dd, ld,
                                      &res[0].algo, dwork, work, 0);
    CK(cudaDeviceSynchronize());
    if (s != CUBLAS_STATUS_SUCCESS) {
      a.st = s;
    } else {
      std::vector<unsigned char> out(n * m * d_elem);
      CK(cudaMemcpy(out.data(), dd, out.size(), cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (int64_t i = 0; i < n * m; ++i) {
        double got;
        if (v.d_type == CUDA_R_8F_E4M3) {
          __nv_fp8_e4m3 q;
          std::memcpy(&q, &out[i], 1);
          got = double(float(q)) / d_scale;
        } else if (v.d_type == CUDA_R_16BF) {
          __nv_bfloat16 q;
          std::memcpy(&q, &out[i * 2], 2);
          got = __bfloat162float(q);
        } else {
          float q;
          std::memcpy(&q, &out[i * 4], 4);
          got = q;
        }
        num += (got - ref[i]) * (got - ref[i]);
        den += ref[i] * ref[i];
      }
      a.err = std::sqrt(num / den);
    }
  }
  if (a.st == CUBLAS_STATUS_SUCCESS && a.found > 0 && !run) {  // time it at this shape
    const float one = 1.f, zero = 0.f;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; ++i)
      cublasLtMatmul(h, desc, &one, dw, la, dx, lb, &zero, dc, lc, dd, ld, &res[0].algo, dwork,
                     work, 0);
    cudaEventRecord(e0);
    for (int i = 0; i < 20; ++i)
      cublasLtMatmul(h, desc, &one, dw, la, dx, lb, &zero, dc, lc, dd, ld, &res[0].algo, dwork,
                     work, 0);
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    a.ms = ms / 20;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  for (void* p : {dw, dx, dd, dc, dws, dxs, dds, db, dwork}) cudaFree(p);
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  cublasLtHandle_t h;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "probe_fp8_out: cublasLtCreate failed (no GPU?)\n");
    return 1;
  }
  const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  const int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const Variant variants[] = {
      {"outer bf16 C / bf16 D, GELU+bias (today's fc1)", CUDA_R_16BF, CUDA_R_16BF, outer,
       CUBLASLT_EPILOGUE_GELU_BIAS},
      {"outer bf16 C / e4m3 D, GELU+bias", CUDA_R_16BF, CUDA_R_8F_E4M3, outer,
       CUBLASLT_EPILOGUE_GELU_BIAS},
      {"outer bf16 C / e4m3 D, no epilogue", CUDA_R_16BF, CUDA_R_8F_E4M3, outer,
       CUBLASLT_EPILOGUE_DEFAULT},
      {"outer fp32 C / e4m3 D, no epilogue", CUDA_R_32F, CUDA_R_8F_E4M3, outer,
       CUBLASLT_EPILOGUE_DEFAULT},
      {"scalar bf16 C / e4m3 D, GELU+bias", CUDA_R_16BF, CUDA_R_8F_E4M3, scalar,
       CUBLASLT_EPILOGUE_GELU_BIAS},
      {"scalar bf16 C / bf16 D, GELU+bias", CUDA_R_16BF, CUDA_R_16BF, scalar,
       CUBLASLT_EPILOGUE_GELU_BIAS},
  };
  int cuver = 0;
  cudaRuntimeGetVersion(&cuver);
  if (json)
    std::printf("{\"cublasLt\": %zu, \"cudart\": %d, \"variants\": [\n", cublasLtGetVersion(),
                cuver);
  bool first = true;
  for (const Variant& v : variants) {
    // Accuracy at a small shape, then the heuristic and a timing at fc1's (4,096 + 64 tokens).
    Answer small = ask(h, v, 256, 512, 512, true);
    Answer big = ask(h, v, 4160, 12288, 3072, false);
    if (json) {
      std::printf(
          "%s{\"variant\": \"%s\", \"status\": \"%s\", \"found\": %d, \"rel_l2\": %.3e, "
          "\"fc1_status\": \"%s\", \"fc1_ms\": %.4f}",
          first ? "" : ",\n", v.name, status_name(small.st), small.found, small.err,
          status_name(big.st), big.ms);
      first = false;
    } else {
      std::printf("%-52s small: %-28s found %d rel L2 %.3e | fc1 4160x12288x3072: %s %.4f ms\n",
                  v.name, status_name(small.st), small.found, small.err, status_name(big.st),
                  big.ms);
    }
  }
  if (json) std::printf("\n]}\n");
  cublasLtDestroy(h);
  return 0;
}
