#include "engine/backends/backend.h"

#include <cmath>
#include <memory>
#include <vector>

#include "engine/core/env.h"
#include "engine/weights/fp8.h"

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
    case OpKind::kInterleavePhases2x:
      return "interleave_phases2x";
  }
  return "unknown";
}

Fp8Attention fp8_attention_from_env() {
  static constexpr Fp8Attention kSpelled[] = {Fp8Attention::kCodes, Fp8Attention::kAmax,
                                              Fp8Attention::kOff};
  return kSpelled[env_choice("LATENT_FP8_ATTENTION", {{"codes"}, {"1"}, {"0"}}, 0)];
}

Status check_phases2x(const Tensor& z) {
  if (!z.defined() || z.rank() != 4)
    return Status::errorf("interleave_phases2x: expected z [N, 4C, H + 1, W + 1], got ",
                          z.defined() ? shape_str(z.shape()) : "an undefined tensor");
  if (z.dim(1) < 4 || z.dim(1) % 4 != 0)
    return Status::errorf("interleave_phases2x: z ", shape_str(z.shape()), " has ", z.dim(1),
                          " channels, not 4 phases of C >= 1 channels each");
  if (z.dim(0) < 1 || z.dim(2) < 2 || z.dim(3) < 2)
    return Status::errorf("interleave_phases2x: z ", shape_str(z.shape()),
                          " is not [N, 4C, H + 1, W + 1] with N, H and W at least 1");
  return ok_status();
}

bool Backend::supports(OpKind op, DType dtype, const Shape& shape) const {
  if (!supports(op, dtype) || shape.size() != 4) return false;
  for (int64_t d : shape)
    if (d <= 0) return false;
  return true;
}

Result<Tensor> Backend::frame_to_tensor(const FrameDesc& frame, const FrameGeometry& g,
                                        const Tensor* into) {
  (void)g, (void)into;
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

namespace {
// The fence of a conversion that was complete on return.
class DoneFence final : public DeviceFence {
 public:
  Status wait() override { return ok_status(); }
};
}  // namespace

Result<std::unique_ptr<DeviceFence>> Backend::fence() {
  return std::unique_ptr<DeviceFence>(std::make_unique<DoneFence>());
}

Result<std::unique_ptr<DeviceFence>> Backend::queue_tensor_to_device_latent(const Tensor& latent,
                                                                            void* data,
                                                                            DType dtype) {
  LATENT_TRY(tensor_to_device_latent(latent, data, dtype));
  return std::unique_ptr<DeviceFence>(std::make_unique<DoneFence>());
}

Result<Fp8Matrix> Backend::fp8_quantize_rows(const Tensor& x) {
  if (!x.defined() || x.rank() < 1 || x.numel() == 0)
    return Status::errorf("fp8_quantize_rows: x ",
                          x.defined() ? shape_str(x.shape()) : std::string("undefined"),
                          " has no rows to quantise");
  LATENT_ASSIGN_OR_RETURN(Tensor host, download(x));
  std::vector<float> v = host.to_floats();
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  std::vector<uint8_t> q(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = v.data() + r * cols;
    const float scale = fp8_e4m3_quantize_row(row, static_cast<size_t>(cols), q.data());
    for (int64_t k = 0; k < cols; ++k) row[k] = fp8_e4m3_to_f32(q[k]) * scale;
  }
  Fp8Matrix m;
  m.shape = x.shape();
  LATENT_ASSIGN_OR_RETURN(m.dequant, upload(Tensor::from_floats(x.shape(), v)));
  return m;
}

Result<Tensor> Backend::linear_fp8(const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& bias,
                                   DitActivation act) {
  if (!x.dequant.defined() || !w.dequant.defined())
    return Status::errorf("linear_fp8: the operands were not quantised by backend ", name());
  return linear(x.dequant, w.dequant, bias, act);
}

Result<Tensor> Backend::linear_fp8_joined(const Fp8Matrix& x_a, const Fp8Matrix& w_a,
                                          const Tensor& b_a, const Fp8Matrix& x_b,
                                          const Fp8Matrix& w_b, const Tensor& b_b) {
  LATENT_ASSIGN_OR_RETURN(Tensor a, linear_fp8(x_a, w_a, b_a, DitActivation::kNone));
  LATENT_ASSIGN_OR_RETURN(Tensor b, linear_fp8(x_b, w_b, b_b, DitActivation::kNone));
  return concat({a, b}, 1);
}

Result<Tensor> Backend::linear_fp8_gated_add(const Fp8Matrix& x, const Fp8Matrix& w,
                                             const Tensor& bias, const Tensor& gate,
                                             const Tensor& residual) {
  if (gate.numel() != w.rows())
    return Status::errorf("linear_fp8_gated_add: gate ", shape_str(gate.shape()),
                          " is not one row of ", w.rows(), " (one batch row, one token group)");
  LATENT_ASSIGN_OR_RETURN(Tensor y, linear_fp8(x, w, bias, DitActivation::kNone));
  if (residual.shape() != y.shape())
    return Status::errorf("linear_fp8_gated_add: residual ", shape_str(residual.shape()),
                          " is not the output's ", shape_str(y.shape()));
  return gated_add(residual, y, gate, {0});
}

namespace {

// The shape of x with its last dim set to n.
Shape with_last(const Tensor& x, int64_t n) {
  Shape s = x.shape();
  s.back() = n;
  return s;
}

std::string shape_or_undefined(const Tensor& x) {
  return x.defined() ? shape_str(x.shape()) : std::string("undefined");
}

}  // namespace

// y [..., N] followed by `extra` zero columns (the composed *_wide ops' columns left to the
// caller).
Result<Tensor> Backend::append_zero_columns(const Tensor& y, int64_t extra) {
  if (extra == 0) return y;
  if (extra < 0) return Status::errorf("append_zero_columns: ", extra, " columns");
  LATENT_ASSIGN_OR_RETURN(Tensor zeros, upload(Tensor::zeros(with_last(y, extra), DType::kF32)));
  return concat({y, zeros}, -1);
}

Result<Tensor> Backend::layer_norm_modulate_wide(const Tensor& x, const Tensor& shift,
                                                 const Tensor& scale,
                                                 const std::vector<int64_t>& group_starts,
                                                 float eps, int64_t extra) {
  if (extra < 0)
    return Status::errorf("layer_norm_modulate_wide: ", extra, " extra columns asked for");
  LATENT_ASSIGN_OR_RETURN(Tensor y, layer_norm_modulate(x, shift, scale, group_starts, eps));
  return append_zero_columns(y, extra);
}

Result<Tensor> Backend::linear_wide(const Tensor& x, const Tensor& w, const Tensor& bias,
                                    DitActivation act, int64_t extra) {
  if (!x.defined() || !w.defined() || x.rank() < 1 || w.rank() != 2 || w.dim(1) > x.dim(-1) ||
      extra < 0)
    return Status::errorf("linear_wide: weight w ", shape_or_undefined(w),
                          " must be [N, K] with K at most the columns of x ", shape_or_undefined(x),
                          ", and extra columns (", extra, ") not negative");
  Tensor xk = x;
  if (w.dim(1) < x.dim(-1)) {
    LATENT_ASSIGN_OR_RETURN(xk, slice(x, x.rank() - 1, 0, w.dim(1)));
  }
  LATENT_ASSIGN_OR_RETURN(Tensor y, linear(xk, w, bias, act));
  return append_zero_columns(y, extra);
}

Result<Tensor> Backend::linear_into_columns(const Tensor& x, const Tensor& w, int64_t column) {
  if (!x.defined() || !w.defined() || x.rank() < 1 || w.rank() != 2 || w.dim(1) > column ||
      column + w.dim(0) > x.dim(-1))
    return Status::errorf("linear_into_columns: weight w ", shape_or_undefined(w),
                          " [N, K] must read columns before ", column, " and write [", column, ", ",
                          column + (w.defined() && w.rank() == 2 ? w.dim(0) : 0),
                          ") inside the columns of x ", shape_or_undefined(x));
  const int last = x.rank() - 1;
  const int64_t cols = x.dim(-1), n = w.dim(0);
  LATENT_ASSIGN_OR_RETURN(Tensor xk, slice(x, last, 0, w.dim(1)));
  LATENT_ASSIGN_OR_RETURN(Tensor h, linear(xk, w, Tensor(), DitActivation::kNone));
  std::vector<Tensor> parts;
  LATENT_ASSIGN_OR_RETURN(Tensor head, slice(x, last, 0, column));
  parts.push_back(head);
  parts.push_back(h);
  if (column + n < cols) {
    LATENT_ASSIGN_OR_RETURN(Tensor tail, slice(x, last, column + n, cols - column - n));
    parts.push_back(tail);
  }
  return concat(parts, last);
}

Result<Tensor> Backend::attention_wide(const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                                       const Tensor& key_mask,
                                       const std::vector<int64_t>& key_lengths, int64_t extra) {
  if (extra < 0) return Status::errorf("attention_wide: ", extra, " extra columns asked for");
  LATENT_ASSIGN_OR_RETURN(Tensor y, attention(q, k, v, heads, key_mask, key_lengths));
  return append_zero_columns(y, extra);
}

Result<Tensor> Backend::joint_qk(const Tensor& img, const Tensor& txt, const Tensor& gamma_img,
                                 const Tensor& gamma_txt, const Tensor& freqs, int heads,
                                 float eps) {
  if (!img.defined() || !txt.defined() || img.rank() != 3 || txt.rank() != 3 || heads < 1 ||
      img.dim(2) % heads != 0)
    return Status::errorf("joint_qk: image ",
                          img.defined() ? shape_str(img.shape()) : std::string("undefined"),
                          " and text ",
                          txt.defined() ? shape_str(txt.shape()) : std::string("undefined"),
                          " must be [B, T, heads * d] with ", heads, " heads");
  const int64_t d = img.dim(2) / heads;
  auto norm = [&](const Tensor& x, const Tensor& gamma) -> Result<Tensor> {
    LATENT_ASSIGN_OR_RETURN(Tensor rows, x.reshape({x.numel() / d, d}));
    LATENT_ASSIGN_OR_RETURN(Tensor y, rms_norm(rows, gamma, eps));
    return y.reshape(x.shape());
  };
  LATENT_ASSIGN_OR_RETURN(Tensor a, norm(img, gamma_img));
  LATENT_ASSIGN_OR_RETURN(Tensor b, norm(txt, gamma_txt));
  LATENT_ASSIGN_OR_RETURN(Tensor joint, concat({a, b}, 1));
  return rope(joint, freqs, heads);
}

Result<Fp8Matrix> Backend::layer_norm_modulate_fp8(const Tensor& x, const Tensor& shift,
                                                  const Tensor& scale,
                                                  const std::vector<int64_t>& group_starts,
                                                  float eps) {
  LATENT_ASSIGN_OR_RETURN(Tensor y, layer_norm_modulate(x, shift, scale, group_starts, eps));
  return fp8_quantize_rows(y);
}

Result<Fp8Matrix> Backend::joint_qk_fp8(const Tensor& img, const Tensor& txt,
                                        const Tensor& gamma_img, const Tensor& gamma_txt,
                                        const Tensor& freqs, int heads, float eps, float bound) {
  if (!(bound > 0.f) || !std::isfinite(bound))
    return Status::errorf("joint_qk_fp8: bound ", bound, " is not a positive number");
  LATENT_ASSIGN_OR_RETURN(Tensor y, joint_qk(img, txt, gamma_img, gamma_txt, freqs, heads, eps));
  LATENT_ASSIGN_OR_RETURN(Tensor host, download(y));
  std::vector<float> v = host.to_floats();
  const float descale = bound / 448.f;
  for (float& x : v) x = fp8_e4m3_to_f32(fp8_e4m3_from_f32(x / descale)) * descale;
  Fp8Matrix m;
  m.shape = y.shape();
  LATENT_ASSIGN_OR_RETURN(m.dequant, upload(Tensor::from_floats(y.shape(), v)));
  return m;
}

Result<Fp8Matrix> Backend::attention_fp8_coded(const Fp8Matrix& q, const Fp8Matrix& k,
                                               const Tensor& v, int heads, const Tensor& key_mask,
                                               const std::vector<int64_t>& key_lengths) {
  if (!q.dequant.defined() || !k.dequant.defined())
    return Status::errorf("attention_fp8_coded: q and k were not coded by backend ", name());
  return attention_fp8(q.dequant, k.dequant, v, heads, key_mask, key_lengths);
}

Result<Fp8Matrix> Backend::attention_fp8(const Tensor& q, const Tensor& k, const Tensor& v,
                                         int heads, const Tensor& key_mask,
                                         const std::vector<int64_t>& key_lengths) {
  LATENT_ASSIGN_OR_RETURN(Tensor y, attention(q, k, v, heads, key_mask, key_lengths));
  return fp8_quantize_rows(y);
}

}  // namespace latent
