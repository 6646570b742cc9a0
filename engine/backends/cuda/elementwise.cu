#include "engine/backends/cuda/common.cuh"
#include "engine/backends/cuda/elementwise.cuh"

namespace latent::cuda {
namespace {

constexpr int kThreads = 256;

struct ActOp {
  Activation act;
  __device__ float operator()(float v) const { return activate(v, act); }
};
struct AffineOp {
  float scale, shift;
  __device__ float operator()(float v) const { return fmaf(v, scale, shift); }
};
struct ClampOp {
  float lo, hi;
  __device__ float operator()(float v) const { return fminf(fmaxf(v, lo), hi); }
};

// y = f(x). `vec`: x and y are 16-byte aligned, so all but the tail goes in 16-byte packs.
template <typename T, typename F>
__global__ void unary_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, bool vec, F f) {
  constexpr int V = Pack<T>::kN;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  int64_t tail = 0;
  if (vec) {
    const int64_t packs = n / V;
    for (int64_t i = first; i < packs; i += stride) {
      Pack<T> p = load_pack(x + i * V);
#pragma unroll
      for (int j = 0; j < V; ++j) p.v[j] = from_f32<T>(f(to_f32(p.v[j])));
      store_pack(y + i * V, p);
    }
    tail = packs * V;
  }
  for (int64_t i = tail + first; i < n; i += stride) y[i] = from_f32<T>(f(to_f32(x[i])));
}

template <typename T>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                           int64_t n, bool vec) {
  constexpr int V = Pack<T>::kN;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  int64_t tail = 0;
  if (vec) {
    const int64_t packs = n / V;
    for (int64_t i = first; i < packs; i += stride) {
      Pack<T> p = load_pack(a + i * V);
      const Pack<T> q = load_pack(b + i * V);
#pragma unroll
      for (int j = 0; j < V; ++j) p.v[j] = from_f32<T>(to_f32(p.v[j]) + to_f32(q.v[j]));
      store_pack(y + i * V, p);
    }
    tail = packs * V;
  }
  for (int64_t i = tail + first; i < n; i += stride)
    y[i] = from_f32<T>(to_f32(a[i]) + to_f32(b[i]));
}

struct ChannelCoefficients {
  float scale[kMaxAffineChannels];
  float shift[kMaxAffineChannels];
};

// `vec` also requires channels % V == 0, so a pack never straddles two pixels.
template <typename T>
__global__ void channel_affine_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                      int channels, bool vec,
                                      const __grid_constant__ ChannelCoefficients coef) {
  __shared__ float scale[kMaxAffineChannels], shift[kMaxAffineChannels];
  for (int c = threadIdx.x; c < channels; c += blockDim.x) {
    scale[c] = coef.scale[c];
    shift[c] = coef.shift[c];
  }
  __syncthreads();
  constexpr int V = Pack<T>::kN;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (vec) {
    for (int64_t i = first; i < n / V; i += stride) {
      Pack<T> p = load_pack(x + i * V);
      const int c0 = static_cast<int>((i * V) % channels);
#pragma unroll
      for (int j = 0; j < V; ++j)
        p.v[j] = from_f32<T>(fmaf(to_f32(p.v[j]), scale[c0 + j], shift[c0 + j]));
      store_pack(y + i * V, p);
    }
  } else {
    for (int64_t i = first; i < n; i += stride) {
      const int c = static_cast<int>(i % channels);
      y[i] = from_f32<T>(fmaf(to_f32(x[i]), scale[c], shift[c]));
    }
  }
}

template <typename T>
__global__ void bias_residual_act_kernel(T* __restrict__ y, const T* __restrict__ bias,
                                         const T* __restrict__ residual, int64_t n, int channels,
                                         bool vec, Activation act) {
  constexpr int V = Pack<T>::kN;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (vec) {
    for (int64_t i = first; i < n / V; i += stride) {
      Pack<T> p = load_pack(y + i * V);
      float v[V];
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = to_f32(p.v[j]);
      if (bias) {
        const Pack<T> b = load_pack(bias + (i * V) % channels);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] += to_f32(b.v[j]);
      }
      if (residual) {
        const Pack<T> r = load_pack(residual + i * V);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] += to_f32(r.v[j]);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) p.v[j] = from_f32<T>(activate(v[j], act));
      store_pack(y + i * V, p);
    }
  } else {
    for (int64_t i = first; i < n; i += stride) {
      float v = to_f32(y[i]);
      if (bias) v += to_f32(bias[i % channels]);
      if (residual) v += to_f32(residual[i]);
      y[i] = from_f32<T>(activate(v, act));
    }
  }
}

// Moves `units` of U per row from rows of src_pitch units (starting `offset` units in) to
// dense rows.
template <typename U>
__global__ void copy_rows_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t rows,
                                 int64_t units, int64_t src_pitch, int64_t offset) {
  const int64_t total = rows * units;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / units, u = i - r * units;
    dst[i] = src[r * src_pitch + offset + u];
  }
}

template <typename U>
__global__ void pad_kernel(const U* __restrict__ src, U* __restrict__ dst, int64_t n, int64_t h,
                           int64_t w, int64_t units, int top, int left, int64_t ho, int64_t wo) {
  const int64_t total = n * ho * wo * units;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const NhwcIndex o = nhwc_index(i, ho, wo, units);
    const int64_t iy = o.y - top, ix = o.x - left;
    U v{};
    if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = src[((o.b * h + iy) * w + ix) * units + o.u];
    dst[i] = v;
  }
}

// One output element a thread step: channel j of a pixel is the input's below c, else zero.
template <typename U>
__global__ void pad_channels_kernel(const U* __restrict__ src, U* __restrict__ dst,
                                    int64_t pixels, int64_t c, int64_t c_out) {
  const int64_t total = pixels * c_out;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t px = i / c_out, j = i - px * c_out;
    dst[i] = j < c ? src[px * c + j] : U{};
  }
}

template <typename T>
bool can_vectorize(const void* a, const void* b = nullptr, const void* c = nullptr) {
  return aligned16(a) && (!b || aligned16(b)) && (!c || aligned16(c));
}

template <typename T, typename F>
Status unary(const void* x, void* y, int64_t n, F f, const Launch& l, const char* name) {
  if (n <= 0) return ok_status();
  const bool vec = can_vectorize<T>(x, y);
  const int64_t work = vec ? n / Pack<T>::kN + 1 : n;
  unary_kernel<T, F><<<grid_for(work, kThreads, l), kThreads, 0, l.stream>>>(
      static_cast<const T*>(x), static_cast<T*>(y), n, vec, f);
  LATENT_CUDA_CHECK_LAUNCH(name);
  return ok_status();
}

}  // namespace

size_t access_width(std::initializer_list<uint64_t> values) {
  for (size_t w : {16, 8, 4, 2}) {
    bool ok = true;
    for (uint64_t v : values) ok = ok && v % w == 0;
    if (ok) return w;
  }
  return 1;
}

Status launch_activation(const void* x, void* y, int64_t n, DType dtype, Activation act,
                         const Launch& l) {
  return LATENT_DISPATCH_DTYPE(dtype, T,
                               [&] { return unary<T>(x, y, n, ActOp{act}, l, "activation"); });
}

Status launch_affine(const void* x, void* y, int64_t n, DType dtype, float scale, float shift,
                     const Launch& l) {
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    return unary<T>(x, y, n, AffineOp{scale, shift}, l, "affine");
  });
}

Status launch_clamp(const void* x, void* y, int64_t n, DType dtype, float lo, float hi,
                    const Launch& l) {
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    return unary<T>(x, y, n, ClampOp{lo, hi}, l, "clamp");
  });
}

Status launch_add(const void* a, const void* b, void* y, int64_t n, DType dtype, const Launch& l) {
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    const bool vec = can_vectorize<T>(a, b, y);
    const int64_t work = vec ? n / Pack<T>::kN + 1 : n;
    add_kernel<T><<<grid_for(work, kThreads, l), kThreads, 0, l.stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n, vec);
    LATENT_CUDA_CHECK_LAUNCH("add");
    return ok_status();
  });
}

Status launch_channel_affine(const void* x, void* y, int64_t n, int64_t channels, DType dtype,
                             const float* scale, const float* shift, const Launch& l) {
  if (channels < 1 || channels > kMaxAffineChannels)
    return Status::errorf("channel_affine: ", channels, " channels (CUDA supports 1 to ",
                          kMaxAffineChannels, ")");
  if (n <= 0) return ok_status();
  ChannelCoefficients coef;
  for (int64_t c = 0; c < channels; ++c) {
    coef.scale[c] = scale[c];
    coef.shift[c] = shift[c];
  }
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    const bool vec = can_vectorize<T>(x, y) && channels % Pack<T>::kN == 0;
    const int64_t work = vec ? n / Pack<T>::kN : n;
    channel_affine_kernel<T><<<grid_for(work, kThreads, l), kThreads, 0, l.stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), n, static_cast<int>(channels), vec, coef);
    LATENT_CUDA_CHECK_LAUNCH("channel_affine");
    return ok_status();
  });
}

Status launch_bias_residual_act(void* y, const void* bias, const void* residual, int64_t n,
                                int64_t channels, DType dtype, Activation act, const Launch& l) {
  if (n <= 0) return ok_status();
  return LATENT_DISPATCH_DTYPE(dtype, T, [&] {
    const bool vec = can_vectorize<T>(y, bias, residual) && channels % Pack<T>::kN == 0;
    const int64_t work = vec ? n / Pack<T>::kN : n;
    bias_residual_act_kernel<T><<<grid_for(work, kThreads, l), kThreads, 0, l.stream>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), static_cast<const T*>(residual), n,
        static_cast<int>(channels), vec, act);
    LATENT_CUDA_CHECK_LAUNCH("bias_residual_act");
    return ok_status();
  });
}

Status launch_slice_channels(const void* x, void* y, int64_t pixels, int64_t channels,
                             int64_t start, int64_t count, size_t elem_size, const Launch& l) {
  if (pixels <= 0 || count <= 0) return ok_status();
  const size_t width = access_width({channels * elem_size, start * elem_size, count * elem_size,
                                     reinterpret_cast<uint64_t>(x), reinterpret_cast<uint64_t>(y)});
  return with_unit(width, [&](auto unit) -> Status {
    using U = decltype(unit);
    const int64_t units = count * static_cast<int64_t>(elem_size) / static_cast<int64_t>(sizeof(U));
    const int64_t pitch =
        channels * static_cast<int64_t>(elem_size) / static_cast<int64_t>(sizeof(U));
    const int64_t offset =
        start * static_cast<int64_t>(elem_size) / static_cast<int64_t>(sizeof(U));
    copy_rows_kernel<U><<<grid_for(pixels * units, kThreads, l), kThreads, 0, l.stream>>>(
        static_cast<const U*>(x), static_cast<U*>(y), pixels, units, pitch, offset);
    LATENT_CUDA_CHECK_LAUNCH("slice_channels");
    return ok_status();
  });
}

Status launch_pad(const void* x, void* y, int64_t n, int64_t h, int64_t w, int64_t c, int top,
                  int bottom, int left, int right, size_t elem_size, const Launch& l) {
  const int64_t ho = h + top + bottom, wo = w + left + right;
  if (n <= 0 || ho <= 0 || wo <= 0 || c <= 0) return ok_status();
  const size_t width =
      access_width({c * elem_size, reinterpret_cast<uint64_t>(x), reinterpret_cast<uint64_t>(y)});
  return with_unit(width, [&](auto unit) -> Status {
    using U = decltype(unit);
    const int64_t units = c * static_cast<int64_t>(elem_size) / static_cast<int64_t>(sizeof(U));
    pad_kernel<U><<<grid_for(n * ho * wo * units, kThreads, l), kThreads, 0, l.stream>>>(
        static_cast<const U*>(x), static_cast<U*>(y), n, h, w, units, top, left, ho, wo);
    LATENT_CUDA_CHECK_LAUNCH("pad");
    return ok_status();
  });
}

Status launch_pad_channels(const void* x, void* y, int64_t pixels, int64_t c, int64_t c_out,
                           size_t elem_size, const Launch& l) {
  if (pixels <= 0 || c_out <= 0) return ok_status();
  if (c < 1 || c > c_out) return Status::errorf("pad_channels: ", c, " channels to ", c_out);
  auto go = [&](auto unit) -> Status {
    using U = decltype(unit);
    pad_channels_kernel<U><<<grid_for(pixels * c_out, kThreads, l), kThreads, 0, l.stream>>>(
        static_cast<const U*>(x), static_cast<U*>(y), pixels, c, c_out);
    LATENT_CUDA_CHECK_LAUNCH("pad_channels");
    return ok_status();
  };
  switch (elem_size) {
    case 2: return go(uint16_t{});
    case 4: return go(uint32_t{});
    default: return Status::errorf("pad_channels: ", elem_size, "-byte elements");
  }
}

}  // namespace latent::cuda
