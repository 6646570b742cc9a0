// The CUDA backend: the class, its checks and its dispatch to the kernels of this folder.
//
// Tensors: 4-D activations and weights are NHWC on the device (Layout::kNHWC, logical shape
// still [N, C, H, W]), so a conv weight [Cout, Cin, kh, kw] is KRSC, the layout cuDNN wants for
// NHWC convolutions; other ranks stay contiguous. Everything is in the compute dtype (bf16 by
// default, fp16, or fp32 with TF32 convolutions), kernels accumulate in fp32.
//
// Execution: one stream per backend; ops only queue work (no host synchronisation except
// download() and synchronize(), and cuDNN's timing of a new convolution shape), and take their
// outputs and scratch from the stream-ordered pool in memory.h. A mutex serialises callers
// (backends are shared between elements), which also keeps the cuDNN handle single-threaded.
//
// Environment (read when a backend is created; a switch of named values takes those listed,
// unset or empty is its default, and any other value is warned about and runs the default:
// env_choice, engine/core/env.h):
//   LATENT_CUDNN_SEARCH=heuristic  pick convolution algorithms without timing them (also the
//                                  3-D fused graphs' engines, unless LATENT_CUDNN_FUSED_TUNE says)
//   LATENT_CUDNN_FUSED_TUNE=N      time cuDNN's first N engines of each fused graph on its first
//                                  call, the choice kept in the plan cache (default: 4 for the
//                                  3-D graphs, 0 for the 2-D ones; 0: the heuristics' first;
//                                  conv_fused.cpp)
//   LATENT_CUDA_TF32=0             exact fp32 convolutions (no TF32 tensor cores; 1: the default)
//   LATENT_CUDA_ATTENTION=simple   the CUDA-core attention kernel even for bf16/fp16 (auto: the
//                                  default)
//   LATENT_CUDA_POISON=1           fill new buffers with NaN (tests: catches unwritten outputs)
//   LATENT_CUDA_CONV3D=0           video: no conv3d_frames (video VAEs compose causal 3-D
//                                  convolutions from one cuDNN 2-D convolution per temporal tap)
//   LATENT_CUDA_CONV3D=taps        video: conv3d_frames by its fallback, one 2-D conv per tap
//                                  (what runs where cuDNN has no 3-D plan; tests)
//   LATENT_CUDA_CONV=cudnn         every convolution through cuDNN (plus a separate epilogue pass);
//                   wgmma          the Hopper implicit-GEMM kernel (conv_wgmma.cu, epilogue fused)
//                                  for every convolution it takes (stride 1 or 2, any zero
//                                  padding, bf16/fp16, 9.0 devices); auto (unset, the default):
//                                  that kernel only where it beat cuDNN on the H100
//                                  (conv_wgmma_preferred); another value is refused with a warning
//                                  and runs the default
//   LATENT_CUDA_CONV_NARROW=0      convolutions with <= 16 output channels (a decoder's last, to
//                                  RGB) on cuDNN too; 1 (the default): on conv_narrow.cu where it
//                                  takes them (stride 1, filters up to 3x3x3, bf16/fp16)
//   LATENT_CUDNN_FUSION=off        cuDNN convolutions with their epilogue (bias, residual, ReLU /
//                                  SiLU) as a separate pass; on (the default): fused in one cuDNN
//                                  operation graph (conv_fused.cpp) where cuDNN has an engine;
//                                  precompiled: fused by engines cuDNN ships compiled only (none
//                                  compiled while planning: ~2 s less start-up at 1080p, slower
//                                  residual-add convolutions)
//   LATENT_CUDNN_KEEP_COMPILED=1   fused graphs whose engine cuDNN compiles while planning are
//                                  serialized into the plan cache (blobs beside its file) and
//                                  loaded by later processes instead of compiled again
//   LATENT_CUDNN_PAD=copy          diffusers' downsampler padding (more at the bottom / right than
//                                  at the top / left) as a padded copy of the input; graph (the
//                                  default): as the fused graph's post-padding, no copy (the copy
//                                  only where no fused graph serves the convolution)
//   LATENT_CUDA_CONV_NORM=0        video: the channel RMS norm after a residual block's first
//                                  convolution as its own pass; unset or 1 (the default): in that
//                                  convolution's epilogue where conv_wgmma's kernel holds every
//                                  output channel (conv_wgmma_norm_fits: the Wan VAEs' 96 -> 96
//                                  levels, 192 -> 192 as a cluster of two blocks; H200, 720p:
//                                  decoder +1.4 %, encoder +0.9 %, session 27)
//   LATENT_RMS_NORM_PACKS=N        the video VAEs' channel RMS norm with at most N (1-6) 16-byte
//                                  packs of a pixel a lane (more lanes a pixel); unset: the
//                                  default (rms_norm.cu: 3)
//   LATENT_FP8_GATED_ADD=0         FP8 models: the gated residual add after an output layer as its
//                                  own pass; 1 (the default): in that layer's FP8 GEMM
//   LATENT_FP8_FAST_ACCUM=0        FP8 GEMMs promote their sums to fp32 periodically (slower,
//                                  closer to exact); 1 (the default): the tensor cores' own
//                                  accumulation, as PyTorch's use_fast_accum (dit_linear.cpp)
//   LATENT_FP8_GEMM_TUNE=1         FP8 GEMMs time up to 16 of cuBLASLt's candidates per shape on
//                                  first use; 0 (the default): its heuristic's first
//                                  (dit_linear.cpp)
//   LATENT_CUDA_PROFILE=1          time every op alone (synchronised) and print the slowest, by
//                                  op and output shape, to stderr when the backend is destroyed
// Read at every call instead (tests switch them), on env_choice too: LATENT_ATTENTION_KERNEL
// (attention_flash.cuh), LATENT_CUDNN_SDPA=0 / LATENT_CUDNN_PADDING_MASK=0 (sdpa.cpp), and
// LATENT_FP8_ATTENTION (dit_ops.cpp, with the DiT model).
#include "engine/backends/cuda/cuda_backend.h"

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>  // plans
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <thread>  // plans
#include <tuple>   // std::tie of the fused-graph tuning counts
#include <utility>

#include "engine/backends/cuda/attention.cuh"
#include "engine/backends/cuda/attention_flash.cuh"
#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/conv2d.cuh"
#include "engine/backends/cuda/conv_narrow.cuh"
#include "engine/backends/cuda/conv_wgmma.cuh"
#include "engine/backends/cuda/convert.cuh"
#include "engine/backends/cuda/dit_ops.h"  // cuda-dit
#include "engine/backends/cuda/elementwise.cuh"
#include "engine/backends/cuda/graph.h"  // plans: graphs and the plan cache
#include "engine/backends/cuda/group_norm.cuh"
#include "engine/backends/cuda/memory.h"
#include "engine/backends/cuda/pixels.cuh"  // gpu-elements: frames
#include "engine/backends/cuda/rms_norm.cuh"
#include "engine/backends/cuda/upsample.cuh"
#include "engine/backends/frames.h"  // gpu-elements: transfer counters
#include "engine/core/env.h"
#include "engine/core/log.h"

namespace latent {
namespace {

using cuda::DeviceContext;
using cuda::DeviceGuard;
using cuda::TempBuffer;

bool valid_activation(Activation act) {
  return static_cast<int>(act) <= static_cast<int>(Activation::kTanh);
}

// How many of cuDNN's candidate engines a fused graph builds and times on its first call
// (choose_engine: one replaces the heuristics' first only where it is at least 10 % faster).
// LATENT_CUDNN_FUSED_TUNE=N: N for every graph (0 or 1: the heuristics' first alone). Unset: 4
// for the 3-D (video) graphs, or 0 where LATENT_CUDNN_SEARCH=heuristic asks for cuDNN's heuristic
// choices everywhere (as the precompute job does by default, so that every worker writes the same
// bytes); 0 for the 2-D (image) graphs.
// - 3-D: at the Wan VAEs' 720p 96-channel 3x3x3 convolution with a bias only the first is an
//   sm80 kernel taking 1.86 ms a frame on an H100, where another engine takes 1.28 ms; the Wan
//   2.1 720p streams ran 14 % faster (bench/NOTES.md, session 20).
// - 2-D: on the TAESD-size and default models at 1080p the first was the fastest at every large
//   shape (the models ran as fast either way), and building 4 candidates took 9.4 s of start-up
//   against 0.3 s, most of it cuDNN compiling kernels (bench/NOTES.md, session 21).
// A timed choice is kept in the plan cache, and a later process builds that engine alone.
// Returns the {2-D, 3-D} counts; `search` is LATENT_CUDNN_SEARCH as set (null: unset).
std::pair<int, int> fused_tune_counts(const char* tune, const char* search) {
  if (tune && *tune) {
    char* end = nullptr;
    const long v = std::strtol(tune, &end, 10);
    if (!*end && v >= 0 && v <= 64) return {static_cast<int>(v), static_cast<int>(v)};
    LATENT_WARN("LATENT_CUDNN_FUSED_TUNE=", tune,
                " is not a count from 0 to 64: using the defaults");
  }
  return {0, search && std::string(search) == "heuristic" ? 0 : 4};
}

// NHWC and NCHW agree when there is one channel or one pixel: such a contiguous 4-D tensor
// (a reshape of a vector, say) can be read as NHWC too.
bool nhwc_compatible(const Tensor& t) {
  if (t.layout() == Layout::kNHWC) return true;
  return t.rank() == 4 && (t.dim(1) == 1 || t.dim(2) * t.dim(3) == 1);
}

class CudaBackend final : public Backend {
 public:
  struct Options {
    bool tf32 = true;
    bool exhaustive_search = true;
    bool tensor_core_attention = true;
    bool conv3d = true;         // video: cuDNN 3-D convolutions for conv3d_frames()
    bool conv3d_taps = false;   // video: conv3d_frames through its 2-D fallback (tests)
    // The Hopper implicit-GEMM convolution: 0 never, 1 where it beats cuDNN, 2 wherever it fits.
    int conv_wgmma = 1;
    // Convolutions with <= 16 output channels on conv_narrow.cu (LATENT_CUDA_CONV_NARROW=0: off).
    bool conv_narrow = true;
    // video: the channel RMS norm in conv_wgmma's epilogue (LATENT_CUDA_CONV_NORM=0: off).
    bool conv_norm = true;
    // LATENT_CONV_WGMMA_TILE: the implicit-GEMM kernel's tile where its width divides the output
    // channels (bench_conv's sweeps); bn 0: the kernel's defaults.
    cuda::ConvWgmmaTile conv_wgmma_tile;
    // Convolution epilogues fused into cuDNN operation graphs where cuDNN has an engine.
    bool conv_fusion = true;
    bool conv_fusion_runtime_compiled = true;  // engines cuDNN compiles at plan time too
    // How many of cuDNN's candidate engines a 2-D / 3-D fused graph builds and times on its
    // first call (LATENT_CUDNN_FUSED_TUNE; fused_tune_counts()).
    int conv_fusion_tune_2d = 0, conv_fusion_tune_3d = 4;
    // Fused graphs with an engine compiled while planning kept in the plan cache (serialized) and
    // loaded by later processes instead of compiled again (LATENT_CUDNN_KEEP_COMPILED=1).
    bool conv_fusion_keep_compiled = false;
    // Bottom / right padding beyond the top / left as the fused graph's post-padding instead of
    // a padded copy of the input (LATENT_CUDNN_PAD=copy turns it off).
    bool conv_pad_in_graph = true;
  };

  CudaBackend(std::shared_ptr<DeviceContext> ctx, DType dtype, cudnnHandle_t cudnn,
              const Options& options)
      : ctx_(std::move(ctx)),
        dtype_(dtype),
        options_(options),
        cudnn_(cudnn),
        conv_plans_(
            std::make_unique<cuda::ConvPlanCache>(cudnn, options.tf32, options.exhaustive_search)) {
    conv3d_failed_ = options.conv3d_taps;  // video
    launch_.stream = ctx_->stream();
    launch_.sm_count = ctx_->properties().multiProcessorCount;
    fp8_linear_ = ctx_->properties().major == 9;
    if (const char* e = std::getenv("LATENT_RMS_NORM_PACKS"); e && *e) {
      if (std::strlen(e) == 1 && e[0] >= '1' && e[0] <= '6')
        rms_norm_packs_ = e[0] - '0';
      else
        LATENT_WARN("LATENT_RMS_NORM_PACKS='", e,
                    "' is not a number from 1 to 6; using the default");
    }
    fp8_gated_add_ = env_choice("LATENT_FP8_GATED_ADD", {{"1"}, {"0"}}, 0) == 0;
    launch_.smem_optin = ctx_->properties().sharedMemPerBlockOptin;
    dit_linear_ = std::make_unique<cuda::DitLinear>(options.tf32);  // cuda-dit
    disk_plans_ = cuda::open_plan_cache(*ctx_);                     // plans
    conv_plans_->set_disk_cache(disk_plans_);                       // plans
    conv_plans_->set_fusion(options.conv_fusion, options.conv_fusion_runtime_compiled,
                            options.conv_fusion_tune_2d, options.conv_fusion_tune_3d,
                            options.conv_fusion_keep_compiled);
    profile_.start(ctx_->label());
  }

  ~CudaBackend() override {
    DeviceGuard guard;
    if (!guard.set(ctx_->device()).ok()) return;
    LATENT_CUDA_WARN(cudaStreamSynchronize(ctx_->stream()));
    profile_.stop();
    save_plans_locked();  // plans
    dit_linear_.reset();  // cuda-dit: cuBLASLt plans and handle, device current
    conv_plans_.reset();
    LATENT_CUDA_WARN(cudnnDestroy(cudnn_));
  }

  std::string name() const override { return str_cat("cuda:", ctx_->device()); }
  Device device() const override { return Device{DeviceKind::kCUDA, ctx_->device()}; }
  DType compute_dtype() const override { return dtype_; }
  using Backend::supports;
  bool supports(OpKind op, DType dtype) const override {
    return static_cast<int>(op) <= static_cast<int>(OpKind::kInterleavePhases2x) && dtype == dtype_;
  }
  bool supports(OpKind op, DType dtype, const Shape& shape) const override {
    if (!Backend::supports(op, dtype, shape)) return false;
    // cuDNN and our kernels take each dimension as a 32-bit int.
    for (int64_t d : shape)
      if (d > std::numeric_limits<int32_t>::max()) return false;
    return true;
  }

  // Frame, latent and staging I/O: our kernels on the device (pixels.cpp, latents.cpp).
  Result<Tensor> frame_to_tensor(const FrameDesc& frame, const FrameGeometry& g,
                                 const Tensor* into = nullptr) override {
    return cuda::frame_to_tensor(io(), frame, g, into);
  }
  Status tensor_to_frame(const Tensor& image, const FrameGeometry& g,
                         const FrameDesc& frame) override {
    return cuda::tensor_to_frame(io(), image, g, frame);
  }
  Result<std::unique_ptr<FrameStager>> create_frame_stager(int depth) override {
    return cuda::create_frame_stager(io(), depth);
  }
  Result<std::unique_ptr<FrameDownloader>> create_frame_downloader(int depth) override {
    return cuda::create_frame_downloader(io(), depth);
  }
  Result<Tensor> zeros(const Shape& shape) override { return cuda::zero_tensor(io(), shape); }
  Result<Tensor> device_latent_to_tensor(const void* data, DType dtype, int channels, int height,
                                         int width) override {
    return cuda::device_latent_to_tensor(io(), data, dtype, channels, height, width);
  }
  Status tensor_to_device_latent(const Tensor& latent, void* data, DType dtype) override {
    return cuda::tensor_to_device_latent(io(), latent, data, dtype);
  }
  Result<std::unique_ptr<DeviceFence>> fence() override { return cuda::stream_fence(io()); }
  Status queue_wait(DeviceFence& fence) override { return cuda::queue_wait(io(), fence); }
  Result<std::unique_ptr<DeviceFence>> queue_tensor_to_device_latent(const Tensor& latent,
                                                                     void* data,
                                                                     DType dtype) override {
    return cuda::queue_tensor_to_device_latent(io(), latent, data, dtype);
  }

  Result<Tensor> upload(const Tensor& host) override;
  Result<Tensor> download(const Tensor& t) override;
  Status synchronize() override;
  // What the frame and latent kernels (pixels.cpp, latents.cpp) run with.
  cuda::BackendIo io() { return cuda::BackendIo{*this, ctx_, launch_}; }
  // Live bytes of the backend's memory pool (tensors, scratch, cuDNN workspace) at their peak;
  // cuDNN's and the driver's own allocations are not counted.
  // plans: plus the memory of captured graphs on this device (not in the pool).
  int64_t peak_memory_bytes() const override {
    const int64_t pool = ctx_->peak_bytes();
    return pool < 0 ? pool : pool + cuda::graph_memory_high(ctx_->device());
  }
  void reset_peak_memory() override {
    ctx_->reset_peak();
    cuda::reset_graph_memory_high(ctx_->device());  // plans
  }
  MemoryUse memory_use() const override {
    MemoryUse m;
    const int64_t used = ctx_->used_bytes(), reserved = ctx_->reserved_bytes();
    if (used >= 0) m.in_use = used + cuda::graph_memory_used(ctx_->device());
    if (reserved >= 0) m.held = reserved + cuda::graph_memory_reserved(ctx_->device());
    return m;
  }

  Result<Tensor> conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& residual, Activation act) override;
  Result<Tensor> group_norm(const Tensor& x, int groups, const Tensor& gamma, const Tensor& beta,
                            float eps, Activation act) override;
  Result<Tensor> rms_norm_channels(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   Activation act) override;
  Status rms_norm_channels_into(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                Activation act, const Tensor& y) override;
  Result<Tensor> activation(const Tensor& x, Activation act) override;
  Result<Tensor> add(const Tensor& a, const Tensor& b) override;
  Result<Tensor> affine(const Tensor& x, float scale, float shift) override;
  Result<Tensor> channel_affine(const Tensor& x, const std::vector<float>& scale,
                                const std::vector<float>& shift) override;
  Result<Tensor> clamp(const Tensor& x, float lo, float hi) override;
  Result<Tensor> upsample_nearest2x(const Tensor& x) override;
  Result<Tensor> interleave_phases2x(const Tensor& z) override;
  Result<Tensor> slice_channels(const Tensor& x, int64_t start, int64_t count) override;
  Result<Tensor> spatial_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   int heads) override;
  // video: clips <-> frames (launch_transpose), frames joined along dim 0 (concat below)
  Result<Tensor> clip_to_frames(const Tensor& clip) override;
  Result<Tensor> frames_to_clip(const Tensor& frames) override;
  bool supports_conv3d_frames() const override { return options_.conv3d; }
  Result<Tensor> conv3d_frames(const Tensor& x, const Tensor& w, int kt, const Tensor& bias,
                               const Conv2dParams& p, const Tensor& residual,
                               Activation act) override;
  // The frames of the `past` tensors then those of x read in place by the implicit-GEMM kernel
  // where it takes the call (no join); else the default (join, then conv3d_frames).
  Result<Tensor> conv3d_frames_after(const std::vector<Tensor>& past, const Tensor& x,
                                     const Tensor& w, int kt, const Tensor& bias,
                                     const Conv2dParams& p, const Tensor& residual,
                                     Activation act) override {
    Result<Tensor> y = run("conv3d_frames", [&]() -> Result<Tensor> {
      if (past.empty() || past.size() > 2)
        return Status::errorf("conv3d_frames_after takes 1 or 2 past tensors, not ", past.size());
      if (!options_.conv3d) return Tensor();
      int64_t before = 0;
      for (const Tensor& q : past) {
        LATENT_TRY(check_tensor("past frames", q, 4, "[P, Cin, H, W]"));
        if (q.dim(1) != x.dim(1) || q.dim(2) != x.dim(2) || q.dim(3) != x.dim(3))
          return Status::errorf("past frames ", shape_str(q.shape()), " and x ",
                                shape_str(x.shape()), " differ in channels or size");
        before += q.dim(0);
      }
      LATENT_TRY(check_tensor("input x", x, 4, "[T, Cin, H, W]"));
      LATENT_TRY(check_tensor("weight w", w, 4, "[Cout, Cin, kt * kh, kw]"));
      const int64_t frames = before + x.dim(0) - kt + 1;
      if (kt < 2 || w.dim(2) % kt != 0 || w.dim(1) != x.dim(1) || frames < 1)
        return Status::errorf("weight w ", shape_str(w.shape()), " with ", kt,
                              " temporal taps does not fit ", before, " past frames and x ",
                              shape_str(x.shape()));
      LATENT_ASSIGN_OR_RETURN(const Shape out_shape, conv3d_output(x, w, kt, frames, p));
      LATENT_TRY(check_conv3d_epilogue(bias, residual, act, w, out_shape));
      if (past.size() == 1) return conv_wgmma(past[0], x, w, kt, bias, p, residual, act, frames);
      return conv_wgmma(past[0], past[1], w, kt, bias, p, residual, act, frames, x);
    });
    if (!y.ok() || y.value().defined()) return y;
    return Backend::conv3d_frames_after(past, x, w, kt, bias, p, residual, act);
  }
  // The norm in conv_wgmma's epilogue where conv_wgmma_norm_fits() (its kernel holds every output
  // channel of a pixel: the halo tile at the Wan VAEs' 96 -> 96 full-resolution convolutions);
  // else undefined (the model runs conv3d_frames, then the norm).
  Result<Tensor> conv3d_frames_normed(const Tensor& x, const Tensor& w, int kt, const Tensor& bias,
                                      const Conv2dParams& p, const Tensor& gamma, Activation act,
                                      const Tensor& into) override {
    return run("conv3d_frames_normed", [&]() -> Result<Tensor> {
      if (!options_.conv3d || !options_.conv_norm) return Tensor();
      LATENT_TRY(check_conv3d_frames(x, w, kt));
      LATENT_ASSIGN_OR_RETURN(const Shape out_shape, conv3d_output(x, w, kt, x.dim(0) - kt + 1, p));
      LATENT_TRY(check_conv3d_epilogue(bias, Tensor(), act, w, out_shape));
      LATENT_TRY(check_param("gamma", gamma, w.dim(0), w));
      if (into.defined()) {
        LATENT_TRY(check_tensor("output into", into, 4));
        if (into.shape() != out_shape)
          return Status::errorf("output into ", shape_str(into.shape()),
                                " does not match the output ", shape_str(out_shape));
      }
      return conv_wgmma(x, Tensor(), w, kt, bias, p, Tensor(), act, out_shape[0], Tensor(), gamma,
                        into);
    });
  }

  // === plans: graph capture and the on-disk plan cache (graph.h) ===
  bool supports_capture() const override { return true; }
  void record_allocations(bool on) override { ctx_->record_allocations(on); }
  Status begin_capture() override;
  Result<std::shared_ptr<CapturedGraph>> end_capture() override;
  Status replay(const CapturedGraph& graph) override;
  Status copy_into(const Tensor& src, const Tensor& dst) override;
  Status save_plans() override;
  // === end plans ===

  // === cuda-dit: DiT ops (dit_ops.h; checks and kernels live there) ===
  bool supports_dit(DitOp op, DType dtype) const override {
    if (op == DitOp::kUploadFp32) return true;
    return static_cast<int>(op) <= static_cast<int>(DitOp::kLinearAdd) && dtype == dtype_;
  }
  Result<Tensor> upload_fp32(const Tensor& host) override;
  Result<Tensor> linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                        DitActivation act) override;
  Result<Tensor> linear_add(const Tensor& x, const Tensor& w, const Tensor& residual,
                            DitActivation act) override;
  // Runtime LoRAs folded into the base GEMM: rows at their pitch, no copies.
  Result<Tensor> layer_norm_modulate_wide(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                          const std::vector<int64_t>& group_starts, float eps,
                                          int64_t extra) override {
    return run("layer_norm_modulate_wide", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_layer_norm_modulate_wide(env, x, shift, scale, group_starts, eps, extra);
    });
  }
  Result<Tensor> linear_wide(const Tensor& x, const Tensor& w, const Tensor& bias,
                             DitActivation act, int64_t extra) override {
    return run("linear_wide", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_linear_wide(env, x, w, bias, act, extra);
    });
  }
  Result<Tensor> attention_wide(const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                                const Tensor& key_mask, const std::vector<int64_t>& key_lengths,
                                int64_t extra) override {
    return run("attention_wide", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_attention(env, q, k, v, heads, key_mask, key_lengths, extra);
    });
  }
  Result<Tensor> linear_into_columns(const Tensor& x, const Tensor& w, int64_t column) override {
    return run("linear_into_columns", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_linear_into_columns(env, x, w, column);
    });
  }
  // FP8 e4m3 x e4m3 with per-row scales on cuBLASLt: Hopper (compute capability 9.0).
  bool supports_fp8_linear() const override { return fp8_linear_; }
  Result<Fp8Matrix> fp8_quantize_rows(const Tensor& x) override {
    if (!fp8_linear_) return Backend::fp8_quantize_rows(x);
    return run("fp8_quantize_rows", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_fp8_quantize_rows(env, x);
    });
  }
  Result<Fp8Matrix> layer_norm_modulate_fp8(const Tensor& x, const Tensor& shift,
                                            const Tensor& scale,
                                            const std::vector<int64_t>& group_starts,
                                            float eps) override {
    if (!fp8_linear_) return Backend::layer_norm_modulate_fp8(x, shift, scale, group_starts, eps);
    return run("layer_norm_modulate_fp8", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_layer_norm_modulate_fp8(env, x, shift, scale, group_starts, eps);
    });
  }
  Result<Tensor> linear_fp8(const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& bias,
                            DitActivation act) override {
    if (!fp8_linear_) return Backend::linear_fp8(x, w, bias, act);
    return run("linear_fp8", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_linear_fp8(env, x, w, bias, act);
    });
  }
  Result<Tensor> linear_fp8_joined(const Fp8Matrix& x_a, const Fp8Matrix& w_a, const Tensor& b_a,
                                   const Fp8Matrix& x_b, const Fp8Matrix& w_b,
                                   const Tensor& b_b) override {
    if (!fp8_linear_ || x_a.shape.empty() || x_a.shape[0] != 1)
      return Backend::linear_fp8_joined(x_a, w_a, b_a, x_b, w_b, b_b);
    return run("linear_fp8_joined", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_linear_fp8_joined(env, x_a, w_a, b_a, x_b, w_b, b_b);
    });
  }
  Result<Tensor> linear_fp8_gated_add(const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& bias,
                                      const Tensor& gate, const Tensor& residual) override {
    if (!fp8_linear_ || !fp8_gated_add_)
      return Backend::linear_fp8_gated_add(x, w, bias, gate, residual);
    Result<Tensor> y = run("linear_fp8_gated_add", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_linear_fp8_gated_add(env, x, w, bias, gate, residual);
    });
    if (y.ok() || y.status().message().find("cuBLASLt has no algorithm") == std::string::npos)
      return y;
    // cuBLASLt without a kernel for C read with per-channel scales: the two ops from now on.
    LATENT_WARN("linear_fp8_gated_add: ", y.status().message(),
                "; gated adds run after their layers from now on");
    fp8_gated_add_ = false;
    return Backend::linear_fp8_gated_add(x, w, bias, gate, residual);
  }
  Result<Fp8Matrix> attention_fp8(const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                                  const Tensor& key_mask,
                                  const std::vector<int64_t>& key_lengths) override {
    if (!fp8_linear_) return Backend::attention_fp8(q, k, v, heads, key_mask, key_lengths);
    return run("attention_fp8", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_attention_fp8(env, q, k, v, heads, key_mask, key_lengths);
    });
  }
  Result<Fp8Matrix> joint_qk_fp8(const Tensor& img, const Tensor& txt, const Tensor& gamma_img,
                                 const Tensor& gamma_txt, const Tensor& freqs, int heads, float eps,
                                 float bound) override {
    if (!fp8_linear_)
      return Backend::joint_qk_fp8(img, txt, gamma_img, gamma_txt, freqs, heads, eps, bound);
    return run("joint_qk_fp8", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_joint_qk_fp8(env, img, txt, gamma_img, gamma_txt, freqs, heads, eps, bound);
    });
  }
  Result<Fp8Matrix> attention_fp8_coded(const Fp8Matrix& q, const Fp8Matrix& k, const Tensor& v,
                                        int heads, const Tensor& key_mask,
                                        const std::vector<int64_t>& key_lengths) override {
    if (!fp8_linear_) return Backend::attention_fp8_coded(q, k, v, heads, key_mask, key_lengths);
    return run("attention_fp8_coded", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_attention_fp8_codes(env, q, k, v, heads, key_mask, key_lengths);
    });
  }
  Result<Tensor> layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            float eps) override;
  Result<Tensor> rms_norm(const Tensor& x, const Tensor& gamma, float eps) override;
  Result<Tensor> modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                          const std::vector<int64_t>& group_starts) override;
  Result<Tensor> layer_norm_modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                     const std::vector<int64_t>& group_starts,
                                     float eps) override;
  Result<Tensor> gated_add(const Tensor& residual, const Tensor& x, const Tensor& gate,
                           const std::vector<int64_t>& group_starts) override;
  Result<Tensor> rope(const Tensor& x, const Tensor& freqs, int heads) override;
  Result<Tensor> joint_qk(const Tensor& img, const Tensor& txt, const Tensor& gamma_img,
                          const Tensor& gamma_txt, const Tensor& freqs, int heads,
                          float eps) override {
    return run("joint_qk", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_joint_qk(env, img, txt, gamma_img, gamma_txt, freqs, heads, eps);
    });
  }
  Result<Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                           const Tensor& key_mask,
                           const std::vector<int64_t>& key_lengths = {}) override;
  Result<Tensor> dit_activation(const Tensor& x, DitActivation act) override;
  Result<Tensor> scaled_add(const Tensor& a, const Tensor& b, float alpha, float beta) override;
  Result<Tensor> cfg_combine(const Tensor& cond, const Tensor& uncond, float scale) override;
  Result<Tensor> concat(const std::vector<Tensor>& parts, int dim) override;
  Result<Tensor> slice(const Tensor& x, int dim, int64_t start, int64_t count) override;
  Result<Tensor> pack_latents(const Tensor& latents) override {
    return run("pack_latents", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_pack_latents(env, latents);
    });
  }
  Result<Tensor> unpack_latents(const Tensor& tokens, int64_t height, int64_t width) override {
    return run("unpack_latents", [&] {
      cuda::DitEnv env = dit_env();
      return cuda::dit_unpack_latents(env, tokens, height, width);
    });
  }
  // === end cuda-dit ===

 private:
  Result<Tensor> conv2d_locked(const Tensor& x, const Tensor& w, const Tensor& bias,
                               const Conv2dParams& p, const Tensor& residual, Activation act);
  // Our own convolution kernels over `frames` output frames: input frames are those of x0, then
  // those of x1 (if defined), then those of x2 (if defined: x1 is then too), output frame t
  // reads input frames t .. t + kt - 1; w [Cout, Cin, kt * kh, kw]. Arguments already checked
  // by the caller. Few output channels go to conv_narrow.cu where it takes them; otherwise the
  // Hopper implicit-GEMM kernel (conv_wgmma.cu). An undefined tensor (no error) when neither
  // takes this call (not a 9.0 device, LATENT_CUDA_CONV=cudnn, fp32, a stride above 2,
  // channels) or, by default, a shape where cuDNN was faster.
  // With `norm_gamma` defined: the channel RMS norm in the epilogue (conv3d_frames_normed), an
  // undefined tensor where conv_wgmma_norm_fits() says no. `into` defined: the output goes there
  // (checked by the caller: the output's shape, this backend's).
  Result<Tensor> conv_wgmma(const Tensor& x0, const Tensor& x1, const Tensor& w, int kt,
                            const Tensor& bias, const Conv2dParams& p, const Tensor& residual,
                            Activation act, int64_t frames, const Tensor& x2 = Tensor(),
                            const Tensor& norm_gamma = Tensor(), const Tensor& into = Tensor()) {
    const int64_t kh = w.dim(2) / kt, kw = w.dim(3);
    const int64_t ho = (x0.dim(2) + p.pad_top + p.pad_bottom - kh) / p.stride + 1,
                  wo = (x0.dim(3) + p.pad_left + p.pad_right - kw) / p.stride + 1;
    if (p.stride < 1 || p.stride > 2 || ho < 1 || wo < 1 || frames < 1) return Tensor();
    const int64_t big = std::numeric_limits<int32_t>::max();
    if (x0.dim(1) > big || x0.dim(2) > big || x0.dim(3) > big || w.dim(0) > big ||
        frames > big || x0.dim(0) > big)
      return Tensor();
    cuda::ConvWgmmaArgs a;
    a.stride = p.stride;
    a.pad_top = p.pad_top;
    a.pad_left = p.pad_left;
    a.out_h = static_cast<int>(ho);
    a.out_w = static_cast<int>(wo);
    a.x0 = x0.data();
    a.n0 = static_cast<int>(x0.dim(0));
    a.x1 = x1.defined() ? x1.data() : nullptr;
    if (x2.defined()) {
      if (x0.dim(0) + x1.dim(0) > big) return Tensor();
      a.x2 = x2.data();
      a.n1 = static_cast<int>(x0.dim(0) + x1.dim(0));
    }
    a.frames = static_cast<int>(frames);
    a.h = static_cast<int>(x0.dim(2));
    a.w = static_cast<int>(x0.dim(3));
    a.c = static_cast<int>(x0.dim(1));
    a.k = static_cast<int>(w.dim(0));
    a.kt = kt;
    a.r = static_cast<int>(kh);
    a.s = static_cast<int>(kw);
    a.weight = w.data();
    a.bias = bias.defined() ? bias.data() : nullptr;
    a.residual = residual.defined() ? residual.data() : nullptr;
    a.act = act;
    a.tile = options_.conv_wgmma_tile;
    a.norm_gamma = norm_gamma.defined() ? norm_gamma.data() : nullptr;
    a.y = into.defined() ? into.data() : nullptr;  // the kernels' alignment checks see it
    const Shape out_shape = {frames, w.dim(0), ho, wo};
    auto output = [&]() -> Result<Tensor> {
      if (into.defined()) return into;
      return ctx_->empty(out_shape, dtype_, Layout::kNHWC);
    };
    // Few output channels (a decoder's last convolution): conv_narrow.cu on any 8.0+ device.
    if (!a.norm_gamma && options_.conv_narrow && cuda::conv_narrow_fits(a, dtype_, launch_)) {
      LATENT_ASSIGN_OR_RETURN(Tensor y, output());
      a.y = y.data();
      LATENT_TRY(cuda::launch_conv_narrow(a, dtype_, launch_));
      return y;
    }
#ifdef LATENT_CONV_WGMMA
    if (options_.conv_wgmma == 0) return Tensor();
    // Input channels not a multiple of 8 (the 3 of an RGB frame at a VAE's first convolution,
    // where cuDNN picks a legacy kernel: 1.15 ms a 720p frame for Wan's 3 -> 96 3x3x3): the
    // kernel runs on copies padded with zero channels to the next multiple of 8, weights too.
    const int64_t cin = x0.dim(1), cpad = (cin + 7) / 8 * 8;
    a.c = static_cast<int>(cpad);
    if (!cuda::conv_wgmma_fits(a, dtype_, launch_)) return Tensor();
    if (options_.conv_wgmma == 1 && !cuda::conv_wgmma_preferred(a, launch_)) return Tensor();
    if (a.norm_gamma && !cuda::conv_wgmma_norm_fits(a, dtype_, launch_)) return Tensor();
    Tensor x0p, x1p, x2p, wp;  // the padded copies (alive until the kernel is queued)
    if (cpad != cin) {
      const size_t es = dtype_size(dtype_);
      auto pad = [&](const Tensor& t, Tensor* out) -> Status {
        LATENT_ASSIGN_OR_RETURN(
            *out, ctx_->empty({t.dim(0), cpad, t.dim(2), t.dim(3)}, dtype_, Layout::kNHWC));
        return cuda::launch_pad_channels(t.data(), out->data(), t.dim(0) * t.dim(2) * t.dim(3),
                                         cin, cpad, es, launch_);
      };
      LATENT_TRY(pad(x0, &x0p));
      a.x0 = x0p.data();
      if (x1.defined()) {
        LATENT_TRY(pad(x1, &x1p));
        a.x1 = x1p.data();
      }
      if (x2.defined()) {
        LATENT_TRY(pad(x2, &x2p));
        a.x2 = x2p.data();
      }
      LATENT_TRY(pad(w, &wp));
      a.weight = wp.data();
    }
    LATENT_ASSIGN_OR_RETURN(Tensor y, output());
    a.y = y.data();
    LATENT_TRY(cuda::launch_conv_wgmma(a, dtype_, launch_));
    return y;
#else
    return Tensor();
#endif
  }

  // y = act(conv + bias + residual) as one cuDNN operation graph into `y`; false (nothing
  // queued) where none serves it, and the caller runs the plain convolution and the epilogue.
  Result<bool> cudnn_fused(const cuda::ConvShape& s, const void* input, const Tensor& w, Tensor& y,
                           const Tensor& bias, const Tensor& residual, Activation act) {
    cuda::ConvEpilogue e;
    e.bias = bias.defined() ? bias.data() : nullptr;
    e.residual = residual.defined() ? residual.data() : nullptr;
    e.act = act;
    return conv_plans_->forward_fused(s, input, w.data(), y.data(), e, *ctx_);
  }

  // video: conv3d_frames as one conv2d per temporal tap (where cuDNN has no 3-D plan).
  Result<Tensor> conv3d_by_taps(const Tensor& x, const Tensor& w, int kt, const Tensor& bias,
                                const Conv2dParams& p, const Tensor& residual, Activation act);
  bool conv3d_failed_ = false;  // video: cuDNN refused a 3-D plan once; taps from then on
  // rms_norm_channels into y (checked by the caller to be x's shape), the lock held.
  Status rms_norm_channels_locked(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  Activation act, const Tensor& y);
  // spatial_attention for one head unfused (d > 256, or LATENT_ATTENTION_KERNEL=gemm): y NHWC.
  Status spatial_attention_gemm(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& y);

  // Runs an op body with the lock held and the device current; failures name op and device.
  static const Shape& result_shape(const Tensor& t) { return t.shape(); }
  static const Shape& result_shape(const Fp8Matrix& m) { return m.shape; }
  // Result<Tensor> or Result<Fp8Matrix>, as `body` returns.
  // With LATENT_LOG=debug an op that holds the host >= 1 ms (or waits that long for the
  // backend's lock) is logged with both times: a queued op should take microseconds, so these are
  // the host synchronisations, first-time plan builds and allocations that leave a shared
  // stream without work while its callers wait (where a chunk's launch stalls, issue 11).
  template <typename F>
  auto run(const char* op, F&& body) -> decltype(body()) {
    using Clock = std::chrono::steady_clock;
    const bool watch = log_enabled(LogLevel::kDebug);
    const Clock::time_point asked = watch ? Clock::now() : Clock::time_point();
    std::unique_lock<std::mutex> lock(mutex_);
    wait_for_capture(lock);  // plans
    const Clock::time_point began = watch ? Clock::now() : Clock::time_point();
    DeviceGuard guard;
    Status st = guard.set(ctx_->device());
    if (!st.ok()) return st.with_context(str_cat(op, " on ", ctx_->label()));
    const bool timed = profile_.enabled && !capturing_;
    std::chrono::steady_clock::time_point t0;
    if (timed) {
      LATENT_CUDA_WARN(cudaStreamSynchronize(ctx_->stream()));
      t0 = std::chrono::steady_clock::now();
    }
    decltype(body()) r = body();
    if (!r.ok()) return r.status().with_context(str_cat(op, " on ", ctx_->label()));
    if (timed) {
      LATENT_CUDA_WARN(cudaStreamSynchronize(ctx_->stream()));
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      profile_.add(str_cat(op, " -> ", shape_str(result_shape(*r))), ms);
    }
    save_new_plans_locked();  // plans: a choice this op just timed (its file write not in the
                              // profile)
    if (watch) {
      auto ms = [](Clock::duration d) {
        return std::chrono::duration<double, std::milli>(d).count();
      };
      const double waited = ms(began - asked), held = ms(Clock::now() - began);
      if (held >= 1.0 || waited >= 1.0)
        LATENT_DEBUG(ctx_->label(), ": ", op, " -> ", shape_str(result_shape(*r)),
                     " held the host ", held, " ms after waiting ", waited, " ms for the backend");
    }
    return r;
  }

  // LATENT_CUDA_PROFILE=1: every op is timed alone (the stream synchronised before and after it,
  // so the total is slower than a normal run) and the ops that took longest, by name and output
  // shape, are printed to stderr when the backend goes away or, for the backends the registry
  // keeps for the whole process, at exit: the per-layer table of a model.
  struct OpProfile {
    std::mutex mutex;  // add() runs under the backend's lock; print() may run at exit
    std::string label;
    bool printed = false;
    // Prints every live profile at exit (registered backends are never destroyed).
    static void at_exit() {
      for (OpProfile* p : registry()) p->print();
    }
    static std::vector<OpProfile*>& registry() {
      static auto* r = new std::vector<OpProfile*>;  // leaked: read at exit
      return *r;
    }
    void start(const std::string& name) {
      if (!enabled) return;
      label = name;
      static std::once_flag once;
      std::call_once(once, [] { std::atexit(&OpProfile::at_exit); });
      registry().push_back(this);
    }
    void stop() {
      if (!enabled) return;
      print();
      auto& r = registry();
      r.erase(std::remove(r.begin(), r.end(), this), r.end());
    }
    bool enabled = [] {
      const char* e = std::getenv("LATENT_CUDA_PROFILE");
      return e && *e && std::strcmp(e, "0") != 0;
    }();
    std::map<std::string, std::pair<double, int64_t>> ops;  // key -> (total ms, calls)
    void add(const std::string& key, double ms) {
      std::lock_guard<std::mutex> lock(mutex);
      auto& e = ops[key];
      e.first += ms;
      ++e.second;
    }
    void print() {
      std::lock_guard<std::mutex> lock(mutex);
      if (!enabled || ops.empty() || printed) return;
      printed = true;
      std::vector<std::pair<std::string, std::pair<double, int64_t>>> v(ops.begin(), ops.end());
      std::sort(v.begin(), v.end(),
                [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
      double total = 0;
      for (const auto& e : v) total += e.second.first;
      std::fprintf(stderr, "# LATENT_CUDA_PROFILE %s: %.1f ms in %zu op kinds (synchronised per op)\n",
                   label.c_str(), total, v.size());
      std::fprintf(stderr, "# %9s %6s %8s %8s  op -> output shape\n", "total ms", "%", "calls",
                   "ms/call");
      for (size_t i = 0; i < v.size() && i < 60; ++i)
        std::fprintf(stderr, "# %9.2f %6.2f %8lld %8.3f  %s\n", v[i].second.first,
                     100.0 * v[i].second.first / total,
                     static_cast<long long>(v[i].second.second),
                     v[i].second.first / static_cast<double>(v[i].second.second), v[i].first.c_str());
    }
  };
  OpProfile profile_;

  // A tensor of this backend: on its device, in its dtype, with all its bytes in its storage,
  // of rank `rank` (-1: any) with no empty dimension; 4-D ones in NHWC.
  Status check_tensor(const char* what, const Tensor& t, int rank,
                      const char* form = "[N, C, H, W]") const {
    if (!t.defined()) return Status::errorf(what, " is undefined");
    if (t.device() != device())
      return Status::errorf(what, " ", t.describe(), " is not on ", name(),
                            t.device().is_cpu() ? " (upload() it first)" : "");
    if (t.dtype() != dtype_)
      return Status::errorf(what, " ", t.describe(), " is not in this backend's dtype ",
                            dtype_name(dtype_));
    if (t.byte_offset() + t.nbytes() > t.storage()->bytes())
      return Status::errorf(what, " ", t.describe(), " needs ", t.nbytes(), " bytes at offset ",
                            t.byte_offset(), " but its storage holds ", t.storage()->bytes());
    if (rank >= 0 && t.rank() != rank)
      return Status::errorf(what, " must be ", rank, "-D ", form, ", got ", shape_str(t.shape()));
    for (int64_t d : t.shape())
      if (d <= 0) return Status::errorf(what, " ", shape_str(t.shape()), " has an empty dimension");
    if (t.rank() == 4 && !nhwc_compatible(t))
      return Status::errorf(what, " ", t.describe(),
                            " is 4-D but not in the NHWC layout of this backend");
    return ok_status();
  }

  // video: conv3d_frames' (and _normed's) frames x [T + kt - 1, Cin, H, W] and merged kernel w
  // [Cout, Cin, kt * kh, kw].
  Status check_conv3d_frames(const Tensor& x, const Tensor& w, int kt) const {
    LATENT_TRY(check_tensor("input x", x, 4, "[T + kt - 1, Cin, H, W]"));
    LATENT_TRY(check_tensor("weight w", w, 4, "[Cout, Cin, kt * kh, kw]"));
    if (kt < 2 || w.dim(2) % kt != 0 || w.dim(1) != x.dim(1) || x.dim(0) < kt)
      return Status::errorf("weight w ", shape_str(w.shape()), " with ", kt,
                            " temporal taps does not fit frames x ", shape_str(x.shape()));
    return ok_status();
  }
  // video: the output [frames, Cout, Ho, Wo] of conv3d_frames_after / _normed with w over frames
  // of x's size: stride, padding and a kernel within the padded frame checked.
  Result<Shape> conv3d_output(const Tensor& x, const Tensor& w, int kt, int64_t frames,
                              const Conv2dParams& p) const {
    if (p.stride < 1 || p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0)
      return Status::errorf("invalid stride ", p.stride, " or padding");
    const int64_t ho = (x.dim(2) + p.pad_top + p.pad_bottom - w.dim(2) / kt) / p.stride + 1,
                  wo = (x.dim(3) + p.pad_left + p.pad_right - w.dim(3)) / p.stride + 1;
    if (ho < 1 || wo < 1)
      return Status::errorf("kernel of w ", shape_str(w.shape()),
                            " is larger than the padded frames of x ", shape_str(x.shape()));
    return Shape{frames, w.dim(0), ho, wo};
  }
  // video: conv3d_frames' epilogue arguments: bias [Cout] of w, residual shaped like the output.
  Status check_conv3d_epilogue(const Tensor& bias, const Tensor& residual, Activation act,
                               const Tensor& w, const Shape& out_shape) const {
    if (bias.defined()) LATENT_TRY(check_param("bias", bias, w.dim(0), w));
    if (residual.defined()) {
      LATENT_TRY(check_tensor("residual", residual, 4));
      if (residual.shape() != out_shape)
        return Status::errorf("residual ", shape_str(residual.shape()),
                              " does not match the output ", shape_str(out_shape));
    }
    return check_activation(act);
  }
  Status check_param(const char* what, const Tensor& t, int64_t channels, const Tensor& x) const {
    LATENT_TRY(check_tensor(what, t, -1));
    if (t.numel() != channels)
      return Status::errorf(what, " ", shape_str(t.shape()), " should have ", channels,
                            " elements for input ", shape_str(x.shape()));
    return ok_status();
  }

  static Status check_activation(Activation act) {
    if (!valid_activation(act)) return Status::errorf("unknown activation ", static_cast<int>(act));
    return ok_status();
  }

  Result<Tensor> empty_like_layout(const Shape& shape) {
    return ctx_->empty(shape, dtype_, shape.size() == 4 ? Layout::kNHWC : Layout::kContiguous);
  }

  std::shared_ptr<DeviceContext> ctx_;  // first: outlives the buffers below
  DType dtype_;
  Options options_;
  cuda::Launch launch_;
  cudnnHandle_t cudnn_;
  std::unique_ptr<cuda::ConvPlanCache> conv_plans_;
  std::mutex mutex_;
  // === plans (members; guarded by mutex_) ===
  // While one thread captures, the others' ops wait (their work would land in its graph).
  void wait_for_capture(std::unique_lock<std::mutex>& lock) {
    capture_cv_.wait(lock, [&] {
      return !capturing_ || capture_thread_ == std::this_thread::get_id();
    });
  }
  void save_plans_locked() {
    if (!disk_plans_ || !disk_plans_->dirty()) return;
    Status st = disk_plans_->save();
    if (!st.ok()) LATENT_WARN(ctx_->label(), ": ", st.message());
  }
  // After each op outside a capture: a choice it timed (a cuDNN engine, an algorithm) goes to
  // disk at once, so every caller's choices survive (an image plan's warm-up, a video stream's
  // first chunks, latent-tool) and a precompute job's other workers find them before they start.
  // A failed write is warned about once and not retried op after op (synchronize() and the
  // destructor still try).
  void save_new_plans_locked() {
    if (capturing_ || plan_save_failed_ || !disk_plans_ || !disk_plans_->dirty()) return;
    Status st = disk_plans_->save();
    if (st.ok()) return;
    plan_save_failed_ = true;
    LATENT_WARN(ctx_->label(), ": ", st.message(), " (the choices stay in memory)");
  }
  bool plan_save_failed_ = false;
  std::shared_ptr<PlanCache> disk_plans_;
  bool capturing_ = false;
  std::thread::id capture_thread_;
  std::condition_variable capture_cv_;
  std::shared_ptr<Storage> capture_arena_;  // the arena of the graph in capture (plans)
  // === end plans ===
  // === cuda-dit: what the DiT ops need (call with the lock held) ===
  cuda::DitEnv dit_env() {
    cuda::DitEnv env;
    env.ctx = ctx_.get();
    env.dtype = dtype_;
    env.launch = launch_;
    env.device = device();
    env.name = name();
    env.linear = dit_linear_.get();
    return env;
  }
  std::unique_ptr<cuda::DitLinear> dit_linear_;  // cuBLASLt handle and plans
  bool fp8_linear_ = false;  // supports_fp8_linear()
  bool fp8_gated_add_ = true;  // LATENT_FP8_GATED_ADD (linear_fp8_gated_add in one GEMM)
  int rms_norm_packs_ = 0;     // LATENT_RMS_NORM_PACKS (launch_rms_norm_channels' max_packs)
  // === end cuda-dit ===
};

Result<Tensor> CudaBackend::upload(const Tensor& host) {
  return run("upload", [&]() -> Result<Tensor> {
    LATENT_TRY(cuda::check_host_tensor(host));
    LATENT_ASSIGN_OR_RETURN(Tensor out, empty_like_layout(host.shape()));
    if (host.numel() == 0) return out;
    const bool transpose = host.rank() == 4 && host.dim(1) > 1 && host.dim(2) * host.dim(3) > 1;
    cudaStream_t stream = ctx_->stream();
    // Pageable host memory: the copy returns once the host buffer has been read, so the caller
    // may free or reuse it right away.
    if (!transpose && host.dtype() == dtype_) {
      LATENT_CUDA_CHECK(
          cudaMemcpyAsync(out.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream));
      count_host_to_device(host.nbytes());  // gpu-elements
      return out;
    }
    TempBuffer staging;
    LATENT_TRY(staging.allocate(*ctx_, host.nbytes()));
    LATENT_CUDA_CHECK(
        cudaMemcpyAsync(staging.get(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream));
    count_host_to_device(host.nbytes());  // gpu-elements
    if (transpose) {
      // [N][C][H*W] -> [N][H*W][C]
      LATENT_TRY(cuda::launch_transpose(staging.get(), host.dtype(), out.data(), dtype_,
                                        host.dim(0), host.dim(1), host.dim(2) * host.dim(3),
                                        launch_));
    } else {
      LATENT_TRY(cuda::launch_convert(staging.get(), host.dtype(), out.data(), dtype_, host.numel(),
                                      launch_));
    }
    return out;
  });
}

Result<Tensor> CudaBackend::download(const Tensor& t) {
  return run("download", [&]() -> Result<Tensor> {
    if (!t.defined()) return Status::error("tensor is undefined");
    if (t.device() != device()) return Status::errorf(t.describe(), " is not on ", name());
    if (t.byte_offset() + t.nbytes() > t.storage()->bytes())
      return Status::errorf(t.describe(), " needs ", t.nbytes(), " bytes at offset ",
                            t.byte_offset(), " but its storage holds ", t.storage()->bytes());
    Tensor host = Tensor::empty(t.shape(), DType::kF32);
    if (t.numel() == 0) return host;
    cudaStream_t stream = ctx_->stream();
    const bool transpose =
        t.layout() == Layout::kNHWC && t.rank() == 4 && t.dim(1) > 1 && t.dim(2) * t.dim(3) > 1;
    if (!transpose && t.dtype() == DType::kF32) {
      LATENT_CUDA_CHECK(
          cudaMemcpyAsync(host.data(), t.data(), host.nbytes(), cudaMemcpyDeviceToHost, stream));
      count_device_to_host(host.nbytes());  // gpu-elements
    } else {
      TempBuffer staging;
      LATENT_TRY(staging.allocate(*ctx_, host.nbytes()));
      if (transpose) {
        // [N][H*W][C] -> [N][C][H*W]
        LATENT_TRY(cuda::launch_transpose(t.data(), t.dtype(), staging.get(), DType::kF32, t.dim(0),
                                          t.dim(2) * t.dim(3), t.dim(1), launch_));
      } else {
        LATENT_TRY(cuda::launch_convert(t.data(), t.dtype(), staging.get(), DType::kF32, t.numel(),
                                        launch_));
      }
      LATENT_CUDA_CHECK(cudaMemcpyAsync(host.data(), staging.get(), host.nbytes(),
                                        cudaMemcpyDeviceToHost, stream));
      count_device_to_host(host.nbytes());  // gpu-elements
    }
    LATENT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host;
  });
}

Status CudaBackend::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for_capture(lock);  // plans
  if (capturing_) return Status::errorf("synchronize on ", ctx_->label(), " while capturing a graph");
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx_->device()));
  LATENT_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream()));
  save_plans_locked();  // plans: new cuDNN choices, written once (no-op when nothing is new)
  return ok_status();
}

// === plans: graph capture and the on-disk plan cache ===
Status CudaBackend::begin_capture() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for_capture(lock);
  if (capturing_) return Status::errorf(ctx_->label(), ": this thread is already capturing");
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx_->device()));
  // With a recording of this thread's allocations (record_allocations), the graph's buffers
  // (cuDNN's workspaces among them: each convolution's is a buffer of its call) come from one
  // arena laid out by their lifetimes, which the graph owns; without one they are graph memory.
  capture_arena_.reset();
  const size_t arena_bytes = ctx_->has_recording() ? ctx_->plan_arena_bytes() : 0;
  if (arena_bytes > 0) {
    LATENT_ASSIGN_OR_RETURN(capture_arena_, ctx_->allocate_storage(arena_bytes));
    ctx_->serve_allocations(capture_arena_->data());
  }
  // Hand back to the driver the pool memory no buffer holds now (what the plain runs before the
  // capture used), so that the graph's memory does not come on top of it.
  Status trimmed = ctx_->trim();
  if (trimmed.ok()) trimmed = cuda::begin_stream_capture(*ctx_);
  if (!trimmed.ok()) {
    if (arena_bytes > 0) (void)ctx_->end_serving();
    capture_arena_.reset();
    return trimmed;
  }
  conv_plans_->set_capturing(true);
  capturing_ = true;
  capture_thread_ = std::this_thread::get_id();
  return ok_status();
}

Result<std::shared_ptr<CapturedGraph>> CudaBackend::end_capture() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!capturing_ || capture_thread_ != std::this_thread::get_id())
    return Status::errorf(ctx_->label(), ": end_capture without begin_capture on this thread");
  DeviceGuard guard;
  Status st = guard.set(ctx_->device());
  const bool planned = ctx_->has_serving();
  const bool matched = !planned || ctx_->end_serving();
  auto made = cuda::end_stream_capture(ctx_, std::move(capture_arena_));
  capture_arena_.reset();
  if (made.ok() && !matched) {
    made = Status::errorf(ctx_->label(),
                          ": the captured run allocated other buffers than the "
                          "recorded one (its arena layout does not apply)");
  }
  conv_plans_->set_capturing(false);
  capturing_ = false;
  lock.unlock();
  capture_cv_.notify_all();
  LATENT_TRY(st);
  if (!made.ok()) return made.status();
  LATENT_DEBUG(ctx_->label(), ": captured a graph of ", (*made)->nodes(), " nodes");
  return std::shared_ptr<CapturedGraph>(std::move(made).value());
}

Status CudaBackend::replay(const CapturedGraph& graph) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_for_capture(lock);
  auto* g = dynamic_cast<const cuda::CudaGraph*>(&graph);
  if (!g || g->context() != ctx_.get())
    return Status::errorf("replay: the graph was not captured by ", ctx_->label());
  if (capturing_) return Status::errorf("replay on ", ctx_->label(), " while capturing a graph");
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx_->device()));
  return g->launch();
}

Status CudaBackend::copy_into(const Tensor& src, const Tensor& dst) {
  return run("copy_into", [&]() -> Result<Tensor> {
           LATENT_TRY(check_tensor("src", src, -1));
           LATENT_TRY(check_tensor("dst", dst, -1));
           if (src.shape() != dst.shape() || src.layout() != dst.layout())
             return Status::errorf("src ", src.describe(), " and dst ", dst.describe(),
                                   " differ in shape or layout");
           if (src.data() != dst.data())
             LATENT_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(),
                                               cudaMemcpyDeviceToDevice, ctx_->stream()));
           return dst;
         })
      .status();
}

Status CudaBackend::save_plans() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!disk_plans_) return ok_status();
  return disk_plans_->save();
}
// === end plans ===

Result<Tensor> CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                   const Conv2dParams& p, const Tensor& residual, Activation act) {
  return run("conv2d", [&] { return conv2d_locked(x, w, bias, p, residual, act); });
}

// conv2d's body, with the lock held (also conv3d_frames' fallback, one call per tap).
Result<Tensor> CudaBackend::conv2d_locked(const Tensor& x, const Tensor& w, const Tensor& bias,
                                          const Conv2dParams& p, const Tensor& residual,
                                          Activation act) {
  LATENT_TRY(check_tensor("input x", x, 4));
  LATENT_TRY(check_tensor("weight w", w, 4, "[Cout, Cin, kh, kw]"));
  if (w.dim(1) != x.dim(1))
    return Status::errorf("weight w ", shape_str(w.shape()), " expects ", w.dim(1),
                          " input channels but x is ", shape_str(x.shape()));
  if (p.stride < 1 || p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0)
    return Status::errorf("invalid stride ", p.stride, " or padding (top ", p.pad_top,
                          ", bottom ", p.pad_bottom, ", left ", p.pad_left, ", right ",
                          p.pad_right, ")");
  const int64_t hp = x.dim(2) + p.pad_top + p.pad_bottom,
                wp = x.dim(3) + p.pad_left + p.pad_right;
  if (hp < w.dim(2) || wp < w.dim(3))
    return Status::errorf("kernel ", w.dim(2), 'x', w.dim(3), " is larger than the padded input ",
                          hp, 'x', wp, " of x ", shape_str(x.shape()));
  const int64_t big = std::numeric_limits<int32_t>::max();
  if (hp > big || wp > big || x.dim(0) > big || x.dim(1) > big || w.dim(0) > big)
    return Status::errorf("x ", shape_str(x.shape()), " is too large for cuDNN");
  const Shape out_shape = {x.dim(0), w.dim(0), (hp - w.dim(2)) / p.stride + 1,
                           (wp - w.dim(3)) / p.stride + 1};
  if (bias.defined()) LATENT_TRY(check_param("bias", bias, w.dim(0), w));
  if (residual.defined()) {
    LATENT_TRY(check_tensor("residual", residual, 4));
    if (residual.shape() != out_shape)
      return Status::errorf("residual ", shape_str(residual.shape()),
                            " does not match the output ", shape_str(out_shape), " of x ",
                            shape_str(x.shape()), " * w ", shape_str(w.shape()));
  }
  LATENT_TRY(check_activation(act));
  {
    // The Hopper implicit-GEMM kernel where it takes the call (epilogue fused, no pad copy).
    LATENT_ASSIGN_OR_RETURN(Tensor y,
                            conv_wgmma(x, Tensor(), w, 1, bias, p, residual, act, x.dim(0)));
    if (y.defined()) return y;
  }

  // cuDNN's convolution API pads symmetrically; whatever one side has beyond the other is
  // padded here, by a copy of the input, unless a fused graph takes it as post-padding.
  const int sym_h = std::min(p.pad_top, p.pad_bottom), sym_w = std::min(p.pad_left, p.pad_right);
  const int extra_t = p.pad_top - sym_h, extra_b = p.pad_bottom - sym_h;
  const int extra_l = p.pad_left - sym_w, extra_r = p.pad_right - sym_w;
  cuda::ConvShape s;
  s.n = static_cast<int>(x.dim(0));
  s.c = static_cast<int>(x.dim(1));
  s.h = static_cast<int>(x.dim(2) + extra_t + extra_b);
  s.w = static_cast<int>(x.dim(3) + extra_l + extra_r);
  s.k = static_cast<int>(w.dim(0));
  s.r = static_cast<int>(w.dim(2));
  s.s = static_cast<int>(w.dim(3));
  s.pad_h = sym_h;
  s.pad_w = sym_w;
  s.stride = p.stride;
  s.dtype = dtype_;
  if (s.out_h() != out_shape[2] || s.out_w() != out_shape[3])
    return Status::errorf("internal error: output ", s.out_h(), 'x', s.out_w(),
                          " != ", shape_str(out_shape));
  LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(out_shape, dtype_, Layout::kNHWC));
  if (!extra_t && !extra_l && (extra_b || extra_r) && options_.conv_pad_in_graph) {
    // diffusers' downsamplers (F.pad(x, (0, 1, 0, 1)), stride 2): x as it is, the bottom / right
    // rows and columns as the graph's post-padding (same output size).
    cuda::ConvShape g = s;
    g.h = static_cast<int>(x.dim(2));
    g.w = static_cast<int>(x.dim(3));
    g.extra_b = extra_b;
    g.extra_r = extra_r;
    LATENT_ASSIGN_OR_RETURN(const bool fused, cudnn_fused(g, x.data(), w, y, bias, residual, act));
    if (fused) return y;
  }

  TempBuffer padded;
  const void* input = x.data();
  if (extra_t || extra_b || extra_l || extra_r) {
    const size_t bytes = static_cast<size_t>(s.n) * s.h * s.w * s.c * dtype_size(dtype_);
    LATENT_TRY(padded.allocate(*ctx_, bytes));
    LATENT_TRY(cuda::launch_pad(x.data(), padded.get(), x.dim(0), x.dim(2), x.dim(3), x.dim(1),
                                extra_t, extra_b, extra_l, extra_r, dtype_size(dtype_), launch_));
    input = padded.get();
  }
  {
    LATENT_ASSIGN_OR_RETURN(const bool fused, cudnn_fused(s, input, w, y, bias, residual, act));
    if (fused) return y;
  }
  LATENT_TRY(conv_plans_->forward(s, input, w.data(), y.data(), *ctx_));
  if (bias.defined() || residual.defined() || act != Activation::kNone) {
    LATENT_TRY(cuda::launch_bias_residual_act(y.data(), bias.defined() ? bias.data() : nullptr,
                                              residual.defined() ? residual.data() : nullptr,
                                              y.numel(), out_shape[1], dtype_, act, launch_));
  }
  return y;
}

Result<Tensor> CudaBackend::group_norm(const Tensor& x, int groups, const Tensor& gamma,
                                       const Tensor& beta, float eps, Activation act) {
  return run("group_norm", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input x", x, 4));
    if (groups < 1 || x.dim(1) % groups != 0)
      return Status::errorf(x.dim(1), " channels of x ", shape_str(x.shape()),
                            " cannot be split into ", groups, " groups");
    if (gamma.defined() != beta.defined())
      return Status::error("gamma and beta must both be given or both be omitted");
    if (!(eps >= 0.f) || !std::isfinite(eps)) return Status::errorf("invalid eps ", eps);
    if (gamma.defined()) {
      LATENT_TRY(check_param("gamma", gamma, x.dim(1), x));
      LATENT_TRY(check_param("beta", beta, x.dim(1), x));
    }
    LATENT_TRY(check_activation(act));
    const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
    const size_t scratch_bytes = cuda::group_norm_scratch_bytes(n, hw, c, groups, dtype_, launch_);
    TempBuffer scratch;
    if (scratch_bytes) LATENT_TRY(scratch.allocate(*ctx_, scratch_bytes));
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(x.shape(), dtype_, Layout::kNHWC));
    LATENT_TRY(cuda::launch_group_norm(
        x.data(), y.data(), n, hw, c, groups, gamma.defined() ? gamma.data() : nullptr,
        beta.defined() ? beta.data() : nullptr, eps, act, dtype_, scratch.get(), launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::rms_norm_channels(const Tensor& x, const Tensor& gamma,
                                              const Tensor& beta, Activation act) {
  return run("rms_norm_channels", [&]() -> Result<Tensor> {
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(x.shape(), dtype_, Layout::kNHWC));
    LATENT_TRY(rms_norm_channels_locked(x, gamma, beta, act, y));
    return y;
  });
}

Status CudaBackend::rms_norm_channels_into(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                           Activation act, const Tensor& y) {
  return run("rms_norm_channels_into",
             [&]() -> Result<Tensor> {
               LATENT_TRY(check_tensor("output y", y, 4));
               if (y.shape() != x.shape() || y.layout() != Layout::kNHWC)
                 return Status::errorf("output y ", y.describe(), " is not the shape of x ",
                                       x.describe());
               LATENT_TRY(rms_norm_channels_locked(x, gamma, beta, act, y));
               return y;
             })
      .status();
}

Status CudaBackend::rms_norm_channels_locked(const Tensor& x, const Tensor& gamma,
                                             const Tensor& beta, Activation act, const Tensor& y) {
  LATENT_TRY(check_tensor("input x", x, 4));
  if (gamma.defined()) LATENT_TRY(check_param("gamma", gamma, x.dim(1), x));
  if (beta.defined()) LATENT_TRY(check_param("beta", beta, x.dim(1), x));
  LATENT_TRY(check_activation(act));
  return cuda::launch_rms_norm_channels(x.data(), y.data(), x.dim(0) * x.dim(2) * x.dim(3),
                                        x.dim(1), gamma.defined() ? gamma.data() : nullptr,
                                        beta.defined() ? beta.data() : nullptr, act, dtype_,
                                        launch_, rms_norm_packs_);
}

Result<Tensor> CudaBackend::activation(const Tensor& x, Activation act) {
  return run("activation", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input x", x, -1));
    LATENT_TRY(check_activation(act));
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(x.shape(), dtype_, x.layout()));
    LATENT_TRY(cuda::launch_activation(x.data(), y.data(), x.numel(), dtype_, act, launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::add(const Tensor& a, const Tensor& b) {
  return run("add", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("a", a, -1));
    LATENT_TRY(check_tensor("b", b, -1));
    if (a.shape() != b.shape())
      return Status::errorf("shapes differ: ", shape_str(a.shape()), " + ", shape_str(b.shape()));
    // Both 4-D tensors passed check_tensor, so both read as NHWC; other ranks are contiguous.
    const Layout layout = a.rank() == 4 ? Layout::kNHWC : Layout::kContiguous;
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(a.shape(), dtype_, layout));
    LATENT_TRY(cuda::launch_add(a.data(), b.data(), y.data(), a.numel(), dtype_, launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::affine(const Tensor& x, float scale, float shift) {
  return run("affine", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input x", x, -1));
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(x.shape(), dtype_, x.layout()));
    LATENT_TRY(cuda::launch_affine(x.data(), y.data(), x.numel(), dtype_, scale, shift, launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::channel_affine(const Tensor& x, const std::vector<float>& scale,
                                           const std::vector<float>& shift) {
  return run("channel_affine", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input x", x, 4));
    if (static_cast<int64_t>(scale.size()) != x.dim(1) ||
        static_cast<int64_t>(shift.size()) != x.dim(1))
      return Status::errorf(scale.size(), " scales and ", shift.size(), " shifts for ", x.dim(1),
                            " channels of x ", shape_str(x.shape()));
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(x.shape(), dtype_, Layout::kNHWC));
    LATENT_TRY(cuda::launch_channel_affine(x.data(), y.data(), x.numel(), x.dim(1), dtype_,
                                           scale.data(), shift.data(), launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::clamp(const Tensor& x, float lo, float hi) {
  return run("clamp", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input x", x, -1));
    if (!(lo <= hi)) return Status::errorf("empty range [", lo, ", ", hi, "]");
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(x.shape(), dtype_, x.layout()));
    LATENT_TRY(cuda::launch_clamp(x.data(), y.data(), x.numel(), dtype_, lo, hi, launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::upsample_nearest2x(const Tensor& x) {
  return run("upsample_nearest2x", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input x", x, 4));
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty({x.dim(0), x.dim(1), 2 * x.dim(2), 2 * x.dim(3)},
                                                  dtype_, Layout::kNHWC));
    LATENT_TRY(cuda::launch_upsample_nearest2x(x.data(), y.data(), x.dim(0), x.dim(2), x.dim(3),
                                               x.dim(1), dtype_size(dtype_), launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::interleave_phases2x(const Tensor& z) {
  return run("interleave_phases2x", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input z", z, 4));
    LATENT_TRY(check_phases2x(z));
    if (z.layout() != Layout::kNHWC)
      return Status::errorf("input z ", z.describe(),
                            " is not in this backend's image layout (NHWC)");
    const int64_t c = z.dim(1) / 4, h = z.dim(2) - 1, w = z.dim(3) - 1;
    LATENT_ASSIGN_OR_RETURN(Tensor y,
                            ctx_->empty({z.dim(0), c, 2 * h, 2 * w}, dtype_, Layout::kNHWC));
    LATENT_TRY(cuda::launch_interleave_phases2x(z.data(), y.data(), z.dim(0), h, w, c,
                                                dtype_size(dtype_), launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::slice_channels(const Tensor& x, int64_t start, int64_t count) {
  return run("slice_channels", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("input x", x, 4));
    if (start < 0 || count < 1 || start > x.dim(1) - count)
      return Status::errorf("channels [", start, ", ", start + count, ") are outside the ",
                            x.dim(1), " channels of x ", shape_str(x.shape()));
    LATENT_ASSIGN_OR_RETURN(
        Tensor y, ctx_->empty({x.dim(0), count, x.dim(2), x.dim(3)}, dtype_, Layout::kNHWC));
    LATENT_TRY(cuda::launch_slice_channels(x.data(), y.data(), x.dim(0) * x.dim(2) * x.dim(3),
                                           x.dim(1), start, count, dtype_size(dtype_), launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::spatial_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                              int heads) {
  return run("spatial_attention", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("q", q, 4));
    LATENT_TRY(check_tensor("k", k, 4));
    LATENT_TRY(check_tensor("v", v, 4));
    if (k.shape() != q.shape() || v.shape() != q.shape())
      return Status::errorf("q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), " and v ",
                            shape_str(v.shape()), " must have the same shape");
    if (heads < 1 || q.dim(1) % heads != 0)
      return Status::errorf(q.dim(1), " channels of q ", shape_str(q.shape()),
                            " cannot be split into ", heads, " heads");
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(q.shape(), dtype_, Layout::kNHWC));
    // NHWC [N, H*W, C] is token-major: each token's channels are one contiguous row.
    // One head wider than 256 (the VAEs' d = 384 / 512) runs unfused by default: 1.06-1.13x the
    // Qwen-Image VAE at 1024^2 / 1920x1088 on the H100 (bench/NOTES.md, session 15). A kernel
    // named by LATENT_ATTENTION_KERNEL keeps that kernel.
    const cuda::AttentionKernel kernel = cuda::attention_kernel_from_env();
    const bool gemm = kernel == cuda::AttentionKernel::kGemm ||
                      (kernel == cuda::AttentionKernel::kDefault && q.dim(1) > 256 &&
                       options_.tensor_core_attention);
    if (heads == 1 && dtype_ != DType::kF32 && q.dim(1) % 8 == 0 && gemm) {
      LATENT_TRY(spatial_attention_gemm(q, k, v, y));
      return y;
    }
    LATENT_TRY(cuda::launch_spatial_attention(q.data(), k.data(), v.data(), y.data(), q.dim(0),
                                              q.dim(2) * q.dim(3), q.dim(1), heads, dtype_,
                                              options_.tensor_core_attention, launch_));
    return y;
  });
}

// One head of d = C channels, unfused (the default for d > 256, LATENT_ATTENTION_KERNEL=gemm for
// any d; for the VAEs' d = 384 / 512, where the flash kernels run mma.sync at ~150-165 TFLOP/s):
// per image, v transposed once, then per chunk of queries s = q k^T in fp32 on cuBLASLt, p =
// softmax(s / sqrt(d)) in the compute dtype, out = p v. The chunk keeps s and p within ~0.5 GB.
Status CudaBackend::spatial_attention_gemm(const Tensor& q, const Tensor& k, const Tensor& v,
                                           Tensor& y) {
  const int64_t n = q.dim(0), t = q.dim(2) * q.dim(3), d = q.dim(1);
  const size_t es = dtype_size(dtype_);
  constexpr size_t kChunkBytes = size_t{512} << 20;
  const int64_t per_row = t * static_cast<int64_t>(sizeof(float) + es);
  int64_t chunk = std::max<int64_t>(128, static_cast<int64_t>(kChunkBytes) / per_row / 128 * 128);
  chunk = std::min(chunk, t);
  TempBuffer vt, s, p;
  LATENT_TRY(vt.allocate(*ctx_, static_cast<size_t>(t * d) * es));
  LATENT_TRY(s.allocate(*ctx_, static_cast<size_t>(chunk * t) * sizeof(float)));
  LATENT_TRY(p.allocate(*ctx_, static_cast<size_t>(chunk * t) * es));
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  // cuBLASLt's workspaces live only while this attention runs (DitLinear::set_workspace_per_call).
  struct PerCall {
    cuda::DitLinear& l;
    explicit PerCall(cuda::DitLinear& linear) : l(linear) { l.set_workspace_per_call(true); }
    ~PerCall() { l.set_workspace_per_call(false); }
  } per_call(*dit_linear_);
  auto at = [&](const Tensor& x, int64_t image, int64_t row) {
    return static_cast<const char*>(x.data()) + static_cast<size_t>((image * t + row) * d) * es;
  };
  for (int64_t b = 0; b < n; ++b) {
    LATENT_TRY(cuda::launch_transpose_2d(at(v, b, 0), vt.get(), t, d, dtype_, launch_));
    for (int64_t r0 = 0; r0 < t; r0 += chunk) {
      const int64_t m = std::min(chunk, t - r0);
      LATENT_TRY(dit_linear_->run_f32_out(*ctx_, at(q, b, r0), at(k, b, 0), s.as<float>(), m, t, d,
                                          dtype_));
      LATENT_TRY(cuda::launch_softmax_rows(s.as<float>(), p.get(), m, t, scale, dtype_, launch_));
      LATENT_TRY(dit_linear_->run(*ctx_, p.get(), vt.get(), nullptr,
                                  const_cast<char*>(at(y, b, r0)), m, d, t, dtype_, false));
    }
  }
  return ok_status();
}

// === cuda-dit: DiT ops, dispatched to dit_ops.cpp under the lock ===
Result<Tensor> CudaBackend::upload_fp32(const Tensor& host) {
  return run("upload_fp32", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_upload_fp32(env, host);
  });
}

Result<Tensor> CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                                   DitActivation act) {
  return run("linear", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_linear(env, x, w, bias, act);
  });
}

Result<Tensor> CudaBackend::linear_add(const Tensor& x, const Tensor& w, const Tensor& residual,
                                       DitActivation act) {
  return run("linear_add", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_linear_add(env, x, w, residual, act);
  });
}

Result<Tensor> CudaBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                       float eps) {
  return run("layer_norm", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_layer_norm(env, x, gamma, beta, eps);
  });
}

Result<Tensor> CudaBackend::rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
  return run("rms_norm", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_rms_norm(env, x, gamma, eps);
  });
}

Result<Tensor> CudaBackend::modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                     const std::vector<int64_t>& group_starts) {
  return run("modulate", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_modulate(env, x, shift, scale, group_starts, false, 0.f);
  });
}

Result<Tensor> CudaBackend::layer_norm_modulate(const Tensor& x, const Tensor& shift,
                                                const Tensor& scale,
                                                const std::vector<int64_t>& group_starts,
                                                float eps) {
  return run("layer_norm_modulate", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_modulate(env, x, shift, scale, group_starts, true, eps);
  });
}

Result<Tensor> CudaBackend::gated_add(const Tensor& residual, const Tensor& x, const Tensor& gate,
                                      const std::vector<int64_t>& group_starts) {
  return run("gated_add", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_gated_add(env, residual, x, gate, group_starts);
  });
}

Result<Tensor> CudaBackend::rope(const Tensor& x, const Tensor& freqs, int heads) {
  return run("rope", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_rope(env, x, freqs, heads);
  });
}

Result<Tensor> CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                      int heads, const Tensor& key_mask,
                                      const std::vector<int64_t>& key_lengths) {
  return run("attention", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_attention(env, q, k, v, heads, key_mask, key_lengths);
  });
}

Result<Tensor> CudaBackend::dit_activation(const Tensor& x, DitActivation act) {
  return run("dit_activation", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_activation(env, x, act);
  });
}

Result<Tensor> CudaBackend::scaled_add(const Tensor& a, const Tensor& b, float alpha,
                                       float beta) {
  return run("scaled_add", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_scaled_add(env, a, b, alpha, beta);
  });
}

Result<Tensor> CudaBackend::cfg_combine(const Tensor& cond, const Tensor& uncond, float scale) {
  return run("cfg_combine", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_cfg_combine(env, cond, uncond, scale);
  });
}

Result<Tensor> CudaBackend::concat(const std::vector<Tensor>& parts, int dim) {
  // video: NHWC images joined along dim 0 (frames of a clip) are whole blocks one after another.
  if (dim == 0 && !parts.empty() && parts[0].rank() == 4 && parts[0].layout() == Layout::kNHWC) {
    return run("concat", [&]() -> Result<Tensor> {
      int64_t total = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        const std::string what = str_cat("part ", i);
        LATENT_TRY(check_tensor(what.c_str(), parts[i], 4));
        if (parts[i].layout() != Layout::kNHWC || parts[i].dim(1) != parts[0].dim(1) ||
            parts[i].dim(2) != parts[0].dim(2) || parts[i].dim(3) != parts[0].dim(3))
          return Status::errorf("part ", i, " ", parts[i].describe(), " does not match part 0 ",
                                parts[0].describe(), " outside dim 0 (NHWC images)");
        total += parts[i].dim(0);
      }
      LATENT_ASSIGN_OR_RETURN(
          Tensor y,
          ctx_->empty({total, parts[0].dim(1), parts[0].dim(2), parts[0].dim(3)}, dtype_,
                      Layout::kNHWC));
      char* dst = static_cast<char*>(y.data());
      for (const Tensor& p : parts) {
        LATENT_CUDA_CHECK(cudaMemcpyAsync(dst, p.data(), p.nbytes(), cudaMemcpyDeviceToDevice,
                                          ctx_->stream()));
        dst += p.nbytes();
      }
      return y;
    });
  }
  return run("concat", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_concat(env, parts, dim);
  });
}

Result<Tensor> CudaBackend::conv3d_frames(const Tensor& x, const Tensor& w, int kt,
                                          const Tensor& bias, const Conv2dParams& p,
                                          const Tensor& residual, Activation act) {
  return run("conv3d_frames", [&]() -> Result<Tensor> {
    if (!options_.conv3d) return Status::error("disabled by LATENT_CUDA_CONV3D=0");
    LATENT_TRY(check_conv3d_frames(x, w, kt));
    if (p.stride < 1 || p.pad_top != p.pad_bottom || p.pad_left != p.pad_right || p.pad_top < 0 ||
        p.pad_left < 0)
      return Status::errorf("conv3d_frames takes symmetric padding and a positive stride");
    const int64_t kh = w.dim(2) / kt, kw = w.dim(3);
    const int64_t big = std::numeric_limits<int32_t>::max();
    if (x.numel() > big || x.dim(0) > big)
      return Status::errorf("x ", shape_str(x.shape()), " is too large for cuDNN");
    cuda::ConvShape s;
    s.n = 1;
    s.d = static_cast<int>(x.dim(0));
    s.kt = kt;
    s.c = static_cast<int>(x.dim(1));
    s.h = static_cast<int>(x.dim(2));
    s.w = static_cast<int>(x.dim(3));
    s.k = static_cast<int>(w.dim(0));
    s.r = static_cast<int>(kh);
    s.s = static_cast<int>(kw);
    s.pad_h = p.pad_top;
    s.pad_w = p.pad_left;
    s.stride = p.stride;
    s.dtype = dtype_;
    if (s.out_h() < 1 || s.out_w() < 1)
      return Status::errorf("kernel ", kh, 'x', kw, " is larger than the padded input of x ",
                            shape_str(x.shape()));
    const Shape out_shape = {s.out_d(), w.dim(0), s.out_h(), s.out_w()};
    LATENT_TRY(check_conv3d_epilogue(bias, residual, act, w, out_shape));
    {
      LATENT_ASSIGN_OR_RETURN(Tensor y,
                              conv_wgmma(x, Tensor(), w, kt, bias, p, residual, act, s.out_d()));
      if (y.defined()) return y;
    }
    if (conv3d_failed_) return conv3d_by_taps(x, w, kt, bias, p, residual, act);
    // [T, Cout, Ho, Wo] NHWC = NDHWC [1][T][Ho][Wo][Cout]
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty(out_shape, dtype_, Layout::kNHWC));
    {
      LATENT_ASSIGN_OR_RETURN(const bool fused,
                              cudnn_fused(s, x.data(), w, y, bias, residual, act));
      if (fused) return y;
    }
    const Status st = conv_plans_->forward(s, x.data(), w.data(), y.data(), *ctx_);
    if (!st.ok()) {
      if (capturing_) return st;
      LATENT_WARN(ctx_->label(), ": cuDNN 3-D convolution failed (", st.message(),
                  "); composing it from 2-D convolutions from now on");
      conv3d_failed_ = true;
      return conv3d_by_taps(x, w, kt, bias, p, residual, act);
    }
    if (bias.defined() || residual.defined() || act != Activation::kNone) {
      LATENT_TRY(cuda::launch_bias_residual_act(y.data(), bias.defined() ? bias.data() : nullptr,
                                                residual.defined() ? residual.data() : nullptr,
                                                y.numel(), out_shape[1], dtype_, act, launch_));
    }
    return y;
  });
}

Result<Tensor> CudaBackend::conv3d_by_taps(const Tensor& x, const Tensor& w, int kt,
                                           const Tensor& bias, const Conv2dParams& p,
                                           const Tensor& residual, Activation act) {
  // w: KTRSC [Cout][kt][kh][kw][Cin]; tap j: rows of kh*kw*Cin at j*kh*kw*Cin of each Cout
  const int64_t cout = w.dim(0), cin = w.dim(1), kh = w.dim(2) / kt, kw = w.dim(3);
  const int64_t t = x.dim(0) - kt + 1;
  const size_t es = dtype_size(dtype_);
  const size_t run_bytes = static_cast<size_t>(kh * kw * cin) * es;
  const size_t frame = x.nbytes() / static_cast<size_t>(x.dim(0));
  Tensor y = residual;
  for (int j = 0; j < kt; ++j) {
    LATENT_ASSIGN_OR_RETURN(Tensor tap, ctx_->empty({cout, cin, kh, kw}, dtype_, Layout::kNHWC));
    LATENT_CUDA_CHECK(cudaMemcpy2DAsync(tap.data(), run_bytes,
                                        static_cast<const char*>(w.data()) + j * run_bytes,
                                        run_bytes * kt, run_bytes, static_cast<size_t>(cout),
                                        cudaMemcpyDeviceToDevice, ctx_->stream()));
    const Tensor in = Tensor::from_storage(x.storage(), x.byte_offset() + frame * j,
                                           {t, x.dim(1), x.dim(2), x.dim(3)}, dtype_,
                                           Layout::kNHWC);
    const bool last = j == kt - 1;
    LATENT_ASSIGN_OR_RETURN(
        y, conv2d_locked(in, tap, last ? bias : Tensor(), p, y, last ? act : Activation::kNone));
  }
  return y;
}

Result<Tensor> CudaBackend::clip_to_frames(const Tensor& clip) {
  return run("clip_to_frames", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("clip", clip, 5, "[1, C, T, H, W]"));
    if (clip.dim(0) != 1 || clip.layout() != Layout::kContiguous)
      return Status::errorf("expected one row-major clip [1, C, T, H, W], got ", clip.describe());
    const int64_t c = clip.dim(1), t = clip.dim(2), h = clip.dim(3), w = clip.dim(4);
    // [1][C][T*H*W] -> [T*H*W][C]: frames [T, C, H, W] in NHWC
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty({t, c, h, w}, dtype_, Layout::kNHWC));
    LATENT_TRY(cuda::launch_transpose(clip.data(), dtype_, y.data(), dtype_, 1, c, t * h * w,
                                      launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::frames_to_clip(const Tensor& frames) {
  return run("frames_to_clip", [&]() -> Result<Tensor> {
    LATENT_TRY(check_tensor("frames", frames, 4, "[T, C, H, W]"));
    const int64_t t = frames.dim(0), c = frames.dim(1), h = frames.dim(2), w = frames.dim(3);
    // [T*H*W][C] -> [1][C][T*H*W]
    LATENT_ASSIGN_OR_RETURN(Tensor y, ctx_->empty({1, c, t, h, w}, dtype_, Layout::kContiguous));
    LATENT_TRY(cuda::launch_transpose(frames.data(), dtype_, y.data(), dtype_, 1, t * h * w, c,
                                      launch_));
    return y;
  });
}

Result<Tensor> CudaBackend::slice(const Tensor& x, int dim, int64_t start, int64_t count) {
  return run("slice", [&] {
    cuda::DitEnv env = dit_env();
    return cuda::dit_slice(env, x, dim, start, count);
  });
}
// === end cuda-dit ===

}  // namespace


int cuda_runtime_device_count() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    LATENT_DEBUG("CUDA: no usable device: ", cudaGetErrorString(rc));
    return 0;
  }
  return count;
}

Result<std::shared_ptr<Backend>> create_cuda_backend(int index, DType dtype) {
  const std::string device = str_cat("cuda:", index);
  const int count = cuda_runtime_device_count();
  if (count == 0) return Status::errorf(device, ": no CUDA device (no GPU, or no usable driver)");
  if (index < 0 || index >= count)
    return Status::errorf(device, ": no such CUDA device (", count, " found)");

  auto made =
      DeviceContext::create(index, env_choice("LATENT_CUDA_POISON", {{"0"}, {"1"}}, 0) == 1);
  if (!made.ok()) return made.status().with_context(str_cat(device, ": cannot set up the device"));
  std::shared_ptr<DeviceContext> ctx = std::move(made).value();
  const std::string& label = ctx->label();

  DeviceGuard guard;
  LATENT_TRY(guard.set(index));
  if (!cuda::check_kernel_image().ok())
    return Status::errorf(label,
                          ": this build's CUDA kernels do not run on this GPU (rebuild with ",
                          "CMAKE_CUDA_ARCHITECTURES including ", ctx->properties().major,
                          ctx->properties().minor, ")");
  if (dtype == DType::kBF16 && ctx->properties().major < 8)
    return Status::errorf(label, ": bf16 needs compute capability 8.0 or newer (use fp16 or fp32)");

  cudnnHandle_t cudnn = nullptr;
  const cudnnStatus_t rc = cudnnCreate(&cudnn);
  if (rc != CUDNN_STATUS_SUCCESS)
    return Status::errorf(label, ": cudnnCreate failed: ", cudnnGetErrorString(rc),
                          " (is cuDNN 9 installed with all its sub-libraries?)");
  const cudnnStatus_t rs = cudnnSetStream(cudnn, ctx->stream());
  if (rs != CUDNN_STATUS_SUCCESS) {
    cudnnDestroy(cudnn);
    return Status::errorf(label, ": cudnnSetStream failed: ", cudnnGetErrorString(rs));
  }

  CudaBackend::Options options;
  options.tf32 = env_choice("LATENT_CUDA_TF32", {{"1"}, {"0"}}, 0) == 0;
  std::tie(options.conv_fusion_tune_2d, options.conv_fusion_tune_3d) =
      fused_tune_counts(std::getenv("LATENT_CUDNN_FUSED_TUNE"), std::getenv("LATENT_CUDNN_SEARCH"));
  // LATENT_CUDNN_SEARCH: "heuristic" (default: cuDNN's own ranking, the same choice, so the same
  // bytes, on every run and machine of one GPU model and library version) or "timed" (also
  // "exhaustive": each candidate timed once per shape, kept in the plan cache). On the H100
  // the two were as fast on every VAE measured, and timing cost 0.4-0.5 GiB of peak memory
  // (bench/NOTES.md, session 9), while timed choices made outputs differ between fresh runs.
  options.exhaustive_search =
      env_choice("LATENT_CUDNN_SEARCH", {{"heuristic"}, {"timed", "exhaustive"}}, 0) == 1;
  options.tensor_core_attention =
      env_choice("LATENT_CUDA_ATTENTION", {{"auto"}, {"simple"}}, 0) == 0;
  {
    const int conv3d = env_choice("LATENT_CUDA_CONV3D", {{"1"}, {"0"}, {"taps"}}, 0);
    options.conv3d = conv3d != 1;
    options.conv3d_taps = conv3d == 2;
  }
  // LATENT_CUDNN_FUSION: "on" (default) fuses the epilogues of cuDNN's convolutions (bias,
  // residual, ReLU / SiLU) into cuDNN operation graphs, "off" runs them as a separate pass,
  // "precompiled" fuses with cuDNN's precompiled engines only (no kernel compiled at plan time).
  {
    const int fusion =
        env_choice("LATENT_CUDNN_FUSION", {{"on", "1"}, {"off", "0"}, {"precompiled"}}, 0);
    options.conv_fusion = fusion != 1;
    options.conv_fusion_runtime_compiled = fusion != 2;
  }
  if (options.conv_fusion && !cuda::ConvPlanCache::fusion_available()) {
    if (std::getenv("LATENT_CUDNN_FUSION") && *std::getenv("LATENT_CUDNN_FUSION"))
      LATENT_WARN("LATENT_CUDNN_FUSION=", std::getenv("LATENT_CUDNN_FUSION"),
                  ": this build has no cudnn-frontend, so convolution epilogues run as a pass");
    options.conv_fusion = false;
  }
  // LATENT_CUDNN_KEEP_COMPILED=1: fused graphs whose engine cuDNN compiles while planning (the
  // residual-add convolutions: 0.1-0.8 s each) are serialized into the plan cache and loaded by
  // later processes (conv_fused.cpp). Off by default: on an H200 the default model's plans
  // compile nothing at run time any more (bench/NOTES.md, session 29).
  options.conv_fusion_keep_compiled =
      env_choice("LATENT_CUDNN_KEEP_COMPILED", {{"0"}, {"1"}}, 0) == 1;
  options.conv_pad_in_graph = env_choice("LATENT_CUDNN_PAD", {{"graph"}, {"copy"}}, 0) == 0;
  options.conv_narrow = env_choice("LATENT_CUDA_CONV_NARROW", {{"1"}, {"0"}}, 0) == 0;
  options.conv_norm = env_choice("LATENT_CUDA_CONV_NORM", {{"1"}, {"0"}}, 0) == 0;
  {
    Result<cuda::ConvWgmmaTile> tile =
        cuda::parse_conv_wgmma_tile(std::getenv("LATENT_CONV_WGMMA_TILE"));
    if (tile.ok())
      options.conv_wgmma_tile = tile.value();
    else
      LATENT_WARN(tile.status().message(), ": using the default tiles");
  }
  // 0 cuDNN everywhere, 1 our kernel where it beat cuDNN (auto), 2 our kernel wherever it runs
  options.conv_wgmma = std::array<int, 3>{
      1, 0, 2}[env_choice("LATENT_CUDA_CONV", {{"auto"}, {"cudnn"}, {"wgmma"}}, 0)];
  LATENT_INFO("cuda backend: ", label, ", ", dtype_name(dtype), ", ",
              ctx->properties().multiProcessorCount, " SMs, cuDNN ", cudnnGetVersion(),
              options.tf32 ? "" : ", no TF32",
              options.exhaustive_search ? ", timed conv algorithms" : "",
              options.tensor_core_attention ? "" : ", CUDA-core attention");
  return std::shared_ptr<Backend>(
      std::make_shared<CudaBackend>(std::move(ctx), dtype, cudnn, options));
}

}  // namespace latent
