// Frames <-> model tensors on the GPU (the CUDA side of engine/backends/frames.h).
//
// The kernels read a frame's raw bytes (packed RGB formats, NV12, I420) and write the NHWC
// model tensor in the compute dtype, applying the size policy on the way (pad: edge
// replication; crop: centre window; scale: bilinear with half-pixel centres) exactly as
// engine/core/pixels.cpp does on the host; the way back writes packed bytes.
// Plain C++ (included by the .cpp host side and by the .cu kernels alike).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/launch.h"
#include "engine/backends/frames.h"
#include "engine/core/pixels.h"

namespace latent::cuda {

class DeviceContext;

// A frame the kernels read: plane pointers in device memory.
struct FrameKernelSource {
  FrameFormat format = FrameFormat::kRGB;
  int width = 0, height = 0;
  const uint8_t* planes[3] = {nullptr, nullptr, nullptr};
  size_t strides[3] = {0, 0, 0};
  YuvCoefficients yuv{};
};

// frame -> out [1, model_h, model_w, 3] (NHWC) in `dtype`.
Status launch_frame_to_nhwc(const FrameKernelSource& src, const FrameGeometry& g, void* out,
                            DType dtype, const Launch& l);
// in [1, model_h, model_w, 3] (NHWC) in `dtype` -> packed frame of g.frame_width x
// g.frame_height at `out` (device memory, `stride` bytes a row).
Status launch_nhwc_to_frame(const void* in, DType dtype, const FrameGeometry& g, PixelFormat format,
                            uint8_t* out, size_t stride, const Launch& l);

// What the CUDA backend's frame and latent I/O runs with: the backend (its device, dtype and
// name), its device context and launch configuration. The CUDA backend's overrides of
// Backend::frame_to_tensor() and friends make it from themselves (cuda_backend.cpp), so
// nothing here has to find out which backend it was given.
struct BackendIo {
  Backend& backend;
  std::shared_ptr<DeviceContext> ctx;
  Launch launch;
};

// The CUDA implementations behind frames.h (frame on the host or on the backend's device).
Result<Tensor> frame_to_tensor(const BackendIo& io, const FrameDesc& frame, const FrameGeometry& g,
                               const Tensor* into = nullptr);
Status tensor_to_frame(const BackendIo& io, const Tensor& image, const FrameGeometry& g,
                       const FrameDesc& frame);

Result<std::unique_ptr<FrameStager>> create_frame_stager(const BackendIo& io, int depth);
Result<std::unique_ptr<FrameDownloader>> create_frame_downloader(const BackendIo& io, int depth);
// A zero-filled tensor of `shape` in the compute dtype and NHWC layout (no host transfer).
Result<Tensor> zero_tensor(const BackendIo& io, const Shape& shape);

// The CUDA implementations of frames.h's device latents (latents.cpp).
Result<Tensor> device_latent_to_tensor(const BackendIo& io, const void* data, DType dtype,
                                       int channels, int height, int width);
Status tensor_to_device_latent(const BackendIo& io, const Tensor& latent, void* data, DType dtype);
// An event recorded on the backend's stream now, as a fence.
Result<std::unique_ptr<DeviceFence>> stream_fence(const BackendIo& io);
// The backend's stream waits on `fence` (one of stream_fence's events; any other fence is
// waited for on the host).
Status queue_wait(const BackendIo& io, DeviceFence& fence);
// The conversion queued on the backend's stream, with an event recorded after it as the fence.
Result<std::unique_ptr<DeviceFence>> queue_tensor_to_device_latent(const BackendIo& io,
                                                                   const Tensor& latent, void* data,
                                                                   DType dtype);

}  // namespace latent::cuda
