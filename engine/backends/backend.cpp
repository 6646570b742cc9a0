#include "engine/backends/backend.h"

#include <memory>

namespace latent {

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::kConv2d:
      return "conv2d";
    case OpKind::kGroupNorm:
      return "group_norm";
    case OpKind::kRmsNormChannels:
      return "rms_norm_channels";
    case OpKind::kActivation:
      return "activation";
    case OpKind::kAdd:
      return "add";
    case OpKind::kAffine:
      return "affine";
    case OpKind::kChannelAffine:
      return "channel_affine";
    case OpKind::kClamp:
      return "clamp";
    case OpKind::kUpsampleNearest2x:
      return "upsample_nearest2x";
    case OpKind::kSliceChannels:
      return "slice_channels";
    case OpKind::kSpatialAttention:
      return "spatial_attention";
  }
  return "unknown";
}

bool Backend::supports(OpKind op, DType dtype, const Shape& shape) const {
  if (!supports(op, dtype) || shape.size() != 4) return false;
  for (int64_t d : shape)
    if (d <= 0) return false;
  return true;
}

Result<Tensor> Backend::frame_to_tensor(const FrameDesc& frame, const FrameGeometry& g) {
  (void)g;
  return Status::errorf("backend ", name(), " cannot read ", frame_format_name(frame.format),
                        " frames");
}

Status Backend::tensor_to_frame(const Tensor& image, const FrameGeometry& g,
                                const FrameDesc& frame) {
  (void)image, (void)g;
  return Status::errorf("backend ", name(), " cannot write ", frame_format_name(frame.format),
                        " frames");
}

Result<std::unique_ptr<FrameStager>> Backend::create_frame_stager(int depth) {
  (void)depth;
  return std::unique_ptr<FrameStager>();
}

Result<std::unique_ptr<FrameDownloader>> Backend::create_frame_downloader(int depth) {
  (void)depth;
  return std::unique_ptr<FrameDownloader>();
}

Result<Tensor> Backend::zeros(const Shape& shape) {
  return upload(Tensor::zeros(shape, DType::kF32));
}

Result<Tensor> Backend::device_latent_to_tensor(const void* data, DType dtype, int channels,
                                                int height, int width) {
  (void)data, (void)dtype, (void)channels, (void)height, (void)width;
  return Status::errorf("backend ", name(), " cannot read latents in device memory");
}

Status Backend::tensor_to_device_latent(const Tensor& latent, void* data, DType dtype) {
  (void)latent, (void)data, (void)dtype;
  return Status::errorf("backend ", name(), " cannot write latents to device memory");
}

}  // namespace latent
