// The CPU backend's frame I/O (Backend::frame_to_tensor() / tensor_to_frame(), reached through
// the checked wrappers of engine/backends/frames.h): the conversion of engine/core/pixels on
// host memory. Staging, downloading and device latents keep the base class's answers (nothing
// to stage; no device memory).
#include "engine/backends/frames.h"

#include <vector>

#include "engine/backends/cpu/cpu_backend.h"

namespace latent {

Result<Tensor> CpuBackend::frame_to_tensor(const FrameDesc& frame, const FrameGeometry& g,
                                           const Tensor* into) {
  (void)into;
  if (!frame.device.is_cpu())
    return Status::errorf("backend ", name(), " cannot read frames in device memory");
  Result<Tensor> host = Status::error("unset");
  if (frame_format_is_packed(frame.format)) {
    host = latent::frame_to_tensor(static_cast<const uint8_t*>(frame.planes[0]), frame.strides[0],
                                   frame_pixel_format(frame.format), g);
  } else {
    const size_t stride = static_cast<size_t>(frame.width) * 3;
    std::vector<uint8_t> rgb(stride * frame.height);
    LATENT_TRY(yuv_to_rgb_host(frame, rgb.data(), stride));
    host = latent::frame_to_tensor(rgb.data(), stride, PixelFormat::kRGB, g);
  }
  if (!host.ok()) return host.status();
  return upload(*host);
}

Status CpuBackend::tensor_to_frame(const Tensor& image, const FrameGeometry& g,
                                   const FrameDesc& frame) {
  if (!frame.device.is_cpu())
    return Status::errorf("backend ", name(), " cannot write frames in device memory");
  LATENT_ASSIGN_OR_RETURN(Tensor host, download(image));
  return latent::tensor_to_frame(host, g, frame_pixel_format(frame.format),
                                 static_cast<uint8_t*>(frame.planes[0]), frame.strides[0]);
}

}  // namespace latent
