// Host-side conversion between packed 8-bit video frames and model input/output tensors, and
// the size policies that fit any frame size onto a model's downsampling grid.
//
// Values: a byte v maps to v / 127.5 - 1 (so [0, 255] -> [-1, 1]); the way back rounds to the
// nearest byte and clamps to 0..255 (NaN -> 0). Alpha and padding bytes are written as 255.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace latent {

// Packed 8-bit RGB formats, named as GStreamer names them ("x" = a byte that is ignored).
enum class PixelFormat : uint8_t {
  kRGB,
  kBGR,
  kRGBA,
  kBGRA,
  kRGBx,
  kBGRx,
  kxRGB,
  kxBGR,
  kARGB,
  kABGR,
};
constexpr int kPixelFormatCount = 10;

// Byte offsets of each component within one pixel; `a` is -1 for 3-byte formats (a 4-byte
// format's fourth byte, alpha or padding, is `a`).
struct PixelLayout {
  int bytes_per_pixel = 3;
  int r = 0, g = 1, b = 2, a = -1;
};
PixelLayout pixel_layout(PixelFormat f);
const char* pixel_format_name(PixelFormat f);  // "RGB", "xBGR", ...
Result<PixelFormat> parse_pixel_format(const std::string& name);

// How a frame whose sides are not multiples of the model's factor is fitted to it.
enum class SizePolicy : uint8_t {
  kPad,    // grow to the next multiple, replicating the right and bottom edge pixels
  kCrop,   // centre crop down to the previous multiple (decoding replicates the lost border)
  kScale,  // bilinear resize to the nearest multiple (decoding resizes back)
};
const char* size_policy_name(SizePolicy p);  // "pad", "crop", "scale"
Result<SizePolicy> parse_size_policy(const std::string& name);

// Largest frame side and factor the planner accepts.
constexpr int kMaxFrameSide = 16384;
constexpr int kMaxDownsample = 64;

// One axis of the mapping between a frame and the model grid.
struct AxisPlan {
  int frame = 0;   // frame pixels
  int model = 0;   // model-grid pixels (a multiple of the factor)
  int offset = 0;  // crop: first frame pixel of the model window; 0 otherwise
};
Result<AxisPlan> plan_axis(int frame, int factor, SizePolicy policy);

// The whole mapping for one frame size.
struct FrameGeometry {
  int factor = 8;
  SizePolicy policy = SizePolicy::kPad;
  AxisPlan x, y;

  int frame_width() const { return x.frame; }
  int frame_height() const { return y.frame; }
  int model_width() const { return x.model; }
  int model_height() const { return y.model; }
  int latent_width() const { return x.model / factor; }
  int latent_height() const { return y.model / factor; }
};
// Errors for sides outside 1..kMaxFrameSide, factors outside 1..kMaxDownsample and crops that
// leave nothing (a frame smaller than the factor).
Result<FrameGeometry> plan_frame_geometry(int frame_width, int frame_height, int factor,
                                          SizePolicy policy);

// Packed frame (`stride` bytes a row, g.frame_width x g.frame_height pixels) -> fp32
// [1, 3, model_height, model_width] host tensor in [-1, 1], fitted per g.policy.
Result<Tensor> frame_to_tensor(const uint8_t* data, size_t stride, PixelFormat format,
                               const FrameGeometry& g);

// fp32 host tensor [1, 3, model_height, model_width] -> packed frame of g.frame_width x
// g.frame_height, undoing g.policy (pad: the padding is cropped away; crop: the border is
// filled by replicating the edge; scale: resized back). Bytes past each row's pixels are left
// untouched.
Status tensor_to_frame(const Tensor& image, const FrameGeometry& g, PixelFormat format,
                       uint8_t* data, size_t stride);

// Bilinear resize of planar fp32 data [channels, sh, sw] -> [channels, dh, dw] with half-pixel
// centres and clamped edges (PyTorch's interpolate(mode="bilinear", align_corners=False) without
// antialiasing).
void resize_bilinear(const float* src, int channels, int sh, int sw, float* dst, int dh, int dw);

}  // namespace latent
