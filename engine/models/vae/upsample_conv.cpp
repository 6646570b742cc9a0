#include "engine/models/vae/upsample_conv.h"

#include <utility>
#include <vector>

#include "engine/core/env.h"
#include "engine/weights/binder.h"

namespace latent {

bool upsample_conv_phases(const Backend& be, int64_t in_channels, UpsampleConvWay way) {
  if (way == UpsampleConvWay::kChosen) {
    // auto stays kChosen: the rule below
    static constexpr UpsampleConvWay kSpelled[] = {
        UpsampleConvWay::kChosen, UpsampleConvWay::kPhases, UpsampleConvWay::kUpsample};
    static const UpsampleConvWay chosen =
        kSpelled[env_choice("LATENT_UPSAMPLE_CONV", {{"auto"}, {"phases"}, {"upsample"}}, 0)];
    way = chosen;
  }
  if (way == UpsampleConvWay::kUpsample ||
      !be.supports(OpKind::kInterleavePhases2x, be.compute_dtype()))
    return false;
  return way == UpsampleConvWay::kPhases || be.device().is_cpu() || in_channels >= 128;
}

Tensor upsample_conv_phase_weights(const Tensor& w) {
  const int64_t cout = w.dim(0), cin = w.dim(1);
  Tensor p = Tensor::zeros({4 * cout, cin, 2, 2}, DType::kF32);
  const float* src = w.data_as<const float>();
  float* dst = p.data_as<float>();
  // The 3x3 taps that land on each of a phase's two rows (columns): parity 0 reads the row above
  // with tap 0 and its own with taps 1 and 2; parity 1 its own with taps 0 and 1, the one below
  // with tap 2.
  static constexpr int kFirst[2][2] = {{0, 1}, {0, 2}};  // [parity][2x2 row]: first 3x3 tap
  static constexpr int kLast[2][2] = {{0, 2}, {1, 2}};   // ... and last (inclusive)
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int64_t o = 0; o < cout; ++o)
        for (int64_t i = 0; i < cin; ++i) {
          const float* k = src + (o * cin + i) * 9;
          float* q = dst + (((2 * a + b) * cout + o) * cin + i) * 4;
          for (int r = 0; r < 2; ++r)
            for (int s = 0; s < 2; ++s) {
              float sum = 0.f;
              for (int y = kFirst[a][r]; y <= kLast[a][r]; ++y)
                for (int x = kFirst[b][s]; x <= kLast[b][s]; ++x) sum += k[y * 3 + x];
              q[r * 2 + s] = sum;
            }
        }
  return p;
}

Result<UpsampleConv> make_upsample_conv(Backend& be, const Tensor& w, const Tensor& bias,
                                        UpsampleConvWay way) {
  if (!w.defined() || w.rank() != 4 || w.dim(2) != 3 || w.dim(3) != 3 || w.dtype() != DType::kF32 ||
      !w.device().is_cpu())
    return Status::errorf(
        "an upsampling convolution takes a host fp32 [Cout, Cin, 3, 3] weight, got ",
        w.defined() ? w.describe() : "an undefined tensor");
  if (bias.defined() &&
      (bias.numel() != w.dim(0) || bias.dtype() != DType::kF32 || !bias.device().is_cpu()))
    return Status::errorf("an upsampling convolution's bias must be a host fp32 [", w.dim(0),
                          "], got ", bias.describe());
  UpsampleConv c;
  c.phases = upsample_conv_phases(be, w.dim(1), way);
  if (!c.phases) {
    LATENT_ASSIGN_OR_RETURN(c.w, be.upload(w));
    if (bias.defined()) {
      LATENT_ASSIGN_OR_RETURN(c.b, be.upload(bias));
    }
    return c;
  }
  LATENT_ASSIGN_OR_RETURN(c.w, be.upload(upsample_conv_phase_weights(w)));
  if (bias.defined()) {
    const int64_t cout = w.dim(0);
    Tensor b4 = Tensor::empty({4 * cout}, DType::kF32);
    for (int p = 0; p < 4; ++p)
      for (int64_t o = 0; o < cout; ++o)
        b4.data_as<float>()[p * cout + o] = bias.data_as<const float>()[o];
    LATENT_ASSIGN_OR_RETURN(c.b, be.upload(b4));
  }
  return c;
}

UpsampleConv load_upsample_conv(WeightBinder& binder, const std::string& name, int64_t cout,
                                int64_t cin, bool bias) {
  Tensor w = binder.take_host(name + ".weight", {cout, cin, 3, 3});
  Tensor b = bias ? binder.take_host(name + ".bias", {cout}) : Tensor();
  if (!w.defined() || (bias && !b.defined())) return UpsampleConv{};  // the binder says why
  Result<UpsampleConv> c = make_upsample_conv(binder.backend(), w, b);
  if (!c.ok()) {
    binder.note(c.status().with_context(str_cat("upsampling convolution '", name, "'")).message());
    return UpsampleConv{};
  }
  return std::move(c).value();
}

Result<Tensor> UpsampleConv::on_upsampled(Backend& be, const Tensor& up, Activation act) const {
  if (phases) return Status::errorf("an upsampling convolution held as phases takes x, not up(x)");
  return be.conv2d(up, w, b, Conv2dParams::same(3), Tensor(), act);
}

Result<Tensor> UpsampleConv::operator()(Backend& be, const Tensor& x, Activation act) const {
  if (!phases) {
    LATENT_ASSIGN_OR_RETURN(Tensor u, be.upsample_nearest2x(x));
    return on_upsampled(be, u, act);
  }
  // Padding 1 on every side: z's row p reads x's rows p - 1 and p (p = 0 .. H).
  Conv2dParams pad;
  pad.pad_top = pad.pad_bottom = pad.pad_left = pad.pad_right = 1;
  LATENT_ASSIGN_OR_RETURN(Tensor z, be.conv2d(x, w, b, pad, Tensor(), act));
  return be.interleave_phases2x(z);
}

}  // namespace latent
