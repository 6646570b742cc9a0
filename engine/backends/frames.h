// Video frames <-> model tensors on a backend, GStreamer-free.
//
// A FrameDesc points at the planes of one 8-bit frame, in host memory or in the memory of a
// CUDA device. frame_to_tensor() turns it into the backend tensor a VAE encoder takes
// ([1, 3, model_height, model_width] in the backend's compute dtype and layout, values in
// [-1, 1]), fitting its size per a FrameGeometry (engine/core/pixels.h); tensor_to_frame() does
// the inverse into a packed frame. The CPU backend delegates to engine/core/pixels; the CUDA
// backend converts with kernels (engine/backends/cuda/pixels.cu), uploading a host frame as its
// raw bytes, so the conversion work never runs on the host.
//
// The functions below check their arguments (frame description, device, shapes, depth) once
// and call the backend's own operation (Backend::frame_to_tensor() and friends, backend.h):
// engine/backends/cpu/frames.cpp, engine/backends/cuda/pixels.cpp and latents.cpp.
//
// YUV input (NV12, I420) is converted to RGB bytes first (rounded and clamped as a converter
// would), with the chroma sample of each 2x2 block (no chroma interpolation), then follows the
// packed path; CPU and CUDA give the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/backends/backend.h"
#include "engine/backends/frame_types.h"
#include "engine/core/pixels.h"

namespace latent {

// Checks a frame's description against a geometry (sizes, strides, planes) and names the fault.
Status check_frame_desc(const FrameDesc& frame, const FrameGeometry& g);

// frame -> backend tensor [1, 3, g.model_height(), g.model_width()] (compute dtype; NHWC on
// CUDA). The frame must be on the host or on the backend's device; a host frame may be freed
// or reused once this returns. `into`: a tensor of the backend shaped, typed and laid out as
// that image (a plan's input buffer, PlannedPart::input()), which the backend writes and
// returns where it can (CUDA), so nothing is copied again; anything else is refused.
Result<Tensor> frame_to_tensor(Backend& backend, const FrameDesc& frame, const FrameGeometry& g,
                               const Tensor* into = nullptr);

// Whether `t` can hold an image of `backend` as frame_to_tensor() makes it for `g`: the shape,
// the compute dtype and the device, contiguous in its storage (the backend checks the layout).
Status check_image_target(const Backend& backend, const Tensor& t, const FrameGeometry& g);

// backend tensor [1, 3, g.model_height(), g.model_width()] -> packed frame (`frame` must be a
// packed format, on the host or on the backend's device), undoing g.policy. The frame holds the
// result when this returns.
Status tensor_to_frame(Backend& backend, const Tensor& image, const FrameGeometry& g,
                       const FrameDesc& frame);

// A stager for `backend` (which must outlive it), or null (not an error) where staging buys
// nothing (the CPU).
Result<std::unique_ptr<FrameStager>> create_frame_stager(Backend& backend, int depth);

// A downloader for `backend` (which must outlive it), or null (not an error) where it buys
// nothing (the CPU).
Result<std::unique_ptr<FrameDownloader>> create_frame_downloader(Backend& backend, int depth);

// Zero-filled tensors shaped, typed and laid out as frame_to_tensor() (an image [1, 3, H, W])
// and device_latent_to_tensor() (a latent [1, C, h, w]) make them on `backend`, made on the
// device without a host transfer: examples to plan a model part with at negotiation.
Result<Tensor> zero_image_tensor(Backend& backend, const FrameGeometry& g);
Result<Tensor> zero_latent_tensor(Backend& backend, int channels, int height, int width);

// Host copies of YUV frames: NV12/I420 -> packed RGB bytes (w * 3 a row), as described above.
Status yuv_to_rgb_host(const FrameDesc& frame, uint8_t* rgb, size_t rgb_stride);

// ---- latents in device memory (GPU-resident buffers between the stages) --------------------
// A latent buffer [C, h, w] (contiguous, channel-major, in `dtype`) at `data` in the memory of
// the backend's device -> backend tensor [1, C, h, w] in the compute dtype and layout. The copy
// (and re-layout) is device-to-device: no byte goes through the host. Errors on a CPU backend.
Result<Tensor> device_latent_to_tensor(Backend& backend, const void* data, DType dtype,
                                       int channels, int height, int width);
// backend tensor [1, C, h, w] -> latent buffer [C, h, w] (contiguous, channel-major, `dtype`)
// at `data` on the backend's device. The buffer is complete when this returns (its reader may
// be on another stream).
Status tensor_to_device_latent(Backend& backend, const Tensor& latent, void* data, DType dtype);
// The same, queued (Backend::queue_tensor_to_device_latent): the buffer is complete once the
// returned fence's wait() returns; wait without holding the backend's run lock.
Result<std::unique_ptr<DeviceFence>> queue_tensor_to_device_latent(Backend& backend,
                                                                   const Tensor& latent, void* data,
                                                                   DType dtype);

// ---- transfer counters (tests check that no byte takes a needless trip) ---------------------
// Every host -> device and device -> host copy the engine makes (backend upload/download and
// the frame paths above) counts here, process-wide.
struct TransferCounts {
  int64_t host_to_device = 0;
  int64_t device_to_host = 0;
  int64_t host_to_device_bytes = 0;
  int64_t device_to_host_bytes = 0;
};
TransferCounts transfer_counts();
void reset_transfer_counts();
void count_host_to_device(size_t bytes);
void count_device_to_host(size_t bytes);

}  // namespace latent
