// Upsample2D / WanResample / TAESD's nearest 2x upsampling followed by a 3x3 convolution with
// padding 1, run at the low resolution.
//
// Output pixel (2i + a, 2j + b) of conv3x3(up(x)) reads up(x)'s rows 2i + a - 1 .. 2i + a + 1,
// which are only two distinct rows of x, i - 1 + a and i + a (the middle one repeats one of
// them), and likewise for columns. So each of the four output phases (a, b) is a 2x2
// convolution of x whose taps are sums of the 3x3 taps (a = 0: rows {0}, {1, 2}; a = 1: rows
// {0, 1}, {2}), and the four are one 2x2 convolution of x with padding 1 to 4 Cout channels,
// z [N, 4 Cout, H + 1, W + 1], whose phase (a, b) at (i + a, j + b) is output pixel
// (2i + a, 2j + b) (Backend::interleave_phases2x). 16 multiply-adds per low-resolution pixel
// and channel pair instead of 36, and no upsampled tensor. Exact up to the rounding of the
// summed taps (once, in the compute dtype) and of the accumulation order; the padding matches
// too (the zero row above up(x) is x's row -1, as the one below is x's row H).
//
// Which way runs (LATENT_UPSAMPLE_CONV; bench/NOTES.md, session 32, has the measurements):
//  - `auto` (the default): phases on the CPU, and on a GPU where the input has >= 128 channels
//    (the compute-bound convolutions: FLUX.1's decoder 9 % faster, Qwen-Image's 6-7 %, the Wan
//    2.1 720p decoder stream 4.4 %). At 64 channels the 3x3 convolution of the upsampled input
//    runs on our own memory-bound kernel and the phases' 2x2 one on cuDNN: TAESD-size decoders
//    were 1.5-2 % slower as phases on an H200, so a GPU keeps the upsample there;
//  - `phases`: wherever the backend has interleave_phases2x;
//  - `upsample`: as the model is written (upsample, then the 3x3 convolution), for A/B runs.
#pragma once

#include <string>

#include "engine/backends/backend.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace latent {

class WeightBinder;

struct UpsampleConv {
  Tensor w, b;  // phases: [4 Cout, Cin, 2, 2] and the bias 4 times; else [Cout, Cin, 3, 3]
  bool phases = false;

  bool defined() const { return w.defined(); }
  // x: [N, Cin, H, W] -> act(conv3x3(up(x)) + bias): [N, Cout, 2H, 2W]
  Result<Tensor> operator()(Backend& be, const Tensor& x, Activation act = Activation::kNone) const;
  // Not as phases only: the 3x3 convolution of an input already upsampled (up(x), which a caller
  // may share between several such convolutions of one x).
  Result<Tensor> on_upsampled(Backend& be, const Tensor& up,
                              Activation act = Activation::kNone) const;
};

// How make_upsample_conv() runs it: as LATENT_UPSAMPLE_CONV chooses (above), or (tests) as
// phases wherever the backend can, or as written.
enum class UpsampleConvWay { kChosen, kPhases, kUpsample };

// Whether `be` runs an upsampling convolution of `in_channels` input channels as phases
// (interleave_phases2x in its compute dtype, and `way`).
bool upsample_conv_phases(const Backend& be, int64_t in_channels,
                          UpsampleConvWay way = UpsampleConvWay::kChosen);

// The four phases' 2x2 kernels of a 3x3 kernel: w [Cout, Cin, 3, 3] (host, fp32) ->
// [4 Cout, Cin, 2, 2] (host, fp32), phase (a, b) in rows [(2a + b) Cout, (2a + b + 1) Cout).
Tensor upsample_conv_phase_weights(const Tensor& w);

// From host fp32 weights w [Cout, Cin, 3, 3] and bias [Cout] (or undefined): uploaded to `be` as
// phases or as they are (`way`).
Result<UpsampleConv> make_upsample_conv(Backend& be, const Tensor& w, const Tensor& bias,
                                        UpsampleConvWay way = UpsampleConvWay::kChosen);

// The checkpoint's convolution `name` (`name`.weight [cout, cin, 3, 3], `name`.bias [cout] when
// `bias`), taken through the binder (whose finish() reports a missing or misshaped tensor, or an
// upload that failed, by name), uploaded to the binder's backend.
UpsampleConv load_upsample_conv(WeightBinder& binder, const std::string& name, int64_t cout,
                                int64_t cin, bool bias);

}  // namespace latent
