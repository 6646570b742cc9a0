// diffusers AutoencoderKLQwenImage / AutoencoderKLWan (Wan 2.1) on images and video; see
// qwen_image.h for how the causal 3-D network maps onto 2-D convolutions.
//
// What diffusers does (autoencoder_kl_wan.py; autoencoder_kl_qwenimage.py is the same network):
//  - WanCausalConv3d pads 2 frames in front: the cached last 2 input frames of the previous
//    chunk where there are some, zeros otherwise (the cache of a one-frame chunk is that frame
//    after the previous chunk's last one). Over a clip this is a causal convolution whose past
//    starts with zeros, whatever the chunking: that is what CausalConv below computes, chunk by
//    chunk, with a 2-frame cache per layer. 1x1x1 convolutions (conv_shortcut, quant_conv,
//    post_quant_conv) have no temporal extent.
//  - "downsample3d": spatial conv per frame, then on the first chunk only the cache is filled
//    (time_conv skipped); later chunks run time_conv (3 taps, stride 2, no padding) over the last
//    frame of the previous chunk followed by this chunk's frames.
//  - "upsample3d": the first chunk marks its cache "Rep" and skips time_conv; later chunks run it
//    as a causal convolution (zero past from the second chunk on) with 2C outputs, which
//    interleave into 2T frames of C channels; then the spatial upsampling per frame.
//  - _encode runs frame 0 alone, then chunks of 4 frames, and keeps the first z_dim channels of
//    quant_conv (the mean); _decode runs post_quant_conv, then one latent frame at a time, and
//    clamps to [-1, 1].
//  - Wan 2.2 (is_residual, patch_size): _encode patchifies the whole clip first and _decode
//    unpatchifies the output (per frame, so per chunk here). WanResidualDownBlock adds
//    AvgDown3D(block input) to its resnets + downsampler; AvgDown3D pads the *chunk* in front
//    with zero frames to a multiple of its temporal factor, so the first chunk's single frame is
//    averaged with a zero frame. WanResidualUpBlock adds DupUp3D(block input) to its resnets +
//    upsampler (whose spatial conv keeps the width); on the first chunk (first_chunk=True)
//    DupUp3D drops the first of its 2 frames, as the upsampler skips time_conv there.
#include "engine/models/vae/qwen_image.h"

#include <array>
#include <cstdlib>
#include <optional>
#include <string>
#include <variant>

#include "engine/core/env.h"
#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/upsample_conv.h"
#include "engine/models/vae/vae_common.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

using vae_common::Conv;

// ---------------------------------------------------------------------------------------------
// Frames: a chunk of one clip is [T, C, H, W] in the backend's image layout, frames along dim 0
// (outermost in NCHW and NHWC alike, so a run of frames is one block of memory; frame_view in
// vae.h).

// The frames of `parts` one after another, in new storage (also for a single part: a copy that
// lets the part's larger storage go).
Result<Tensor> join_frames(Backend& b, const std::vector<Tensor>& parts) {
  return b.concat(parts, 0);
}

// n zero frames shaped like the frames of x, made on the device (a cudaMemsetAsync on CUDA). Not
// an upload of host zeros: at 720p a stream's first chunk needs ~1.5 GB of them (one frame per
// causal convolution), which cost ~1.8 s (encoder) / ~2.9 s (decoder) a stream on an H100 when
// they were filled and converted on the host and copied over.
Result<Tensor> zero_frames(Backend& b, int64_t n, const Tensor& x) {
  return b.zeros({n, x.dim(1), x.dim(2), x.dim(3)});
}

// LATENT_VIDEO_CACHE=copy: causal convs keep copies of their last 2 input frames, as before
// session 10 (for A/B timing only; the results are the same); `views` (or unset) is the default.
bool copy_cached_frames() {
  static const bool copy = env_choice("LATENT_VIDEO_CACHE", {{"views"}, {"copy"}}, 0) == 1;
  return copy;
}

// LATENT_VIDEO_RING=0: the layers that see one frame at a time keep their past frames as above
// (views, read in place by CUDA's implicit-GEMM kernel or joined for cuDNN) instead of in a
// frame ring (CausalConv below); for A/B timing and memory, the results are the same.
bool frame_rings() {
  static const bool on = env_choice("LATENT_VIDEO_RING", {{"1"}, {"0"}}, 0) == 0;
  return on;
}

// What a stream keeps between chunks, one slot per causal layer (diffusers' feat_cache).
// A causal conv keeps its last 2 input frames as the tensors they came in, not as a copy: `older`
// (when defined) holds the first of them and `frames` the rest, so a chunk of one frame (the
// full-resolution layers run frame by frame) costs no copy at all; at 720p a copy of 2 frames of
// 96 channels moves ~0.7 GB, once per causal conv and frame.
struct CausalCache {
  std::vector<Tensor> frames;  // a causal conv's last input frames; a downsampler's last frame
  std::vector<Tensor> older;   // a causal conv's frame before `frames` (then each holds one)
  std::vector<char> started;   // resamplers: a chunk has passed (diffusers' non-None slot)
  // A causal conv's frame ring ([3, C, H, W]; frame j of the clip in slot j % 3) and the number
  // of frames it has taken, where the conv keeps one (CausalConv::input_slot).
  std::vector<Tensor> ring;
  std::vector<int64_t> ring_frames;
  explicit CausalCache(int slots)
      : frames(slots), older(slots), started(slots, 0), ring(slots), ring_frames(slots, 0) {}
};

// Pixels of p x p patches as channels, channel c*p*p + dy*p + dx (Backend::pack_latents'
// order; diffusers' patchify orders them (c, dx, dy): the first and last convolutions' weights
// are reordered instead, see ParamLoader::causal_conv).
// x: [T, C, H, W] -> [T, C*p*p, H/p, W/p]
Result<Tensor> space_to_depth(Backend& b, const Tensor& x, int64_t p) {
  const int64_t t = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  if (x.layout() == Layout::kNHWC && p == 2) {
    // tokens [T, (H/2)(W/2), 4C] are the NHWC image [T, 4C, H/2, W/2]
    LATENT_ASSIGN_OR_RETURN(Tensor tokens, b.pack_latents(x));
    return Tensor::from_storage(tokens.storage(), tokens.byte_offset(), {t, c * 4, h / 2, w / 2},
                                tokens.dtype(), Layout::kNHWC);
  }
  LATENT_ASSIGN_OR_RETURN(Tensor host, b.download(x));  // [T, C, H, W] fp32, row-major
  Tensor y = Tensor::empty({t, c * p * p, h / p, w / p}, DType::kF32);
  const float* src = host.data_as<const float>();
  float* dst = y.data_as<float>();
  const int64_t ho = h / p, wo = w / p;
  for (int64_t f = 0; f < t * c; ++f)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j)
        dst[((f * p * p + (i % p) * p + j % p) * ho + i / p) * wo + j / p] =
            src[(f * h + i) * w + j];
  return b.upload(y);
}

// The inverse. x: [T, C*p*p, h, w] -> [T, C, h*p, w*p]
Result<Tensor> depth_to_space(Backend& b, const Tensor& x, int64_t p) {
  const int64_t t = x.dim(0), cp = x.dim(1), h = x.dim(2), w = x.dim(3), c = cp / (p * p);
  if (x.layout() == Layout::kNHWC && p == 2) {
    Tensor tokens = Tensor::from_storage(x.storage(), x.byte_offset(), {t, h * w, cp}, x.dtype(),
                                         Layout::kContiguous);
    return b.unpack_latents(tokens, 2 * h, 2 * w);
  }
  LATENT_ASSIGN_OR_RETURN(Tensor host, b.download(x));
  Tensor y = Tensor::empty({t, c, h * p, w * p}, DType::kF32);
  const float* src = host.data_as<const float>();
  float* dst = y.data_as<float>();
  const int64_t ho = h * p, wo = w * p;
  for (int64_t f = 0; f < t * c; ++f)
    for (int64_t i = 0; i < ho; ++i)
      for (int64_t j = 0; j < wo; ++j)
        dst[(f * ho + i) * wo + j] =
            src[((f * p * p + (i % p) * p + j % p) * h + i / p) * w + j / p];
  return b.upload(y);
}

// ---------------------------------------------------------------------------------------------
// Parameters

// A WanCausalConv3d with a k x k spatial kernel (k = 3, or 1 for a time_conv) and 3 temporal
// taps, as the backend's conv3d_frames() or three 2-D convolutions; or one with a single tap
// (1x1x1).
struct CausalConv {
  std::array<Tensor, 3> taps;  // [Cout, Cin, k, k] for time t - 2, t - 1, t (taps[2] only: 1 tap)
  // The whole kernel [Cout, Cin, 3 * k, k] where the backend runs conv3d_frames(); then taps
  // holds only taps[2] (image mode and the first frame of a clip).
  Tensor fused;
  Tensor bias;  // [Cout]
  Conv2dParams params;
  bool temporal = false;  // 3 taps
  int slot = -1;          // its CausalCache slot
  // The frame ring of a layer that sees one frame at a time (a stream's full-resolution
  // levels): its input frames go to a 3-frame ring, frame j in slot j % 3, written there by
  // their producer (input_slot), and the convolution reads the ring as one tensor of 3 frames
  // with the temporal taps permuted to where the frames sit: ring_w[j % 3] (ring_w[2] = fused,
  // the taps in order). No join and no copy of the past frames, and cuDNN (which reads frames
  // only at one stride) can run it. Undefined where the layer has no ring.
  std::array<Tensor, 3> ring_w;

  // Where the producer of this layer's next input frame writes it: the ring slot of that frame,
  // for a one-frame input shaped like `like` (a frame of the same channels and size). Undefined
  // where the layer keeps no ring: image mode, no ring weights, more than one frame, or a clip
  // that started outside the ring. The ring starts (zeroed: the past before frame 0) with the
  // clip's first frame.
  Result<Tensor> input_slot(Backend& b, CausalCache* cache, const Tensor& like) const {
    if (!cache || !ring_w[0].defined() || like.dim(0) != 1) return Tensor();
    Tensor& ring = cache->ring[slot];
    if (!ring.defined()) {
      if (cache->frames[slot].defined()) return Tensor();
      LATENT_ASSIGN_OR_RETURN(ring, zero_frames(b, 3, like));
      cache->ring_frames[slot] = 0;
      LATENT_DEBUG("causal conv (cache slot ", slot, "): a frame ring of ",
                   shape_str(ring.shape()));
    }
    return frame_view(ring, cache->ring_frames[slot] % 3, 1);
  }

  // Whether x is one frame written into this layer's ring at the slot of its next frame.
  bool in_ring_slot(const Tensor& x, const CausalCache& cache) const {
    const Tensor& ring = cache.ring[slot];
    if (!ring.defined() || x.dim(0) != 1) return false;
    const Tensor at = frame_view(ring, cache.ring_frames[slot] % 3, 1);
    return x.storage() == at.storage() && x.byte_offset() == at.byte_offset();
  }
  // The ring's frame j has been convolved: j + 1 next, and the same past as views, for a chunk
  // that comes outside the ring (which ends it).
  void ring_advanced(CausalCache& cache) const {
    const Tensor& ring = cache.ring[slot];
    const int64_t j = cache.ring_frames[slot];
    cache.ring_frames[slot] = j + 1;
    cache.older[slot] = frame_view(ring, (j + 2) % 3, 1);
    cache.frames[slot] = frame_view(ring, j % 3, 1);
  }

  // forward() with the channel RMS norm (gamma) and act of its output in the same pass, written
  // into `next`'s frame ring where it keeps one: a residual block's conv1 -> norm2 -> SiLU ->
  // conv2, where the backend fuses them (Backend::conv3d_frames_normed) and x is a later frame of
  // this layer's ring (the per-frame levels of a stream). An undefined tensor, with nothing queued
  // and this layer's cache unchanged, elsewhere: the caller then runs forward() and the norm.
  Result<Tensor> forward_normed(Backend& b, const Tensor& x, CausalCache* cache,
                                const Tensor& gamma, Activation act, const CausalConv& next) const {
    if (!temporal || !cache || !ring_w[0].defined() || !in_ring_slot(x, *cache)) return Tensor();
    const int64_t j = cache->ring_frames[slot];
    // the clip's first frame (one 2-D tap), or output channels other than the input's (the
    // output's ring slot below is made shaped like x): unfused
    if (j == 0 || taps[2].dim(0) != x.dim(1)) return Tensor();
    LATENT_ASSIGN_OR_RETURN(const Tensor into, next.input_slot(b, cache, x));
    LATENT_ASSIGN_OR_RETURN(Tensor y, b.conv3d_frames_normed(cache->ring[slot], ring_w[j % 3], 3,
                                                             bias, params, gamma, act, into));
    if (y.defined()) ring_advanced(*cache);
    return y;
  }

  // x: [T, Cin, H, W] -> [T, Cout, H, W]; y = act(conv3d(x) + bias + residual). `cache` null:
  // image mode (every frame a clip of its own).
  Result<Tensor> forward(Backend& b, const Tensor& x, CausalCache* cache,
                         const Tensor& residual = Tensor(),
                         Activation act = Activation::kNone) const {
    const Tensor& last = temporal ? taps[2] : taps[0];
    if (!temporal || !cache) return b.conv2d(x, last, bias, params, residual, act);
    Tensor& past = cache->frames[slot];
    Tensor& older = cache->older[slot];
    const int64_t t = x.dim(0);
    Tensor& ring = cache->ring[slot];
    if (ring.defined()) {
      const int64_t j = cache->ring_frames[slot];
      if (in_ring_slot(x, *cache)) {
        // Frame j is in its slot: the ring's 3 frames with the taps permuted, or for the clip's
        // first frame only the last tap (its past is zero).
        Result<Tensor> y =
            j == 0 ? b.conv2d(x, last, bias, params, residual, act)
                   : b.conv3d_frames(ring, ring_w[j % 3], 3, bias, params, residual, act);
        if (!y.ok()) return y;
        ring_advanced(*cache);
        return y;
      }
      // An input not written into the ring: the views above carry the past on, the ring ends.
      ring = Tensor();
    }
    if (!past.defined() && t == 1) {
      // Zero past: only the last tap meets data.
      LATENT_ASSIGN_OR_RETURN(older, zero_frames(b, 1, x));
      past = x;
      return b.conv2d(x, last, bias, params, residual, act);
    }
    if (!past.defined()) {
      LATENT_ASSIGN_OR_RETURN(past, zero_frames(b, 2, x));
      older = Tensor();
    }
    std::vector<Tensor> before;  // the 2 past frames, in one or two tensors
    if (older.defined()) before.push_back(older);
    before.push_back(past);
    Tensor y;
    if (fused.defined()) {
      // The past frames then x, read in place where the backend can (no join).
      LATENT_ASSIGN_OR_RETURN(
          y, b.conv3d_frames_after(before, x, fused, 3, bias, params, residual, act));
    } else {
      std::vector<Tensor> parts = before;
      parts.push_back(x);
      // xx: [T + 2, Cin, H, W], the 2 past frames then x
      LATENT_ASSIGN_OR_RETURN(Tensor xx, join_frames(b, parts));
      LATENT_ASSIGN_OR_RETURN(y,
                              b.conv2d(frame_view(xx, 0, t), taps[0], Tensor(), params, residual));
      LATENT_ASSIGN_OR_RETURN(y, b.conv2d(frame_view(xx, 1, t), taps[1], Tensor(), params, y));
      LATENT_ASSIGN_OR_RETURN(y, b.conv2d(frame_view(xx, 2, t), taps[2], bias, params, y, act));
    }
    // The next chunk's past, the last 2 frames of [past, x], as views (no copy). No backend op
    // writes into its inputs (copy_into aside, which only graph replays use: image-mode plans
    // and the DiT, never a stream's tensors), so the views keep what the frames held.
    if (t >= 2) {
      older = Tensor();
      past = frame_view(x, t - 2, 2);
    } else {
      older = older.defined() ? past : frame_view(past, 1, 1);
      past = x;
    }
    if (copy_cached_frames()) {  // A/B against the cache of copies (bench/NOTES.md, session 10)
      LATENT_ASSIGN_OR_RETURN(
          past, older.defined() ? join_frames(b, {older, past}) : join_frames(b, {past}));
      older = Tensor();
    }
    return y;
  }
};

// Takes parameters through the binder; splits 3-D kernels into their temporal taps on the host.
class ParamLoader {
 public:
  ParamLoader(WeightBinder& binder, Backend& backend) : binder_(binder), backend_(backend) {}

  // WanCausalConv3d(in, out, (kt, k, k)) with kt = 3 (padding k/2 in space) or kt = k = 1.
  // `rows` keeps only output channels [0, rows) (0: all). Cached convs get a slot. `fuse`: keep
  // the whole kernel for conv3d_frames() where the backend runs it.
  // `patch` > 1: the input (kPatchInputs) or output (kPatchOutputs) channels are pixels of
  // patch x patch patches in diffusers' patchify order (c, dx, dy); they are reordered to
  // (c, dy, dx), the order of Backend::pack_latents / unpack_latents (see space_to_depth).
  enum PatchSide { kNoPatch, kPatchInputs, kPatchOutputs };
  // `ring`: the layer sees one frame at a time in a stream and its input comes from a norm that
  // can write into a ring slot; it keeps a frame ring (CausalConv::ring_w) where the kernel is
  // fused (3x3x3) and LATENT_VIDEO_RING is not 0.
  CausalConv causal_conv(const std::string& prefix, int64_t in, int64_t out, int k, int kt,
                         int64_t rows = 0, bool fuse = true, PatchSide side = kNoPatch,
                         int64_t patch = 1, bool ring = false) {
    CausalConv c;
    c.params = Conv2dParams::same(k);
    c.temporal = kt == 3;
    if (c.temporal) c.slot = slots_++;
    const int64_t keep = rows > 0 ? rows : out;
    Tensor w = binder_.take_host(prefix + ".weight", {out, in, kt, k, k});
    Tensor b = binder_.take_host(prefix + ".bias", {out});
    if (side != kNoPatch && patch > 1) {
      // channel c*p*p + dy*p + dx <- diffusers' c*p*p + dx*p + dy
      auto from = [patch](int64_t i) {
        const int64_t pp = patch * patch, r = i % pp;
        return i - r + (r % patch) * patch + r / patch;
      };
      if (w.defined()) {
        Tensor pw = Tensor::empty(w.shape(), DType::kF32);
        const float* src = w.data_as<const float>();
        float* dst = pw.data_as<float>();
        const int64_t inner = int64_t{kt} * k * k;
        for (int64_t o = 0; o < out; ++o)
          for (int64_t i = 0; i < in; ++i) {
            const int64_t so = side == kPatchOutputs ? from(o) : o;
            const int64_t si = side == kPatchInputs ? from(i) : i;
            std::copy(src + (so * in + si) * inner, src + (so * in + si + 1) * inner,
                      dst + (o * in + i) * inner);
          }
        w = pw;
      }
      if (b.defined() && side == kPatchOutputs) {
        Tensor pb = Tensor::empty(b.shape(), DType::kF32);
        for (int64_t o = 0; o < out; ++o)
          pb.data_as<float>()[o] = b.data_as<const float>()[from(o)];
        b = pb;
      }
    }
    if (w.defined()) {
      // w: [out, in, kt, k, k] -> taps[j]: [keep, in, k, k] at t = j
      const float* src = w.data_as<const float>();
      const int64_t plane = int64_t{k} * k;
      const bool fused = fuse && kt == 3 && backend_.supports_conv3d_frames();
      if (fused) {
        // [keep, in, kt, k, k] -> [keep, in, kt * k, k]: the same values (rows are a prefix)
        Tensor s = Tensor::empty({keep, in, kt * k, k}, DType::kF32);
        std::copy(src, src + keep * in * kt * k * k, s.data_as<float>());
        c.fused = upload(s, prefix + ".weight");
        if (ring && frame_rings()) {
          // ring_w[r]: ring slot q holds the frame of tap 2 - (r - q) mod 3 (frame j in slot
          // j % 3, r = j % 3: slot r holds frame j = tap 2, slot r + 1 frame j - 2 = tap 0)
          c.ring_w[2] = c.fused;
          for (int r = 0; r < 2; ++r) {
            Tensor rw = Tensor::empty({keep, in, kt * k, k}, DType::kF32);
            float* dst = rw.data_as<float>();
            for (int64_t oi = 0; oi < keep * in; ++oi)
              for (int q = 0; q < 3; ++q) {
                const int tap = 2 - (r - q + 3) % 3;
                std::copy(src + (oi * kt + tap) * plane, src + (oi * kt + tap + 1) * plane,
                          dst + (oi * kt + q) * plane);
              }
            c.ring_w[r] = upload(rw, prefix + ".weight");
          }
        }
      }
      for (int j = fused ? kt - 1 : 0; j < kt; ++j) {
        Tensor s = Tensor::empty({keep, in, k, k}, DType::kF32);
        float* dst = s.data_as<float>();
        for (int64_t oi = 0; oi < keep * in; ++oi) {
          const float* tap = src + (oi * kt + j) * plane;
          std::copy(tap, tap + plane, dst + oi * plane);
        }
        c.taps[j] = upload(s, prefix + ".weight");
      }
    }
    if (b.defined()) {
      // b: [out] -> [keep]
      Tensor s = Tensor::from_floats(
          {keep}, std::vector<float>(b.data_as<const float>(), b.data_as<const float>() + keep));
      c.bias = upload(s, prefix + ".bias");
    }
    return c;
  }

  // The upsamplers' nn.Conv2d(in, out, 3, padding=1) after their nearest 2x upsampling.
  UpsampleConv upsample_conv(const std::string& prefix, int64_t in, int64_t out) {
    return load_upsample_conv(binder_, prefix, out, in, /*bias=*/true);
  }

  // nn.Conv2d(in, out, k) with explicit padding/stride.
  Conv conv2d(const std::string& prefix, int64_t in, int64_t out, int k, Conv2dParams params) {
    return vae_common::load_conv(binder_, prefix, out, in, k, /*bias=*/true, params);
  }

  // WanRMS_norm gamma: [C, 1, 1, 1] (images=False) or [C, 1, 1] (images=True) -> [C].
  Tensor norm_gamma(const std::string& name, int64_t channels, bool images) {
    Shape shape = images ? Shape{channels, 1, 1} : Shape{channels, 1, 1, 1};
    Tensor g = binder_.take_host(name, shape);
    if (!g.defined()) return Tensor();
    auto flat = g.reshape({channels});
    if (!flat.ok()) {
      note(flat.status().with_context(name));
      return Tensor();
    }
    return upload(*flat, name);
  }

  int new_slot() { return slots_++; }
  int slots() const { return slots_; }
  Status status() const { return status_; }

  Tensor upload(const Tensor& host, const std::string& name) {
    auto t = backend_.upload(host);
    if (!t.ok()) {
      note(t.status().with_context(str_cat("uploading '", name, "' to ", backend_.name())));
      return Tensor();
    }
    return std::move(t).value();
  }

 private:
  void note(const Status& s) {
    if (status_.ok()) status_ = s;
  }

  WeightBinder& binder_;
  Backend& backend_;
  Status status_;
  int slots_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Blocks. Every forward takes a chunk x: [T, C, H, W] and the stream's cache (null: images).

// SiLU(rms_norm_channels(x) * gamma), the input of `conv`: written into conv's frame ring where
// it keeps one (the ring's slot is the result), else a new tensor.
Result<Tensor> norm_silu_into(Backend& b, const Tensor& x, const Tensor& gamma,
                              const CausalConv& conv, CausalCache* cache) {
  LATENT_ASSIGN_OR_RETURN(Tensor slot, conv.input_slot(b, cache, x));
  if (!slot.defined()) return b.rms_norm_channels(x, gamma, Tensor(), Activation::kSiLU);
  LATENT_TRY(b.rms_norm_channels_into(x, gamma, Tensor(), Activation::kSiLU, slot));
  return slot;
}

// WanResidualBlock: norm1 -> SiLU -> conv1 -> norm2 -> SiLU -> conv2, + shortcut(x).
struct ResidualBlock {
  Tensor norm1, norm2;
  CausalConv conv1, conv2;
  std::optional<CausalConv> conv_shortcut;  // 1x1x1 when in != out

  // per_frame: the block sees one frame at a time in a stream; its convs keep frame rings.
  static ResidualBlock load(ParamLoader& p, const std::string& prefix, int64_t in, int64_t out,
                            bool per_frame = false) {
    ResidualBlock r;
    r.norm1 = p.norm_gamma(prefix + ".norm1.gamma", in, /*images=*/false);
    r.conv1 = p.causal_conv(prefix + ".conv1", in, out, 3, 3, 0, true, ParamLoader::kNoPatch, 1,
                            per_frame);
    r.norm2 = p.norm_gamma(prefix + ".norm2.gamma", out, /*images=*/false);
    r.conv2 = p.causal_conv(prefix + ".conv2", out, out, 3, 3, 0, true, ParamLoader::kNoPatch, 1,
                            per_frame);
    if (in != out) r.conv_shortcut = p.causal_conv(prefix + ".conv_shortcut", in, out, 1, 1);
    return r;
  }

  // x: [T, Cin, H, W] -> [T, Cout, H, W]
  Result<Tensor> forward(Backend& b, const Tensor& x, CausalCache* cache) const {
    Tensor h = x;
    if (conv_shortcut) {
      LATENT_ASSIGN_OR_RETURN(h, conv_shortcut->forward(b, x, cache));
    }
    LATENT_ASSIGN_OR_RETURN(Tensor y, norm_silu_into(b, x, norm1, conv1, cache));
    // conv1 -> norm2 -> SiLU in one pass where the backend fuses them, else one after the other
    LATENT_ASSIGN_OR_RETURN(Tensor z,
                            conv1.forward_normed(b, y, cache, norm2, Activation::kSiLU, conv2));
    if (!z.defined()) {
      LATENT_ASSIGN_OR_RETURN(z, conv1.forward(b, y, cache));
      LATENT_ASSIGN_OR_RETURN(z, norm_silu_into(b, z, norm2, conv2, cache));
    }
    // dropout is the identity at inference
    return conv2.forward(b, z, cache, h);
  }
};

// diffusers' AvgDown3D, the shortcut of a Wan 2.2 down block: the input's [ft, fs, fs] blocks
// of frames and pixels (with ft - T % ft zero frames in front of the chunk) become channels
// c*f + kt*fs*fs + dy*fs + dx (f = ft*fs*fs), and each output channel is the mean of a group of
// in*f/out consecutive ones. A linear map: one fs x fs stride-fs convolution per temporal tap kt
// whose weight holds 1/group where a channel belongs to the group.
struct AvgDown {
  int64_t ft = 1, fs = 1;
  bool identity = false;
  std::array<Tensor, 2> taps;  // [out, in, fs, fs] for frames 2j + kt of the padded chunk
  Conv2dParams params;

  static AvgDown load(ParamLoader& p, const std::string& name, int64_t in, int64_t out, int64_t ft,
                      int64_t fs) {
    AvgDown a;
    a.ft = ft;
    a.fs = fs;
    const int64_t factor = ft * fs * fs, group = in * factor / out;
    a.identity = factor == 1 && in == out;
    if (a.identity) return a;
    a.params.stride = static_cast<int>(fs);
    for (int64_t kt = 0; kt < ft; ++kt) {
      Tensor w = Tensor::zeros({out, in, fs, fs}, DType::kF32);
      float* d = w.data_as<float>();
      for (int64_t c = 0; c < in; ++c)
        for (int64_t dy = 0; dy < fs; ++dy)
          for (int64_t dx = 0; dx < fs; ++dx) {
            const int64_t o = (c * factor + kt * fs * fs + dy * fs + dx) / group;
            d[((o * in + c) * fs + dy) * fs + dx] = 1.0f / static_cast<float>(group);
          }
      a.taps[kt] = p.upload(w, name);
    }
    return a;
  }

  // x: [T, in, H, W] -> [ceil(T / ft), out, H/fs, W/fs]. `clip` false: every frame is a clip of
  // its own (image mode).
  Result<Tensor> forward(Backend& b, const Tensor& x, bool clip) const {
    if (identity) return x;
    const int64_t t = x.dim(0);
    if (ft == 1 || !clip || t == 1) {
      // one frame padded with ft - 1 zero frames in front: only the last tap meets data
      return b.conv2d(x, taps[ft - 1], Tensor(), params);
    }
    if (ft != 2) return Status::errorf("AvgDown3D: temporal factor ", ft, " is not supported");
    Tensor xx = x;
    if (t % 2 != 0) {
      LATENT_ASSIGN_OR_RETURN(Tensor zero, zero_frames(b, 1, x));
      LATENT_ASSIGN_OR_RETURN(xx, join_frames(b, {zero, x}));
    }
    Tensor y;
    for (int kt = 0; kt < 2; ++kt) {
      std::vector<Tensor> picked;
      for (int64_t o = 0; o < xx.dim(0) / 2; ++o) picked.push_back(frame_view(xx, 2 * o + kt, 1));
      Tensor in = picked[0];
      if (picked.size() > 1) {
        LATENT_ASSIGN_OR_RETURN(in, join_frames(b, picked));
      }
      LATENT_ASSIGN_OR_RETURN(y, b.conv2d(in, taps[kt], Tensor(), params, y));
    }
    return y;
  }
};

// diffusers' DupUp3D (spatial factor 2), the shortcut of a Wan 2.2 up block: each input channel
// repeated r = out*f/in times (f = ft*4) gives channels o*f + kt*4 + dy*2 + dx, which become
// output channel o at frame t*ft + kt and pixel (2y + dy, 2x + dx). Per temporal tap kt: a 1x1
// convolution that picks those channels (one-hot weights, exact), then depth_to_space. On the
// clip's first chunk diffusers drops the first ft - 1 output frames (first_chunk).
struct DupUp {
  int64_t ft = 1;
  std::array<Tensor, 2> pick;  // [out*4, in, 1, 1]

  static DupUp load(ParamLoader& p, const std::string& name, int64_t in, int64_t out, int64_t ft) {
    DupUp d;
    d.ft = ft;
    const int64_t factor = ft * 4, repeats = out * factor / in;
    for (int64_t kt = 0; kt < ft; ++kt) {
      Tensor w = Tensor::zeros({out * 4, in, 1, 1}, DType::kF32);
      float* dst = w.data_as<float>();
      for (int64_t o = 0; o < out; ++o)
        for (int64_t s = 0; s < 4; ++s)
          dst[(o * 4 + s) * in + (o * factor + kt * 4 + s) / repeats] = 1.0f;
      d.pick[kt] = p.upload(w, name);
    }
    return d;
  }

  // x: [T, in, h, w] -> [T*ft, out, 2h, 2w] (first_chunk: its first ft - 1 frames dropped).
  // `clip` false: every frame is a clip of its own, as a first chunk (image mode).
  Result<Tensor> forward(Backend& b, const Tensor& x, bool clip, bool first_chunk) const {
    std::array<Tensor, 2> sub;
    const int64_t from = clip && !(first_chunk && x.dim(0) == 1) ? 0 : ft - 1;
    for (int64_t kt = from; kt < ft; ++kt) {
      LATENT_ASSIGN_OR_RETURN(Tensor g, b.conv2d(x, pick[kt], Tensor(), Conv2dParams()));
      LATENT_ASSIGN_OR_RETURN(sub[kt], depth_to_space(b, g, 2));
    }
    if (from == ft - 1) return sub[ft - 1];
    std::vector<Tensor> frames;
    for (int64_t t = 0; t < x.dim(0); ++t)
      for (int64_t kt = 0; kt < ft; ++kt) {
        if (first_chunk && t == 0 && kt < ft - 1) continue;
        frames.push_back(frame_view(sub[kt], t, 1));
      }
    return join_frames(b, frames);
  }
};

// WanAttentionBlock: single-head self-attention over the pixels of each frame.
struct AttentionBlock {
  Tensor norm;
  Conv to_qkv, proj;
  int64_t dim = 0;

  static AttentionBlock load(ParamLoader& p, const std::string& prefix, int64_t dim) {
    AttentionBlock a;
    a.dim = dim;
    a.norm = p.norm_gamma(prefix + ".norm.gamma", dim, /*images=*/true);
    a.to_qkv = p.conv2d(prefix + ".to_qkv", dim, 3 * dim, 1, Conv2dParams());
    a.proj = p.conv2d(prefix + ".proj", dim, dim, 1, Conv2dParams());
    return a;
  }

  // x: [T, C, H, W] -> [T, C, H, W]
  Result<Tensor> forward(Backend& b, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, b.rms_norm_channels(x, norm, Tensor()));
    // qkv: [T, 3C, H, W]; diffusers chunks the 3C channels of each pixel into q, k, v.
    LATENT_ASSIGN_OR_RETURN(Tensor qkv, to_qkv(b, h));
    LATENT_ASSIGN_OR_RETURN(Tensor q, b.slice_channels(qkv, 0, dim));
    LATENT_ASSIGN_OR_RETURN(Tensor k, b.slice_channels(qkv, dim, dim));
    LATENT_ASSIGN_OR_RETURN(Tensor v, b.slice_channels(qkv, 2 * dim, dim));
    LATENT_ASSIGN_OR_RETURN(Tensor o, b.spatial_attention(q, k, v, /*heads=*/1));
    return proj(b, o, x);
  }
};

// WanResample: "upsample2d"/"upsample3d" (nearest 2x + 3x3 conv to `out` channels) or
// "downsample2d"/"downsample3d" (ZeroPad2d(0, 1, 0, 1) + 3x3 stride-2 conv); the 3-D modes add
// a time_conv (see the top of this file).
struct Resample {
  bool up = false;
  Conv conv;                            // downsample
  UpsampleConv upconv;                  // upsample: nearest 2x, then the 3x3 conv
  std::optional<CausalConv> time_conv;  // upsample: (3,1,1) C -> 2C; downsample: C -> C, stride 2
  int slot = -1;                        // the "started" flag (and the downsampler's last frame)
  int64_t dim = 0;

  // up_out: the upsampler's output channels (0: dim / 2, Wan 2.1; the Wan 2.2 blocks keep dim).
  static Resample load(ParamLoader& p, const std::string& prefix, int64_t dim, bool up,
                       bool temporal, int64_t up_out = 0) {
    Resample r;
    r.up = up;
    r.dim = dim;
    if (up) {
      r.upconv = p.upsample_conv(prefix + ".resample.1", dim, up_out > 0 ? up_out : dim / 2);
      if (temporal) r.time_conv = p.causal_conv(prefix + ".time_conv", dim, dim * 2, 1, 3);
    } else {
      Conv2dParams params;
      params.stride = 2;
      params.pad_bottom = params.pad_right = 1;
      r.conv = p.conv2d(prefix + ".resample.1", dim, dim, 3, params);
      if (temporal) {
        // stride 2 in time: run per tap (no conv3d_frames)
        r.time_conv = p.causal_conv(prefix + ".time_conv", dim, dim, 1, 3, 0, /*fuse=*/false);
        r.time_conv->slot = -1;  // not a padded causal conv: its input comes from `slot`
      }
    }
    if (temporal) r.slot = p.new_slot();
    return r;
  }

  // x: [T, C, H, W] -> up: [T (*2 after the first chunk), C/2, 2H, 2W];
  //                    down: [T (/2 after the first chunk), C, H/2, W/2]
  Result<Tensor> forward(Backend& b, const Tensor& x, CausalCache* cache) const {
    if (up) {
      Tensor h = x;
      if (time_conv && cache) {
        if (!cache->started[slot]) {
          cache->started[slot] = 1;  // diffusers' "Rep": the first chunk skips time_conv
        } else {
          // y: [T, 2C, H, W] -> frames 2t, 2t + 1 = channels [0, C), [C, 2C) of frame t
          LATENT_ASSIGN_OR_RETURN(Tensor y, time_conv->forward(b, x, cache));
          LATENT_ASSIGN_OR_RETURN(Tensor first, b.slice_channels(y, 0, dim));
          LATENT_ASSIGN_OR_RETURN(Tensor second, b.slice_channels(y, dim, dim));
          std::vector<Tensor> frames;
          for (int64_t t = 0; t < x.dim(0); ++t) {
            frames.push_back(frame_view(first, t, 1));
            frames.push_back(frame_view(second, t, 1));
          }
          LATENT_ASSIGN_OR_RETURN(h, join_frames(b, frames));
        }
      }
      return upconv(b, h);
    }
    LATENT_ASSIGN_OR_RETURN(Tensor h, conv(b, x));
    if (!time_conv || !cache) return h;
    Tensor& last = cache->frames[slot];
    const int64_t t = h.dim(0);
    if (!cache->started[slot]) {
      cache->started[slot] = 1;
      LATENT_ASSIGN_OR_RETURN(last, join_frames(b, {frame_view(h, t - 1, 1)}));
      return h;
    }
    if (t % 2 != 0)
      return Status::errorf("temporal downsampling of ", t,
                            " frames: chunks after the first must have an even frame count");
    // xx: [T + 1, C, h, w]; output frame j = taps over xx[2j], xx[2j + 1], xx[2j + 2]
    LATENT_ASSIGN_OR_RETURN(Tensor xx, join_frames(b, {last, h}));
    Tensor y;
    for (int j = 0; j < 3; ++j) {
      std::vector<Tensor> picked;
      for (int64_t o = 0; o < t / 2; ++o) picked.push_back(frame_view(xx, 2 * o + j, 1));
      Tensor in = picked[0];
      if (picked.size() > 1) {
        LATENT_ASSIGN_OR_RETURN(in, join_frames(b, picked));
      }
      LATENT_ASSIGN_OR_RETURN(y,
                              b.conv2d(in, time_conv->taps[j], j == 2 ? time_conv->bias : Tensor(),
                                       time_conv->params, y));
    }
    LATENT_ASSIGN_OR_RETURN(last, join_frames(b, {frame_view(h, t - 1, 1)}));
    return y;
  }
};

// WanMidBlock with num_layers = 1: resnet, attention, resnet.
struct MidBlock {
  ResidualBlock res0, res1;
  AttentionBlock attn;

  static MidBlock load(ParamLoader& p, const std::string& prefix, int64_t dim) {
    MidBlock m;
    m.res0 = ResidualBlock::load(p, prefix + ".resnets.0", dim, dim);
    m.attn = AttentionBlock::load(p, prefix + ".attentions.0", dim);
    m.res1 = ResidualBlock::load(p, prefix + ".resnets.1", dim, dim);
    return m;
  }

  // x: [T, C, H, W] -> [T, C, H, W]
  Result<Tensor> forward(Backend& b, const Tensor& x, CausalCache* cache) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, res0.forward(b, x, cache));
    LATENT_ASSIGN_OR_RETURN(h, attn.forward(b, h));
    return res1.forward(b, h, cache);
  }
};

// WanResidualDownBlock (Wan 2.2): num_res_blocks residual blocks and a downsampler, plus the
// AvgDown3D shortcut of the block's input.
struct ResidualDownBlock {
  std::vector<ResidualBlock> resnets;
  std::optional<Resample> downsampler;
  AvgDown shortcut;

  bool temporal() const { return downsampler && downsampler->time_conv; }

  // x: [T, Cin, H, W] -> [T (/2 after the first chunk when temporal), Cout, H (/2), W (/2)]
  Result<Tensor> forward(Backend& b, const Tensor& x, CausalCache* cache) const {
    Tensor h = x;
    for (const auto& r : resnets) {
      LATENT_ASSIGN_OR_RETURN(h, r.forward(b, h, cache));
    }
    if (downsampler) {
      LATENT_ASSIGN_OR_RETURN(h, downsampler->forward(b, h, cache));
    }
    LATENT_ASSIGN_OR_RETURN(Tensor s, shortcut.forward(b, x, cache != nullptr));
    return b.add(h, s);
  }
};

// WanEncoder3d followed by the mean half of quant_conv.
struct Encoder {
  // attn_scales would add attention blocks here; validate_config() refuses them (see there).
  using Layer = std::variant<ResidualBlock, Resample, ResidualDownBlock>;
  int64_t patch = 1;  // Wan 2.2: frames patchified first
  CausalConv conv_in;
  std::vector<Layer> down_blocks;
  MidBlock mid_block;
  Tensor norm_out;
  CausalConv conv_out;
  CausalConv quant_mean;  // quant_conv rows [0, z_dim)
  int slots = 0;

  static Encoder load(ParamLoader& p, const QwenImageVaeConfig& c) {
    Encoder e;
    const int first_slot = p.slots();
    const auto& m = c.dim_mult;
    std::vector<int64_t> dims{c.base_dim};
    for (int64_t u : m) dims.push_back(c.base_dim * u);
    e.patch = c.patch_size;
    e.conv_in = p.causal_conv("encoder.conv_in", c.input_channels, dims[0], 3, 3, 0, true,
                              ParamLoader::kPatchInputs, c.patch_size);
    int64_t out_dim = dims[0];
    // The layers before the first temporal one see one frame at a time (first_temporal()).
    bool per_frame = true;
    for (size_t i = 0; i < m.size(); ++i) {
      int64_t in_dim = dims[i];
      out_dim = dims[i + 1];
      if (c.is_residual) {
        const std::string prefix = str_cat("encoder.down_blocks.", i);
        const bool down = i + 1 != m.size();
        const bool temporal = down && c.temperal_downsample[i];
        per_frame = per_frame && !temporal;
        ResidualDownBlock r;
        r.shortcut = AvgDown::load(p, prefix + ".avg_shortcut", in_dim, out_dim, temporal ? 2 : 1,
                                   down ? 2 : 1);
        for (int64_t j = 0; j < c.num_res_blocks; ++j) {
          r.resnets.push_back(
              ResidualBlock::load(p, str_cat(prefix, ".resnets.", j), in_dim, out_dim, per_frame));
          in_dim = out_dim;
        }
        if (down)
          r.downsampler =
              Resample::load(p, prefix + ".downsampler", out_dim, /*up=*/false, temporal);
        e.down_blocks.emplace_back(std::move(r));
        continue;
      }
      for (int64_t r = 0; r < c.num_res_blocks; ++r) {
        const std::string prefix = str_cat("encoder.down_blocks.", e.down_blocks.size());
        e.down_blocks.emplace_back(ResidualBlock::load(p, prefix, in_dim, out_dim, per_frame));
        in_dim = out_dim;
      }
      if (i + 1 != m.size()) {
        const std::string prefix = str_cat("encoder.down_blocks.", e.down_blocks.size());
        e.down_blocks.emplace_back(
            Resample::load(p, prefix, out_dim, /*up=*/false, c.temperal_downsample[i]));
        per_frame = per_frame && !c.temperal_downsample[i];
      }
    }
    e.mid_block = MidBlock::load(p, "encoder.mid_block", out_dim);
    e.norm_out = p.norm_gamma("encoder.norm_out.gamma", out_dim, /*images=*/false);
    e.conv_out = p.causal_conv("encoder.conv_out", out_dim, 2 * c.z_dim, 3, 3);
    e.quant_mean = p.causal_conv("quant_conv", 2 * c.z_dim, 2 * c.z_dim, 1, 1, /*rows=*/c.z_dim);
    e.slots = p.slots() - first_slot;
    return e;
  }

  // Layers [0, first_temporal) of down_blocks see frames one at a time (causal convs, spatial
  // resampling): with a cache, a chunk runs through them frame by frame, which is exact and cuts
  // the full-resolution activations of a 4-frame chunk to one frame's.
  size_t first_temporal() const {
    for (size_t i = 0; i < down_blocks.size(); ++i) {
      const Resample* r = std::get_if<Resample>(&down_blocks[i]);
      if (r && r->time_conv) return i;
      const ResidualDownBlock* d = std::get_if<ResidualDownBlock>(&down_blocks[i]);
      if (d && d->temporal()) return i;
    }
    return down_blocks.size();
  }

  // x: [T, 3, H, W] -> mean [T', z_dim, H/f, W/f] (T' = T / 4 after the first chunk)
  Result<Tensor> forward(Backend& b, const Tensor& frames, CausalCache* cache) const {
    Tensor x = frames;
    if (patch > 1) {
      // x: [T, 3 * patch^2, H/patch, W/patch]
      LATENT_ASSIGN_OR_RETURN(x, space_to_depth(b, frames, patch));
    }
    const size_t split = cache && x.dim(0) > 1 ? first_temporal() : 0;
    auto layer = [&](size_t i, const Tensor& h) {
      return std::visit([&](const auto& l) { return l.forward(b, h, cache); }, down_blocks[i]);
    };
    Tensor h;
    if (split > 0) {
      std::vector<Tensor> frames;
      for (int64_t t = 0; t < x.dim(0); ++t) {
        // f: [1, C, H', W'] through conv_in and the per-frame levels
        LATENT_ASSIGN_OR_RETURN(Tensor f, conv_in.forward(b, frame_view(x, t, 1), cache));
        for (size_t i = 0; i < split; ++i) {
          LATENT_ASSIGN_OR_RETURN(f, layer(i, f));
        }
        frames.push_back(std::move(f));
      }
      LATENT_ASSIGN_OR_RETURN(h, join_frames(b, frames));
    } else {
      LATENT_ASSIGN_OR_RETURN(h, conv_in.forward(b, x, cache));
    }
    for (size_t i = split; i < down_blocks.size(); ++i) {
      // h: [T, C, H', W']
      LATENT_ASSIGN_OR_RETURN(h, layer(i, h));
    }
    LATENT_ASSIGN_OR_RETURN(h, mid_block.forward(b, h, cache));
    LATENT_ASSIGN_OR_RETURN(h, b.rms_norm_channels(h, norm_out, Tensor(), Activation::kSiLU));
    LATENT_ASSIGN_OR_RETURN(h, conv_out.forward(b, h, cache));
    return quant_mean.forward(b, h, cache);
  }
};

// WanUpBlock: num_res_blocks + 1 resnets and an optional upsampler.
// Wan 2.2's WanResidualUpBlock adds the DupUp3D shortcut of the block's input.
struct UpBlock {
  std::vector<ResidualBlock> resnets;
  std::optional<Resample> upsampler;
  std::optional<DupUp> shortcut;

  // x: [T, Cin, H, W] -> [T (*2), Cout (/2 when upsampling, Wan 2.1), H (*2), W (*2)].
  // first_chunk: the clip's first latent frame (or image mode), see DupUp.
  Result<Tensor> forward(Backend& b, const Tensor& x, CausalCache* cache, bool first_chunk) const {
    Tensor h = x;
    for (const auto& r : resnets) {
      LATENT_ASSIGN_OR_RETURN(h, r.forward(b, h, cache));
    }
    if (upsampler) {
      LATENT_ASSIGN_OR_RETURN(h, upsampler->forward(b, h, cache));
    }
    if (!shortcut) return h;
    LATENT_ASSIGN_OR_RETURN(Tensor s, shortcut->forward(b, x, cache != nullptr, first_chunk));
    return b.add(h, s);
  }
};

// post_quant_conv followed by WanDecoder3d.
struct Decoder {
  int64_t patch = 1;  // Wan 2.2: the output is unpatchified
  CausalConv post_quant_conv;
  CausalConv conv_in;
  MidBlock mid_block;
  std::vector<UpBlock> up_blocks;
  Tensor norm_out;
  CausalConv conv_out;
  int slots = 0;

  static Decoder load(ParamLoader& p, const QwenImageVaeConfig& c) {
    Decoder d;
    const int first_slot = p.slots();
    const auto& m = c.dim_mult;
    const int64_t base = c.decoder_dim();
    std::vector<int64_t> dims{base * m.back()};
    for (auto it = m.rbegin(); it != m.rend(); ++it) dims.push_back(base * *it);
    d.post_quant_conv = p.causal_conv("post_quant_conv", c.z_dim, c.z_dim, 1, 1);
    d.conv_in = p.causal_conv("decoder.conv_in", c.z_dim, dims[0], 3, 3);
    d.mid_block = MidBlock::load(p, "decoder.mid_block", dims[0]);
    int64_t out_dim = dims[0];
    d.patch = c.patch_size;
    // Up blocks after the last one with a temporal upsampler see one frame at a time
    // (after_last_temporal(); temperal_upsample = temperal_downsample reversed).
    size_t per_frame_from = 0;
    for (size_t i = 0; i + 1 < m.size(); ++i)
      if (c.temperal_downsample[m.size() - 2 - i]) per_frame_from = i + 1;
    for (size_t i = 0; i < m.size(); ++i) {
      int64_t in_dim = i > 0 && !c.is_residual ? dims[i] / 2 : dims[i];
      out_dim = dims[i + 1];
      UpBlock u;
      const std::string prefix = str_cat("decoder.up_blocks.", i);
      const bool per_frame = i >= per_frame_from;
      if (c.is_residual) {
        const bool up = i + 1 != m.size();
        const bool temporal = up && c.temperal_downsample[m.size() - 2 - i];
        if (up)
          u.shortcut = DupUp::load(p, prefix + ".avg_shortcut", in_dim, out_dim, temporal ? 2 : 1);
        for (int64_t r = 0; r <= c.num_res_blocks; ++r) {
          u.resnets.push_back(
              ResidualBlock::load(p, str_cat(prefix, ".resnets.", r), in_dim, out_dim, per_frame));
          in_dim = out_dim;
        }
        if (up)
          u.upsampler =
              Resample::load(p, prefix + ".upsampler", out_dim, /*up=*/true, temporal, out_dim);
        d.up_blocks.push_back(std::move(u));
        continue;
      }
      for (int64_t r = 0; r <= c.num_res_blocks; ++r) {
        u.resnets.push_back(
            ResidualBlock::load(p, str_cat(prefix, ".resnets.", r), in_dim, out_dim, per_frame));
        in_dim = out_dim;
      }
      if (i + 1 != m.size()) {
        // temperal_upsample = temperal_downsample reversed
        const bool temporal = c.temperal_downsample[m.size() - 2 - i];
        u.upsampler = Resample::load(p, prefix + ".upsamplers.0", out_dim, /*up=*/true, temporal);
      }
      d.up_blocks.push_back(std::move(u));
    }
    d.norm_out = p.norm_gamma("decoder.norm_out.gamma", out_dim, /*images=*/false);
    d.conv_out = p.causal_conv("decoder.conv_out", out_dim, c.input_channels, 3, 3, 0, true,
                               ParamLoader::kPatchOutputs, c.patch_size);
    d.slots = p.slots() - first_slot;
    return d;
  }

  // Up blocks after the last temporal upsampler, and the head, see frames one at a time: with
  // a cache, the frames of a chunk run through them one by one (exact; the full-resolution
  // activations of 4 frames shrink to one frame's).
  size_t after_last_temporal() const {
    size_t k = 0;
    for (size_t i = 0; i < up_blocks.size(); ++i)
      if (up_blocks[i].upsampler && up_blocks[i].upsampler->time_conv) k = i + 1;
    return k;
  }

  // h: [T, C, H', W'] from up block `from` on -> [T, 3, H, W]
  Result<Tensor> tail(Backend& b, Tensor h, size_t from, CausalCache* cache,
                      bool first_chunk) const {
    for (size_t i = from; i < up_blocks.size(); ++i) {
      LATENT_ASSIGN_OR_RETURN(h, up_blocks[i].forward(b, h, cache, first_chunk));
    }
    LATENT_ASSIGN_OR_RETURN(h, b.rms_norm_channels(h, norm_out, Tensor(), Activation::kSiLU));
    LATENT_ASSIGN_OR_RETURN(h, conv_out.forward(b, h, cache));
    if (patch > 1) {
      // h: [T, 3 * patch^2, H/patch, W/patch] -> [T, 3, H, W]
      LATENT_ASSIGN_OR_RETURN(h, depth_to_space(b, h, patch));
    }
    return b.clamp(h, -1.f, 1.f);
  }

  // z: [t, z_dim, h, w] -> [T, 3, h*f, w*f] in [-1, 1] (T = t, then 4t after the first chunk).
  // first_chunk: the clip's first latent frame (always true in image mode, cache null).
  Result<Tensor> forward(Backend& b, const Tensor& z, CausalCache* cache,
                         bool first_chunk = true) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, post_quant_conv.forward(b, z, cache));
    LATENT_ASSIGN_OR_RETURN(h, conv_in.forward(b, h, cache));
    LATENT_ASSIGN_OR_RETURN(h, mid_block.forward(b, h, cache));
    const size_t split = cache ? after_last_temporal() : 0;
    for (size_t i = 0; i < split; ++i) {
      // h: [T, C, H', W']
      LATENT_ASSIGN_OR_RETURN(h, up_blocks[i].forward(b, h, cache, first_chunk));
    }
    if (!cache || h.dim(0) == 1) return tail(b, h, split, cache, first_chunk);
    std::vector<Tensor> frames;
    for (int64_t t = 0; t < h.dim(0); ++t) {
      // (after the last temporal upsampler every shortcut has ft = 1: first_chunk is moot)
      LATENT_ASSIGN_OR_RETURN(Tensor f,
                              tail(b, frame_view(h, t, 1), split, cache, first_chunk && t == 0));
      frames.push_back(std::move(f));
    }
    return join_frames(b, frames);
  }
};

// ---------------------------------------------------------------------------------------------
// The model

class QwenImageVae;

// One clip through the encoder or the decoder. Each clip of a batch has its own causal cache
// and is run on its own (frames of one clip along the batch axis of the 2-D ops).
class WanStream final : public VaeStream {
 public:
  WanStream(QwenImageVae& model, bool encoder) : model_(model), encoder_(encoder) {}

  Result<Tensor> push(const Tensor& x) override;
  Result<Tensor> finish(int* padded_frames) override;
  void reset() override {
    clips_.clear();
    seen_ = 0;
    buffered_ = 0;
    shape_.clear();
  }
  int frames_buffered() const override { return buffered_; }
  int64_t frames_seen() const override { return seen_; }

 private:
  struct Clip {
    CausalCache cache;
    Tensor pending;  // encoder: frames [n, 3, H, W] waiting for a complete chunk
    int64_t chunks = 0;
    explicit Clip(int slots) : cache(slots) {}
  };
  // Runs the complete chunks of clip i's pending frames (encoder) or every latent frame of
  // `frames` (decoder); returns the output frames [T', C', H', W'] (undefined: none).
  Result<Tensor> run_clip(Clip& clip, const Tensor& frames);

  QwenImageVae& model_;
  bool encoder_;
  std::vector<Clip> clips_;
  Shape shape_;  // [N, C, -, H, W] of the first push
  int64_t seen_ = 0;
  int buffered_ = 0;
};

class QwenImageVae : public VaeModel {
 public:
  QwenImageVae(std::shared_ptr<Backend> backend, QwenImageVaeConfig config, ModelInfo info,
               std::optional<Encoder> encoder, std::optional<Decoder> decoder)
      : config_(std::move(config)),
        info_(std::move(info)),
        encoder_(std::move(encoder)),
        decoder_(std::move(decoder)) {
    backend_ = std::move(backend);
  }

  const ModelInfo& info() const override { return info_; }
  bool has_encoder() const override { return encoder_.has_value(); }
  bool has_decoder() const override { return decoder_.has_value(); }
  int temporal_factor() const override {
    // diffusers encodes 4 frames a chunk: only a factor of 4 maps chunks to latent frames.
    return config_.temporal_factor() == 4 ? 4 : 1;
  }

  // sample: [N, 3, H, W] -> raw latent mean [N, z_dim, H/f, W/f]
  Result<Tensor> encode(const Tensor& sample) override {
    LATENT_TRY(require(true));
    LATENT_TRY(vae_common::check_encode_sample(*backend_, sample, config_.image_channels(),
                                               config_.downsample())
                   .with_context("qwen-image vae"));
    auto r = encoder_->forward(*backend_, sample, nullptr);
    if (!r.ok()) return r.status().with_context("qwen-image vae encode");
    return r;
  }

  // latent: raw [N, z_dim, h, w] -> [N, 3, h*f, w*f]
  Result<Tensor> decode(const Tensor& latent) override {
    LATENT_TRY(require(false));
    LATENT_TRY(vae_common::check_decode_latent(*backend_, latent, config_.z_dim)
                   .with_context("qwen-image vae"));
    auto r = decoder_->forward(*backend_, latent, nullptr);
    if (!r.ok()) return r.status().with_context("qwen-image vae decode");
    return r;
  }

  Result<std::unique_ptr<VaeStream>> open_stream(bool encoder) override {
    if (temporal_factor() != 4)
      return Status::errorf(info_.architecture, " from ", info_.source.given,
                            " has no video mode: its temperal_downsample gives a temporal factor "
                            "of ",
                            config_.temporal_factor(), ", diffusers' 4-frame chunks need 4");
    LATENT_TRY(require(encoder));
    return std::unique_ptr<VaeStream>(new WanStream(*this, encoder));
  }

  const QwenImageVaeConfig& config() const { return config_; }
  const Encoder& encoder_net() const { return *encoder_; }
  const Decoder& decoder_net() const { return *decoder_; }

 private:
  Status require(bool encoder) const {
    if (encoder ? !encoder_ : !decoder_)
      return Status::errorf(info_.architecture, " from ", info_.source.given,
                            " was loaded without its ", encoder ? "encoder" : "decoder");
    return ok_status();
  }

  QwenImageVaeConfig config_;
  ModelInfo info_;
  std::optional<Encoder> encoder_;
  std::optional<Decoder> decoder_;
};

Result<Tensor> WanStream::run_clip(Clip& clip, const Tensor& frames) {
  Backend& b = model_.backend();
  std::vector<Tensor> outs;
  if (encoder_) {
    const Encoder& net = model_.encoder_net();
    Tensor pending = frames;
    if (clip.pending.defined()) {
      LATENT_ASSIGN_OR_RETURN(pending, join_frames(b, {clip.pending, frames}));
    }
    int64_t at = 0;
    for (;;) {
      const int64_t need = clip.chunks == 0 ? 1 : 4;  // frame 0 alone, then 4 frames a chunk
      if (pending.dim(0) - at < need) break;
      LATENT_ASSIGN_OR_RETURN(Tensor y, net.forward(b, frame_view(pending, at, need), &clip.cache));
      outs.push_back(std::move(y));
      at += need;
      ++clip.chunks;
    }
    clip.pending = Tensor();
    if (at < pending.dim(0)) {
      // the rest (at most 3 frames) in storage of its own
      LATENT_ASSIGN_OR_RETURN(clip.pending,
                              join_frames(b, {frame_view(pending, at, pending.dim(0) - at)}));
    }
  } else {
    const Decoder& net = model_.decoder_net();
    for (int64_t t = 0; t < frames.dim(0); ++t) {  // one latent frame a chunk
      LATENT_ASSIGN_OR_RETURN(
          Tensor y, net.forward(b, frame_view(frames, t, 1), &clip.cache, clip.chunks == 0));
      outs.push_back(std::move(y));
      ++clip.chunks;
    }
  }
  if (outs.empty()) return Tensor();
  if (outs.size() == 1) return outs[0];
  return join_frames(b, outs);
}

Result<Tensor> WanStream::push(const Tensor& x) {
  const char* what = encoder_ ? "encoder stream" : "decoder stream";
  const QwenImageVaeConfig& c = model_.config();
  Backend& b = model_.backend();
  const int64_t channels = encoder_ ? c.image_channels() : c.z_dim;
  if (!x.defined() || x.rank() != 5 || x.dim(1) != channels || x.dim(0) < 1 || x.dim(2) < 1 ||
      x.dim(3) < 1 || x.dim(4) < 1)
    return Status::errorf(what, ": expected [N, ", channels, ", T, H, W], got ",
                          x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  if (x.device() != b.device())
    return Status::errorf(what, ": input is on ", x.device().to_string(), ", the model on ",
                          b.name());
  if (encoder_ && (x.dim(3) % c.downsample() != 0 || x.dim(4) % c.downsample() != 0))
    return Status::errorf(what, ": frame size ", x.dim(4), "x", x.dim(3), " is not a multiple of ",
                          c.downsample(), " (the VAE's downsampling factor)");
  if (!shape_.empty() && (x.dim(0) != shape_[0] || x.dim(3) != shape_[3] || x.dim(4) != shape_[4]))
    return Status::errorf(what, ": this push is ", shape_str(x.shape()),
                          " but the clip began with ", shape_str(shape_),
                          " (batch, height and width must stay; reset() starts a new clip)");
  if (shape_.empty()) {
    shape_ = x.shape();
    const int slots = encoder_ ? model_.encoder_net().slots : model_.decoder_net().slots;
    for (int64_t n = 0; n < x.dim(0); ++n) clips_.emplace_back(slots);
  }
  std::vector<Tensor> outs;
  for (int64_t n = 0; n < x.dim(0); ++n) {
    Tensor clip = x;
    if (x.dim(0) > 1) {
      LATENT_ASSIGN_OR_RETURN(clip, b.slice(x, 0, n, 1));
    }
    // frames: [T, C, H, W]
    LATENT_ASSIGN_OR_RETURN(Tensor frames, b.clip_to_frames(clip));
    auto y = run_clip(clips_[n], frames);
    if (!y.ok()) {
      reset();  // the caches are half-updated: the clip cannot go on
      return y.status().with_context(str_cat(what, " of ", model_.info().architecture));
    }
    if (!y->defined()) continue;
    LATENT_ASSIGN_OR_RETURN(Tensor out, b.frames_to_clip(*y));
    outs.push_back(std::move(out));
  }
  seen_ += x.dim(2);
  buffered_ =
      encoder_ && clips_[0].pending.defined() ? static_cast<int>(clips_[0].pending.dim(0)) : 0;
  if (outs.empty()) return Tensor();
  if (outs.size() == 1) return outs[0];
  return b.concat(outs, 0);
}

Result<Tensor> WanStream::finish(int* padded_frames) {
  if (padded_frames) *padded_frames = 0;
  if (!encoder_ || buffered_ == 0) {
    reset();
    return Tensor();
  }
  // Complete the partial chunk by repeating its last frame.
  Backend& b = model_.backend();
  const int pad = 4 - buffered_;
  std::vector<Tensor> outs;
  for (Clip& clip : clips_) {
    std::vector<Tensor> parts{clip.pending};
    const Tensor last = frame_view(clip.pending, clip.pending.dim(0) - 1, 1);
    for (int i = 0; i < pad; ++i) parts.push_back(last);
    LATENT_ASSIGN_OR_RETURN(Tensor chunk, join_frames(b, parts));
    clip.pending = Tensor();
    auto y = run_clip(clip, chunk);
    if (!y.ok()) {
      reset();
      return y.status().with_context(
          str_cat("finishing the encoder stream of ", model_.info().architecture));
    }
    LATENT_ASSIGN_OR_RETURN(Tensor out, b.frames_to_clip(*y));
    outs.push_back(std::move(out));
  }
  reset();
  if (padded_frames) *padded_frames = pad;
  if (outs.size() == 1) return outs[0];
  return b.concat(outs, 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

Result<std::unique_ptr<VaeModel>> load_qwen_image_vae(const ModelSource& source,
                                                      const Config* config,
                                                      const WeightStore& weights,
                                                      std::shared_ptr<Backend> backend,
                                                      const VaeLoadOptions& options) {
  const std::string where = source.given.empty() ? weights.path() : source.given;
  if (!backend) return Status::errorf("loading ", where, ": no backend");
  if (!options.encoder && !options.decoder)
    return Status::errorf("loading ", where, ": neither the encoder nor the decoder was asked for");

  LATENT_ASSIGN_OR_RETURN(QwenImageVaeLayout layout, detect_qwen_image_vae_layout(weights));
  QwenImageVaeConfig cfg;
  if (config) {
    LATENT_ASSIGN_OR_RETURN(cfg, parse_qwen_image_vae_config(*config));
  } else {
    LATENT_ASSIGN_OR_RETURN(cfg, infer_qwen_image_vae_config(weights, layout));
  }
  if (layout.residual != cfg.is_residual)
    return Status::errorf(
        "loading ", where, ": ", config ? config->path() : std::string("the configuration"),
        cfg.is_residual ? " describes the Wan 2.2 VAE (is_residual) but the weights are a Wan 2.1 "
                          "/ Qwen-Image VAE"
                        : " describes a Wan 2.1 / Qwen-Image VAE but the weights are the Wan 2.2 "
                          "VAE (residual down/up blocks); set \"is_residual\": true");
  const int64_t nrb = cfg.num_res_blocks;
  const bool residual = cfg.is_residual;
  auto rename = [layout, nrb, residual](const std::string& n) {
    return layout.prefix + (layout.original ? qwen_image_vae_original_name(n, nrb, residual) : n);
  };

  WeightBinder binder(weights, *backend, rename);
  ModelInfo info;
  std::optional<Encoder> encoder;
  std::optional<Decoder> decoder;
  Status param_status;
  if (options.encoder) {
    ParamLoader params(binder, *backend);
    const int64_t before = binder.parameters_taken();
    encoder = Encoder::load(params, cfg);
    info.parts.push_back({"encoder", binder.parameters_taken() - before});
    param_status = params.status();
  } else {
    binder.ignore_prefix(rename("encoder."));
    binder.ignore_prefix(rename("quant_conv.weight"));
    binder.ignore_prefix(rename("quant_conv.bias"));
  }
  if (options.decoder) {
    ParamLoader params(binder, *backend);
    const int64_t before = binder.parameters_taken();
    decoder = Decoder::load(params, cfg);
    info.parts.push_back({"decoder", binder.parameters_taken() - before});
    if (param_status.ok()) param_status = params.status();
  } else {
    binder.ignore_prefix(rename("decoder."));
    binder.ignore_prefix(rename("post_quant_conv.weight"));
    binder.ignore_prefix(rename("post_quant_conv.bias"));
  }
  // A single file has no class name: the Wan 2.2 VAE is only ever AutoencoderKLWan.
  const std::string cls = config && !config->class_name().empty() ? config->class_name()
                          : cfg.is_residual                       ? "AutoencoderKLWan"
                                                                  : "AutoencoderKLQwenImage";
  const std::string context = str_cat("loading ", cls, " from ", where);
  LATENT_TRY(binder.finish().with_context(context));
  LATENT_TRY(param_status.with_context(context));

  const std::string space =
      qwen_image_latent_space_name(cfg.latents_mean, cfg.latents_std, cfg.is_residual);
  info.architecture = cls;
  info.variant = str_cat(space, " (", cfg.is_residual ? "Wan 2.2 VAE, " : "", "base_dim ",
                         cfg.base_dim, ", z_dim ", cfg.z_dim,
                         cfg.patch_size > 1 ? str_cat(", patch_size ", cfg.patch_size) : "", ")");
  info.source = source;
  info.storage_dtypes = binder.storage_dtypes();
  info.latent_space = LatentSpace::from_mean_std(
      space, static_cast<int>(cfg.z_dim), cfg.downsample(), cfg.latents_mean, cfg.latents_std);
  info.description = describe_qwen_image_vae(cfg, layout, config ? config->path() : "");
  LATENT_INFO("loaded ", cls, " (", info.variant, ") from ", where, " onto ", backend->name());

  return std::unique_ptr<VaeModel>(new QwenImageVae(
      std::move(backend), std::move(cfg), std::move(info), std::move(encoder), std::move(decoder)));
}

}  // namespace latent
