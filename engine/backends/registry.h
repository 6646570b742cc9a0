// Backend creation: the one place that knows which backends this build has.
#pragma once

#include <memory>
#include <string>

#include "engine/backends/backend.h"

namespace latent {

struct BackendOptions {
  std::string device = "auto";  // "auto", "cpu", "cuda", "cuda:N"
  // Empty: the device's default (fp32 on the CPU, bf16 on CUDA).
  std::string dtype;
};

// True when this build contains the CUDA backend (it may still find no GPU at run time).
bool cuda_backend_built();
// Number of usable CUDA devices (0 without a driver or GPU, or in a CPU-only build).
int cuda_device_count();

// "auto" picks cuda:0 when a GPU is usable, else the CPU. Asking for cuda without a GPU, a
// device index out of range or an unsupported dtype is an error naming the problem.
// Backends are shared: the same (device, dtype) returns the same instance in one process.
Result<std::shared_ptr<Backend>> get_backend(const BackendOptions& options);

}  // namespace latent
