// diffusers AutoencoderKLQwenImage on single frames; see qwen_image.h for why it is 2-D here.
//
// What diffusers does with a 1-frame input [N, 3, 1, H, W] (autoencoder_kl_qwenimage.py):
//  - _encode runs the encoder on frame 0 alone with an empty feat_cache; every
//    QwenImageCausalConv3d then pads 2 zero frames in front (no cache yet), so of its 3 temporal
//    taps only weight[:, :, -1] meets data. 1x1x1 convs (conv_shortcut, quant_conv) are plain.
//  - QwenImageResample "downsample3d" stores the frame in the cache and skips time_conv when the
//    cache slot is empty: it equals "downsample2d" (ZeroPad2d(0, 1, 0, 1) + 3x3 stride-2 conv).
//  - _decode applies post_quant_conv, then the decoder on frame 0 with an empty cache;
//    "upsample3d" marks its slot "Rep" and skips time_conv: it equals "upsample2d"
//    (nearest-exact 2x, which for an exact factor 2 is plain nearest, then a 3x3 conv).
//  - the decoded frame is clamped to [-1, 1]; encode's mean is the first z_dim channels of
//    quant_conv's 2 * z_dim outputs, so only those rows of quant_conv are kept.
#include "engine/models/vae/qwen_image.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <optional>
#include <variant>

#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/vae_common.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

using vae_common::starts_with;

bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// ---------------------------------------------------------------------------------------------
// Parameters

// A 2-D convolution: an nn.Conv2d, or the last temporal tap of a QwenImageCausalConv3d.
struct Conv {
  Tensor weight;  // [Cout, Cin, k, k]
  Tensor bias;    // [Cout]
  Conv2dParams params;

  // x: [N, Cin, H, W] -> [N, Cout, Ho, Wo]; y = act(conv(x) + bias + residual)
  Result<Tensor> forward(Backend& b, const Tensor& x, const Tensor& residual = Tensor(),
                         Activation act = Activation::kNone) const {
    return b.conv2d(x, weight, bias, params, residual, act);
  }
};

// Takes parameters through the binder; slices 3-D kernels on the host before uploading them.
class ParamLoader {
 public:
  ParamLoader(WeightBinder& binder, Backend& backend) : binder_(binder), backend_(backend) {}

  // QwenImageCausalConv3d(in, out, k, padding=k/2): weight [out, in, k, k, k] -> its last
  // temporal slice [out, in, k, k]. `rows` keeps only output channels [0, rows) (0: all).
  Conv causal_conv(const std::string& prefix, int64_t in, int64_t out, int k, int64_t rows = 0) {
    Conv c;
    c.params = Conv2dParams::same(k);
    const int64_t keep = rows > 0 ? rows : out;
    Tensor w = binder_.take_host(prefix + ".weight", {out, in, k, k, k});
    Tensor b = binder_.take_host(prefix + ".bias", {out});
    if (w.defined()) {
      // w: [out, in, k, k, k] -> [keep, in, k, k] at t = k - 1
      Tensor s = Tensor::empty({keep, in, k, k}, DType::kF32);
      const float* src = w.data_as<const float>();
      float* dst = s.data_as<float>();
      const int64_t plane = int64_t{k} * k;
      for (int64_t oi = 0; oi < keep * in; ++oi) {
        const float* tap = src + (oi * k + (k - 1)) * plane;
        std::copy(tap, tap + plane, dst + oi * plane);
      }
      c.weight = upload(s, prefix + ".weight");
    }
    if (b.defined()) {
      // b: [out] -> [keep]
      Tensor s = Tensor::from_floats(
          {keep}, std::vector<float>(b.data_as<const float>(), b.data_as<const float>() + keep));
      c.bias = upload(s, prefix + ".bias");
    }
    return c;
  }

  // nn.Conv2d(in, out, k) with explicit padding/stride.
  Conv conv2d(const std::string& prefix, int64_t in, int64_t out, int k, Conv2dParams params) {
    Conv c;
    c.params = params;
    c.weight = binder_.take(prefix + ".weight", {out, in, k, k});
    c.bias = binder_.take(prefix + ".bias", {out});
    return c;
  }

  // QwenImageRMS_norm gamma: [C, 1, 1, 1] (images=False) or [C, 1, 1] (images=True) -> [C].
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

  // The temporal convolution of a 3-D resampler: checked and marked as used, never run on a
  // single frame (diffusers skips it for the first chunk).
  void unused_time_conv(const std::string& prefix, int64_t in, int64_t out) {
    binder_.take_host(prefix + ".weight", {out, in, 3, 1, 1});
    binder_.take_host(prefix + ".bias", {out});
  }

  Status status() const { return status_; }

 private:
  Tensor upload(const Tensor& host, const std::string& name) {
    auto t = backend_.upload(host);
    if (!t.ok()) {
      note(t.status().with_context(str_cat("uploading '", name, "' to ", backend_.name())));
      return Tensor();
    }
    return std::move(t).value();
  }
  void note(const Status& s) {
    if (status_.ok()) status_ = s;
  }

  WeightBinder& binder_;
  Backend& backend_;
  Status status_;
};

// ---------------------------------------------------------------------------------------------
// Blocks

// QwenImageResidualBlock: norm1 -> SiLU -> conv1 -> norm2 -> SiLU -> conv2, + shortcut(x).
struct ResidualBlock {
  Tensor norm1, norm2;
  Conv conv1, conv2;
  std::optional<Conv> conv_shortcut;  // 1x1x1 when in != out

  static ResidualBlock load(ParamLoader& p, const std::string& prefix, int64_t in, int64_t out) {
    ResidualBlock r;
    r.norm1 = p.norm_gamma(prefix + ".norm1.gamma", in, /*images=*/false);
    r.conv1 = p.causal_conv(prefix + ".conv1", in, out, 3);
    r.norm2 = p.norm_gamma(prefix + ".norm2.gamma", out, /*images=*/false);
    r.conv2 = p.causal_conv(prefix + ".conv2", out, out, 3);
    if (in != out) r.conv_shortcut = p.causal_conv(prefix + ".conv_shortcut", in, out, 1);
    return r;
  }

  // x: [N, Cin, H, W] -> [N, Cout, H, W]
  Result<Tensor> forward(Backend& b, const Tensor& x) const {
    Tensor h = x;
    if (conv_shortcut) {
      LATENT_ASSIGN_OR_RETURN(h, conv_shortcut->forward(b, x));
    }
    LATENT_ASSIGN_OR_RETURN(Tensor y, b.rms_norm_channels(x, norm1, Tensor(), Activation::kSiLU));
    LATENT_ASSIGN_OR_RETURN(y, conv1.forward(b, y));
    LATENT_ASSIGN_OR_RETURN(y, b.rms_norm_channels(y, norm2, Tensor(), Activation::kSiLU));
    // dropout is the identity at inference
    return conv2.forward(b, y, h);
  }
};

// QwenImageAttentionBlock: single-head self-attention over the pixels of each frame.
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

  // x: [N, C, H, W] -> [N, C, H, W]
  Result<Tensor> forward(Backend& b, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, b.rms_norm_channels(x, norm, Tensor()));
    // qkv: [N, 3C, H, W]; diffusers chunks the 3C channels of each pixel into q, k, v.
    LATENT_ASSIGN_OR_RETURN(Tensor qkv, to_qkv.forward(b, h));
    LATENT_ASSIGN_OR_RETURN(Tensor q, b.slice_channels(qkv, 0, dim));
    LATENT_ASSIGN_OR_RETURN(Tensor k, b.slice_channels(qkv, dim, dim));
    LATENT_ASSIGN_OR_RETURN(Tensor v, b.slice_channels(qkv, 2 * dim, dim));
    LATENT_ASSIGN_OR_RETURN(Tensor o, b.spatial_attention(q, k, v, /*heads=*/1));
    return proj.forward(b, o, x);
  }
};

// QwenImageResample in its 2-D form (the 3-D modes equal it on the first frame).
struct Resample {
  bool up = false;
  Conv conv;

  static Resample load(ParamLoader& p, const std::string& prefix, int64_t dim, bool up,
                       bool temporal) {
    Resample r;
    r.up = up;
    if (up) {
      r.conv = p.conv2d(prefix + ".resample.1", dim, dim / 2, 3, Conv2dParams::same(3));
      if (temporal) p.unused_time_conv(prefix + ".time_conv", dim, dim * 2);
    } else {
      // ZeroPad2d((0, 1, 0, 1)) then a 3x3 stride-2 conv without padding.
      Conv2dParams params;
      params.stride = 2;
      params.pad_bottom = params.pad_right = 1;
      r.conv = p.conv2d(prefix + ".resample.1", dim, dim, 3, params);
      if (temporal) p.unused_time_conv(prefix + ".time_conv", dim, dim);
    }
    return r;
  }

  // x: [N, C, H, W] -> up: [N, C/2, 2H, 2W]; down: [N, C, H/2, W/2]
  Result<Tensor> forward(Backend& b, const Tensor& x) const {
    if (!up) return conv.forward(b, x);
    LATENT_ASSIGN_OR_RETURN(Tensor u, b.upsample_nearest2x(x));
    return conv.forward(b, u);
  }
};

// QwenImageMidBlock with num_layers = 1: resnet, attention, resnet.
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

  // x: [N, C, H, W] -> [N, C, H, W]
  Result<Tensor> forward(Backend& b, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, res0.forward(b, x));
    LATENT_ASSIGN_OR_RETURN(h, attn.forward(b, h));
    return res1.forward(b, h);
  }
};

// QwenImageEncoder3d followed by the mean half of quant_conv.
struct Encoder {
  // attn_scales would add attention blocks here; validate_config() refuses them (see there).
  using Layer = std::variant<ResidualBlock, Resample>;
  Conv conv_in;
  std::vector<Layer> down_blocks;
  MidBlock mid_block;
  Tensor norm_out;
  Conv conv_out;
  Conv quant_mean;  // quant_conv rows [0, z_dim)

  static Encoder load(ParamLoader& p, const QwenImageVaeConfig& c) {
    Encoder e;
    const auto& m = c.dim_mult;
    std::vector<int64_t> dims{c.base_dim};
    for (int64_t u : m) dims.push_back(c.base_dim * u);
    e.conv_in = p.causal_conv("encoder.conv_in", c.input_channels, dims[0], 3);
    int64_t out_dim = dims[0];
    for (size_t i = 0; i < m.size(); ++i) {
      int64_t in_dim = dims[i];
      out_dim = dims[i + 1];
      for (int64_t r = 0; r < c.num_res_blocks; ++r) {
        const std::string prefix = str_cat("encoder.down_blocks.", e.down_blocks.size());
        e.down_blocks.emplace_back(ResidualBlock::load(p, prefix, in_dim, out_dim));
        in_dim = out_dim;
      }
      if (i + 1 != m.size()) {
        const std::string prefix = str_cat("encoder.down_blocks.", e.down_blocks.size());
        e.down_blocks.emplace_back(
            Resample::load(p, prefix, out_dim, /*up=*/false, c.temperal_downsample[i]));
      }
    }
    e.mid_block = MidBlock::load(p, "encoder.mid_block", out_dim);
    e.norm_out = p.norm_gamma("encoder.norm_out.gamma", out_dim, /*images=*/false);
    e.conv_out = p.causal_conv("encoder.conv_out", out_dim, 2 * c.z_dim, 3);
    e.quant_mean = p.causal_conv("quant_conv", 2 * c.z_dim, 2 * c.z_dim, 1, /*rows=*/c.z_dim);
    return e;
  }

  // x: [N, 3, H, W] -> mean [N, z_dim, H/f, W/f]
  Result<Tensor> forward(Backend& b, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, conv_in.forward(b, x));
    for (const Layer& layer : down_blocks) {
      // h: [N, C, H', W']
      LATENT_ASSIGN_OR_RETURN(h, std::visit([&](const auto& l) { return l.forward(b, h); }, layer));
    }
    LATENT_ASSIGN_OR_RETURN(h, mid_block.forward(b, h));
    LATENT_ASSIGN_OR_RETURN(h, b.rms_norm_channels(h, norm_out, Tensor(), Activation::kSiLU));
    LATENT_ASSIGN_OR_RETURN(h, conv_out.forward(b, h));
    return quant_mean.forward(b, h);
  }
};

// QwenImageUpBlock: num_res_blocks + 1 resnets and an optional upsampler.
struct UpBlock {
  std::vector<ResidualBlock> resnets;
  std::optional<Resample> upsampler;

  // x: [N, Cin, H, W] -> [N, Cout (/2 when upsampling), H (*2), W (*2)]
  Result<Tensor> forward(Backend& b, const Tensor& x) const {
    Tensor h = x;
    for (const auto& r : resnets) {
      LATENT_ASSIGN_OR_RETURN(h, r.forward(b, h));
    }
    if (upsampler) return upsampler->forward(b, h);
    return h;
  }
};

// post_quant_conv followed by QwenImageDecoder3d.
struct Decoder {
  Conv post_quant_conv;
  Conv conv_in;
  MidBlock mid_block;
  std::vector<UpBlock> up_blocks;
  Tensor norm_out;
  Conv conv_out;

  static Decoder load(ParamLoader& p, const QwenImageVaeConfig& c) {
    Decoder d;
    const auto& m = c.dim_mult;
    std::vector<int64_t> dims{c.base_dim * m.back()};
    for (auto it = m.rbegin(); it != m.rend(); ++it) dims.push_back(c.base_dim * *it);
    d.post_quant_conv = p.causal_conv("post_quant_conv", c.z_dim, c.z_dim, 1);
    d.conv_in = p.causal_conv("decoder.conv_in", c.z_dim, dims[0], 3);
    d.mid_block = MidBlock::load(p, "decoder.mid_block", dims[0]);
    int64_t out_dim = dims[0];
    for (size_t i = 0; i < m.size(); ++i) {
      int64_t in_dim = i > 0 ? dims[i] / 2 : dims[i];
      out_dim = dims[i + 1];
      UpBlock u;
      const std::string prefix = str_cat("decoder.up_blocks.", i);
      for (int64_t r = 0; r <= c.num_res_blocks; ++r) {
        u.resnets.push_back(
            ResidualBlock::load(p, str_cat(prefix, ".resnets.", r), in_dim, out_dim));
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
    d.conv_out = p.causal_conv("decoder.conv_out", out_dim, c.input_channels, 3);
    return d;
  }

  // z: [N, z_dim, h, w] -> [N, 3, h*f, w*f] in [-1, 1]
  Result<Tensor> forward(Backend& b, const Tensor& z) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, post_quant_conv.forward(b, z));
    LATENT_ASSIGN_OR_RETURN(h, conv_in.forward(b, h));
    LATENT_ASSIGN_OR_RETURN(h, mid_block.forward(b, h));
    for (const auto& u : up_blocks) {
      // h: [N, C, H', W']
      LATENT_ASSIGN_OR_RETURN(h, u.forward(b, h));
    }
    LATENT_ASSIGN_OR_RETURN(h, b.rms_norm_channels(h, norm_out, Tensor(), Activation::kSiLU));
    LATENT_ASSIGN_OR_RETURN(h, conv_out.forward(b, h));
    return b.clamp(h, -1.f, 1.f);
  }
};

// ---------------------------------------------------------------------------------------------
// The model

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

  // sample: [N, 3, H, W] -> raw latent mean [N, z_dim, H/f, W/f]
  Result<Tensor> encode(const Tensor& sample) override {
    if (!encoder_)
      return Status::errorf("qwen-image vae from ", info_.source.given,
                            " was loaded without its encoder");
    LATENT_TRY(
        check_input(sample, "encode", config_.input_channels, config_.downsample(), "image"));
    auto r = encoder_->forward(*backend_, sample);
    if (!r.ok()) return r.status().with_context("qwen-image vae encode");
    return r;
  }

  // latent: raw [N, z_dim, h, w] -> [N, 3, h*f, w*f]
  Result<Tensor> decode(const Tensor& latent) override {
    if (!decoder_)
      return Status::errorf("qwen-image vae from ", info_.source.given,
                            " was loaded without its decoder");
    LATENT_TRY(check_input(latent, "decode", config_.z_dim, 1, "latent"));
    auto r = decoder_->forward(*backend_, latent);
    if (!r.ok()) return r.status().with_context("qwen-image vae decode");
    return r;
  }

 private:
  Status check_input(const Tensor& x, const char* what, int64_t channels, int multiple,
                     const char* kind) const {
    if (!x.defined()) return Status::errorf("qwen-image vae ", what, ": no input tensor");
    if (x.rank() != 4 || x.dim(1) != channels)
      return Status::errorf("qwen-image vae ", what, ": expected an ", kind, " of shape [N, ",
                            channels, ", H, W], got ", shape_str(x.shape()));
    if (x.dim(0) < 1 || x.dim(2) < 1 || x.dim(3) < 1)
      return Status::errorf("qwen-image vae ", what, ": empty input ", shape_str(x.shape()));
    if (x.dim(2) % multiple != 0 || x.dim(3) % multiple != 0)
      return Status::errorf("qwen-image vae ", what, ": height and width must be multiples of ",
                            multiple, ", got ", shape_str(x.shape()));
    if (x.device() != backend_->device())
      return Status::errorf("qwen-image vae ", what, ": input is on ", x.device().to_string(),
                            ", the model on ", backend_->name());
    return ok_status();
  }

  QwenImageVaeConfig config_;
  ModelInfo info_;
  std::optional<Encoder> encoder_;
  std::optional<Decoder> decoder_;
};

// ---------------------------------------------------------------------------------------------
// Checkpoint layouts

// Original (Wan-Video) names of the pieces of a residual block.
std::string original_resnet_leaf(const std::string& leaf) {
  static const std::pair<const char*, const char*> kTable[] = {
      {"norm1.", "residual.0."}, {"conv1.", "residual.2."},       {"norm2.", "residual.3."},
      {"conv2.", "residual.6."}, {"conv_shortcut.", "shortcut."},
  };
  for (const auto& [from, to] : kTable) {
    if (starts_with(leaf, from)) return to + leaf.substr(std::char_traits<char>::length(from));
  }
  return leaf;
}

// If `s` starts with `head` followed by "<digits>.", strips both and returns the number.
bool strip_index(std::string* s, const std::string& head, int64_t* index) {
  if (!starts_with(*s, head)) return false;
  size_t pos = head.size(), end = pos;
  while (end < s->size() && end - pos < 9 && std::isdigit(static_cast<unsigned char>((*s)[end])))
    ++end;
  if (end == pos || end >= s->size() || (*s)[end] != '.') return false;
  *index = std::stoll(s->substr(pos, end - pos));
  *s = s->substr(end + 1);
  return true;
}

Shape stored_shape(const WeightStore& w, const std::string& name) {
  const TensorRecord* r = w.find(name);
  return r ? r->shape : Shape{};
}

const std::vector<std::string>& original_markers() {
  static const std::vector<std::string> k = {"decoder.middle.0.residual.0.gamma",
                                             "encoder.middle.0.residual.0.gamma"};
  return k;
}
const std::vector<std::string>& diffusers_markers() {
  static const std::vector<std::string> k = {"decoder.mid_block.resnets.0.norm1.gamma",
                                             "encoder.mid_block.resnets.0.norm1.gamma"};
  return k;
}

bool nearly_equal(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i] - b[i]) > 1e-6 * std::max(1.0, std::fabs(b[i]))) return false;
  }
  return true;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// One entry of a flattened down/up sequence read from the weights.
struct ScannedLayer {
  enum Kind { kResidual, kAttention, kResample } kind;
  int64_t out = 0;        // residual blocks: output channels
  bool temporal = false;  // resamplers: has time_conv
};

// Groups a scanned sequence into levels separated by resamplers.
struct ScannedLevel {
  int64_t resnets = 0;
  int64_t out = 0;
  bool attention = false;
  bool resample = false;
  bool temporal = false;
};

Result<std::vector<ScannedLevel>> group_levels(const std::vector<ScannedLayer>& seq,
                                               const std::string& what) {
  std::vector<ScannedLevel> levels(1);
  for (const auto& l : seq) {
    ScannedLevel& cur = levels.back();
    switch (l.kind) {
      case ScannedLayer::kResidual:
        if (cur.resnets > 0 && cur.out != l.out)
          return Status::errorf(what, ": residual blocks of one level have ", cur.out, " and ",
                                l.out, " output channels");
        cur.out = l.out;
        ++cur.resnets;
        break;
      case ScannedLayer::kAttention:
        cur.attention = true;
        break;
      case ScannedLayer::kResample:
        cur.resample = true;
        cur.temporal = l.temporal;
        levels.emplace_back();
        break;
    }
  }
  for (size_t i = 0; i < levels.size(); ++i) {
    if (levels[i].resnets == 0)
      return Status::errorf(what, ": level ", i, " has no residual blocks");
    if (levels[i].resnets != levels[0].resnets)
      return Status::errorf(what, ": levels have ", levels[0].resnets, " and ", levels[i].resnets,
                            " residual blocks");
  }
  return levels;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config

const std::vector<double>& qwen_image_latents_mean() {
  static const std::vector<double> k = {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,
                                        -0.1517, 1.5508,  0.4134,  -0.0715, 0.5517,  -0.3632,
                                        -0.1922, -0.9497, 0.2503,  -0.2921};
  return k;
}

const std::vector<double>& qwen_image_latents_std() {
  static const std::vector<double> k = {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708,
                                        2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                                        1.6382, 1.1253, 2.8251, 1.9160};
  return k;
}

std::string qwen_image_latent_space_name(const std::vector<double>& mean,
                                         const std::vector<double>& std) {
  if (nearly_equal(mean, qwen_image_latents_mean()) && nearly_equal(std, qwen_image_latents_std()))
    return "qwen-image";
  return "qwen-image-vae-custom";
}

namespace {

// Checks a config for the structure the model builder relies on.
Status validate_config(const QwenImageVaeConfig& c, const std::string& what) {
  auto bad = [&](auto&&... args) { return Status::errorf(what, ": ", args...); };
  if (c.base_dim < 1) return bad("'base_dim' must be positive, got ", c.base_dim);
  if (c.z_dim < 1) return bad("'z_dim' must be positive, got ", c.z_dim);
  if (c.dim_mult.empty() || c.dim_mult.size() > 8)
    return bad("'dim_mult' must have 1 to 8 entries, got ", c.dim_mult.size());
  for (int64_t m : c.dim_mult)
    if (m < 1) return bad("'dim_mult' entries must be positive, got ", join(c.dim_mult));
  if (c.num_res_blocks < 1) return bad("'num_res_blocks' must be positive, got ", c.num_res_blocks);
  if (c.temperal_downsample.size() + 1 < c.dim_mult.size())
    return bad("'temperal_downsample' has ", c.temperal_downsample.size(), " entries, ",
               c.dim_mult.size() - 1, " needed for dim_mult ", join(c.dim_mult));
  if (c.input_channels < 1) return bad("'input_channels' must be positive");
  // diffusers (and the original Wan code) put an attention block after each residual block of a
  // down level whose scale is in attn_scales, then call it with the causal cache arguments it
  // does not take: such a model cannot encode there, so there is nothing to match.
  double scale = 1.0;
  for (size_t i = 0; i < c.dim_mult.size(); ++i, scale /= 2.0) {
    if (std::find(c.attn_scales.begin(), c.attn_scales.end(), scale) != c.attn_scales.end())
      return bad("'attn_scales' puts attention blocks in encoder level ", i, " (scale ", scale,
                 "); AutoencoderKLQwenImage cannot run those (QwenImageAttentionBlock.forward "
                 "takes no feature cache), so they are not supported");
  }
  if (c.latents_mean.size() != static_cast<size_t>(c.z_dim) ||
      c.latents_std.size() != static_cast<size_t>(c.z_dim))
    return bad("'latents_mean' and 'latents_std' must have z_dim = ", c.z_dim, " entries, got ",
               c.latents_mean.size(), " and ", c.latents_std.size());
  for (double s : c.latents_std)
    if (!(s > 0.0) || !std::isfinite(s)) return bad("'latents_std' entries must be positive");
  for (double m : c.latents_mean)
    if (!std::isfinite(m)) return bad("'latents_mean' entries must be finite");
  return ok_status();
}

}  // namespace

Result<QwenImageVaeConfig> parse_qwen_image_vae_config(const Config& config) {
  const std::string what = config.path().empty() ? "config.json" : config.path();
  QwenImageVaeConfig c;
  const std::string cls = config.class_name();
  const bool wan = cls == "AutoencoderKLWan";
  if (!cls.empty() && cls != "AutoencoderKLQwenImage" && !wan)
    return Status::errorf(what, ": _class_name '", cls,
                          "' is not AutoencoderKLQwenImage or AutoencoderKLWan");
  if (wan) {
    // The Wan 2.2 VAE shares the class but patchifies its input and has residual down blocks.
    LATENT_ASSIGN_OR_RETURN(bool residual, config.get_bool("is_residual", false));
    if (residual || (config.has("patch_size") && !config.json()["patch_size"].is_null()))
      return Status::errorf(what,
                            ": AutoencoderKLWan with is_residual/patch_size (the Wan 2.2 "
                            "VAE) is not supported, only the Wan 2.1 layout");
  }
  LATENT_ASSIGN_OR_RETURN(c.base_dim, config.get_int("base_dim", c.base_dim));
  LATENT_ASSIGN_OR_RETURN(c.z_dim, config.get_int("z_dim", c.z_dim));
  LATENT_ASSIGN_OR_RETURN(c.dim_mult, config.get_int_list("dim_mult", c.dim_mult));
  LATENT_ASSIGN_OR_RETURN(c.num_res_blocks, config.get_int("num_res_blocks", c.num_res_blocks));
  LATENT_ASSIGN_OR_RETURN(c.attn_scales, config.get_float_list("attn_scales", {}));
  LATENT_ASSIGN_OR_RETURN(c.input_channels,
                          config.get_int(wan ? "in_channels" : "input_channels", 3));
  LATENT_ASSIGN_OR_RETURN(double dropout, config.get_float("dropout", 0.0));
  (void)dropout;  // identity at inference; read so that a malformed value is reported
  if (config.has("temperal_downsample")) {
    const auto& j = config.json()["temperal_downsample"];
    if (!j.is_array())
      return Status::errorf(what, ": 'temperal_downsample' must be a list of booleans");
    c.temperal_downsample.clear();
    for (const auto& e : j) {
      if (!e.is_boolean())
        return Status::errorf(what, ": 'temperal_downsample' must be a list of booleans");
      c.temperal_downsample.push_back(e.get<bool>());
    }
  }
  LATENT_ASSIGN_OR_RETURN(c.latents_mean,
                          config.get_float_list("latents_mean", qwen_image_latents_mean()));
  LATENT_ASSIGN_OR_RETURN(c.latents_std,
                          config.get_float_list("latents_std", qwen_image_latents_std()));
  LATENT_TRY(validate_config(c, what));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Layouts and single files

std::string qwen_image_vae_original_name(const std::string& name, int64_t num_res_blocks) {
  if (starts_with(name, "quant_conv.")) return "conv1." + name.substr(11);
  if (starts_with(name, "post_quant_conv.")) return "conv2." + name.substr(16);
  for (const std::string part : {"encoder.", "decoder."}) {
    if (!starts_with(name, part)) continue;
    std::string r = name.substr(part.size());
    int64_t i = 0, j = 0;
    if (starts_with(r, "conv_in.")) return part + "conv1." + r.substr(8);
    if (starts_with(r, "norm_out.")) return part + "head.0." + r.substr(9);
    if (starts_with(r, "conv_out.")) return part + "head.2." + r.substr(9);
    if (strip_index(&r, "mid_block.resnets.", &j))
      return str_cat(part, "middle.", 2 * j, ".", original_resnet_leaf(r));
    if (strip_index(&r, "mid_block.attentions.", &j))
      return str_cat(part, "middle.", 2 * j + 1, ".", r);
    if (strip_index(&r, "down_blocks.", &i))
      return str_cat(part, "downsamples.", i, ".", original_resnet_leaf(r));
    if (strip_index(&r, "up_blocks.", &i)) {
      // Each up level is num_res_blocks + 1 residual blocks and one resampler, flattened.
      const int64_t base = i * (num_res_blocks + 2);
      if (strip_index(&r, "resnets.", &j))
        return str_cat(part, "upsamples.", base + j, ".", original_resnet_leaf(r));
      if (strip_index(&r, "upsamplers.", &j))
        return str_cat(part, "upsamples.", base + num_res_blocks + 1, ".", r);
    }
    return name;
  }
  return name;
}

Result<QwenImageVaeLayout> detect_qwen_image_vae_layout(const WeightStore& weights) {
  std::optional<QwenImageVaeLayout> found;
  for (const std::string& n : weights.names()) {
    for (int original = 1; original >= 0; --original) {
      for (const auto& marker : original ? original_markers() : diffusers_markers()) {
        if (!ends_with(n, marker)) continue;
        std::string prefix = n.substr(0, n.size() - marker.size());
        if (!prefix.empty() && prefix.back() != '.') continue;
        if (!found || prefix.size() < found->prefix.size())
          found = QwenImageVaeLayout{original == 1, prefix};
      }
    }
  }
  if (!found)
    return Status::errorf(weights.path(),
                          ": no Qwen-Image / Wan VAE tensors (looked for "
                          "'decoder.middle.0.residual.0.gamma' or "
                          "'decoder.mid_block.resnets.0.norm1.gamma')");
  const std::string& p = found->prefix;
  // The Wan 2.2 VAE nests residual blocks in its down/up levels and patchifies the input.
  for (const char* wan22 :
       {"encoder.downsamples.0.downsamples.", "decoder.upsamples.0.upsamples.",
        "encoder.down_blocks.0.resnets.", "decoder.up_blocks.0.resnets.0.avg"}) {
    for (const std::string& n : weights.names()) {
      if (starts_with(n, p + wan22))
        return Status::errorf(weights.path(), ": '", n,
                              "' belongs to the Wan 2.2 VAE (residual down/up blocks), which is "
                              "not supported; use the Wan 2.1 / Qwen-Image VAE");
    }
  }
  return *found;
}

Result<QwenImageVaeConfig> infer_qwen_image_vae_config(const WeightStore& weights,
                                                       const QwenImageVaeLayout& layout) {
  const std::string what =
      str_cat(weights.path(), " (", layout.original ? "Wan-Video" : "diffusers", " key names)");
  // Encoder names do not depend on num_res_blocks.
  auto stored = [&](const std::string& n) {
    return layout.prefix + (layout.original ? qwen_image_vae_original_name(n, 2) : n);
  };
  auto shape_of = [&](const std::string& n) { return stored_shape(weights, stored(n)); };
  auto has = [&](const std::string& n) { return weights.contains(stored(n)); };
  auto need = [&](const std::string& n, size_t rank) -> Result<Shape> {
    Shape s = shape_of(n);
    if (s.empty())
      return Status::errorf(what, ": missing tensor '", stored(n),
                            "' needed to read the model size");
    if (s.size() != rank)
      return Status::errorf(what, ": tensor '", stored(n), "' has shape ", shape_str(s),
                            ", expected ", rank, " dimensions");
    return s;
  };

  QwenImageVaeConfig c;
  c.attn_scales.clear();
  if (has("encoder.conv_in.weight")) {
    LATENT_ASSIGN_OR_RETURN(Shape conv_in, need("encoder.conv_in.weight", 5));
    LATENT_ASSIGN_OR_RETURN(Shape conv_out, need("encoder.conv_out.weight", 5));
    c.base_dim = conv_in[0];
    c.input_channels = conv_in[1];
    if (conv_out[0] % 2 != 0)
      return Status::errorf(what, ": encoder output has ", conv_out[0],
                            " channels, expected 2 * z_dim");
    c.z_dim = conv_out[0] / 2;
    std::vector<ScannedLayer> seq;
    for (int64_t k = 0;; ++k) {
      const std::string p = str_cat("encoder.down_blocks.", k);
      if (has(p + ".norm1.gamma")) {
        LATENT_ASSIGN_OR_RETURN(Shape w, need(p + ".conv1.weight", 5));
        seq.push_back({ScannedLayer::kResidual, w[0], false});
      } else if (has(p + ".to_qkv.weight")) {
        seq.push_back({ScannedLayer::kAttention, 0, false});
      } else if (has(p + ".resample.1.weight")) {
        // Either time_conv tensor marks a 3-D resampler, so that a missing one is reported.
        seq.push_back({ScannedLayer::kResample, 0,
                       has(p + ".time_conv.weight") || has(p + ".time_conv.bias")});
      } else {
        break;
      }
    }
    LATENT_ASSIGN_OR_RETURN(auto levels, group_levels(seq, what + " encoder"));
    c.num_res_blocks = levels[0].resnets;
    c.dim_mult.clear();
    c.temperal_downsample.clear();
    double scale = 1.0;
    for (const auto& l : levels) {
      if (l.out % c.base_dim != 0)
        return Status::errorf(what, ": encoder level width ", l.out,
                              " is not a multiple of base_dim ", c.base_dim);
      c.dim_mult.push_back(l.out / c.base_dim);
      if (l.attention) c.attn_scales.push_back(scale);
      if (l.resample) c.temperal_downsample.push_back(l.temporal);
      scale /= 2.0;
    }
  } else if (has("decoder.conv_in.weight")) {
    LATENT_ASSIGN_OR_RETURN(Shape conv_in, need("decoder.conv_in.weight", 5));
    LATENT_ASSIGN_OR_RETURN(Shape conv_out, need("decoder.conv_out.weight", 5));
    c.z_dim = conv_in[1];
    c.input_channels = conv_out[0];
    std::vector<ScannedLayer> seq;
    const std::string p = layout.prefix;
    if (layout.original) {
      for (int64_t n = 0;; ++n) {
        const std::string q = str_cat(p, "decoder.upsamples.", n);
        if (weights.contains(q + ".residual.0.gamma")) {
          Shape w = stored_shape(weights, q + ".residual.2.weight");
          if (w.size() != 5)
            return Status::errorf(what, ": missing or misshaped '", q, ".residual.2.weight'");
          seq.push_back({ScannedLayer::kResidual, w[0], false});
        } else if (weights.contains(q + ".to_qkv.weight")) {
          seq.push_back({ScannedLayer::kAttention, 0, false});
        } else if (weights.contains(q + ".resample.1.weight")) {
          seq.push_back({ScannedLayer::kResample, 0,
                         weights.contains(q + ".time_conv.weight") ||
                             weights.contains(q + ".time_conv.bias")});
        } else {
          break;
        }
      }
    } else {
      for (int64_t i = 0;; ++i) {
        const std::string q = str_cat(p, "decoder.up_blocks.", i);
        int64_t j = 0;
        for (;; ++j) {
          Shape w = stored_shape(weights, str_cat(q, ".resnets.", j, ".conv1.weight"));
          if (w.size() != 5) break;
          seq.push_back({ScannedLayer::kResidual, w[0], false});
        }
        if (j == 0) break;
        if (weights.contains(q + ".upsamplers.0.resample.1.weight"))
          seq.push_back({ScannedLayer::kResample, 0,
                         weights.contains(q + ".upsamplers.0.time_conv.weight") ||
                             weights.contains(q + ".upsamplers.0.time_conv.bias")});
      }
    }
    LATENT_ASSIGN_OR_RETURN(auto levels, group_levels(seq, what + " decoder"));
    for (const auto& l : levels) {
      if (l.attention)
        return Status::errorf(what,
                              ": attention blocks in the decoder's up levels are not "
                              "supported (diffusers' AutoencoderKLQwenImage has none)");
    }
    if (levels[0].resnets < 2)
      return Status::errorf(what, ": decoder levels have ", levels[0].resnets,
                            " residual blocks, expected num_res_blocks + 1 >= 2");
    c.num_res_blocks = levels[0].resnets - 1;
    // Level i of the decoder has base_dim * dim_mult[L-1-i] channels; only the products are
    // known, so base_dim is their greatest common divisor.
    int64_t g = 0;
    for (const auto& l : levels) g = std::gcd(g, l.out);
    c.base_dim = g;
    c.dim_mult.clear();
    c.temperal_downsample.clear();
    for (auto it = levels.rbegin(); it != levels.rend(); ++it) {
      c.dim_mult.push_back(it->out / g);
      if (it->resample) c.temperal_downsample.push_back(it->temporal);
    }
  } else {
    return Status::errorf(what,
                          ": neither 'encoder.conv_in.weight' nor 'decoder.conv_in.weight' "
                          "found (as '",
                          stored("encoder.conv_in.weight"), "' / '",
                          stored("decoder.conv_in.weight"), "')");
  }
  if (c.z_dim == 16) {
    c.latents_mean = qwen_image_latents_mean();
    c.latents_std = qwen_image_latents_std();
  } else {
    // Unknown statistics: the identity normalisation, under a custom latent space name.
    c.latents_mean.assign(static_cast<size_t>(c.z_dim), 0.0);
    c.latents_std.assign(static_cast<size_t>(c.z_dim), 1.0);
  }
  LATENT_TRY(validate_config(c, what));
  return c;
}

bool is_qwen_image_vae_checkpoint(const WeightStore& weights) {
  for (const std::string& n : weights.names()) {
    for (const auto* markers : {&original_markers(), &diffusers_markers()}) {
      for (const auto& m : *markers) {
        if (!ends_with(n, m)) continue;
        const size_t plen = n.size() - m.size();
        if (plen == 0 || n[plen - 1] == '.') return true;
      }
    }
  }
  return false;
}

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
  const int64_t nrb = cfg.num_res_blocks;
  auto rename = [layout, nrb](const std::string& n) {
    return layout.prefix + (layout.original ? qwen_image_vae_original_name(n, nrb) : n);
  };

  WeightBinder binder(weights, *backend, rename);
  ParamLoader params(binder, *backend);
  ModelInfo info;
  std::optional<Encoder> encoder;
  std::optional<Decoder> decoder;
  if (options.encoder) {
    const int64_t before = binder.parameters_taken();
    encoder = Encoder::load(params, cfg);
    info.parts.push_back({"encoder", binder.parameters_taken() - before});
  } else {
    binder.ignore_prefix(rename("encoder."));
    binder.ignore_prefix(rename("quant_conv.weight"));
    binder.ignore_prefix(rename("quant_conv.bias"));
  }
  if (options.decoder) {
    const int64_t before = binder.parameters_taken();
    decoder = Decoder::load(params, cfg);
    info.parts.push_back({"decoder", binder.parameters_taken() - before});
  } else {
    binder.ignore_prefix(rename("decoder."));
    binder.ignore_prefix(rename("post_quant_conv.weight"));
    binder.ignore_prefix(rename("post_quant_conv.bias"));
  }
  const std::string context = str_cat("loading AutoencoderKLQwenImage from ", where);
  LATENT_TRY(binder.finish().with_context(context));
  LATENT_TRY(params.status().with_context(context));

  const std::string space = qwen_image_latent_space_name(cfg.latents_mean, cfg.latents_std);
  info.architecture = "AutoencoderKLQwenImage";
  info.variant = str_cat(space, " (base_dim ", cfg.base_dim, ", z_dim ", cfg.z_dim, ")");
  info.source = source;
  info.storage_dtypes = binder.storage_dtypes();
  info.latent_space = LatentSpace::from_mean_std(
      space, static_cast<int>(cfg.z_dim), cfg.downsample(), cfg.latents_mean, cfg.latents_std);
  std::string temporal;
  for (bool t : cfg.temperal_downsample)
    temporal += str_cat(temporal.empty() ? "" : ", ", t ? "true" : "false");
  std::string attn;
  for (double s : cfg.attn_scales) attn += str_cat(attn.empty() ? "" : ", ", s);
  info.description = str_cat(
      "key names: ", layout.original ? "Wan-Video / ComfyUI" : "diffusers",
      layout.prefix.empty() ? "" : str_cat(" under '", layout.prefix, "'"), "\n",
      "config: ", config ? config->path() : "inferred from the weights", "\n",
      "base_dim: ", cfg.base_dim, "\n", "z_dim: ", cfg.z_dim, "\n",
      "dim_mult: ", join(cfg.dim_mult), "\n", "num_res_blocks: ", cfg.num_res_blocks, "\n",
      "attn_scales: [", attn, "]\n", "temperal_downsample: [", temporal, "] (unused for images)\n",
      "input_channels: ", cfg.input_channels, "\n", "spatial downsample: ", cfg.downsample(), "\n",
      "latent space: ", space, " (normalised = (raw - latents_mean) / latents_std)");
  LATENT_INFO("loaded AutoencoderKLQwenImage (", info.variant, ") from ", where, " onto ",
              backend->name());

  return std::unique_ptr<VaeModel>(new QwenImageVae(
      std::move(backend), std::move(cfg), std::move(info), std::move(encoder), std::move(decoder)));
}

}  // namespace latent
