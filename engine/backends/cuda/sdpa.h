// cuDNN's fused flash attention (scaled dot-product attention, SDPA) through the cuDNN graph API
// (cudnn-frontend), for the DiT attention op (backend.h `attention`). It is what PyTorch runs on
// Hopper for F.scaled_dot_product_attention in bf16/fp16 (about 2x our mma.sync kernel at DiT
// sizes, NOTES.md); our kernel (dit_attention.cu) stays the fallback.
//
// The frontend headers are only seen by sdpa.cpp: without them (LATENT_HAVE_CUDNN_FRONTEND
// undefined at build time) sdpa_attention() always answers "not done" and the caller runs its
// own kernel.
//
// Layout: q [B, Tq, H*d], k and v [B, Tk, H*d], out [B, Tq, H*d], contiguous (BSHD strides);
// out's rows may be wider (out_ld below: the first H*d elements of each written).
// The key mask [B, Tk] (nonzero: attend) becomes an additive bias (0 / -65504, the value PyTorch
// uses for boolean masks with cuDNN) in a [B, Tk] scratch buffer (rows padded to 8 elements, 16
// bytes) that the graph broadcasts over heads and queries with zero strides; no host read of the
// mask, no synchronisation.
//
// With key lengths (backend.h: the mask is a prefix of valid keys per batch row) the graph uses
// cuDNN's padding mask instead (seq_len_q = Tq for every row, seq_len_kv = the lengths, int32
// [B, 1, 1, 1] on the device): no bias is read and the kernel stops at the last valid key. The
// lengths are uploaded once per distinct vector (counted by count_host_to_device) and kept with
// the context. Where that graph cannot be built or run, the bias graph runs instead (one
// warning), and where that cannot, our kernel; LATENT_CUDNN_PADDING_MASK=0 skips it.
//
// One graph per (B, Tq, Tk, H, d, dtype, mask variant: none, bias or padding) and device
// context, built on first use (never while the stream is capturing) and cached with the
// context's own cuDNN handle bound to its stream. Workspace and bias come from the context's
// stream-ordered pool.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "engine/backends/cuda/memory.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// True when this build has cudnn-frontend (the cuDNN path can run at all).
bool sdpa_compiled();

// Process-wide counts of attention calls by path, for tests and benchmarks.
struct SdpaCounters {
  int64_t cudnn = 0;          // ran cuDNN's SDPA
  int64_t cudnn_padding = 0;  // of those, with the padding mask (key lengths) rather than a bias
  int64_t cudnn_fp8 = 0;      // of those, cuDNN's FP8 SDPA (sdpa_attention_fp8)
  int64_t fallback = 0;       // left to our kernel (any reason)
};
SdpaCounters sdpa_counters();

// Queues cuDNN's SDPA on ctx.stream() and returns true, or returns false when the caller must
// run its own kernel: not built with the frontend, fp32, d > 256 or not a multiple of 8, below
// sm_80, LATENT_CUDNN_SDPA=0, a kernel forced with LATENT_ATTENTION_KERNEL (forcing one of ours
// means: run ours), a pointer not 16-byte aligned, no graph yet while the stream is capturing,
// or cuDNN has no engine for the shape or failed to execute it (remembered, logged once as a
// warning, never retried). An error only when scratch memory cannot be had. Counts the call
// (sdpa_counters) and logs at debug level, once per shape and path, which path ran. The device
// must be current. `key_lengths`: null, or b values in [1, tk] that describe `key_mask` exactly
// (backend.h), for the padding-mask graph. `out_ld`: elements from one token's output row to the
// next (0: heads * d; more for Backend::attention_wide, a multiple of 8 for the graph).
Result<bool> sdpa_attention(DeviceContext& ctx, const void* q, const void* k, const void* v,
                            const void* key_mask, const int64_t* key_lengths, void* out, int64_t b,
                            int64_t tq, int64_t tk, int heads, int64_t d, DType dtype,
                            int64_t out_ld = 0);

// cuDNN's FP8 SDPA (Hopper and newer): q8 [B, Tq, H*d], k8 and v8 [B, Tk, H*d], o8 [B, Tq, H*d],
// e4m3 codes one byte each, contiguous, each tensor with one scale: the descales and scales are
// the device block `scalars` (fp8_quant.cuh, Fp8AttentionScalar, written by
// launch_fp8_attention_inputs on the same stream), the output coded as O / descale_o. The
// probabilities are coded in e4m3 too (P * 448), sums in fp32. `key_lengths`: null (no mask) or
// b prefix lengths (cuDNN's padding mask; the graph has no bias input in FP8). Returns false
// (counted as a fallback, logged once) where it cannot run: no frontend, below sm_90, d not a
// multiple of 16 <= 256, a pointer not 16-byte aligned, LATENT_CUDNN_SDPA=0, no graph yet while
// the stream is capturing, or cuDNN has no engine or fails (remembered). `dtype`: the caller's
// compute dtype (for the log and the plan's key only).
Result<bool> sdpa_attention_fp8(DeviceContext& ctx, const void* q8, const void* k8, const void* v8,
                                const int64_t* key_lengths, void* o8, float* scalars, int64_t b,
                                int64_t tq, int64_t tk, int heads, int64_t d, DType dtype);

// bias[r, c] = mask[r, c] != 0 ? 0 : -65504 for a [rows, cols] mask, into rows of
// `bias_stride` >= cols elements (the padding columns -65504), in `dtype` (sdpa_bias.cu).
Status launch_sdpa_mask_bias(const void* mask, void* bias, int64_t rows, int64_t cols,
                             int64_t bias_stride, DType dtype, cudaStream_t stream);

}  // namespace latent::cuda
