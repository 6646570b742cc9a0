// Backend creation and sharing. The CUDA backend is linked in only with LATENT_HAVE_CUDA; a
// CPU-only build still answers every question about CUDA, with an error that says why.
#include "engine/backends/registry.h"

#include <map>
#include <mutex>
#include <utility>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/core/log.h"
#ifdef LATENT_HAVE_CUDA
#include "engine/backends/cuda/cuda_backend.h"
#endif

namespace latent {

bool cuda_backend_built() {
#ifdef LATENT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef LATENT_HAVE_CUDA
  return cuda_runtime_device_count();
#else
  return 0;
#endif
}

namespace {

bool is_auto(const std::string& name) { return name.empty() || name == "auto"; }

}  // namespace

Status check_device_name(const std::string& name) {
  if (is_auto(name)) return ok_status();
  return parse_device(name).status();
}

Result<Device> resolve_device(const std::string& name) {
  if (is_auto(name)) {
    if (cuda_backend_built() && cuda_device_count() > 0) return Device{DeviceKind::kCUDA, 0};
    return Device{DeviceKind::kCPU, 0};
  }
  LATENT_ASSIGN_OR_RETURN(Device device, parse_device(name));
  if (device.is_cpu()) return device;
  if (!cuda_backend_built())
    return Status::errorf("device '", name,
                          "': this build of gst-latent has no CUDA backend (built without CUDA "
                          "toolkit/cuDNN)");
  const int count = cuda_device_count();
  if (count == 0)
    return Status::errorf("no CUDA device available (", device.to_string(), " requested, 0 found)");
  if (device.index >= count)
    return Status::errorf("CUDA device ", device.to_string(), " out of range (", count,
                          " found: cuda:0",
                          count > 1 ? str_cat("..cuda:", count - 1) : std::string(), ")");
  return device;
}

namespace {

Result<std::shared_ptr<Backend>> create_backend(Device device, DType dtype) {
  if (device.is_cpu()) return create_cpu_backend(dtype);
#ifdef LATENT_HAVE_CUDA
  return create_cuda_backend(device.index, dtype);
#else
  return Status::errorf("device ", device.to_string(),
                        ": this build of gst-latent has no CUDA backend");
#endif
}

}  // namespace

Result<std::shared_ptr<Backend>> get_backend(const BackendOptions& options) {
  LATENT_ASSIGN_OR_RETURN(Device device, resolve_device(options.device));
  if (is_auto(options.device) && device.is_cpu())
    LATENT_INFO("device auto: ",
                cuda_backend_built() ? "no usable CUDA device" : "built without CUDA",
                ", using the CPU backend");
  DType dtype = device.is_cpu() ? DType::kF32 : DType::kBF16;
  if (!is_auto(options.dtype)) {
    LATENT_ASSIGN_OR_RETURN(dtype, parse_dtype(options.dtype));
  }

  // Leaked on purpose: backends must not be torn down during static destruction, after the
  // CUDA runtime may already have unloaded.
  static std::mutex* mutex = new std::mutex;
  static auto* backends = new std::map<std::pair<std::string, DType>, std::shared_ptr<Backend>>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto key = std::make_pair(device.to_string(), dtype);
  auto it = backends->find(key);
  if (it != backends->end()) return it->second;
  LATENT_ASSIGN_OR_RETURN(std::shared_ptr<Backend> backend, create_backend(device, dtype));
  LATENT_INFO("created backend ", backend->name(), " (", dtype_name(dtype), ")");
  backends->emplace(key, backend);
  return backend;
}

std::shared_ptr<std::mutex> backend_run_lock(const Backend& backend) {
  // Leaked like the backends themselves, which live as long as the process.
  static std::mutex* mutex = new std::mutex;
  static auto* locks = new std::map<const Backend*, std::shared_ptr<std::mutex>>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto& run_lock = (*locks)[&backend];
  if (!run_lock) run_lock = std::make_shared<std::mutex>();
  return run_lock;
}

Result<void*> retain_cuda_primary_context(int index) {
#ifdef LATENT_HAVE_CUDA
  return cuda_retain_primary_context(index);
#else
  return Status::errorf("cuda:", index, ": this build of gst-latent has no CUDA backend");
#endif
}

Result<void*> alloc_pinned_host(int device, size_t bytes) {
#ifdef LATENT_HAVE_CUDA
  return cuda_alloc_pinned_host(device, bytes);
#else
  (void)bytes;
  return Status::errorf("cuda:", device, ": this build of gst-latent has no CUDA backend");
#endif
}

void free_pinned_host(int device, void* data) {
#ifdef LATENT_HAVE_CUDA
  cuda_free_pinned_host(device, data);
#else
  (void)device;
  (void)data;
#endif
}

}  // namespace latent
