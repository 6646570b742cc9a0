// diffusers AutoencoderKL as diffusers computes it (models/autoencoders/autoencoder_kl.py,
// vae.py Encoder/Decoder, resnet.py ResnetBlock2D, Downsample2D, Upsample2D and the mid block's
// Attention). The attention's Linear projections run as 1x1 convolutions so that every tensor
// stays [N, C, H, W].
#include "engine/models/vae/autoencoder_kl.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>

#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/upsample_conv.h"
#include "engine/models/vae/vae_common.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

using vae_common::Conv;
using vae_common::fmt_g;
using vae_common::has_prefix;
using vae_common::starts_with;

constexpr float kEps = 1e-6f;  // every GroupNorm of the KL autoencoder (resnet_eps)

std::string basename_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string join_from(const std::vector<std::string>& parts, size_t from) {
  std::string out;
  for (size_t i = from; i < parts.size(); ++i) out += (i > from ? "." : "") + parts[i];
  return out;
}

bool parse_index(const std::string& s, int* out) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *out = std::stoi(s);
  return true;
}

bool near(double a, double b) { return std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b)); }

// ---------------------------------------------------------------------------------------------
// Parameters: every tensor is asked for by its diffusers name through the binder.

struct Norm {
  Tensor gamma, beta;
  int groups = 32;
  // x: [N, C, H, W]
  Result<Tensor> operator()(Backend& be, const Tensor& x,
                            Activation act = Activation::kNone) const {
    return be.group_norm(x, groups, gamma, beta, kEps, act);
  }
};

class Params {
 public:
  Params(WeightBinder& binder, const WeightStore& store, Backend& backend,
         std::function<std::string(const std::string&)> rename, int groups)
      : binder_(binder),
        store_(store),
        backend_(backend),
        rename_(std::move(rename)),
        groups_(groups) {}

  Conv conv(const std::string& name, int64_t cout, int64_t cin, int k, Conv2dParams p) {
    return vae_common::load_conv(binder_, name, cout, cin, k, true, p);
  }
  // Upsample2D's conv (3x3, after the nearest 2x upsampling: upsample_conv.h).
  UpsampleConv upsample_conv(const std::string& name, int64_t cout, int64_t cin) {
    return load_upsample_conv(binder_, name, cout, cin, /*bias=*/true);
  }
  Norm norm(const std::string& name, int64_t channels) {
    Norm n;
    n.gamma = binder_.take(name + ".weight", {channels});
    n.beta = binder_.take(name + ".bias", {channels});
    n.groups = groups_;
    return n;
  }
  // The attention projections: diffusers stores Linear weights [C, C], LDM files 1x1 convs
  // [C, C, 1, 1]; both become a 1x1 conv.
  Conv linear_as_conv(const std::string& name, int64_t c) {
    Conv out;
    out.p = Conv2dParams::same(1);
    out.b = binder_.take(name + ".bias", {c});
    const std::string wname = name + ".weight";
    const TensorRecord* rec = store_.find(rename_(wname));
    if (rec && (rec->shape.size() == 2 || rec->shape.size() == 3)) {
      // [C, C] (or the [C, C, 1] of old conv1d checkpoints): host copy, reshape, upload.
      Shape stored = rec->shape.size() == 2 ? Shape{c, c} : Shape{c, c, 1};
      Tensor host = binder_.take_host(wname, stored);
      if (!host.defined()) return out;
      auto reshaped = host.reshape({c, c, 1, 1});
      if (!reshaped.ok()) {
        errors_.push_back(reshaped.status().message());
        return out;
      }
      auto dev = backend_.upload(*reshaped);
      if (!dev.ok()) {
        errors_.push_back(str_cat("uploading ", wname, ": ", dev.status().message()));
        return out;
      }
      out.w = std::move(dev).value();
      return out;
    }
    out.w = binder_.take(wname, {c, c, 1, 1});
    return out;
  }
  Status status() const {
    if (errors_.empty()) return ok_status();
    std::string msg;
    for (const auto& e : errors_) msg += (msg.empty() ? "" : "; ") + e;
    return Status::error(msg);
  }

 private:
  WeightBinder& binder_;
  const WeightStore& store_;
  Backend& backend_;
  std::function<std::string(const std::string&)> rename_;
  int groups_;
  std::vector<std::string> errors_;
};

// ---------------------------------------------------------------------------------------------
// Blocks.

// resnet.py ResnetBlock2D without time embedding (output_scale_factor 1, pre-norm).
struct ResnetBlock {
  Norm norm1, norm2;
  Conv conv1, conv2;
  std::optional<Conv> shortcut;  // conv_shortcut, 1x1, when in != out

  static ResnetBlock load(Params& p, const std::string& name, int64_t cin, int64_t cout) {
    ResnetBlock r;
    r.norm1 = p.norm(name + ".norm1", cin);
    r.conv1 = p.conv(name + ".conv1", cout, cin, 3, Conv2dParams::same(3));
    r.norm2 = p.norm(name + ".norm2", cout);
    r.conv2 = p.conv(name + ".conv2", cout, cout, 3, Conv2dParams::same(3));
    if (cin != cout)
      r.shortcut = p.conv(name + ".conv_shortcut", cout, cin, 1, Conv2dParams::same(1));
    return r;
  }

  // x: [N, Cin, H, W] -> [N, Cout, H, W]
  Result<Tensor> forward(Backend& be, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, norm1(be, x, Activation::kSiLU));
    LATENT_ASSIGN_OR_RETURN(h, conv1(be, h));
    LATENT_ASSIGN_OR_RETURN(h, norm2(be, h, Activation::kSiLU));
    Tensor skip = x;
    if (shortcut) {
      LATENT_ASSIGN_OR_RETURN(skip, (*shortcut)(be, x));
    }
    return conv2(be, h, skip);  // (x + h) / output_scale_factor, factor 1
  }
};

// attention_processor.py Attention as built by UNetMidBlock2D: group norm, one head of
// C channels, residual connection, rescale_output_factor 1.
struct AttentionBlock {
  Norm group_norm;
  Conv to_q, to_k, to_v, to_out;

  static AttentionBlock load(Params& p, const std::string& name, int64_t c) {
    AttentionBlock a;
    a.group_norm = p.norm(name + ".group_norm", c);
    a.to_q = p.linear_as_conv(name + ".to_q", c);
    a.to_k = p.linear_as_conv(name + ".to_k", c);
    a.to_v = p.linear_as_conv(name + ".to_v", c);
    a.to_out = p.linear_as_conv(name + ".to_out.0", c);
    return a;
  }

  // x: [N, C, H, W] -> [N, C, H, W]
  Result<Tensor> forward(Backend& be, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, group_norm(be, x));
    LATENT_ASSIGN_OR_RETURN(Tensor q, to_q(be, h));
    LATENT_ASSIGN_OR_RETURN(Tensor k, to_k(be, h));
    LATENT_ASSIGN_OR_RETURN(Tensor v, to_v(be, h));
    h = Tensor();
    // heads = C / attention_head_dim = 1
    LATENT_ASSIGN_OR_RETURN(Tensor a, be.spatial_attention(q, k, v, 1));
    return to_out(be, a, x);
  }
};

// unet_2d_blocks.py UNetMidBlock2D: resnet, (attention, resnet).
struct MidBlock {
  ResnetBlock resnet0, resnet1;
  std::optional<AttentionBlock> attention;

  static MidBlock load(Params& p, const std::string& name, int64_t c, bool add_attention) {
    MidBlock m;
    m.resnet0 = ResnetBlock::load(p, name + ".resnets.0", c, c);
    if (add_attention) m.attention = AttentionBlock::load(p, name + ".attentions.0", c);
    m.resnet1 = ResnetBlock::load(p, name + ".resnets.1", c, c);
    return m;
  }

  // x: [N, C, H, W] -> [N, C, H, W]
  Result<Tensor> forward(Backend& be, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, resnet0.forward(be, x));
    if (attention) {
      LATENT_ASSIGN_OR_RETURN(h, attention->forward(be, h));
    }
    return resnet1.forward(be, h);
  }
};

// vae.py Encoder with double_z: conv_in, DownEncoderBlock2D per level, mid block, norm, conv_out.
struct Encoder {
  struct Level {
    std::vector<ResnetBlock> resnets;
    std::optional<Conv> downsample;  // Downsample2D: pad (0, 1, 0, 1), 3x3 stride-2 conv
  };
  Conv conv_in;
  std::vector<Level> levels;
  MidBlock mid;
  Norm norm_out;
  Conv conv_out;

  static Encoder load(Params& p, const AutoencoderKLConfig& cfg) {
    Encoder e;
    const auto& ch = cfg.block_out_channels;
    e.conv_in = p.conv("encoder.conv_in", ch[0], cfg.in_channels, 3, Conv2dParams::same(3));
    int64_t cin = ch[0];
    for (size_t i = 0; i < ch.size(); ++i) {
      Level level;
      const std::string name = str_cat("encoder.down_blocks.", i);
      for (int64_t j = 0; j < cfg.layers_per_block; ++j) {
        level.resnets.push_back(
            ResnetBlock::load(p, str_cat(name, ".resnets.", j), j == 0 ? cin : ch[i], ch[i]));
      }
      if (i + 1 < ch.size()) {
        Conv2dParams down;
        down.stride = 2;
        down.pad_bottom = down.pad_right = 1;
        level.downsample = p.conv(name + ".downsamplers.0.conv", ch[i], ch[i], 3, down);
      }
      cin = ch[i];
      e.levels.push_back(std::move(level));
    }
    e.mid = MidBlock::load(p, "encoder.mid_block", ch.back(), cfg.mid_block_add_attention);
    e.norm_out = p.norm("encoder.conv_norm_out", ch.back());
    e.conv_out =
        p.conv("encoder.conv_out", 2 * cfg.latent_channels, ch.back(), 3, Conv2dParams::same(3));
    return e;
  }

  // x: [N, Cin, H, W] -> [N, 2 * latent_channels, H / f, W / f]
  Result<Tensor> forward(Backend& be, const Tensor& x) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, conv_in(be, x));
    for (const auto& level : levels) {
      for (const auto& r : level.resnets) {
        LATENT_ASSIGN_OR_RETURN(h, r.forward(be, h));
      }
      if (level.downsample) {
        LATENT_ASSIGN_OR_RETURN(h, (*level.downsample)(be, h));
      }
    }
    LATENT_ASSIGN_OR_RETURN(h, mid.forward(be, h));
    LATENT_ASSIGN_OR_RETURN(h, norm_out(be, h, Activation::kSiLU));
    return conv_out(be, h);
  }
};

// vae.py Decoder: conv_in, mid block, UpDecoderBlock2D per level (layers_per_block + 1 resnets,
// nearest 2x + conv upsampler), norm, conv_out.
struct Decoder {
  struct Level {
    std::vector<ResnetBlock> resnets;
    std::optional<UpsampleConv> upsample;  // Upsample2D: nearest 2x, then 3x3 conv
  };
  Conv conv_in;
  MidBlock mid;
  std::vector<Level> levels;
  Norm norm_out;
  Conv conv_out;

  static Decoder load(Params& p, const AutoencoderKLConfig& cfg) {
    Decoder d;
    std::vector<int64_t> ch(cfg.block_out_channels.rbegin(), cfg.block_out_channels.rend());
    d.conv_in = p.conv("decoder.conv_in", ch[0], cfg.latent_channels, 3, Conv2dParams::same(3));
    d.mid = MidBlock::load(p, "decoder.mid_block", ch[0], cfg.mid_block_add_attention);
    int64_t cin = ch[0];
    for (size_t i = 0; i < ch.size(); ++i) {
      Level level;
      const std::string name = str_cat("decoder.up_blocks.", i);
      for (int64_t j = 0; j < cfg.layers_per_block + 1; ++j) {
        level.resnets.push_back(
            ResnetBlock::load(p, str_cat(name, ".resnets.", j), j == 0 ? cin : ch[i], ch[i]));
      }
      if (i + 1 < ch.size())
        level.upsample = p.upsample_conv(name + ".upsamplers.0.conv", ch[i], ch[i]);
      cin = ch[i];
      d.levels.push_back(std::move(level));
    }
    d.norm_out = p.norm("decoder.conv_norm_out", ch.back());
    d.conv_out = p.conv("decoder.conv_out", cfg.out_channels, ch.back(), 3, Conv2dParams::same(3));
    return d;
  }

  // z: [N, latent_channels, h, w] -> [N, out_channels, h * f, w * f]
  Result<Tensor> forward(Backend& be, const Tensor& z) const {
    LATENT_ASSIGN_OR_RETURN(Tensor h, conv_in(be, z));
    LATENT_ASSIGN_OR_RETURN(h, mid.forward(be, h));
    for (const auto& level : levels) {
      for (const auto& r : level.resnets) {
        LATENT_ASSIGN_OR_RETURN(h, r.forward(be, h));
      }
      if (level.upsample) {
        LATENT_ASSIGN_OR_RETURN(h, (*level.upsample)(be, h));
      }
    }
    LATENT_ASSIGN_OR_RETURN(h, norm_out(be, h, Activation::kSiLU));
    return conv_out(be, h);
  }
};

// ---------------------------------------------------------------------------------------------

class AutoencoderKL final : public VaeModel {
 public:
  AutoencoderKL(std::shared_ptr<Backend> backend, AutoencoderKLConfig cfg, ModelInfo info)
      : cfg_(std::move(cfg)), info_(std::move(info)) {
    backend_ = std::move(backend);
  }

  const ModelInfo& info() const override { return info_; }
  bool has_encoder() const override { return encoder_.has_value(); }
  bool has_decoder() const override { return decoder_.has_value(); }

  // sample: [N, in_channels, H, W] -> raw posterior mean [N, latent_channels, H / f, W / f]
  Result<Tensor> encode(const Tensor& sample) override {
    if (!encoder_)
      return Status::errorf(info_.source.given, ": the encoder of this ", info_.architecture,
                            " was not loaded");
    LATENT_TRY(
        vae_common::check_encode_sample(*backend_, sample, cfg_.in_channels, cfg_.downsample()));
    LATENT_ASSIGN_OR_RETURN(Tensor moments, encoder_->forward(*backend_, sample));
    if (quant_conv_) {
      LATENT_ASSIGN_OR_RETURN(moments, (*quant_conv_)(*backend_, moments));
    }
    // DiagonalGaussianDistribution: mean = first latent_channels channels, then logvar.
    return backend_->slice_channels(moments, 0, cfg_.latent_channels);
  }

  // latent: [N, latent_channels, h, w] (raw) -> [N, out_channels, h * f, w * f]
  Result<Tensor> decode(const Tensor& latent) override {
    if (!decoder_)
      return Status::errorf(info_.source.given, ": the decoder of this ", info_.architecture,
                            " was not loaded");
    LATENT_TRY(vae_common::check_decode_latent(*backend_, latent, cfg_.latent_channels));
    Tensor z = latent;
    if (post_quant_conv_) {
      LATENT_ASSIGN_OR_RETURN(z, (*post_quant_conv_)(*backend_, z));
    }
    return decoder_->forward(*backend_, z);
  }

  AutoencoderKLConfig cfg_;
  ModelInfo info_;
  std::optional<Encoder> encoder_;
  std::optional<Decoder> decoder_;
  std::optional<Conv> quant_conv_, post_quant_conv_;
};

Status validate(const AutoencoderKLConfig& c, const std::string& what) {
  if (c.block_out_channels.empty() || c.block_out_channels.size() > 8)
    return Status::errorf(what, ": 'block_out_channels' must have 1 to 8 entries, found ",
                          c.block_out_channels.size());
  if (c.norm_num_groups <= 0)
    return Status::errorf(what, ": 'norm_num_groups' must be positive, found ", c.norm_num_groups);
  for (int64_t ch : c.block_out_channels) {
    if (ch <= 0 || ch % c.norm_num_groups != 0)
      return Status::errorf(what, ": block_out_channels entry ", ch,
                            " is not a positive multiple of norm_num_groups ", c.norm_num_groups);
  }
  if (c.layers_per_block < 1 || c.layers_per_block > 64)
    return Status::errorf(what, ": 'layers_per_block' must be 1..64, found ", c.layers_per_block);
  // Bounds far above any real VAE: sizes past them are typos and must not reach an allocation.
  constexpr int64_t kMaxChannels = 1 << 16;
  for (auto [key, v] : {std::pair<const char*, int64_t>{"in_channels", c.in_channels},
                        {"out_channels", c.out_channels},
                        {"latent_channels", c.latent_channels}})
    if (v < 1 || v > kMaxChannels)
      return Status::errorf(what, ": '", key, "' is ", v, ", expected 1 to ", kMaxChannels);
  for (int64_t ch : c.block_out_channels)
    if (ch > kMaxChannels)
      return Status::errorf(what, ": block_out_channels entry ", ch, " is over ", kMaxChannels);
  if (!(c.scaling_factor > 0) || !std::isfinite(c.scaling_factor) || !std::isfinite(c.shift_factor))
    return Status::errorf(what, ": 'scaling_factor' must be a positive number, found ",
                          c.scaling_factor);
  if (!c.latents_mean.empty() || !c.latents_std.empty()) {
    if (c.latents_mean.size() != static_cast<size_t>(c.latent_channels) ||
        c.latents_std.size() != static_cast<size_t>(c.latent_channels))
      return Status::errorf(what, ": 'latents_mean' and 'latents_std' must both have ",
                            c.latent_channels, " entries");
    for (double s : c.latents_std)
      if (!(s > 0)) return Status::errorf(what, ": 'latents_std' entries must be positive");
  }
  return ok_status();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config.

Result<AutoencoderKLConfig> AutoencoderKLConfig::from_config(const Config& config) {
  AutoencoderKLConfig c;
  const std::string what = config.path().empty() ? "config" : config.path();
  LATENT_ASSIGN_OR_RETURN(c.in_channels, config.get_int("in_channels", 3));
  LATENT_ASSIGN_OR_RETURN(c.out_channels, config.get_int("out_channels", 3));
  LATENT_ASSIGN_OR_RETURN(c.block_out_channels, config.get_int_list("block_out_channels", {64}));
  LATENT_ASSIGN_OR_RETURN(c.layers_per_block, config.get_int("layers_per_block", 1));
  LATENT_ASSIGN_OR_RETURN(c.latent_channels, config.get_int("latent_channels", 4));
  LATENT_ASSIGN_OR_RETURN(c.norm_num_groups, config.get_int("norm_num_groups", 32));
  LATENT_ASSIGN_OR_RETURN(c.use_quant_conv, config.get_bool("use_quant_conv", true));
  LATENT_ASSIGN_OR_RETURN(c.use_post_quant_conv, config.get_bool("use_post_quant_conv", true));
  LATENT_ASSIGN_OR_RETURN(c.mid_block_add_attention,
                          config.get_bool("mid_block_add_attention", true));
  LATENT_ASSIGN_OR_RETURN(c.scaling_factor, config.get_float("scaling_factor", 0.18215));
  LATENT_ASSIGN_OR_RETURN(c.shift_factor, config.get_float("shift_factor", 0.0));
  LATENT_ASSIGN_OR_RETURN(c.latents_mean, config.get_float_list("latents_mean", {}));
  LATENT_ASSIGN_OR_RETURN(c.latents_std, config.get_float_list("latents_std", {}));
  LATENT_ASSIGN_OR_RETURN(c.latent_space, config.get_string("latent_space", ""));

  LATENT_ASSIGN_OR_RETURN(std::string act, config.get_string("act_fn", "silu"));
  if (act != "silu" && act != "swish")
    return Status::errorf(what, ": act_fn '", act, "' is not supported (AutoencoderKL: silu)");
  const size_t levels = c.block_out_channels.size();
  LATENT_ASSIGN_OR_RETURN(
      auto down, config.get_string_list("down_block_types",
                                        std::vector<std::string>(levels, "DownEncoderBlock2D")));
  LATENT_ASSIGN_OR_RETURN(
      auto up, config.get_string_list("up_block_types",
                                      std::vector<std::string>(levels, "UpDecoderBlock2D")));
  if (down.size() != levels || up.size() != levels)
    return Status::errorf(what, ": down_block_types (", down.size(), ") and up_block_types (",
                          up.size(), ") must have one entry per block_out_channels entry (", levels,
                          ")");
  for (const auto& t : down)
    if (t != "DownEncoderBlock2D")
      return Status::errorf(what, ": down block type '", t,
                            "' is not supported (supported: DownEncoderBlock2D)");
  for (const auto& t : up)
    if (t != "UpDecoderBlock2D")
      return Status::errorf(what, ": up block type '", t,
                            "' is not supported (supported: UpDecoderBlock2D)");
  LATENT_TRY(validate(c, what));
  return c;
}

nlohmann::json AutoencoderKLConfig::to_json() const {
  nlohmann::json j;
  j["_class_name"] = "AutoencoderKL";
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels;
  j["block_out_channels"] = block_out_channels;
  j["down_block_types"] = std::vector<std::string>(block_out_channels.size(), "DownEncoderBlock2D");
  j["up_block_types"] = std::vector<std::string>(block_out_channels.size(), "UpDecoderBlock2D");
  j["layers_per_block"] = layers_per_block;
  j["latent_channels"] = latent_channels;
  j["norm_num_groups"] = norm_num_groups;
  j["act_fn"] = "silu";
  j["use_quant_conv"] = use_quant_conv;
  j["use_post_quant_conv"] = use_post_quant_conv;
  j["mid_block_add_attention"] = mid_block_add_attention;
  j["scaling_factor"] = scaling_factor;
  j["shift_factor"] = shift_factor;
  if (!latents_mean.empty()) j["latents_mean"] = latents_mean;
  if (!latents_std.empty()) j["latents_std"] = latents_std;
  if (!latent_space.empty()) j["latent_space"] = latent_space;
  return j;
}

// ---------------------------------------------------------------------------------------------
// Layouts and single files.

bool detect_autoencoder_kl_layout(const WeightStore& weights, AutoencoderKLLayout* layout) {
  const std::vector<std::string> names = weights.names();
  for (const char* prefix : {"", "first_stage_model.", "vae."}) {
    const std::string p = prefix;
    bool conv_in_ok = false;
    for (const char* part : {"encoder.conv_in.weight", "decoder.conv_in.weight"}) {
      const TensorRecord* rec = weights.find(p + part);
      if (rec && rec->shape.size() == 4) conv_in_ok = true;
    }
    if (!conv_in_ok) continue;
    const bool ldm = has_prefix(names, p + "encoder.down.") || has_prefix(names, p + "decoder.up.");
    const bool diffusers = has_prefix(names, p + "encoder.down_blocks.") ||
                           has_prefix(names, p + "decoder.up_blocks.");
    if (!ldm && !diffusers) continue;
    if (layout) {
      layout->ldm = ldm;
      layout->prefix = p;
    }
    return true;
  }
  return false;
}

std::string autoencoder_kl_store_name(const std::string& name, const AutoencoderKLLayout& layout,
                                      int levels) {
  if (!layout.ldm) return layout.prefix + name;
  std::vector<std::string> parts = split(name, '.');
  if (parts.size() < 3 || (parts[0] != "encoder" && parts[0] != "decoder"))
    return layout.prefix + name;
  auto resnet_rest = [&](size_t from) {
    std::string rest = join_from(parts, from);
    if (starts_with(rest, "conv_shortcut.")) rest = "nin_shortcut." + rest.substr(14);
    return rest;
  };
  const std::string& part = parts[0];
  int i = 0, j = 0;
  std::string mapped;
  if (parts[1] == "conv_norm_out") {
    mapped = part + ".norm_out." + join_from(parts, 2);
  } else if (parts[1] == "down_blocks" && parts.size() >= 5 && parse_index(parts[2], &i)) {
    if (parts[3] == "resnets" && parse_index(parts[4], &j) && parts.size() >= 6)
      mapped = str_cat(part, ".down.", i, ".block.", j, ".", resnet_rest(5));
    else if (parts[3] == "downsamplers" && parts[4] == "0" && parts.size() >= 6)
      mapped = str_cat(part, ".down.", i, ".downsample.", join_from(parts, 5));
  } else if (parts[1] == "up_blocks" && parts.size() >= 5 && parse_index(parts[2], &i)) {
    const int level = levels - 1 - i;
    if (parts[3] == "resnets" && parse_index(parts[4], &j) && parts.size() >= 6)
      mapped = str_cat(part, ".up.", level, ".block.", j, ".", resnet_rest(5));
    else if (parts[3] == "upsamplers" && parts[4] == "0" && parts.size() >= 6)
      mapped = str_cat(part, ".up.", level, ".upsample.", join_from(parts, 5));
  } else if (parts[1] == "mid_block" && parts.size() >= 5) {
    if (parts[2] == "resnets" && parse_index(parts[3], &j)) {
      mapped = str_cat(part, ".mid.block_", j + 1, ".", resnet_rest(4));
    } else if (parts[2] == "attentions" && parts[3] == "0") {
      std::string rest = join_from(parts, 4);
      static const std::pair<const char*, const char*> kAttn[] = {{"group_norm.", "norm."},
                                                                  {"to_q.", "q."},
                                                                  {"to_k.", "k."},
                                                                  {"to_v.", "v."},
                                                                  {"to_out.0.", "proj_out."}};
      for (const auto& [from, to] : kAttn) {
        if (starts_with(rest, from)) {
          rest = std::string(to) + rest.substr(std::string(from).size());
          break;
        }
      }
      mapped = part + ".mid.attn_1." + rest;
    }
  }
  return layout.prefix + (mapped.empty() ? name : mapped);
}

Result<AutoencoderKLConfig> infer_autoencoder_kl_config(const WeightStore& weights,
                                                        const AutoencoderKLLayout& layout) {
  const std::vector<std::string> names = weights.names();
  const std::string& P = layout.prefix;
  const bool ldm = layout.ldm;
  auto level_prefix = [&](bool enc, int i) {
    return str_cat(P, enc ? "encoder." : "decoder.",
                   ldm ? (enc ? "down." : "up.") : (enc ? "down_blocks." : "up_blocks."), i, ".");
  };
  const bool has_enc = has_prefix(names, P + "encoder.");
  const bool has_dec = has_prefix(names, P + "decoder.");
  int levels = 0;
  while (levels < 16 && has_prefix(names, level_prefix(has_enc, levels))) ++levels;
  if (levels == 0)
    return Status::errorf(weights.path(), ": no AutoencoderKL ", has_enc ? "down" : "up",
                          " blocks found (looked for '", level_prefix(has_enc, 0), "*')");
  AutoencoderKLConfig c;
  auto shape_of = [&](const std::string& diffusers_name, size_t rank, Shape* shape) -> Status {
    const std::string stored = autoencoder_kl_store_name(diffusers_name, layout, levels);
    const TensorRecord* rec = weights.find(stored);
    if (!rec) {
      // Present in a dtype the engine does not load (I32, F64, ...): say that, not "missing".
      auto probe = weights.get(stored);
      if (!probe.ok() && probe.status().message().rfind("unsupported dtype", 0) == 0)
        return probe.status().with_context("cannot infer the AutoencoderKL configuration");
      return Status::errorf(weights.path(),
                            ": cannot infer the AutoencoderKL configuration: ", "tensor '", stored,
                            "' is missing");
    }
    if (rec->shape.size() != rank)
      return Status::errorf(weights.path(), ": tensor '", stored, "' has shape ",
                            shape_str(rec->shape), ", expected ", rank, " dimensions");
    *shape = rec->shape;
    return ok_status();
  };
  Shape s;
  c.block_out_channels.assign(static_cast<size_t>(levels), 0);
  for (int i = 0; i < levels; ++i) {
    const std::string n =
        has_enc ? str_cat("encoder.down_blocks.", i, ".resnets.0.conv1.weight")
                : str_cat("decoder.up_blocks.", levels - 1 - i, ".resnets.0.conv1.weight");
    LATENT_TRY(shape_of(n, 4, &s));
    c.block_out_channels[i] = s[0];
  }
  int resnets = 0;
  while (resnets < 64 &&
         weights.contains(autoencoder_kl_store_name(
             has_enc ? str_cat("encoder.down_blocks.0.resnets.", resnets, ".conv1.weight")
                     : str_cat("decoder.up_blocks.0.resnets.", resnets, ".conv1.weight"),
             layout, levels)))
    ++resnets;
  c.layers_per_block = has_enc ? resnets : resnets - 1;
  if (has_dec) {
    LATENT_TRY(shape_of("decoder.conv_in.weight", 4, &s));
    c.latent_channels = s[1];
    LATENT_TRY(shape_of("decoder.conv_out.weight", 4, &s));
    c.out_channels = s[0];
  }
  if (has_enc) {
    LATENT_TRY(shape_of("encoder.conv_in.weight", 4, &s));
    c.in_channels = s[1];
    LATENT_TRY(shape_of("encoder.conv_out.weight", 4, &s));
    if (!has_dec) c.latent_channels = s[0] / 2;
  }
  c.use_quant_conv = weights.contains(P + "quant_conv.weight");
  c.use_post_quant_conv = weights.contains(P + "post_quant_conv.weight");
  const char* part = has_enc ? "encoder" : "decoder";
  c.mid_block_add_attention = weights.contains(autoencoder_kl_store_name(
      str_cat(part, ".mid_block.attentions.0.group_norm.weight"), layout, levels));
  return c;
}

std::string autoencoder_kl_latent_space_name(int64_t channels, double scaling, double shift) {
  struct Known {
    const char* name;
    int64_t channels;
    double scaling, shift;
  };
  static const Known kKnown[] = {{"sd", 4, 0.18215, 0.0},
                                 {"sdxl", 4, 0.13025, 0.0},
                                 {"sd3", 16, 1.5305, 0.0609},
                                 {"flux1", 16, 0.3611, 0.1159}};
  for (const auto& k : kKnown)
    if (k.channels == channels && near(scaling, k.scaling) && near(shift, k.shift)) return k.name;
  return str_cat("autoencoder-kl-", channels, "ch-s", fmt_g(scaling), "-t", fmt_g(shift));
}

std::string latent_space_from_name(const std::string& path) {
  std::string base = basename_of(path);
  std::string lower;
  for (char ch : base) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  static const std::pair<const char*, const char*> kHints[] = {
      {"taesdxl", "sdxl"}, {"taesd3", "sd3"}, {"taesd", "sd"}, {"taef1", "flux1"},
      {"taef2", "flux2"},  {"sdxl", "sdxl"},  {"sd3", "sd3"},  {"flux2", "flux2"},
      {"flux.2", "flux2"}, {"flux", "flux1"}};
  for (const auto& [hint, name] : kHints)
    if (lower.find(hint) != std::string::npos) return name;
  if (lower == "ae.safetensors") return "flux1";  // black-forest-labs' FLUX.1 file name
  return "";
}

// ---------------------------------------------------------------------------------------------
// The network side of load_autoencoder_kl (autoencoder_kl_loader.cpp).

Status validate_autoencoder_kl_config(const AutoencoderKLConfig& cfg, const std::string& what) {
  return validate(cfg, what);
}

Result<std::unique_ptr<VaeModel>> bind_autoencoder_kl(
    std::shared_ptr<Backend> backend, const AutoencoderKLConfig& cfg, const WeightStore& weights,
    WeightBinder& binder, const std::function<std::string(const std::string&)>& rename,
    bool encoder, bool decoder, ModelInfo info) {
  Params params(binder, weights, *backend, rename, static_cast<int>(cfg.norm_num_groups));
  auto model = std::make_unique<AutoencoderKL>(backend, cfg, ModelInfo());
  const int64_t lat2 = 2 * cfg.latent_channels;
  if (encoder) {
    const int64_t before = binder.parameters_taken();
    model->encoder_ = Encoder::load(params, cfg);
    if (cfg.use_quant_conv)
      model->quant_conv_ = params.conv("quant_conv", lat2, lat2, 1, Conv2dParams::same(1));
    info.parts.push_back({"encoder", binder.parameters_taken() - before});
  }
  if (decoder) {
    const int64_t before = binder.parameters_taken();
    model->decoder_ = Decoder::load(params, cfg);
    if (cfg.use_post_quant_conv)
      model->post_quant_conv_ = params.conv("post_quant_conv", cfg.latent_channels,
                                            cfg.latent_channels, 1, Conv2dParams::same(1));
    info.parts.push_back({"decoder", binder.parameters_taken() - before});
  }
  LATENT_TRY(params.status());
  LATENT_TRY(binder.finish());
  info.storage_dtypes = binder.storage_dtypes();
  model->info_ = std::move(info);
  return std::unique_ptr<VaeModel>(std::move(model));
}

bool is_autoencoder_kl_checkpoint(const WeightStore& weights) {
  return detect_autoencoder_kl_layout(weights, nullptr);
}

}  // namespace latent
