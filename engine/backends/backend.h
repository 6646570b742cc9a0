// The backend interface: the one abstract class every device implements.
//
// Tensors passed to and returned by a backend live on its device, in its compute dtype and in a
// physical layout of its choosing; models only see logical shapes ([N, C, H, W] for images).
// Every op returns a Result: a backend that cannot run an op at a shape or dtype says so in the
// message instead of aborting, and `supports()` answers the same question ahead of time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backends/frame_types.h"
#include "engine/core/pixels.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace latent {

enum class Activation : uint8_t { kNone, kSiLU, kReLU, kGELU, kTanh };

struct Conv2dParams {
  int stride = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  // The usual symmetric "same" padding of a k x k kernel: pad k/2 on each side.
  static Conv2dParams same(int kernel, int stride = 1) {
    Conv2dParams p;
    p.stride = stride;
    p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = kernel / 2;
    return p;
  }
};

enum class OpKind : uint8_t {
  kConv2d,
  kGroupNorm,
  kRmsNormChannels,
  kActivation,
  kAdd,
  kAffine,
  kChannelAffine,
  kClamp,
  kUpsampleNearest2x,
  kSliceChannels,
  kSpatialAttention,
  kInterleavePhases2x,
};
const char* op_name(OpKind op);

// Whether z can be Backend::interleave_phases2x()'s input: [N, 4C, H + 1, W + 1] with C, H and
// W at least 1. The error names z's shape and what is wrong.
Status check_phases2x(const Tensor& z);

// === DiT (diffusion transformer) types ========================================================
// Used by the DiT section of Backend below (Qwen-Image MMDiT; engine/models/dit/).

// The activations a DiT op can apply (fused into linear()). GELU here is PyTorch's
// approximate="tanh" form, which DiT MLPs use; Activation::kGELU above is the exact erf form.
enum class DitActivation : uint8_t { kNone, kSiLU, kGELUTanh };

// LATENT_FP8_ATTENTION, read by the DiT model (how q and k are coded) and by the backend's FP8
// attention alike: `codes` (the default: q and k coded with static bounds), `1` (q, k and v
// scaled by their amax), `0` (attention in the compute dtype).
enum class Fp8Attention : uint8_t { kCodes, kAmax, kOff };
Fp8Attention fp8_attention_from_env();

enum class DitOp : uint8_t {
  kUploadFp32,
  kLinear,
  kLayerNorm,
  kRmsNorm,
  kModulate,
  kLayerNormModulate,
  kGatedAdd,
  kRope,
  kAttention,
  kActivation,
  kScaledAdd,
  kCfgCombine,
  kConcat,
  kSlice,
  kPackLatents,
  kUnpackLatents,
  kLinearAdd,
};

inline const char* dit_op_name(DitOp op) {
  switch (op) {
    case DitOp::kUploadFp32:
      return "upload_fp32";
    case DitOp::kLinear:
      return "linear";
    case DitOp::kLayerNorm:
      return "layer_norm";
    case DitOp::kRmsNorm:
      return "rms_norm";
    case DitOp::kModulate:
      return "modulate";
    case DitOp::kLayerNormModulate:
      return "layer_norm_modulate";
    case DitOp::kGatedAdd:
      return "gated_add";
    case DitOp::kRope:
      return "rope";
    case DitOp::kAttention:
      return "attention";
    case DitOp::kActivation:
      return "dit_activation";
    case DitOp::kScaledAdd:
      return "scaled_add";
    case DitOp::kCfgCombine:
      return "cfg_combine";
    case DitOp::kConcat:
      return "concat";
    case DitOp::kSlice:
      return "slice";
    case DitOp::kPackLatents:
      return "pack_latents";
    case DitOp::kUnpackLatents:
      return "unpack_latents";
    case DitOp::kLinearAdd:
      return "linear_add";
  }
  return "unknown";
}
// === end of DiT types ========================================================================

// === Graph capture (plans; engine/models/vae/planned_vae.h) =================================
// Work a backend recorded between begin_capture() and end_capture(), replayable with replay().
// Opaque to callers; it keeps alive whatever device memory the recorded work uses besides the
// tensors the caller passed in (which the caller must keep alive and unchanged in place).
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
};
// === end of graph capture types ==============================================================

// A point in the work queued on a backend's stream (Backend::fence(),
// queue_tensor_to_device_latent()): wait() returns once everything queued before it has run.
// Waiting needs no lock: other threads may queue work on the same backend meanwhile. A backend
// can also order its own later work after a fence without the host waiting
// (Backend::queue_wait: a CUDA stream waits on the fence's event).
class DeviceFence {
 public:
  virtual ~DeviceFence() = default;
  virtual Status wait() = 0;
};

// A matrix quantised to FP8 (e4m3) one row at a time (ditdenoise / latent-tool dtype fp8):
// row r holds codes q[r, :] with one fp32 scale, x[r, k] ~= q[r, k] * scale[r], scale[r] =
// max_k |x[r, k]| / 448 (engine/weights/fp8.h, fp8_e4m3_quantize_row). A linear layer's weight
// [N, K] is quantised once at load (one scale per output channel), its input [..., K] at every
// call (one scale per token). Made by Backend::fp8_quantize_rows and read only by the backend
// that made it.
struct Fp8Matrix {
  Shape shape;     // the quantised tensor's shape, [..., K]
  Tensor codes;    // native FP8 backends: the e4m3 codes, row-major, one byte each (held in a
                   // 2-byte-dtype tensor of shape [rows, K / 2]: the engine has no byte dtype)
  Tensor scales;   // native FP8 backends: fp32 [rows]
  Tensor dequant;  // emulating backends: q * scale in the compute dtype, shaped like `shape`
  bool defined() const { return !shape.empty(); }
  int64_t cols() const { return shape.back(); }
  int64_t rows() const { return shape_numel(shape) / shape.back(); }
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  virtual Device device() const = 0;
  // The dtype activations and weights are held in on this backend.
  virtual DType compute_dtype() const = 0;
  // Whether `op` runs on this backend for `dtype`.
  virtual bool supports(OpKind op, DType dtype) const = 0;
  // Whether `op` runs on this backend for `dtype` with `shape` its (first) input's logical
  // shape ([N, C, H, W]). The default: supports(op, dtype), a rank-4 shape of positive
  // dimensions; backends add their own limits. The op still reports a shape it refuses.
  // (Derived classes that override one supports() say `using Backend::supports;`.)
  virtual bool supports(OpKind op, DType dtype, const Shape& shape) const;

  // Host tensor (any dtype, contiguous) -> backend tensor in the compute dtype. Weights and
  // activations use the same entry point; a backend may re-layout 4-D tensors.
  virtual Result<Tensor> upload(const Tensor& host) = 0;
  // Backend tensor -> contiguous host tensor in fp32.
  virtual Result<Tensor> download(const Tensor& t) = 0;
  // Waits for all queued work (a no-op on the CPU).
  virtual Status synchronize() = 0;
  // Peak device memory this backend has held since creation or the last reset, in bytes
  // (-1 where it is not tracked, e.g. the CPU).
  virtual int64_t peak_memory_bytes() const { return -1; }
  virtual void reset_peak_memory() {}
  // Device memory now, in bytes (-1 where not tracked): `in_use` by tensors, scratch and the
  // captured graphs' own buffers; `held` from the driver (in use plus what the backend keeps
  // for reuse).
  struct MemoryUse {
    int64_t in_use = -1;
    int64_t held = -1;
  };
  virtual MemoryUse memory_use() const { return {}; }

  // y = act(conv(x, w) + bias + residual).
  // x: [N, Cin, H, W]; w: [Cout, Cin, kh, kw]; bias: [Cout] or undefined;
  // residual: [N, Cout, Ho, Wo] or undefined.
  virtual Result<Tensor> conv2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Conv2dParams& p, const Tensor& residual = Tensor(),
                                Activation act = Activation::kNone) = 0;

  // Group normalisation over [N, C, H, W] with C/groups channels a group, then optional act.
  // gamma/beta: [C] (both defined or both undefined).
  virtual Result<Tensor> group_norm(const Tensor& x, int groups, const Tensor& gamma,
                                    const Tensor& beta, float eps,
                                    Activation act = Activation::kNone) = 0;

  // The Wan / Qwen-Image VAE channel RMS norm: x / max(||x||_C, 1e-12) * sqrt(C) * gamma
  // (+ beta when defined), per pixel over channels, then optional act. gamma: [C].
  virtual Result<Tensor> rms_norm_channels(const Tensor& x, const Tensor& gamma,
                                           const Tensor& beta,
                                           Activation act = Activation::kNone) = 0;
  // The same written into y (x's shape, this backend's; e.g. a frame of a causal convolution's
  // ring of input frames, see engine/models/vae/qwen_image.cpp). The default computes it and
  // copies it in (copy_into()).
  virtual Status rms_norm_channels_into(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        Activation act, const Tensor& y) {
    Result<Tensor> r = rms_norm_channels(x, gamma, beta, act);
    if (!r.ok()) return r.status();
    return copy_into(r.value(), y);
  }

  virtual Result<Tensor> activation(const Tensor& x, Activation act) = 0;
  // a + b, same shapes.
  virtual Result<Tensor> add(const Tensor& a, const Tensor& b) = 0;
  // x * scale + shift.
  virtual Result<Tensor> affine(const Tensor& x, float scale, float shift) = 0;
  // x[:, c] * scale[c] + shift[c] for [N, C, H, W]; scale and shift have C entries.
  virtual Result<Tensor> channel_affine(const Tensor& x, const std::vector<float>& scale,
                                        const std::vector<float>& shift) = 0;
  virtual Result<Tensor> clamp(const Tensor& x, float lo, float hi) = 0;
  // [N, C, H, W] -> [N, C, 2H, 2W], nearest neighbour.
  virtual Result<Tensor> upsample_nearest2x(const Tensor& x) = 0;
  // The second half of a nearest 2x upsampling followed by a 3x3 convolution (padding 1), run
  // at the low resolution (engine/models/vae/vae_common.h, UpsampleConv): z [N, 4C, H + 1, W + 1]
  // is the 2x2 convolution (padding 1) of the low-resolution input with the four output phases'
  // kernels, phase (a, b) in channels [(2a + b) C, (2a + b + 1) C). Returns y [N, C, 2H, 2W] with
  // y[n, c, 2i + a, 2j + b] = z[n, (2a + b) C + c, i + a, j + b]. Values move unchanged.
  virtual Result<Tensor> interleave_phases2x(const Tensor& z) = 0;
  // Channels [start, start + count) of [N, C, H, W].
  virtual Result<Tensor> slice_channels(const Tensor& x, int64_t start, int64_t count) = 0;
  // softmax(q k^T / sqrt(d)) v over the H*W spatial tokens of each image, `heads` heads of
  // d = C / heads channels. q, k, v: [N, C, H, W] -> [N, C, H, W]. Never holds the whole
  // (H*W) x (H*W) score matrix at once.
  virtual Result<Tensor> spatial_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           int heads) = 0;

  // === Video clips (causal video VAEs; engine/models/vae/qwen_image.cpp) ======================
  // A clip [1, C, T, H, W] (row-major, e.g. one clip of an upload()ed [N, C, T, H, W]: slice()
  // on dim 0) -> its frames [T, C, H, W] in this backend's image layout (what conv2d() takes),
  // and back. Frames of one clip then move along dim 0 with concat(parts, 0) and views.
  // Values move unchanged. The defaults: not supported.
  virtual Result<Tensor> clip_to_frames(const Tensor& clip) {
    (void)clip;
    return Status::errorf("clip_to_frames is not supported by backend ", name());
  }
  virtual Result<Tensor> frames_to_clip(const Tensor& frames) {
    (void)frames;
    return Status::errorf("frames_to_clip is not supported by backend ", name());
  }
  // A 3-D convolution over the frames of one clip, valid in time (no temporal padding; a causal
  // convolution's caller puts the cached frames in front): x [T + kt - 1, Cin, H, W] (frames
  // along dim 0, image layout); w [Cout, Cin, kt * kh, kw], the 3-D kernel [Cout, Cin, kt, kh,
  // kw] with its temporal and height axes merged and upload()ed as a 4-D tensor; spatial padding
  // and stride p (symmetric) -> [T, Cout, Ho, Wo]; y = act(conv3d(x, w) + bias + residual).
  // supports_conv3d_frames() says whether a backend runs it (else the caller composes it from
  // conv2d, one call per temporal tap).
  virtual bool supports_conv3d_frames() const { return false; }
  virtual Result<Tensor> conv3d_frames(const Tensor& x, const Tensor& w, int kt, const Tensor& bias,
                                       const Conv2dParams& p, const Tensor& residual = Tensor(),
                                       Activation act = Activation::kNone) {
    (void)x, (void)w, (void)kt, (void)bias, (void)p, (void)residual, (void)act;
    return Status::errorf("conv3d_frames is not supported by backend ", name());
  }
  // conv3d_frames over the frames of the `past` tensors (in order; one or two of them) followed
  // by those of x, without joining them where the backend can read them in place (CUDA's
  // implicit-GEMM kernel: a causal convolution's cache then needs no copy, neither of the chunk
  // nor of the frames it keeps, which may stay the earlier chunks' own tensors). The default
  // joins them (concat) and calls conv3d_frames().
  virtual Result<Tensor> conv3d_frames_after(const std::vector<Tensor>& past, const Tensor& x,
                                             const Tensor& w, int kt, const Tensor& bias,
                                             const Conv2dParams& p,
                                             const Tensor& residual = Tensor(),
                                             Activation act = Activation::kNone) {
    std::vector<Tensor> parts(past);
    parts.push_back(x);
    Result<Tensor> xx = concat(parts, 0);
    if (!xx.ok()) return xx.status();
    return conv3d_frames(xx.value(), w, kt, bias, p, residual, act);
  }
  // conv3d_frames(x, w, kt, bias, p) followed by rms_norm_channels(y, gamma, no beta, act) in one
  // pass, for a convolution whose output feeds only that norm (the Wan residual block's conv1 ->
  // norm2 -> SiLU): written into `into` when it is defined (this backend's [T, Cout, Ho, Wo],
  // e.g. a slot of the next convolution's frame ring), else into a new tensor. An undefined
  // result, with nothing queued, where the backend does not fuse them (the default); the caller
  // then runs the two ops.
  virtual Result<Tensor> conv3d_frames_normed(const Tensor& x, const Tensor& w, int kt,
                                              const Tensor& bias, const Conv2dParams& p,
                                              const Tensor& gamma, Activation act,
                                              const Tensor& into = Tensor()) {
    (void)x, (void)w, (void)kt, (void)bias, (void)p, (void)gamma, (void)act, (void)into;
    return Tensor();
  }
  // === end of video clips ===================================================================
  // === Frame, latent and staging I/O ========================================================
  // Each backend converts frames and latents its own way (the CPU on the host, CUDA with its
  // kernels on the device). Callers use the checked wrappers of engine/backends/frames.h, which
  // validate the frame description, its device and the tensor's shape before calling these;
  // the defaults report the operation unsupported (or, for the stager and downloader, that
  // they buy nothing: null).

  // frame (on the host or on this backend's device) -> image tensor [1, 3, g.model_height(),
  // g.model_width()] in the compute dtype and this backend's layout, values in [-1, 1].
  // `into` (checked by the wrapper to be such a tensor of this backend): the backend may write
  // the image there (a plan's input buffer) and return it; one that cannot returns a new tensor.
  virtual Result<Tensor> frame_to_tensor(const FrameDesc& frame, const FrameGeometry& g,
                                         const Tensor* into = nullptr);
  // image tensor [1, 3, g.model_height(), g.model_width()] -> packed `frame` (on the host or
  // on this backend's device), undoing g.policy; the frame holds the result on return.
  virtual Status tensor_to_frame(const Tensor& image, const FrameGeometry& g,
                                 const FrameDesc& frame);
  // Pinned staging of host frames both ways (frames.h's FrameStager / FrameDownloader); null
  // where it buys nothing. `depth` is checked by the caller (0..64).
  virtual Result<std::unique_ptr<FrameStager>> create_frame_stager(int depth);
  virtual Result<std::unique_ptr<FrameDownloader>> create_frame_downloader(int depth);
  // A zero-filled tensor of logical `shape` ([N, C, H, W]) in the compute dtype and this
  // backend's layout, made without a host transfer where the backend can.
  virtual Result<Tensor> zeros(const Shape& shape);
  // A latent [C, h, w] (contiguous, channel-major, `dtype`) in this backend's device memory
  // <-> tensor [1, C, h, w]; device to device. Backends without device memory refuse.
  virtual Result<Tensor> device_latent_to_tensor(const void* data, DType dtype, int channels,
                                                 int height, int width);
  // Returns once `data` holds the latent (the buffer's reader may use another stream).
  virtual Status tensor_to_device_latent(const Tensor& latent, void* data, DType dtype);
  // The same conversion, queued: `data` holds the latent once the returned fence's wait()
  // returns. A stage waits for it after releasing the backend's run lock, so that another stage
  // sharing the backend keeps the device busy meanwhile (a full synchronisation under the lock
  // would drain the stream and leave the device idle until the next stage queues work).
  virtual Result<std::unique_ptr<DeviceFence>> queue_tensor_to_device_latent(const Tensor& latent,
                                                                             void* data,
                                                                             DType dtype);
  // A fence after the work queued so far (e.g. a frame_to_tensor() that reads a frame in device
  // memory the caller must not hand back before it has been read). Backends that run ops
  // synchronously return one that is already passed.
  virtual Result<std::unique_ptr<DeviceFence>> fence();
  // Orders the work queued on this backend from now on after `fence` (another backend's, e.g. a
  // latent written on another stream, or read there before its buffer is written again), on the
  // device where it can: the CUDA backend makes its stream wait on the fence's event and the host
  // goes on. The default, and a fence the backend cannot order on its device, waits on the host.
  // The caller holds the backend's run lock, as for any work it queues.
  virtual Status queue_wait(DeviceFence& fence) { return fence.wait(); }
  // === end of frame, latent and staging I/O =================================================

  // === Graph capture and plan persistence (plans) ===========================================
  // A backend that supports capture records the device work that the ops called by this thread
  // between begin_capture() and end_capture() queue, instead of running it; replay() runs it
  // again with the same buffers (new data placed in the captured input tensors in place, e.g.
  // with copy_into()). While capturing: every op must already have been run once at its shape
  // (so no tuning or allocation decision happens inside), nothing may wait for the device
  // (download(), synchronize() fail), and other threads' calls wait until end_capture().
  // Tensors the captured ops return are only valid during replays: keep none past end_capture()
  // except by copying into a tensor made before begin_capture(). The defaults: not supported.
  virtual bool supports_capture() const { return false; }
  // Between record_allocations(true) and (false), the buffers this thread's ops allocate (a plain
  // run of what is captured next) are recorded; the next begin_capture() of this thread lays
  // them out by lifetime in one arena the graph keeps, instead of leaving the layout to the
  // graph allocator. A capture whose allocations differ from the recording fails at
  // end_capture() (capture again: the recording is used once). The default: nothing recorded.
  virtual void record_allocations(bool on) { (void)on; }
  virtual Status begin_capture() {
    return Status::errorf("graph capture is not supported by backend ", name());
  }
  // Ends the capture begun by this thread (also after a failed op, to leave capture mode) and
  // returns the recorded work, or the reason capture failed.
  virtual Result<std::shared_ptr<CapturedGraph>> end_capture() {
    return Status::errorf("graph capture is not supported by backend ", name());
  }
  // Queues the recorded work (asynchronous, like any op).
  virtual Status replay(const CapturedGraph& graph) {
    (void)graph;
    return Status::errorf("graph capture is not supported by backend ", name());
  }
  // dst <- src in place (same shape, dtype and layout; both of this backend), queued.
  virtual Status copy_into(const Tensor& src, const Tensor& dst) {
    (void)src, (void)dst;
    return Status::errorf("copy_into is not supported by backend ", name());
  }
  // Writes tuning results found so far (cuDNN algorithm choices) to the on-disk plan cache
  // (engine/core/plan_cache.h), if the backend keeps one; a no-op otherwise. (The CUDA backend
  // also writes them itself after each op, outside graph captures, that timed a new choice.)
  virtual Status save_plans() { return ok_status(); }
  // === end of graph capture and plan persistence ============================================

  // === DiT ops (diffusion transformers; engine/models/dit/) ==================================
  // Token tensors are row-major with features last: activations [B, T, D] (batch, tokens,
  // features); weights [N, K] as nn.Linear stores them. "Rows" are all leading dims together.
  // Every op has a default that reports it unsupported, so a backend can add them one at a
  // time; supports_dit() answers ahead of time. Outputs are fresh tensors (slice() may return
  // a view sharing the input's storage); inputs are never modified.
  //
  // Per-token conditioning (AdaLN): `group_starts` splits the T tokens of every batch row into
  // G = group_starts.size() runs, group g being tokens [group_starts[g], group_starts[g+1])
  // (the last runs to T; group_starts[0] == 0, strictly increasing). A conditioning tensor
  // (shift, scale, gate) holds one D-vector per group and batch row: shape [G, B, D] or
  // [G * B, D], row g * B + b. G = 1 ({0}) is ordinary AdaLN; Qwen-Image-Edit-2511's
  // zero_cond_t uses G = 2: target-image tokens at t, reference-image tokens at t = 0.

  virtual bool supports_dit(DitOp op, DType dtype) const {
    (void)op;
    (void)dtype;
    return false;
  }
  // Host tensor -> backend tensor kept in fp32 whatever the compute dtype (tables that need
  // full precision, e.g. rope()'s cos/sin table).
  virtual Result<Tensor> upload_fp32(const Tensor& host) {
    (void)host;
    return dit_unsupported(DitOp::kUploadFp32);
  }
  // y = act(x w^T + bias). x: [..., K]; w: [N, K]; bias: [N] or undefined -> y: [..., N].
  virtual Result<Tensor> linear(const Tensor& x, const Tensor& w, const Tensor& bias,
                                DitActivation act) {
    (void)x, (void)w, (void)bias, (void)act;
    return dit_unsupported(DitOp::kLinear);
  }
  // y = act(x w^T + residual): a linear layer without bias whose output lands on a tensor of
  // the output's shape (runtime LoRAs: the up projection added to the base layer's output).
  // x: [..., K]; w: [N, K]; residual: [..., N] (x's leading dims) -> [..., N]. This default
  // composes linear(), scaled_add() and dit_activation() (the reference); a backend may fuse it
  // (CUDA: cuBLASLt reads residual as C with beta 1, GELU in the epilogue).
  virtual Result<Tensor> linear_add(const Tensor& x, const Tensor& w, const Tensor& residual,
                                    DitActivation act) {
    LATENT_ASSIGN_OR_RETURN(Tensor y, linear(x, w, Tensor(), DitActivation::kNone));
    if (!residual.defined() || residual.shape() != y.shape())
      return Status::errorf("linear_add: residual ",
                            residual.defined() ? shape_str(residual.shape()) : "undefined",
                            " does not match the output ", shape_str(y.shape()));
    LATENT_ASSIGN_OR_RETURN(y, scaled_add(residual, y, 1.f, 1.f));
    if (act == DitActivation::kNone) return y;
    return dit_activation(y, act);
  }
  // --- Runtime LoRAs folded into the base GEMM (QwenImageMmdit, lora-mode runtime) ---
  // A wide input x' = [x | h] ([..., K + E]) holds a layer input x and E more columns for the
  // low-rank projections h = x down^T of the LoRAs of the layers reading x. A layer's weight is
  // then held as W' = [W | 0 | up] ([N, K'], K' <= K + E), so x'[..., :K'] W'^T adds the LoRA
  // term inside the base GEMM: the output is written once, its epilogue (bias, GELU) kept.
  // The producers of x write it straight into x' (the two *_wide ops); linear_into_columns()
  // fills h. The defaults compose slice(), linear(), concat() (with zeros for the columns left
  // to the caller); a backend may write in place and read rows at their pitch (CUDA).
  //
  // layer_norm_modulate() of x [B, T, D] into the first D columns of a [B, T, D + extra]
  // tensor; the last `extra` columns are left to the caller (their values are undefined).
  virtual Result<Tensor> layer_norm_modulate_wide(const Tensor& x, const Tensor& shift,
                                                  const Tensor& scale,
                                                  const std::vector<int64_t>& group_starts,
                                                  float eps, int64_t extra);
  // y = act(x[..., :K] w^T + bias), K = w.dim(1) <= x.dim(-1) (the first K columns of each row
  // of x), written into the first N columns of y [..., N + extra]; the last `extra` columns are
  // left to the caller (undefined). With K = x.dim(-1) and extra = 0 this is linear().
  virtual Result<Tensor> linear_wide(const Tensor& x, const Tensor& w, const Tensor& bias,
                                     DitActivation act, int64_t extra);
  // x [..., C] with its columns [column, column + N) set to x[..., :K] w^T; w [N, K] with
  // K <= column and column + N <= C (what is read is never written). Returns the result: x
  // itself where the backend writes in place (CUDA), else a new tensor.
  virtual Result<Tensor> linear_into_columns(const Tensor& x, const Tensor& w, int64_t column);
  // attention() written into the first heads * d columns of a [B, T, heads * d + extra] tensor
  // (the attention outputs' layers, to_out / to_add_out, read it as their wide input); the last
  // `extra` columns are left to the caller (undefined).
  virtual Result<Tensor> attention_wide(const Tensor& q, const Tensor& k, const Tensor& v,
                                        int heads, const Tensor& key_mask,
                                        const std::vector<int64_t>& key_lengths, int64_t extra);

  // --- FP8 linear layers (Fp8Matrix above) ---
  // Whether linear_fp8 multiplies FP8 codes on FP8 tensor cores (CUDA on compute capability
  // 9.0: cuBLASLt's per-row scaled FP8). Elsewhere the defaults emulate it: the same
  // quantisation of weights and activations, their dequantised values multiplied in the
  // compute dtype (the reference the native path is tested against; slow).
  virtual bool supports_fp8_linear() const { return false; }
  // x [..., K] on this backend -> its rows quantised. The default downloads x, quantises on
  // the host and uploads the dequantised values.
  virtual Result<Fp8Matrix> fp8_quantize_rows(const Tensor& x);
  // y = act(x w^T + bias) from quantised operands: x [..., K] (its rows, one scale a token),
  // w [N, K] (one scale an output channel); bias [N] or undefined -> y [..., N] in the compute
  // dtype. The default: linear() of the two `dequant` tensors.
  virtual Result<Tensor> linear_fp8(const Fp8Matrix& x, const Fp8Matrix& w, const Tensor& bias,
                                    DitActivation act);
  // residual + gate * (x w^T + bias): an FP8 layer whose output is added to the residual stream
  // through a gate (gated_add() below with one batch row and one token group). gate: one row
  // of N values (numel N); residual: [..., N] as the output. The default composes linear_fp8
  // and gated_add; CUDA folds the gate into the weight's channel scales and the bias and reads
  // the residual in the GEMM's epilogue (LATENT_FP8_GATED_ADD=0: the default's two ops).
  virtual Result<Tensor> linear_fp8_gated_add(const Fp8Matrix& x, const Fp8Matrix& w,
                                              const Tensor& bias, const Tensor& gate,
                                              const Tensor& residual);
  // concat({linear_fp8(x_a, w_a, b_a), linear_fp8(x_b, w_b, b_b)}, 1): two FP8 layers' outputs
  // joined along the tokens (the attention's v from the image and text streams: [B, T_a + T_b,
  // N]). The default composes them; CUDA writes each GEMM's rows in place (one batch row).
  virtual Result<Tensor> linear_fp8_joined(const Fp8Matrix& x_a, const Fp8Matrix& w_a,
                                           const Tensor& b_a, const Fp8Matrix& x_b,
                                           const Fp8Matrix& w_b, const Tensor& b_b);
  // layer_norm_modulate() (below) with its output's rows quantised as fp8_quantize_rows()
  // would: the normalised input of FP8 layers, never stored in the compute dtype. The default
  // composes the two.
  virtual Result<Fp8Matrix> layer_norm_modulate_fp8(const Tensor& x, const Tensor& shift,
                                                    const Tensor& scale,
                                                    const std::vector<int64_t>& group_starts,
                                                    float eps);
  // attention() (below) for FP8 layers: its output [B, T, heads * d] as the next layer's
  // quantised input. On CUDA (compute capability 9.0 and newer, cuDNN's FP8 SDPA) q, k and v
  // are each quantised to e4m3 with one scale, the probabilities and the output in e4m3 too
  // (every output row then has the output's one scale); with a key mask only where key_lengths
  // describe it. The default (and CUDA where that cannot run): attention() in the compute
  // dtype, its rows quantised as fp8_quantize_rows().
  virtual Result<Fp8Matrix> attention_fp8(const Tensor& q, const Tensor& k, const Tensor& v,
                                          int heads, const Tensor& key_mask,
                                          const std::vector<int64_t>& key_lengths);
  // joint_qk() (below) for FP8 attention: its values coded in e4m3 with one scale, bound / 448,
  // for the whole tensor (every row scale that value), where `bound` holds |every value| (after
  // a per-head RMS norm with gamma and the rotation: sqrt(d) max|gamma|). CUDA writes the codes
  // as it computes the values; the default composes joint_qk() and the coding on the host
  // (emulated: `dequant`).
  virtual Result<Fp8Matrix> joint_qk_fp8(const Tensor& img, const Tensor& txt,
                                         const Tensor& gamma_img, const Tensor& gamma_txt,
                                         const Tensor& freqs, int heads, float eps, float bound);
  // attention_fp8() with q and k from joint_qk_fp8(); v [B, S, heads * d] in the compute dtype.
  // The default: attention() of the dequantised q and k, its rows quantised.
  virtual Result<Fp8Matrix> attention_fp8_coded(const Fp8Matrix& q, const Fp8Matrix& k,
                                                const Tensor& v, int heads, const Tensor& key_mask,
                                                const std::vector<int64_t>& key_lengths);
  // LayerNorm over the last dim D: (x - mean) / sqrt(var + eps) * gamma + beta (biased
  // variance). gamma, beta: [D] or undefined (no affine; either may be given alone).
  virtual Result<Tensor> layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    float eps) {
    (void)x, (void)gamma, (void)beta, (void)eps;
    return dit_unsupported(DitOp::kLayerNorm);
  }
  // RMSNorm over the last dim D: x / sqrt(mean(x^2) + eps) * gamma. gamma: [D] or undefined.
  // (Per-head QK norm: view q [B, T, H * d] as [B, T, H, d] with reshape().)
  virtual Result<Tensor> rms_norm(const Tensor& x, const Tensor& gamma, float eps) {
    (void)x, (void)gamma, (void)eps;
    return dit_unsupported(DitOp::kRmsNorm);
  }
  // y = x * (1 + scale) + shift per token group (see above). x: [B, T, D]; shift, scale:
  // [G, B, D].
  virtual Result<Tensor> modulate(const Tensor& x, const Tensor& shift, const Tensor& scale,
                                  const std::vector<int64_t>& group_starts) {
    (void)x, (void)shift, (void)scale, (void)group_starts;
    return dit_unsupported(DitOp::kModulate);
  }
  // modulate(layer_norm(x, no affine, eps), shift, scale, group_starts), fused.
  virtual Result<Tensor> layer_norm_modulate(const Tensor& x, const Tensor& shift,
                                             const Tensor& scale,
                                             const std::vector<int64_t>& group_starts, float eps) {
    (void)x, (void)shift, (void)scale, (void)group_starts, (void)eps;
    return dit_unsupported(DitOp::kLayerNormModulate);
  }
  // y = residual + gate * x per token group. residual, x: [B, T, D]; gate: [G, B, D].
  virtual Result<Tensor> gated_add(const Tensor& residual, const Tensor& x, const Tensor& gate,
                                   const std::vector<int64_t>& group_starts) {
    (void)residual, (void)x, (void)gate, (void)group_starts;
    return dit_unsupported(DitOp::kGatedAdd);
  }
  // The joint query (or key) of the dual-stream attention: per-head RMS norm of each stream
  // with its own gamma ([d], eps; as rms_norm() over rows of d), the streams joined along the
  // tokens ([image, text]), then rope() with freqs ([T_img + T_txt, d/2, 2] fp32).
  // img: [B, T_img, heads * d], txt: [B, T_txt, heads * d] -> [B, T_img + T_txt, heads * d].
  // The default composes rms_norm, concat and rope (three passes, each rounded to the compute
  // dtype); CUDA runs it in one pass, rounding once.
  virtual Result<Tensor> joint_qk(const Tensor& img, const Tensor& txt, const Tensor& gamma_img,
                                  const Tensor& gamma_txt, const Tensor& freqs, int heads,
                                  float eps);
  // Rotary embedding on interleaved pairs, as diffusers' apply_rotary_emb_qwen(use_real=False)
  // (and FLUX): for each head and i < d/2, with (c, s) = freqs[t, i],
  //   y[2i] = x[2i] c - x[2i+1] s,   y[2i+1] = x[2i] s + x[2i+1] c.
  // x: [B, T, heads * d]; freqs: [T, d/2, 2] (cos, sin), fp32 (from upload_fp32()).
  virtual Result<Tensor> rope(const Tensor& x, const Tensor& freqs, int heads) {
    (void)x, (void)freqs, (void)heads;
    return dit_unsupported(DitOp::kRope);
  }
  // Multi-head attention softmax(q k^T / sqrt(d)) v over sequences, heads side by side in the
  // features (no transposes needed around the projections):
  // q: [B, T, heads * d]; k, v: [B, S, heads * d]; key_mask: [B, S] (nonzero: attend, zero:
  // padding key never attended) or undefined -> [B, T, heads * d]. A batch row must keep at
  // least one key. Never holds all T x S scores at once.
  // key_lengths: empty, or B values with key_mask that promise its shape: key_mask[b, s] != 0
  // exactly when s < key_lengths[b] (the valid keys a prefix, the padding a tail). A backend may
  // use either (CUDA: cuDNN's padding mask, faster than a bias); the CPU checks the promise.
  virtual Result<Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, int heads,
                                   const Tensor& key_mask,
                                   const std::vector<int64_t>& key_lengths = {}) {
    (void)q, (void)k, (void)v, (void)heads, (void)key_mask, (void)key_lengths;
    return dit_unsupported(DitOp::kAttention);
  }
  // Elementwise activation (any shape).
  virtual Result<Tensor> dit_activation(const Tensor& x, DitActivation act) {
    (void)x, (void)act;
    return dit_unsupported(DitOp::kActivation);
  }
  // alpha * a + beta * b, same shapes (a scheduler step, noising a latent), computed in fp32.
  virtual Result<Tensor> scaled_add(const Tensor& a, const Tensor& b, float alpha, float beta) {
    (void)a, (void)b, (void)alpha, (void)beta;
    return dit_unsupported(DitOp::kScaledAdd);
  }
  // True classifier-free guidance with the Qwen-Image norm rescale, per row over the last dim:
  //   comb = uncond + scale * (cond - uncond);  y = comb * (||cond|| / ||comb||).
  // cond, uncond: [..., C], same shapes.
  virtual Result<Tensor> cfg_combine(const Tensor& cond, const Tensor& uncond, float scale) {
    (void)cond, (void)uncond, (void)scale;
    return dit_unsupported(DitOp::kCfgCombine);
  }
  // Concatenation along `dim` (e.g. 1: tokens of [B, T, D]); other dims must match. Also
  // image-layout [N, C, H, W] tensors along dim 0 (frames of a clip; the layout is kept).
  virtual Result<Tensor> concat(const std::vector<Tensor>& parts, int dim) {
    (void)parts, (void)dim;
    return dit_unsupported(DitOp::kConcat);
  }
  // Elements [start, start + count) along `dim`, all of every other dim.
  virtual Result<Tensor> slice(const Tensor& x, int dim, int64_t start, int64_t count) {
    (void)x, (void)dim, (void)start, (void)count;
    return dit_unsupported(DitOp::kSlice);
  }
  // QwenImagePipeline._pack_latents: latents [B, C, h, w] (a backend image tensor in this
  // backend's own layout, e.g. from upload() or device_latent_to_tensor(); or row-major
  // [B, C, 1, h, w]), h and w even -> tokens [B, (h/2)(w/2), 4C], token (y, x) holding the 2x2
  // patch channels-major (c, dy, dx). A permutation: values are moved unchanged.
  virtual Result<Tensor> pack_latents(const Tensor& latents) {
    (void)latents;
    return dit_unsupported(DitOp::kPackLatents);
  }
  // _unpack_latents, the inverse: tokens [B, (h/2)(w/2), 4C] -> [B, C, h, w] in this backend's
  // image layout (as upload() holds a host [B, C, h, w]; what VAEs and
  // tensor_to_device_latent() take).
  virtual Result<Tensor> unpack_latents(const Tensor& tokens, int64_t height, int64_t width) {
    (void)tokens, (void)height, (void)width;
    return dit_unsupported(DitOp::kUnpackLatents);
  }

 protected:
  Status dit_unsupported(DitOp op) const {
    return Status::errorf("op ", dit_op_name(op), " is not supported by backend ", name());
  }
  // y [..., N] followed by `extra` columns of zeros (the composed *_wide ops).
  Result<Tensor> append_zero_columns(const Tensor& y, int64_t extra);
  // === end of DiT ops ========================================================================
};

}  // namespace latent
