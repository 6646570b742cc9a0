// Retaining a device's primary context for other CUDA users in the process (GStreamer's CUDA
// elements, through elements/gstlatentcuda.cpp): the context the runtime calls of the CUDA
// backend run in, so device pointers pass between them unchanged. And page-locked host memory
// for their system-memory buffers.
#include <cuda.h>  // CUcontext, CUresult: types only; the driver is reached through the runtime

#include <map>
#include <mutex>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/cuda_backend.h"
#include "engine/backends/cuda/memory.h"

namespace latent {

namespace {

using PrimaryCtxRetain = CUresult (*)(CUcontext*, CUdevice);

Result<void*> retain(int index) {
  const int count = cuda_runtime_device_count();
  if (index < 0 || index >= count)
    return Status::errorf("cuda:", index, ": no such CUDA device (", count, " found)");
  {
    // The runtime initialises the driver and creates the primary context (as the backend will);
    // the guard puts this thread's current device back.
    cuda::DeviceGuard guard;
    LATENT_TRY(guard.set(index));
    LATENT_CUDA_CHECK(cudaFree(nullptr));
  }
  // Through the runtime's entry-point query, so neither the engine nor the plugin links libcuda.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  LATENT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxRetain", &fn, 12000,
                                                     cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || !fn)
    return Status::errorf("cuda:", index,
                          ": the driver has no cuDevicePrimaryCtxRetain (query result ",
                          static_cast<int>(found), ")");
  CUcontext handle = nullptr;
  const CUresult rc = reinterpret_cast<PrimaryCtxRetain>(fn)(&handle, static_cast<CUdevice>(index));
  if (rc != CUDA_SUCCESS || !handle) {
    LATENT_ERROR("cuDevicePrimaryCtxRetain(cuda:", index, ") failed: CUresult ", static_cast<int>(rc));
    return Status::errorf("cuDevicePrimaryCtxRetain(cuda:", index, ") failed: CUresult ",
                          static_cast<int>(rc));
  }
  LATENT_INFO("cuda:", index, ": retained the primary context ", static_cast<void*>(handle));
  return static_cast<void*>(handle);
}

}  // namespace

Result<void*> cuda_retain_primary_context(int index) {
  // Retained once and kept for the life of the process: the backend's runtime uses it anyway.
  // A failure is not remembered, so a later call may succeed (a driver loaded since, say).
  static std::mutex* mutex = new std::mutex;
  static auto* retained = new std::map<int, void*>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = retained->find(index);
  if (it != retained->end()) return it->second;
  LATENT_ASSIGN_OR_RETURN(void* handle, retain(index));
  (*retained)[index] = handle;
  return handle;
}

Result<void*> cuda_alloc_pinned_host(int device, size_t bytes) {
  const int count = cuda_runtime_device_count();
  if (device < 0 || device >= count)
    return Status::errorf("cuda:", device, ": no such CUDA device (", count, " found)");
  cuda::DeviceGuard guard;  // the device's context, not device 0's
  LATENT_TRY(guard.set(device));
  void* data = nullptr;
  LATENT_CUDA_CHECK(cudaHostAlloc(&data, bytes, cudaHostAllocPortable));
  return data;
}

void cuda_free_pinned_host(int device, void* data) {
  if (!data) return;
  cuda::DeviceGuard guard;
  if (!guard.set(device).ok()) return;
  LATENT_CUDA_WARN(cudaFreeHost(data));
}

}  // namespace latent
