// Backend creation: the one place that knows which backends this build has.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "engine/backends/backend.h"

namespace latent {

struct BackendOptions {
  std::string device = "auto";  // "auto" (or empty), "cpu", "cuda", "cuda:N"
  // Empty or "auto": the device's default (fp32 on the CPU, bf16 on CUDA).
  std::string dtype;
};

// True when this build contains the CUDA backend (it may still find no GPU at run time).
bool cuda_backend_built();
// Number of usable CUDA devices (0 without a driver or GPU, or in a CPU-only build).
int cuda_device_count();

// The device a `device` setting names, the one place that resolves "auto": "auto" (or empty)
// picks cuda:0 when a GPU is usable, else the CPU. Asking for cuda without a GPU (or in a build
// without CUDA) or a device index out of range is an error naming the problem.
Result<Device> resolve_device(const std::string& name);
// Whether `name` is a device setting at all (auto, empty, cpu, cuda, cuda:N), without probing
// for GPUs: for validating a setting when it is made.
Status check_device_name(const std::string& name);

// The backend resolve_device(options.device) names, computing in options.dtype (checked for
// the device). Backends are shared: the same (device, dtype) returns the same instance in one
// process.
Result<std::shared_ptr<Backend>> get_backend(const BackendOptions& options);

// The run lock of `backend`: backends and their one stream are shared by every user on the same
// device and dtype and are not thread-safe, so every engine call on `backend`, the destruction
// of every device tensor on it (frees are queued on its stream) and a CUDA graph capture on it
// hold this lock. One lock per backend for the life of the process.
std::shared_ptr<std::mutex> backend_run_lock(const Backend& backend);

// Retains CUDA device `index`'s primary context for the life of the process (once; later calls
// return the same handle) and returns its driver handle (a CUcontext): the context the CUDA
// backend's runtime calls use, for sharing device pointers with other CUDA libraries. Errors name
// the failed CUDA call, or say the build has no CUDA backend.
Result<void*> retain_cuda_primary_context(int index);

// Page-locked host memory that CUDA device `device` copies into (or out of) directly, e.g. a
// decoded frame's buffer (FrameDownloader::queue's `direct`): portable (every device may use it),
// freed with free_pinned_host() from any thread, also after every backend is gone. Errors name the
// failed call, or say the build has no CUDA backend.
Result<void*> alloc_pinned_host(int device, size_t bytes);
void free_pinned_host(int device, void* data);

}  // namespace latent
