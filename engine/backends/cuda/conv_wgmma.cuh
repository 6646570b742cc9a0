// Hopper implicit-GEMM convolution (conv_wgmma.cu): spatial stride 1 or 2, any zero padding
// (diffusers' asymmetric (0, 1, 0, 1) downsampling included), any number of temporal taps, NHWC
// activations and K(T)RSC filters in bf16/fp16, with the bias, residual and activation epilogue
// fused (cuDNN's path runs it as a second pass). Built only where the CUDA architectures include 90
// (LATENT_CONV_WGMMA is then defined for the engine) and launched only on compute capability 9.0
// devices.
//
// The GEMM: M = output pixels (frames x H x W), N = output channels, K = taps x R x S x Cin.
// Input frames come from up to three places so a causal cache needs no join: output frame t
// reads input frames t .. t + kt - 1, and input frame f is frame f of `x0` when f < n0, else
// frame f - n0 of `x1` when f < n1, else frame f - n1 of `x2` (a 2-D convolution: kt = 1, n0 =
// the batch, x1 and x2 unused).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/launch.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent::cuda {

// A block's tile: 64 wg mt output pixels by bn output channels, with `stages` shared buffers. bn
// 0: the default for the call's output channels (conv_wgmma.cu): the TMA halo kernel at the
// shapes where it beats cuDNN (96 -> 96 channels; 64 -> 64 with a residual), the strip kernel
// at 64 -> 64 2-D 3x3 with no activation, ReLU or SiLU, else the implicit-GEMM tiles.
struct ConvWgmmaTile {
  int mt = 1, bn = 0, wg = 2, stages = 4;
  bool halo = false;      // the halo kernel (conv_wgmma.cu) for every call it fits
  bool halo_tma = false;  // the same with its loads by TMA ("halotma")
  int halo_rows = 0;      // 96 -> 96 TMA halo tile: output rows a block ("halotmar4"; 0: 2)
  int halo_stages = 0;  // and filter buffers ("halotmas2" / "s3" / "s4"; 0: 2 at 96 -> 96, else 3)
  bool no_halo = false;   // "implicit": the implicit-GEMM tiles only, no halo kernel
  bool strip64 = false;   // "strip64": the strip kernel wherever it fits (64 -> 64 2-D 3x3)
  bool strip64_staged = false;  // "strip64s": its session-23 form (fp32 staging in shared memory)
};

// LATENT_CONV_WGMMA_TILE's values: "<128|256>x<64|96|128|192|256>" (two warpgroups; 256 with bn
// <= 128: two m64 tiles each), or "256x<64|96|128>w4" (four warpgroups of one m64 tile), "w4s5"
// with 5 shared buffers; "halo": the halo kernel (2 or 4 output rows of 64 pixels a block, the
// input under them loaded once a temporal tap) for the calls it fits (stride 1, 3x3 (x kt)
// filters, 64 or 96 input channels; the default tile elsewhere) with cp.async loads; "halotma":
// the same with TMA loads, for every call it fits; "implicit": never the halo kernel (the
// implicit-GEMM default tiles everywhere, and no strip kernel); "strip64": the strip kernel (64
// output channels as M, the filter resident, persistent) at every 64 -> 64 2-D 3x3 stride 1
// call; "strip64s": the same with session 23's epilogue (fp32 staged in shared memory; also
// where y or the residual is not 16-byte aligned, or with GELU / tanh). Null or empty: the default
// ({} with bn 0: the strip kernel, else halotma, where they beat cuDNN's fused graphs per call,
// bench/NOTES.md sessions 23 and 24).
// An error names the value.
inline Result<ConvWgmmaTile> parse_conv_wgmma_tile(const char* text) {
  ConvWgmmaTile f;
  if (!text || !*text) return f;
  if (std::string(text) == "halo") {
    f.halo = true;
    return f;
  }
  if (std::string(text).rfind("halotma", 0) == 0) {
    // "halotma", optionally "r2" / "r4" (rows a block) then "s2" / "s3" / "s4" (filter buffers)
    const std::string rest = std::string(text).substr(7);
    int r = 0, st = 0;
    size_t i = 0;
    if (i < rest.size() && rest[i] == 'r' && i + 1 < rest.size()) r = rest[i + 1] - '0', i += 2;
    if (i < rest.size() && rest[i] == 's' && i + 1 < rest.size()) st = rest[i + 1] - '0', i += 2;
    if (i == rest.size() && (r == 0 || r == 2 || r == 4) && (st == 0 || (st >= 2 && st <= 4))) {
      f.halo_tma = true;
      f.halo_rows = r;
      f.halo_stages = st;
      return f;
    }
  }
  if (std::string(text) == "implicit") {
    f.no_halo = true;
    return f;
  }
  if (std::string(text) == "strip64") {
    f.strip64 = true;
    return f;
  }
  if (std::string(text) == "strip64s") {
    f.strip64_staged = true;
    return f;
  }
  int bm = 0, bn = 0, used = 0;
  const bool parsed = std::sscanf(text, "%dx%d%n", &bm, &bn, &used) == 2;
  const std::string rest = parsed ? text + used : "";
  const bool w4 = rest == "w4" || rest == "w4s5";
  if (parsed && (rest.empty() || w4) && (bm == 128 || (bm == 256 && bn <= 128)) &&
      (!w4 || bm == 256) && (bn == 64 || bn == 96 || bn == 128 || bn == 192 || bn == 256)) {
    f.bn = bn;
    f.mt = w4 ? 1 : bm / 128;
    f.wg = w4 ? 4 : 2;
    f.stages = rest == "w4s5" ? 5 : 4;
    return f;
  }
  return Status::errorf("LATENT_CONV_WGMMA_TILE=", text,
                        " is not a tile (128x64, 128x96, 128x128, 128x192, 128x256, 256x64, "
                        "256x96, 256x128; 256x64w4, 256x96w4, 256x128w4, each also with s5; "
                        "halo, halotma[r2|r4][s2|s3|s4], implicit, strip64, strip64s)");
}

struct ConvWgmmaArgs {
  const void* x0 = nullptr;  // input frames [0, n0): [n0][h][w][c]
  const void* x1 = nullptr;  // input frames [n0, n1): [..][h][w][c]
  const void* x2 = nullptr;  // input frames [n1, frames + kt - 1), or null (x1 has them all)
  int n0 = 0;
  int n1 = 0;                      // with x2 only
  int frames = 0;                  // output frames (or images)
  int h = 0, w = 0, c = 0;         // input height, width, channels (c % 8 == 0)
  int k = 0;                       // output channels
  int kt = 1, r = 1, s = 1;        // temporal taps, filter height and width
  int stride = 1;                  // spatial stride, 1 or 2
  int pad_top = 0, pad_left = 0;   // zero padding before the first row / column (the bottom and
                                   // right padding follow from out_h, out_w)
  int out_h = 0, out_w = 0;        // output height and width
  const void* weight = nullptr;    // [k][kt][r][s][c]
  const void* bias = nullptr;      // [k] or null
  const void* residual = nullptr;  // [frames][out_h][out_w][k] or null
  void* y = nullptr;               // [frames][out_h][out_w][k]
  Activation act = Activation::kNone;
  ConvWgmmaTile tile;  // forced where its bn divides k (bench_conv's sweeps); else the default
  // [k] or null: y = act(rms_norm_channels(conv + bias) * norm_gamma) (the Wan VAEs' channel RMS
  // norm, rms_norm.cu, of the output rounded to the dtype first, as the unfused path reads it)
  // in the same pass; only where conv_wgmma_norm_fits().
  const void* norm_gamma = nullptr;
};

// The input frames of a call as the kernels (this one and conv_narrow.cu) read them: input frame
// f is frame f of x0 when f < n0, else frame f - n0 of x1 when f < n1, else frame f - n1 of x2,
// with the absent tensors and bounds filled in so that no branch needs a null check.
struct ConvFrames {
  const void* x0 = nullptr;
  const void* x1 = nullptr;
  const void* x2 = nullptr;
  int n0 = 0, n1 = 0;
  int64_t frame_elems = 0;  // h * w * c
};

inline ConvFrames conv_frames(const ConvWgmmaArgs& a) {
  ConvFrames f;
  f.x0 = a.x0;
  f.x1 = a.x1 ? a.x1 : a.x0;
  f.x2 = a.x2 ? a.x2 : f.x1;
  f.n0 = a.x1 ? a.n0 : a.frames + a.kt;  // no x1: every frame from x0
  f.n1 = a.x2 ? a.n1 : a.frames + a.kt;  // no x2: every frame past x0 from x1
  f.frame_elems = static_cast<int64_t>(a.h) * a.w * a.c;
  return f;
}

// What every convolution kernel of ours reads (conv_wgmma.cu and conv_narrow.cu extend it), as
// conv_kernel_args() fills it from a call's arguments: trivially copyable, passed by value.
struct ConvKernelArgs {
  ConvFrames in;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* y = nullptr;
  int frames = 0, h = 0, w = 0, c = 0, k = 0, kt = 1, r = 1, s = 1;
  int pad_h = 0, pad_w = 0, out_h = 0, out_w = 0, act = 0;
};

inline ConvKernelArgs conv_kernel_args(const ConvWgmmaArgs& a) {
  ConvKernelArgs p;
  p.in = conv_frames(a);
  p.weight = a.weight;
  p.bias = a.bias;
  p.residual = a.residual;
  p.y = a.y;
  p.frames = a.frames;
  p.h = a.h;
  p.w = a.w;
  p.c = a.c;
  p.k = a.k;
  p.kt = a.kt;
  p.r = a.r;
  p.s = a.s;
  p.pad_h = a.pad_top;
  p.pad_w = a.pad_left;
  p.out_h = a.out_h;
  p.out_w = a.out_w;
  p.act = static_cast<int>(a.act);
  return p;
}

// Whether a call's frame sources are consistent and its inputs and filter 16-byte aligned (the
// kernels' cp.async loads).
inline bool conv_frames_fit(const ConvWgmmaArgs& a) {
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if (a.x2 && (!a.x1 || a.n1 <= a.n0 || a.n1 > a.frames + a.kt - 1)) return false;
  return aligned(a.x0) && (!a.x1 || aligned(a.x1)) && (!a.x2 || aligned(a.x2)) && aligned(a.weight);
}

// Whether the kernel runs this call: bf16/fp16, a compute capability 9.0 device, c % 8 == 0, an
// output-channel tile that divides k, r * s <= 32, stride 1 or 2, padding smaller than the
// filter, 16-byte aligned pointers, sizes within int32.
bool conv_wgmma_fits(const ConvWgmmaArgs& a, DType dtype, const Launch& l);

// Whether the kernel beat cuDNN at this shape on the H100 (bench_conv), reading the frames from
// where they are: the backend's default runs it only there.
bool conv_wgmma_preferred(const ConvWgmmaArgs& a, const Launch& l);

// Whether a call with norm_gamma runs with the norm in its epilogue: conv_wgmma_fits(), the kernel
// that runs it holds all k output channels of a pixel in one block (the halo tiles at 96 -> 96, or
// an implicit-GEMM tile as wide as k), no residual, SiLU or no activation, gamma 16-byte aligned.
bool conv_wgmma_norm_fits(const ConvWgmmaArgs& a, DType dtype, const Launch& l);

Status launch_conv_wgmma(const ConvWgmmaArgs& a, DType dtype, const Launch& l);

}  // namespace latent::cuda
