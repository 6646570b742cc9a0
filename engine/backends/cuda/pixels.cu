// Frame conversion kernels (see pixels.cuh). One thread per output pixel, grid-stride.
#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/pixels.cuh"

namespace latent::cuda {
namespace {

struct Taps {
  int i0, i1;
  float w1;
};

// PyTorch's bilinear source taps (align_corners=False, no antialias), in double as the host.
__device__ __forceinline__ Taps bilinear_taps(int i, int s, int d) {
  const double scale = static_cast<double>(s) / d;
  double c = (i + 0.5) * scale - 0.5;
  if (c < 0) c = 0;
  int i0 = static_cast<int>(c);
  if (i0 > s - 1) i0 = s - 1;
  const int i1 = i0 + 1 < s - 1 ? i0 + 1 : s - 1;
  return {i0, i1, static_cast<float>(c - i0)};
}

__device__ __forceinline__ int clampi(int v, int lo, int hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

__device__ __forceinline__ float round_byte(float v) {
  if (!(v > 0.f)) return 0.f;
  if (v >= 255.f) return 255.f;
  return floorf(v + 0.5f);
}

__device__ __forceinline__ float byte_value(float b) { return b / 127.5f - 1.f; }

struct PackedLayout {
  int bpp, r, g, b, a;
};

// Frame pixel (x, y) as three values in [-1, 1].
__device__ __forceinline__ void read_pixel(const FrameKernelSource& f, const PackedLayout& L, int x,
                                           int y, float& r, float& g, float& b) {
  if (f.format == FrameFormat::kNV12 || f.format == FrameFormat::kI420) {
    const YuvCoefficients& k = f.yuv;
    const float Y = (f.planes[0][static_cast<size_t>(y) * f.strides[0] + x] - k.y_off) * k.y_scale;
    const int cx = x / 2, cy = y / 2;
    float U, V;
    if (f.format == FrameFormat::kNV12) {
      const uint8_t* uv = f.planes[1] + static_cast<size_t>(cy) * f.strides[1] + 2 * cx;
      U = uv[0];
      V = uv[1];
    } else {
      U = f.planes[1][static_cast<size_t>(cy) * f.strides[1] + cx];
      V = f.planes[2][static_cast<size_t>(cy) * f.strides[2] + cx];
    }
    U = (U - 128.f) * k.c_scale;
    V = (V - 128.f) * k.c_scale;
    // __fmul_rn/__fadd_rn: no FMA contraction, so the bytes match the host's rounding.
    r = byte_value(round_byte(__fadd_rn(Y, __fmul_rn(k.cr_r, V))));
    g = byte_value(
        round_byte(__fadd_rn(__fsub_rn(Y, __fmul_rn(k.cb_g, U)), -__fmul_rn(k.cr_g, V))));
    b = byte_value(round_byte(__fadd_rn(Y, __fmul_rn(k.cb_b, U))));
    return;
  }
  const uint8_t* px = f.planes[0] + static_cast<size_t>(y) * f.strides[0] + x * L.bpp;
  r = byte_value(px[L.r]);
  g = byte_value(px[L.g]);
  b = byte_value(px[L.b]);
}

template <typename T>
__global__ void frame_to_nhwc_kernel(FrameKernelSource f, PackedLayout L, FrameGeometry geo,
                                     T* out) {
  const int fw = geo.x.frame, fh = geo.y.frame, mw = geo.x.model, mh = geo.y.model;
  const bool resize = geo.policy == SizePolicy::kScale && (fw != mw || fh != mh);
  const int ox = geo.policy == SizePolicy::kScale ? 0 : geo.x.offset;
  const int oy = geo.policy == SizePolicy::kScale ? 0 : geo.y.offset;
  const int64_t n = static_cast<int64_t>(mw) * mh;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int x = static_cast<int>(i % mw), y = static_cast<int>(i / mw);
    float v[3];
    if (!resize) {
      read_pixel(f, L, clampi(x + ox, 0, fw - 1), clampi(y + oy, 0, fh - 1), v[0], v[1], v[2]);
    } else {
      const Taps tx = bilinear_taps(x, fw, mw), ty = bilinear_taps(y, fh, mh);
      float p00[3], p01[3], p10[3], p11[3];
      read_pixel(f, L, tx.i0, ty.i0, p00[0], p00[1], p00[2]);
      read_pixel(f, L, tx.i1, ty.i0, p01[0], p01[1], p01[2]);
      read_pixel(f, L, tx.i0, ty.i1, p10[0], p10[1], p10[2]);
      read_pixel(f, L, tx.i1, ty.i1, p11[0], p11[1], p11[2]);
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const float top = __fadd_rn(p00[c], __fmul_rn(__fsub_rn(p01[c], p00[c]), tx.w1));
        const float bottom = __fadd_rn(p10[c], __fmul_rn(__fsub_rn(p11[c], p10[c]), tx.w1));
        v[c] = __fadd_rn(top, __fmul_rn(__fsub_rn(bottom, top), ty.w1));
      }
    }
    T* o = out + i * 3;
    o[0] = from_f32<T>(v[0]);
    o[1] = from_f32<T>(v[1]);
    o[2] = from_f32<T>(v[2]);
  }
}

__device__ __forceinline__ uint8_t to_byte(float v) {
  const float x = (v + 1.f) * 127.5f;
  if (!(x > 0.f)) return 0;
  if (x >= 255.f) return 255;
  return static_cast<uint8_t>(x + 0.5f);
}

template <typename T>
__global__ void nhwc_to_frame_kernel(const T* in, FrameGeometry geo, PackedLayout L, uint8_t* out,
                                     size_t stride) {
  const int fw = geo.x.frame, fh = geo.y.frame, mw = geo.x.model, mh = geo.y.model;
  const bool resize = geo.policy == SizePolicy::kScale && (fw != mw || fh != mh);
  const int ox = geo.policy == SizePolicy::kCrop ? geo.x.offset : 0;
  const int oy = geo.policy == SizePolicy::kCrop ? geo.y.offset : 0;
  const int64_t n = static_cast<int64_t>(fw) * fh;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int x = static_cast<int>(i % fw), y = static_cast<int>(i / fw);
    float v[3];
    if (!resize) {
      const T* p =
          in +
          (static_cast<int64_t>(clampi(y - oy, 0, mh - 1)) * mw + clampi(x - ox, 0, mw - 1)) * 3;
      v[0] = to_f32(p[0]);
      v[1] = to_f32(p[1]);
      v[2] = to_f32(p[2]);
    } else {
      const Taps tx = bilinear_taps(x, mw, fw), ty = bilinear_taps(y, mh, fh);
      const T* p00 = in + (static_cast<int64_t>(ty.i0) * mw + tx.i0) * 3;
      const T* p01 = in + (static_cast<int64_t>(ty.i0) * mw + tx.i1) * 3;
      const T* p10 = in + (static_cast<int64_t>(ty.i1) * mw + tx.i0) * 3;
      const T* p11 = in + (static_cast<int64_t>(ty.i1) * mw + tx.i1) * 3;
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        const float a = to_f32(p00[c]), b = to_f32(p01[c]), d = to_f32(p10[c]), e = to_f32(p11[c]);
        const float top = __fadd_rn(a, __fmul_rn(__fsub_rn(b, a), tx.w1));
        const float bottom = __fadd_rn(d, __fmul_rn(__fsub_rn(e, d), tx.w1));
        v[c] = __fadd_rn(top, __fmul_rn(__fsub_rn(bottom, top), ty.w1));
      }
    }
    uint8_t* px = out + static_cast<size_t>(y) * stride + static_cast<size_t>(x) * L.bpp;
    px[L.r] = to_byte(v[0]);
    px[L.g] = to_byte(v[1]);
    px[L.b] = to_byte(v[2]);
    if (L.a >= 0) px[L.a] = 255;
  }
}

PackedLayout packed_layout(FrameFormat f) {
  if (!frame_format_is_packed(f)) return {1, 0, 0, 0, -1};
  const PixelLayout p = pixel_layout(frame_pixel_format(f));
  return {p.bytes_per_pixel, p.r, p.g, p.b, p.a};
}

constexpr int kThreads = 256;

}  // namespace

Status launch_frame_to_nhwc(const FrameKernelSource& src, const FrameGeometry& g, void* out,
                            DType dtype, const Launch& l) {
  const int64_t n = static_cast<int64_t>(g.x.model) * g.y.model;
  const unsigned blocks = grid_for(n, kThreads, l);
  const PackedLayout L = packed_layout(src.format);
  switch (dtype) {
    case DType::kF32:
      frame_to_nhwc_kernel<float>
          <<<blocks, kThreads, 0, l.stream>>>(src, L, g, static_cast<float*>(out));
      break;
    case DType::kBF16:
      frame_to_nhwc_kernel<bf16>
          <<<blocks, kThreads, 0, l.stream>>>(src, L, g, static_cast<bf16*>(out));
      break;
    case DType::kF16:
      frame_to_nhwc_kernel<f16>
          <<<blocks, kThreads, 0, l.stream>>>(src, L, g, static_cast<f16*>(out));
      break;
  }
  LATENT_CUDA_CHECK_LAUNCH("frame_to_nhwc");
  return ok_status();
}

Status launch_nhwc_to_frame(const void* in, DType dtype, const FrameGeometry& g, PixelFormat format,
                            uint8_t* out, size_t stride, const Launch& l) {
  const int64_t n = static_cast<int64_t>(g.x.frame) * g.y.frame;
  const unsigned blocks = grid_for(n, kThreads, l);
  const PackedLayout L = packed_layout(frame_format(format));
  switch (dtype) {
    case DType::kF32:
      nhwc_to_frame_kernel<float>
          <<<blocks, kThreads, 0, l.stream>>>(static_cast<const float*>(in), g, L, out, stride);
      break;
    case DType::kBF16:
      nhwc_to_frame_kernel<bf16>
          <<<blocks, kThreads, 0, l.stream>>>(static_cast<const bf16*>(in), g, L, out, stride);
      break;
    case DType::kF16:
      nhwc_to_frame_kernel<f16>
          <<<blocks, kThreads, 0, l.stream>>>(static_cast<const f16*>(in), g, L, out, stride);
      break;
  }
  LATENT_CUDA_CHECK_LAUNCH("nhwc_to_frame");
  return ok_status();
}

}  // namespace latent::cuda
