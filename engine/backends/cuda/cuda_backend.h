// Entry points of the CUDA backend used by the backend registry (only compiled with
// LATENT_HAVE_CUDA). The backend class itself is private to engine/backends/cuda/.
#pragma once

#include <memory>

#include "engine/backends/backend.h"

namespace latent {

// Number of CUDA devices the runtime sees; 0 (not an error) without a driver or GPU.
int cuda_runtime_device_count();
// Creates the backend for device `index` computing in `dtype` (bf16 default, fp16, fp32 with
// TF32). Errors name the device and the CUDA/cuDNN failure.
Result<std::shared_ptr<Backend>> create_cuda_backend(int index, DType dtype);
// retain_cuda_primary_context (engine/backends/registry.h): every CUDA call checked.
Result<void*> cuda_retain_primary_context(int index);
// alloc_pinned_host / free_pinned_host (engine/backends/registry.h).
Result<void*> cuda_alloc_pinned_host(int device, size_t bytes);
void cuda_free_pinned_host(int device, void* data);

}  // namespace latent
