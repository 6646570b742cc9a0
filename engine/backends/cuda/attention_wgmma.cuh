// The Hopper (sm_90a, wgmma) flash-attention kernel of attention_wgmma.cu, for
// attention_flash.cu's dispatch. Built only where the CUDA architectures include 90
// (LATENT_ATTENTION_WGMMA is then defined for the engine).
#pragma once

#include "engine/backends/cuda/attention_flash.cuh"

namespace latent::cuda {

// Whether the wgmma kernel can run this call: bf16/fp16, d = 128, a compute capability 9.0
// device, its shared memory allowed (pointers are checked 16-byte aligned by the caller).
bool attention_wgmma_fits(const AttentionArgs& a, DType dtype, const Launch& l);

Status launch_attention_wgmma(const AttentionArgs& a, DType dtype, const Launch& l);

}  // namespace latent::cuda
