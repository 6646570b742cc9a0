#include "engine/backends/backend.h"

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

}  // namespace latent
