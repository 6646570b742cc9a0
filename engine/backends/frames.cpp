#include "engine/backends/frames.h"

#include <atomic>
#include <vector>

namespace latent {

namespace {

std::atomic<int64_t> g_h2d{0}, g_d2h{0}, g_h2d_bytes{0}, g_d2h_bytes{0};

inline uint8_t round_byte(float v) {
  if (!(v > 0.f)) return 0;
  if (v >= 255.f) return 255;
  return static_cast<uint8_t>(v + 0.5f);
}

}  // namespace

int frame_format_planes(FrameFormat f) {
  switch (f) {
    case FrameFormat::kNV12:
      return 2;
    case FrameFormat::kI420:
      return 3;
    default:
      return 1;
  }
}

const char* frame_format_name(FrameFormat f) {
  if (frame_format_is_packed(f)) return pixel_format_name(frame_pixel_format(f));
  if (f == FrameFormat::kNV12) return "NV12";
  if (f == FrameFormat::kI420) return "I420";
  return "?";
}

YuvCoefficients yuv_coefficients(const YuvColor& c) {
  double kr = 0.299, kb = 0.114;
  if (c.matrix == YuvMatrix::kBT709) kr = 0.2126, kb = 0.0722;
  if (c.matrix == YuvMatrix::kBT2020) kr = 0.2627, kb = 0.0593;
  const double kg = 1.0 - kr - kb;
  YuvCoefficients k;
  k.y_off = c.full_range ? 0.f : 16.f;
  k.y_scale = c.full_range ? 1.f : static_cast<float>(255.0 / 219.0);
  k.c_scale = c.full_range ? 1.f : static_cast<float>(255.0 / 224.0);
  k.cr_r = static_cast<float>(2.0 * (1.0 - kr));
  k.cb_b = static_cast<float>(2.0 * (1.0 - kb));
  k.cb_g = static_cast<float>(2.0 * kb * (1.0 - kb) / kg);
  k.cr_g = static_cast<float>(2.0 * kr * (1.0 - kr) / kg);
  return k;
}

Status check_frame_desc(const FrameDesc& f, const FrameGeometry& g) {
  if (f.format > FrameFormat::kI420)
    return Status::errorf("unknown frame format ", static_cast<int>(f.format));
  if (f.width != g.frame_width() || f.height != g.frame_height())
    return Status::errorf(frame_format_name(f.format), " frame of ", f.width, "x", f.height,
                          " does not match the planned frame size ", g.frame_width(), "x",
                          g.frame_height());
  if (g.x.model <= 0 || g.y.model <= 0 || f.width <= 0 || f.height <= 0)
    return Status::errorf("empty frame geometry (frame ", f.width, "x", f.height, ", model ",
                          g.x.model, "x", g.y.model, ")");
  const int planes = frame_format_planes(f.format);
  for (int i = 0; i < planes; ++i) {
    if (!f.planes[i])
      return Status::errorf(frame_format_name(f.format), " frame has no data for plane ", i);
    size_t row = 0;
    if (frame_format_is_packed(f.format))
      row =
          static_cast<size_t>(f.width) * pixel_layout(frame_pixel_format(f.format)).bytes_per_pixel;
    else if (i == 0)
      row = static_cast<size_t>(f.width);
    else
      row = static_cast<size_t>((f.width + 1) / 2) * (f.format == FrameFormat::kNV12 ? 2 : 1);
    if (f.strides[i] < row)
      return Status::errorf(frame_format_name(f.format), " plane ", i, ": row stride ",
                            f.strides[i], " is smaller than one row (", row, " bytes)");
  }
  return ok_status();
}

Status yuv_to_rgb_host(const FrameDesc& f, uint8_t* rgb, size_t rgb_stride) {
  if (frame_format_is_packed(f.format) || !f.device.is_cpu())
    return Status::errorf("yuv_to_rgb_host needs a host NV12 or I420 frame, got ",
                          frame_format_name(f.format), " on ", f.device.to_string());
  const YuvCoefficients k = yuv_coefficients(f.color);
  const auto* yp = static_cast<const uint8_t*>(f.planes[0]);
  const auto* up = static_cast<const uint8_t*>(f.planes[1]);
  const auto* vp = static_cast<const uint8_t*>(f.planes[2]);
  const bool nv12 = f.format == FrameFormat::kNV12;
  for (int y = 0; y < f.height; ++y) {
    const uint8_t* yrow = yp + static_cast<size_t>(y) * f.strides[0];
    const uint8_t* urow = up + static_cast<size_t>(y / 2) * f.strides[1];
    const uint8_t* vrow = nv12 ? urow : vp + static_cast<size_t>(y / 2) * f.strides[2];
    uint8_t* out = rgb + static_cast<size_t>(y) * rgb_stride;
    for (int x = 0; x < f.width; ++x) {
      const int cx = x / 2;
      const float Y = (yrow[x] - k.y_off) * k.y_scale;
      const float U = ((nv12 ? urow[2 * cx] : urow[cx]) - 128.f) * k.c_scale;
      const float V = ((nv12 ? vrow[2 * cx + 1] : vrow[cx]) - 128.f) * k.c_scale;
      out[3 * x + 0] = round_byte(Y + k.cr_r * V);
      out[3 * x + 1] = round_byte(Y - k.cb_g * U - k.cr_g * V);
      out[3 * x + 2] = round_byte(Y + k.cb_b * U);
    }
  }
  return ok_status();
}

// The checked entry points: what every backend may assume is checked here once, then the
// backend's own operation runs (Backend::frame_to_tensor() and friends).

Status check_image_target(const Backend& backend, const Tensor& t, const FrameGeometry& g) {
  const Shape want = {1, 3, g.model_height(), g.model_width()};
  if (!t.defined()) return Status::error("no tensor to write the image into");
  if (t.shape() != want || t.dtype() != backend.compute_dtype() || t.device() != backend.device())
    return Status::errorf("cannot write a ", shape_str(want), " ",
                          dtype_name(backend.compute_dtype()), " image of backend ", backend.name(),
                          " into ", t.describe());
  if (t.byte_offset() + t.nbytes() > t.storage()->bytes())
    return Status::errorf("image target ", t.describe(), " is larger than its storage");
  return ok_status();
}

Result<Tensor> frame_to_tensor(Backend& backend, const FrameDesc& frame, const FrameGeometry& g,
                               const Tensor* into) {
  LATENT_TRY(check_frame_desc(frame, g));
  if (!frame.device.is_cpu() && frame.device != backend.device())
    return Status::errorf(frame_format_name(frame.format), " frame on ", frame.device.to_string(),
                          " cannot be read by backend ", backend.name());
  if (into) LATENT_TRY(check_image_target(backend, *into, g));
  return backend.frame_to_tensor(frame, g, into);
}

Status tensor_to_frame(Backend& backend, const Tensor& image, const FrameGeometry& g,
                       const FrameDesc& frame) {
  LATENT_TRY(check_frame_desc(frame, g));
  if (!frame_format_is_packed(frame.format))
    return Status::errorf("cannot write ", frame_format_name(frame.format),
                          " frames (packed RGB formats only)");
  if (!frame.device.is_cpu() && frame.device != backend.device())
    return Status::errorf("frame on ", frame.device.to_string(), " cannot be written by backend ",
                          backend.name());
  if (!image.defined()) return Status::error("decoded image tensor is empty");
  const Shape want{1, 3, g.model_height(), g.model_width()};
  if (image.shape() != want)
    return Status::errorf("expected an image of shape ", shape_str(want), ", got ",
                          image.describe());
  return backend.tensor_to_frame(image, g, frame);
}

Result<std::unique_ptr<FrameStager>> create_frame_stager(Backend& backend, int depth) {
  if (depth < 0 || depth > 64) return Status::errorf("prefetch depth ", depth, " is outside 0..64");
  return backend.create_frame_stager(depth);
}

Result<std::unique_ptr<FrameDownloader>> create_frame_downloader(Backend& backend, int depth) {
  if (depth < 0 || depth > 64) return Status::errorf("prefetch depth ", depth, " is outside 0..64");
  return backend.create_frame_downloader(depth);
}

Result<Tensor> zero_image_tensor(Backend& backend, const FrameGeometry& g) {
  if (g.model_width() <= 0 || g.model_height() <= 0)
    return Status::errorf("empty frame geometry (model ", g.model_width(), "x", g.model_height(),
                          ")");
  return backend.zeros({1, 3, g.model_height(), g.model_width()});
}

Result<Tensor> zero_latent_tensor(Backend& backend, int channels, int height, int width) {
  if (channels <= 0 || height <= 0 || width <= 0)
    return Status::errorf("latent of ", channels, "x", height, "x", width, " is empty");
  return backend.zeros({1, channels, height, width});
}

Result<Tensor> device_latent_to_tensor(Backend& backend, const void* data, DType dtype,
                                       int channels, int height, int width) {
  if (!data) return Status::error("device latent buffer is null");
  if (channels <= 0 || height <= 0 || width <= 0)
    return Status::errorf("device latent of ", channels, "x", height, "x", width, " is empty");
  return backend.device_latent_to_tensor(data, dtype, channels, height, width);
}

namespace {
Status check_device_latent(const Tensor& latent, const void* data) {
  if (!data) return Status::error("device latent buffer is null");
  if (!latent.defined() || latent.rank() != 4 || latent.dim(0) != 1)
    return Status::errorf("expected a latent [1, C, h, w], got ",
                          latent.defined() ? latent.describe() : std::string("an empty tensor"));
  return ok_status();
}
}  // namespace

Status tensor_to_device_latent(Backend& backend, const Tensor& latent, void* data, DType dtype) {
  LATENT_TRY(check_device_latent(latent, data));
  return backend.tensor_to_device_latent(latent, data, dtype);
}

Result<std::unique_ptr<DeviceFence>> queue_tensor_to_device_latent(Backend& backend,
                                                                   const Tensor& latent, void* data,
                                                                   DType dtype) {
  LATENT_TRY(check_device_latent(latent, data));
  return backend.queue_tensor_to_device_latent(latent, data, dtype);
}

TransferCounts transfer_counts() {
  TransferCounts c;
  c.host_to_device = g_h2d.load();
  c.device_to_host = g_d2h.load();
  c.host_to_device_bytes = g_h2d_bytes.load();
  c.device_to_host_bytes = g_d2h_bytes.load();
  return c;
}

void reset_transfer_counts() {
  g_h2d = 0;
  g_d2h = 0;
  g_h2d_bytes = 0;
  g_d2h_bytes = 0;
}

void count_host_to_device(size_t bytes) {
  ++g_h2d;
  g_h2d_bytes += static_cast<int64_t>(bytes);
}

void count_device_to_host(size_t bytes) {
  ++g_d2h;
  g_d2h_bytes += static_cast<int64_t>(bytes);
}

}  // namespace latent
