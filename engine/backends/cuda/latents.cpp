// Latent buffers in device memory <-> backend tensors (frames.h), device-to-device: the
// GStreamer stages hand latents over in GPU memory and nothing goes through the host.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/convert.cuh"
#include "engine/backends/cuda/memory.h"
#include "engine/backends/cuda/pixels.cuh"

namespace latent::cuda {

Result<Tensor> device_latent_to_tensor(const BackendIo& io, const void* data, DType dtype,
                                       int channels, int height, int width) {
  Backend& backend = io.backend;
  const std::shared_ptr<DeviceContext>& ctx = io.ctx;
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx->device()));
  const Launch l = io.launch;
  // out: [1, C, h, w] in the backend's NHWC layout and compute dtype
  LATENT_ASSIGN_OR_RETURN(
      Tensor out, ctx->empty({1, channels, height, width}, backend.compute_dtype(), Layout::kNHWC));
  const int64_t pixels = static_cast<int64_t>(height) * width;
  if (channels > 1 && pixels > 1) {
    // [1][C][h*w] -> [1][h*w][C]
    LATENT_TRY(launch_transpose(data, dtype, out.data(), out.dtype(), 1, channels, pixels, l));
  } else {
    LATENT_TRY(launch_convert(data, dtype, out.data(), out.dtype(), channels * pixels, l));
  }
  return out;
}

namespace {

// Queues the conversion of `t` into `data` on the backend's stream.
Status launch_tensor_to_device_latent(const BackendIo& io, const Tensor& t, void* data,
                                      DType dtype) {
  Backend& backend = io.backend;
  const std::shared_ptr<DeviceContext>& ctx = io.ctx;
  if (t.device() != backend.device())
    return Status::errorf("latent ", t.describe(), " is not on ", backend.name());
  if (t.byte_offset() + t.nbytes() > t.storage()->bytes())
    return Status::errorf("latent ", t.describe(), " is larger than its storage");
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx->device()));
  const Launch l = io.launch;
  const int64_t channels = t.dim(1), pixels = t.dim(2) * t.dim(3);
  if (t.layout() == Layout::kNHWC && channels > 1 && pixels > 1) {
    // [1][h*w][C] -> [1][C][h*w]
    LATENT_TRY(launch_transpose(t.data(), t.dtype(), data, dtype, 1, pixels, channels, l));
  } else {
    LATENT_TRY(launch_convert(t.data(), t.dtype(), data, dtype, t.numel(), l));
  }
  return ok_status();
}

// Events of fences that are gone, per device, for the next fences: a stage makes one or two
// fences a frame (a latent's write, its reads), and these cost no driver object a frame. Never
// freed (the list would otherwise be destroyed at exit, after the driver's teardown); at most
// kKept a device stay, the rest are destroyed.
class SpareEvents {
 public:
  static SpareEvents& get() {
    static SpareEvents* spare = new SpareEvents();
    return *spare;
  }
  // The caller has set `device` current.
  Result<cudaEvent_t> take(int device) {
    {
      std::lock_guard<std::mutex> lock(lock_);
      std::vector<cudaEvent_t>& list = free_[device];
      if (!list.empty()) {
        cudaEvent_t e = list.back();
        list.pop_back();
        return e;
      }
    }
    cudaEvent_t event = nullptr;
    LATENT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void give(int device, cudaEvent_t event) {
    {
      std::lock_guard<std::mutex> lock(lock_);
      std::vector<cudaEvent_t>& list = free_[device];
      if (list.size() < kKept) {
        list.push_back(event);
        return;
      }
    }
    DeviceGuard guard;
    if (guard.set(device).ok()) LATENT_CUDA_WARN(cudaEventDestroy(event));
  }

 private:
  static constexpr size_t kKept = 64;
  std::mutex lock_;
  std::map<int, std::vector<cudaEvent_t>> free_;
};

// An event recorded on the backend's stream; given back to SpareEvents with the fence (a stream
// still waiting on it keeps what it was recorded for: a new record affects later waits only).
class EventFence final : public DeviceFence {
 public:
  EventFence(int device, cudaEvent_t event) : device_(device), event_(event) {}
  cudaEvent_t event() const { return event_; }
  ~EventFence() override { SpareEvents::get().give(device_, event_); }
  Status wait() override {
    DeviceGuard guard;
    LATENT_TRY(guard.set(device_));
    LATENT_CUDA_CHECK(cudaEventSynchronize(event_));
    return ok_status();
  }

 private:
  int device_;
  cudaEvent_t event_;
};

}  // namespace

Status tensor_to_device_latent(const BackendIo& io, const Tensor& t, void* data, DType dtype) {
  LATENT_TRY(launch_tensor_to_device_latent(io, t, data, dtype));
  // The buffer's reader (the next element) may use another stream.
  DeviceGuard guard;
  LATENT_TRY(guard.set(io.ctx->device()));
  LATENT_CUDA_CHECK(cudaStreamSynchronize(io.ctx->stream()));
  return ok_status();
}

Result<std::unique_ptr<DeviceFence>> queue_tensor_to_device_latent(const BackendIo& io,
                                                                   const Tensor& t, void* data,
                                                                   DType dtype) {
  LATENT_TRY(launch_tensor_to_device_latent(io, t, data, dtype));
  return stream_fence(io);
}

Result<std::unique_ptr<DeviceFence>> stream_fence(const BackendIo& io) {
  DeviceGuard guard;
  LATENT_TRY(guard.set(io.ctx->device()));
  LATENT_ASSIGN_OR_RETURN(cudaEvent_t event, SpareEvents::get().take(io.ctx->device()));
  auto fence = std::make_unique<EventFence>(io.ctx->device(), event);
  LATENT_CUDA_CHECK(cudaEventRecord(event, io.ctx->stream()));
  return std::unique_ptr<DeviceFence>(std::move(fence));
}

Status queue_wait(const BackendIo& io, DeviceFence& fence) {
  auto* event = dynamic_cast<EventFence*>(&fence);
  if (!event) return fence.wait();  // not a CUDA event: on the host
  DeviceGuard guard;
  LATENT_TRY(guard.set(io.ctx->device()));
  // (An event of another device is fine: the stream waits for it all the same.)
  LATENT_CUDA_CHECK(cudaStreamWaitEvent(io.ctx->stream(), event->event(), 0));
  return ok_status();
}

}  // namespace latent::cuda
