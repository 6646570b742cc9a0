#include "engine/core/pixels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace latent {

namespace {

struct FormatEntry {
  PixelFormat format;
  const char* name;
  PixelLayout layout;
};

// {bytes_per_pixel, r, g, b, a}
constexpr std::array<FormatEntry, kPixelFormatCount> kFormats = {{
    {PixelFormat::kRGB, "RGB", {3, 0, 1, 2, -1}},
    {PixelFormat::kBGR, "BGR", {3, 2, 1, 0, -1}},
    {PixelFormat::kRGBA, "RGBA", {4, 0, 1, 2, 3}},
    {PixelFormat::kBGRA, "BGRA", {4, 2, 1, 0, 3}},
    {PixelFormat::kRGBx, "RGBx", {4, 0, 1, 2, 3}},
    {PixelFormat::kBGRx, "BGRx", {4, 2, 1, 0, 3}},
    {PixelFormat::kxRGB, "xRGB", {4, 1, 2, 3, 0}},
    {PixelFormat::kxBGR, "xBGR", {4, 3, 2, 1, 0}},
    {PixelFormat::kARGB, "ARGB", {4, 1, 2, 3, 0}},
    {PixelFormat::kABGR, "ABGR", {4, 3, 2, 1, 0}},
}};

const FormatEntry& entry(PixelFormat f) { return kFormats[static_cast<size_t>(f)]; }

// byte -> [-1, 1]
struct ByteTable {
  float v[256];
  ByteTable() {
    for (int i = 0; i < 256; ++i) v[i] = static_cast<float>(i) / 127.5f - 1.f;
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

inline uint8_t to_byte(float v) {
  float x = (v + 1.f) * 127.5f;
  if (!(x > 0.f)) return 0;  // also NaN
  if (x >= 255.f) return 255;
  return static_cast<uint8_t>(x + 0.5f);
}

inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Frame -> planar [3, out_h, out_w], reading frame pixel (clamp(y + oy), clamp(x + ox)).
// With offsets 0 and out == frame this is a plain conversion; pad and crop are both this.
void unpack_shifted(const uint8_t* data, size_t stride, const PixelLayout& L, int fw, int fh,
                    int ox, int oy, int out_w, int out_h, float* out) {
  const ByteTable& t = byte_table();
  std::vector<int> src_x(out_w);
  for (int x = 0; x < out_w; ++x) src_x[x] = clampi(x + ox, 0, fw - 1) * L.bytes_per_pixel;
  const size_t plane = static_cast<size_t>(out_w) * out_h;
  float* pr = out;
  float* pg = out + plane;
  float* pb = out + 2 * plane;
  for (int y = 0; y < out_h; ++y) {
    const uint8_t* row = data + static_cast<size_t>(clampi(y + oy, 0, fh - 1)) * stride;
    const size_t o = static_cast<size_t>(y) * out_w;
    for (int x = 0; x < out_w; ++x) {
      const uint8_t* px = row + src_x[x];
      pr[o + x] = t.v[px[L.r]];
      pg[o + x] = t.v[px[L.g]];
      pb[o + x] = t.v[px[L.b]];
    }
  }
}

// Planar [3, in_h, in_w] -> frame, writing frame pixel (y, x) from planar
// (clamp(y - oy), clamp(x - ox)).
void pack_shifted(const float* in, int in_w, int in_h, int ox, int oy, const PixelLayout& L, int fw,
                  int fh, uint8_t* data, size_t stride) {
  std::vector<int> src_x(fw);
  for (int x = 0; x < fw; ++x) src_x[x] = clampi(x - ox, 0, in_w - 1);
  const size_t plane = static_cast<size_t>(in_w) * in_h;
  const float* pr = in;
  const float* pg = in + plane;
  const float* pb = in + 2 * plane;
  for (int y = 0; y < fh; ++y) {
    const size_t o = static_cast<size_t>(clampi(y - oy, 0, in_h - 1)) * in_w;
    uint8_t* row = data + static_cast<size_t>(y) * stride;
    for (int x = 0; x < fw; ++x) {
      uint8_t* px = row + static_cast<size_t>(x) * L.bytes_per_pixel;
      const size_t i = o + src_x[x];
      px[L.r] = to_byte(pr[i]);
      px[L.g] = to_byte(pg[i]);
      px[L.b] = to_byte(pb[i]);
      if (L.a >= 0) px[L.a] = 255;
    }
  }
}

Status check_frame_args(const uint8_t* data, size_t stride, PixelFormat format,
                        const FrameGeometry& g) {
  if (static_cast<int>(format) >= kPixelFormatCount) return Status::error("unknown pixel format");
  if (!data) return Status::error("frame has no data");
  if (g.x.frame <= 0 || g.y.frame <= 0 || g.x.model <= 0 || g.y.model <= 0)
    return Status::errorf("empty frame geometry (frame ", g.x.frame, "x", g.y.frame, ", model ",
                          g.x.model, "x", g.y.model, ")");
  const size_t row = static_cast<size_t>(g.x.frame) * pixel_layout(format).bytes_per_pixel;
  if (stride < row)
    return Status::errorf("row stride ", stride, " is smaller than one row of ", g.x.frame, " ",
                          pixel_format_name(format), " pixels (", row, " bytes)");
  return ok_status();
}

}  // namespace

PixelLayout pixel_layout(PixelFormat f) { return entry(f).layout; }

const char* pixel_format_name(PixelFormat f) { return entry(f).name; }

Result<PixelFormat> parse_pixel_format(const std::string& name) {
  for (const FormatEntry& e : kFormats)
    if (name == e.name) return e.format;
  return Status::errorf("unsupported pixel format '", name,
                        "' (expected RGB, BGR, RGBA, BGRA, RGBx, BGRx, xRGB, xBGR, ARGB or ABGR)");
}

const char* size_policy_name(SizePolicy p) {
  switch (p) {
    case SizePolicy::kPad:
      return "pad";
    case SizePolicy::kCrop:
      return "crop";
    case SizePolicy::kScale:
      return "scale";
  }
  return "?";
}

Result<SizePolicy> parse_size_policy(const std::string& name) {
  if (name == "pad") return SizePolicy::kPad;
  if (name == "crop") return SizePolicy::kCrop;
  if (name == "scale") return SizePolicy::kScale;
  return Status::errorf("unknown size policy '", name, "' (expected pad, crop or scale)");
}

Result<AxisPlan> plan_axis(int frame, int factor, SizePolicy policy) {
  if (factor < 1 || factor > kMaxDownsample)
    return Status::errorf("downsampling factor ", factor, " is outside 1..", kMaxDownsample);
  if (frame < 1 || frame > kMaxFrameSide)
    return Status::errorf("frame side ", frame, " is outside 1..", kMaxFrameSide);
  AxisPlan a;
  a.frame = frame;
  switch (policy) {
    case SizePolicy::kPad:
      a.model = (frame + factor - 1) / factor * factor;
      break;
    case SizePolicy::kCrop:
      a.model = frame / factor * factor;
      if (a.model == 0)
        return Status::errorf("cannot crop a side of ", frame, " pixels to a multiple of ", factor,
                              " (use size-policy pad or scale)");
      a.offset = (frame - a.model) / 2;
      break;
    case SizePolicy::kScale:
      a.model = std::max(factor, (frame + factor / 2) / factor * factor);
      break;
    default:
      return Status::error("unknown size policy");
  }
  return a;
}

Result<FrameGeometry> plan_frame_geometry(int frame_width, int frame_height, int factor,
                                          SizePolicy policy) {
  FrameGeometry g;
  g.factor = factor;
  g.policy = policy;
  auto x = plan_axis(frame_width, factor, policy);
  if (!x.ok()) return x.status().with_context(str_cat("frame width ", frame_width));
  auto y = plan_axis(frame_height, factor, policy);
  if (!y.ok()) return y.status().with_context(str_cat("frame height ", frame_height));
  g.x = *x;
  g.y = *y;
  return g;
}

void resize_bilinear(const float* src, int channels, int sh, int sw, float* dst, int dh, int dw) {
  // Source coordinate of each destination column/row: (i + 0.5) * scale - 0.5, clamped at 0.
  struct Tap {
    int i0, i1;
    float w1;
  };
  auto taps = [](int s, int d) {
    std::vector<Tap> t(d);
    const double scale = static_cast<double>(s) / d;
    for (int i = 0; i < d; ++i) {
      double c = (i + 0.5) * scale - 0.5;
      if (c < 0) c = 0;
      int i0 = static_cast<int>(c);
      if (i0 > s - 1) i0 = s - 1;
      const int i1 = std::min(i0 + 1, s - 1);
      t[i] = {i0, i1, static_cast<float>(c - i0)};
    }
    return t;
  };
  const std::vector<Tap> tx = taps(sw, dw);
  const std::vector<Tap> ty = taps(sh, dh);
  const size_t splane = static_cast<size_t>(sw) * sh;
  const size_t dplane = static_cast<size_t>(dw) * dh;
  for (int c = 0; c < channels; ++c) {
    const float* s = src + c * splane;
    float* d = dst + c * dplane;
    for (int y = 0; y < dh; ++y) {
      const float* r0 = s + static_cast<size_t>(ty[y].i0) * sw;
      const float* r1 = s + static_cast<size_t>(ty[y].i1) * sw;
      const float wy = ty[y].w1;
      float* out = d + static_cast<size_t>(y) * dw;
      for (int x = 0; x < dw; ++x) {
        const Tap& t = tx[x];
        const float top = r0[t.i0] + (r0[t.i1] - r0[t.i0]) * t.w1;
        const float bottom = r1[t.i0] + (r1[t.i1] - r1[t.i0]) * t.w1;
        out[x] = top + (bottom - top) * wy;
      }
    }
  }
}

Result<Tensor> frame_to_tensor(const uint8_t* data, size_t stride, PixelFormat format,
                               const FrameGeometry& g) {
  LATENT_TRY(check_frame_args(data, stride, format, g));
  const PixelLayout L = pixel_layout(format);
  const int fw = g.x.frame, fh = g.y.frame, mw = g.x.model, mh = g.y.model;
  Tensor out = Tensor::empty({1, 3, mh, mw}, DType::kF32);
  if (g.policy == SizePolicy::kScale) {
    if (fw == mw && fh == mh) {
      unpack_shifted(data, stride, L, fw, fh, 0, 0, mw, mh, out.data_as<float>());
    } else {
      std::vector<float> full(static_cast<size_t>(3) * fw * fh);
      unpack_shifted(data, stride, L, fw, fh, 0, 0, fw, fh, full.data());
      resize_bilinear(full.data(), 3, fh, fw, out.data_as<float>(), mh, mw);
    }
  } else {
    unpack_shifted(data, stride, L, fw, fh, g.x.offset, g.y.offset, mw, mh, out.data_as<float>());
  }
  return out;
}

Status tensor_to_frame(const Tensor& image, const FrameGeometry& g, PixelFormat format,
                       uint8_t* data, size_t stride) {
  LATENT_TRY(check_frame_args(data, stride, format, g));
  const int fw = g.x.frame, fh = g.y.frame, mw = g.x.model, mh = g.y.model;
  if (!image.defined()) return Status::error("decoded image tensor is empty");
  if (!image.device().is_cpu() || image.dtype() != DType::kF32 ||
      image.layout() != Layout::kContiguous)
    return Status::errorf("expected a contiguous fp32 host image, got ", image.describe());
  if (image.shape() != Shape{1, 3, mh, mw})
    return Status::errorf("expected an image of shape ", shape_str({1, 3, mh, mw}), ", got ",
                          image.describe());
  const PixelLayout L = pixel_layout(format);
  const float* src = image.data_as<float>();
  if (g.policy == SizePolicy::kScale && (fw != mw || fh != mh)) {
    std::vector<float> full(static_cast<size_t>(3) * fw * fh);
    resize_bilinear(src, 3, mh, mw, full.data(), fh, fw);
    pack_shifted(full.data(), fw, fh, 0, 0, L, fw, fh, data, stride);
  } else {
    const bool shifted = g.policy == SizePolicy::kCrop;
    pack_shifted(src, mw, mh, shifted ? g.x.offset : 0, shifted ? g.y.offset : 0, L, fw, fh, data,
                 stride);
  }
  return ok_status();
}

}  // namespace latent
