// diffusers AutoencoderTiny as diffusers computes it (autoencoder_tiny.py, vae.py
// EncoderTiny/DecoderTiny, unet_2d_blocks.py AutoencoderTinyBlock), plus the FLUX.2 block pool
// of madebyollin's taef2 (the same Block as ComfyUI's comfy/taesd/taesd.py with
// use_midblock_gn).
#include "engine/models/vae/tiny.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/models/vae/upsample_conv.h"
#include "engine/models/vae/vae_common.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

using vae_common::Conv;
using vae_common::fmt_g;
using vae_common::has_prefix;
using vae_common::load_conv;
using vae_common::starts_with;

// The store name of layer `k` (diffusers numbering) of a part, plus a parameter suffix.
std::string layer_name(const TinyPartLayout& part, int k, const std::string& rest) {
  return str_cat(part.prefix, k + part.offset, rest.empty() ? "" : ".", rest);
}

const TensorRecord* conv_record(const WeightStore& w, const TinyPartLayout& part, int k) {
  const TensorRecord* rec = w.find(layer_name(part, k, "weight"));
  return rec && rec->shape.size() == 4 ? rec : nullptr;
}

bool is_block(const WeightStore& w, const TinyPartLayout& part, int k) {
  return w.contains(layer_name(part, k, "conv.0.weight"));
}

bool has_layer(const std::vector<std::string>& names, const TinyPartLayout& part, int k) {
  return has_prefix(names, layer_name(part, k, "") + ".");
}

bool part_has_pool(const WeightStore& w, const TinyPartLayout& part) {
  for (const auto& n : w.names())
    if (starts_with(n, part.prefix) && n.find(".pool.") != std::string::npos) return true;
  return false;
}

constexpr int kMaxLayers = 512;

// ---------------------------------------------------------------------------------------------

// unet_2d_blocks.py AutoencoderTinyBlock (in == out channels), with taef2's optional pool.
struct TinyBlock {
  Conv conv0, conv2, conv4;
  Activation act = Activation::kReLU;
  // pool: 1x1 conv C -> 4C (no bias), GroupNorm(4 groups, eps 1e-5), ReLU, 1x1 conv 4C -> C.
  std::optional<Conv> pool0, pool3;
  Tensor pool_gamma, pool_beta;

  static TinyBlock load(WeightBinder& binder, const std::string& name, int64_t c, Activation act,
                        bool pool) {
    TinyBlock b;
    b.act = act;
    b.conv0 = load_conv(binder, name + ".conv.0", c, c, 3, true, Conv2dParams::same(3));
    b.conv2 = load_conv(binder, name + ".conv.2", c, c, 3, true, Conv2dParams::same(3));
    b.conv4 = load_conv(binder, name + ".conv.4", c, c, 3, true, Conv2dParams::same(3));
    if (pool) {
      b.pool0 = load_conv(binder, name + ".pool.0", 4 * c, c, 1, false, Conv2dParams::same(1));
      b.pool_gamma = binder.take(name + ".pool.1.weight", {4 * c});
      b.pool_beta = binder.take(name + ".pool.1.bias", {4 * c});
      b.pool3 = load_conv(binder, name + ".pool.3", c, 4 * c, 1, false, Conv2dParams::same(1));
    }
    return b;
  }

  // x: [N, C, H, W] -> [N, C, H, W]
  Result<Tensor> forward(Backend& be, const Tensor& in) const {
    Tensor x = in;
    if (pool0) {
      // x = x + pool(x)
      LATENT_ASSIGN_OR_RETURN(Tensor p, (*pool0)(be, x));  // p: [N, 4C, H, W]
      LATENT_ASSIGN_OR_RETURN(p,
                              be.group_norm(p, 4, pool_gamma, pool_beta, 1e-5f, Activation::kReLU));
      LATENT_ASSIGN_OR_RETURN(x, (*pool3)(be, p, x));
    }
    LATENT_ASSIGN_OR_RETURN(Tensor h, conv0(be, x, Tensor(), act));
    LATENT_ASSIGN_OR_RETURN(h, conv2(be, h, Tensor(), act));
    return conv4(be, h, x, Activation::kReLU);  // fuse = ReLU(conv(x) + skip(x))
  }
};

// vae.py EncoderTiny.
struct TinyEncoder {
  struct Stage {
    std::optional<Conv> down;  // 3x3 stride-2 conv without bias (all stages but the first)
    std::vector<TinyBlock> blocks;
  };
  Conv conv_in;
  std::vector<Stage> stages;
  Conv conv_out;

  static TinyEncoder load(WeightBinder& binder, const AutoencoderTinyConfig& cfg) {
    TinyEncoder e;
    const Activation act = cfg.activation();
    const auto& ch = cfg.encoder_block_out_channels;
    int k = 0;
    auto name = [&](int idx) { return str_cat("encoder.layers.", idx); };
    for (size_t i = 0; i < ch.size(); ++i) {
      Stage s;
      if (i == 0) {
        e.conv_in =
            load_conv(binder, name(k++), ch[0], cfg.in_channels, 3, true, Conv2dParams::same(3));
      } else {
        s.down = load_conv(binder, name(k++), ch[i], ch[i], 3, false, Conv2dParams::same(3, 2));
      }
      const bool pool = cfg.encoder_pool && i + 1 == ch.size();
      for (int64_t j = 0; j < cfg.num_encoder_blocks[i]; ++j)
        s.blocks.push_back(TinyBlock::load(binder, name(k++), ch[i], act, pool));
      e.stages.push_back(std::move(s));
    }
    e.conv_out =
        load_conv(binder, name(k), cfg.latent_channels, ch.back(), 3, true, Conv2dParams::same(3));
    return e;
  }

  // x: [N, 3, H, W] in [-1, 1] -> [N, latent_channels, H / f, W / f]
  Result<Tensor> forward(Backend& be, const Tensor& sample) const {
    LATENT_ASSIGN_OR_RETURN(Tensor x, be.affine(sample, 0.5f, 0.5f));  // x.add(1).div(2)
    LATENT_ASSIGN_OR_RETURN(x, conv_in(be, x));
    for (const auto& s : stages) {
      if (s.down) {
        LATENT_ASSIGN_OR_RETURN(x, (*s.down)(be, x));
      }
      for (const auto& b : s.blocks) {
        LATENT_ASSIGN_OR_RETURN(x, b.forward(be, x));
      }
    }
    return conv_out(be, x);
  }
};

// vae.py DecoderTiny.
struct TinyDecoder {
  struct Stage {
    std::vector<TinyBlock> blocks;
    // nearest 2x, then 3x3 conv without bias (all stages but the last)
    std::optional<UpsampleConv> up;
  };
  Conv conv_in;
  Activation act = Activation::kReLU;
  std::vector<Stage> stages;
  Conv conv_out;

  static TinyDecoder load(WeightBinder& binder, const AutoencoderTinyConfig& cfg) {
    TinyDecoder d;
    d.act = cfg.activation();
    const auto& ch = cfg.decoder_block_out_channels;
    auto name = [&](int idx) { return str_cat("decoder.layers.", idx); };
    d.conv_in =
        load_conv(binder, name(0), ch[0], cfg.latent_channels, 3, true, Conv2dParams::same(3));
    int k = 2;  // layer 1 is the activation
    for (size_t i = 0; i < ch.size(); ++i) {
      Stage s;
      const bool pool = cfg.decoder_pool && i == 0;
      for (int64_t j = 0; j < cfg.num_decoder_blocks[i]; ++j)
        s.blocks.push_back(TinyBlock::load(binder, name(k++), ch[i], d.act, pool));
      if (i + 1 < ch.size()) {
        ++k;  // nn.Upsample
        s.up = load_upsample_conv(binder, name(k++), ch[i], ch[i], /*bias=*/false);
      } else {
        d.conv_out =
            load_conv(binder, name(k++), cfg.out_channels, ch[i], 3, true, Conv2dParams::same(3));
      }
      d.stages.push_back(std::move(s));
    }
    return d;
  }

  // z: [N, latent_channels, h, w] -> [N, 3, h * f, w * f], nominally in [-1, 1]
  Result<Tensor> forward(Backend& be, const Tensor& z) const {
    // torch.tanh(x / 3) * 3
    LATENT_ASSIGN_OR_RETURN(Tensor x, be.affine(z, 1.f / 3.f, 0.f));
    LATENT_ASSIGN_OR_RETURN(x, be.activation(x, Activation::kTanh));
    LATENT_ASSIGN_OR_RETURN(x, be.affine(x, 3.f, 0.f));
    LATENT_ASSIGN_OR_RETURN(x, conv_in(be, x, Tensor(), act));
    for (const auto& s : stages) {
      for (const auto& b : s.blocks) {
        LATENT_ASSIGN_OR_RETURN(x, b.forward(be, x));
      }
      if (s.up) {
        LATENT_ASSIGN_OR_RETURN(x, (*s.up)(be, x));
      }
    }
    LATENT_ASSIGN_OR_RETURN(x, conv_out(be, x));
    return be.affine(x, 2.f, -1.f);  // x.mul(2).sub(1)
  }
};

class AutoencoderTiny final : public VaeModel {
 public:
  AutoencoderTiny(std::shared_ptr<Backend> backend, AutoencoderTinyConfig cfg)
      : cfg_(std::move(cfg)) {
    backend_ = std::move(backend);
  }
  const ModelInfo& info() const override { return info_; }
  bool has_encoder() const override { return encoder_.has_value(); }
  bool has_decoder() const override { return decoder_.has_value(); }

  // sample: [N, in_channels, H, W] -> latents [N, latent_channels, H / f, W / f]
  Result<Tensor> encode(const Tensor& sample) override {
    if (!encoder_)
      return Status::errorf(info_.source.given, ": this AutoencoderTiny has no encoder loaded",
                            info_.source.single_file
                                ? " (TAESD encoders ship as a separate *_encoder.safetensors file)"
                                : "");
    LATENT_TRY(vae_common::check_encode_sample(*backend_, sample, cfg_.in_channels,
                                               cfg_.encoder_downsample()));
    return encoder_->forward(*backend_, sample);
  }

  // latent: [N, latent_channels, h, w] -> [N, out_channels, h * f, w * f]
  Result<Tensor> decode(const Tensor& latent) override {
    if (!decoder_)
      return Status::errorf(info_.source.given, ": this AutoencoderTiny has no decoder loaded",
                            info_.source.single_file
                                ? " (TAESD decoders ship as a separate *_decoder.safetensors file)"
                                : "");
    LATENT_TRY(vae_common::check_decode_latent(*backend_, latent, cfg_.latent_channels));
    return decoder_->forward(*backend_, latent);
  }

  AutoencoderTinyConfig cfg_;
  ModelInfo info_;
  std::optional<TinyEncoder> encoder_;
  std::optional<TinyDecoder> decoder_;
};

Status validate(const AutoencoderTinyConfig& c, const std::string& what) {
  auto check_lists = [&](const char* chname, const std::vector<int64_t>& ch, const char* nbname,
                         const std::vector<int64_t>& nb) -> Status {
    if (ch.empty() || ch.size() > 8)
      return Status::errorf(what, ": '", chname, "' must have 1 to 8 entries, found ", ch.size());
    if (ch.size() != nb.size())
      return Status::errorf(what, ": '", chname, "' (", ch.size(), " entries) and '", nbname, "' (",
                            nb.size(), ") must have the same length");
    for (size_t i = 0; i < ch.size(); ++i) {
      if (ch[i] <= 0 || nb[i] < 0 || nb[i] > 64)
        return Status::errorf(what, ": stage ", i, " of '", chname, "'/'", nbname, "' has ", ch[i],
                              " channels and ", nb[i], " blocks");
      // diffusers builds every stage's first conv (and the decoder's upsampling convs) as
      // ch[i] -> ch[i], so the stages must agree.
      if (i > 0 && ch[i] != ch[i - 1])
        return Status::errorf(what, ": '", chname, "' must use one channel count for all stages ",
                              "(diffusers' AutoencoderTiny connects stage ", i - 1, " (", ch[i - 1],
                              ") to stage ", i, " (", ch[i], ") with a ", ch[i], "->", ch[i],
                              " conv)");
    }
    return ok_status();
  };
  LATENT_TRY(check_lists("encoder_block_out_channels", c.encoder_block_out_channels,
                         "num_encoder_blocks", c.num_encoder_blocks));
  LATENT_TRY(check_lists("decoder_block_out_channels", c.decoder_block_out_channels,
                         "num_decoder_blocks", c.num_decoder_blocks));
  // Bounds far above any real VAE: sizes past them are typos and must not reach an allocation.
  constexpr int64_t kMaxChannels = 1 << 16;
  for (auto [key, v] : {std::pair<const char*, int64_t>{"in_channels", c.in_channels},
                        {"out_channels", c.out_channels},
                        {"latent_channels", c.latent_channels}})
    if (v < 1 || v > kMaxChannels)
      return Status::errorf(what, ": '", key, "' is ", v, ", expected 1 to ", kMaxChannels);
  if (c.act_fn != "relu" && c.act_fn != "silu" && c.act_fn != "swish")
    return Status::errorf(what, ": act_fn '", c.act_fn,
                          "' is not supported (AutoencoderTiny: relu, silu)");
  if (!(c.scaling_factor > 0) || !std::isfinite(c.scaling_factor) || !std::isfinite(c.shift_factor))
    return Status::errorf(what, ": 'scaling_factor' must be a positive number, found ",
                          c.scaling_factor);
  return ok_status();
}

}  // namespace

Activation AutoencoderTinyConfig::activation() const {
  return act_fn == "relu" ? Activation::kReLU : Activation::kSiLU;
}

Result<AutoencoderTinyConfig> AutoencoderTinyConfig::from_config(const Config& config) {
  AutoencoderTinyConfig c;
  const std::string what = config.path().empty() ? "config" : config.path();
  LATENT_ASSIGN_OR_RETURN(c.in_channels, config.get_int("in_channels", 3));
  LATENT_ASSIGN_OR_RETURN(c.out_channels, config.get_int("out_channels", 3));
  LATENT_ASSIGN_OR_RETURN(c.encoder_block_out_channels,
                          config.get_int_list("encoder_block_out_channels", {64, 64, 64, 64}));
  LATENT_ASSIGN_OR_RETURN(c.decoder_block_out_channels,
                          config.get_int_list("decoder_block_out_channels", {64, 64, 64, 64}));
  LATENT_ASSIGN_OR_RETURN(c.num_encoder_blocks,
                          config.get_int_list("num_encoder_blocks", {1, 3, 3, 3}));
  LATENT_ASSIGN_OR_RETURN(c.num_decoder_blocks,
                          config.get_int_list("num_decoder_blocks", {3, 3, 3, 1}));
  LATENT_ASSIGN_OR_RETURN(c.latent_channels, config.get_int("latent_channels", 4));
  LATENT_ASSIGN_OR_RETURN(c.act_fn, config.get_string("act_fn", "relu"));
  LATENT_ASSIGN_OR_RETURN(c.latent_magnitude, config.get_float("latent_magnitude", 3.0));
  LATENT_ASSIGN_OR_RETURN(c.latent_shift, config.get_float("latent_shift", 0.5));
  LATENT_ASSIGN_OR_RETURN(c.scaling_factor, config.get_float("scaling_factor", 1.0));
  LATENT_ASSIGN_OR_RETURN(c.shift_factor, config.get_float("shift_factor", 0.0));
  LATENT_ASSIGN_OR_RETURN(c.latent_space, config.get_string("latent_space", ""));
  LATENT_ASSIGN_OR_RETURN(int64_t up, config.get_int("upsampling_scaling_factor", 2));
  if (up != 2)
    return Status::errorf(what, ": upsampling_scaling_factor ", up, " is not supported (only 2)");
  LATENT_ASSIGN_OR_RETURN(std::string upsample_fn, config.get_string("upsample_fn", "nearest"));
  if (upsample_fn != "nearest")
    return Status::errorf(what, ": upsample_fn '", upsample_fn,
                          "' is not supported (only nearest)");
  LATENT_TRY(validate(c, what));
  return c;
}

nlohmann::json AutoencoderTinyConfig::to_json() const {
  nlohmann::json j;
  j["_class_name"] = "AutoencoderTiny";
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels;
  j["encoder_block_out_channels"] = encoder_block_out_channels;
  j["decoder_block_out_channels"] = decoder_block_out_channels;
  j["num_encoder_blocks"] = num_encoder_blocks;
  j["num_decoder_blocks"] = num_decoder_blocks;
  j["latent_channels"] = latent_channels;
  j["act_fn"] = act_fn;
  j["upsample_fn"] = "nearest";
  j["upsampling_scaling_factor"] = 2;
  j["latent_magnitude"] = latent_magnitude;
  j["latent_shift"] = latent_shift;
  j["scaling_factor"] = scaling_factor;
  j["shift_factor"] = shift_factor;
  if (!latent_space.empty()) j["latent_space"] = latent_space;
  return j;
}

// ---------------------------------------------------------------------------------------------
// Layouts.

bool detect_autoencoder_tiny_layout(const WeightStore& weights, AutoencoderTinyLayout* layout) {
  const std::vector<std::string> names = weights.names();
  auto rank4 = [&](const std::string& n) {
    const TensorRecord* r = weights.find(n);
    return r && r->shape.size() == 4;
  };
  AutoencoderTinyLayout l;
  struct Candidate {
    const char* enc;
    const char* dec;
    int dec_offset;
    const char* form;
  };
  static const Candidate kCandidates[] = {{"encoder.layers.", "decoder.layers.", 0, "diffusers"},
                                          {"taesd_encoder.", "taesd_decoder.", 1, "ComfyUI"},
                                          {"encoder.", "decoder.", 1, "taesd.py module"}};
  for (const auto& c : kCandidates) {
    TinyPartLayout enc{rank4(str_cat(c.enc, "0.weight")), c.enc, 0};
    TinyPartLayout dec{rank4(str_cat(c.dec, c.dec_offset, ".weight")), c.dec, c.dec_offset};
    if (enc.present || dec.present) {
      l.encoder = enc;
      l.decoder = dec;
      l.form = c.form;
      if (layout) *layout = l;
      return true;
    }
  }
  // A bare layer list: taesd_encoder.safetensors starts with "0.weight" (the RGB conv),
  // taesd_decoder.safetensors with "1.weight" (layer 0 is the Clamp).
  const TensorRecord* first = weights.find("0.weight");
  if (first && first->shape.size() == 4 && has_prefix(names, "1.conv.0.")) {
    l.encoder = {true, "", 0};
    l.form = "TAESD encoder file";
  } else if (!first && rank4("1.weight") && has_prefix(names, "3.conv.0.")) {
    l.decoder = {true, "", 1};
    l.form = "TAESD decoder file";
  } else {
    return false;
  }
  if (layout) *layout = l;
  return true;
}

Status infer_autoencoder_tiny_encoder(const WeightStore& weights, const TinyPartLayout& part,
                                      AutoencoderTinyConfig* cfg) {
  const std::vector<std::string> names = weights.names();
  const TensorRecord* first = conv_record(weights, part, 0);
  if (!first) {
    auto probe = weights.get(layer_name(part, 0, "weight"));
    if (!probe.ok() && probe.status().message().rfind("unsupported dtype", 0) == 0)
      return probe.status();
    return Status::errorf(weights.path(), ": TAESD encoder layer '", layer_name(part, 0, "weight"),
                          "' is missing or not a conv");
  }
  cfg->in_channels = first->shape[1];
  std::vector<int64_t> ch{first->shape[0]}, nb{0};
  int k = 1;
  for (; k < kMaxLayers; ++k) {
    if (is_block(weights, part, k)) {
      ++nb.back();
      continue;
    }
    const TensorRecord* conv = conv_record(weights, part, k);
    if (!conv)
      return Status::errorf(weights.path(), ": unexpected TAESD encoder layout at layer '",
                            layer_name(part, k, ""), "' (neither a block nor a conv)");
    if (has_layer(names, part, k + 1)) {  // a stride-2 conv opening the next stage
      ch.push_back(conv->shape[0]);
      nb.push_back(0);
    } else {  // the output conv
      cfg->latent_channels = conv->shape[0];
      break;
    }
  }
  if (k >= kMaxLayers) return Status::errorf(weights.path(), ": too many TAESD encoder layers");
  cfg->encoder_block_out_channels = ch;
  cfg->num_encoder_blocks = nb;
  return ok_status();
}

Status infer_autoencoder_tiny_decoder(const WeightStore& weights, const TinyPartLayout& part,
                                      AutoencoderTinyConfig* cfg) {
  const TensorRecord* first = conv_record(weights, part, 0);
  if (!first) {
    auto probe = weights.get(layer_name(part, 0, "weight"));
    if (!probe.ok() && probe.status().message().rfind("unsupported dtype", 0) == 0)
      return probe.status();
    return Status::errorf(weights.path(), ": TAESD decoder layer '", layer_name(part, 0, "weight"),
                          "' is missing or not a conv");
  }
  cfg->latent_channels = first->shape[1];
  std::vector<int64_t> ch{first->shape[0]}, nb{0};
  int k = 2;  // layer 1 is the activation
  for (; k < kMaxLayers; ++k) {
    if (is_block(weights, part, k)) {
      ++nb.back();
      continue;
    }
    if (const TensorRecord* conv = conv_record(weights, part, k)) {  // the output conv
      cfg->out_channels = conv->shape[0];
      break;
    }
    // An upsampling layer holds no weights; the conv after it closes this stage.
    const TensorRecord* conv = conv_record(weights, part, k + 1);
    if (!conv)
      return Status::errorf(weights.path(), ": unexpected TAESD decoder layout at layer '",
                            layer_name(part, k + 1, ""), "' (expected the conv after an upsample)");
    ++k;
    ch.push_back(conv->shape[0]);
    nb.push_back(0);
  }
  if (k >= kMaxLayers) return Status::errorf(weights.path(), ": too many TAESD decoder layers");
  cfg->decoder_block_out_channels = ch;
  cfg->num_decoder_blocks = nb;
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Loader.

// ---------------------------------------------------------------------------------------------
// The network side of load_autoencoder_tiny (tiny_loader.cpp).

Status validate_autoencoder_tiny_config(const AutoencoderTinyConfig& cfg, const std::string& what) {
  return validate(cfg, what);
}

bool autoencoder_tiny_part_has_pool(const WeightStore& weights, const TinyPartLayout& part) {
  return part_has_pool(weights, part);
}

Result<std::unique_ptr<VaeModel>> bind_autoencoder_tiny(std::shared_ptr<Backend> backend,
                                                        const AutoencoderTinyConfig& cfg,
                                                        WeightBinder* encoder,
                                                        WeightBinder* decoder, ModelInfo info) {
  auto model = std::make_unique<AutoencoderTiny>(backend, cfg);
  if (encoder) {
    const int64_t before = encoder->parameters_taken();
    model->encoder_ = TinyEncoder::load(*encoder, cfg);
    info.parts.push_back({"encoder", encoder->parameters_taken() - before});
  }
  if (decoder) {
    const int64_t before = decoder->parameters_taken();
    model->decoder_ = TinyDecoder::load(*decoder, cfg);
    info.parts.push_back({"decoder", decoder->parameters_taken() - before});
  }
  // One binder per file, so that every file is checked for unexpected tensors.
  std::vector<WeightBinder*> binders;
  for (WeightBinder* b : {encoder, decoder})
    if (b && std::find(binders.begin(), binders.end(), b) == binders.end()) binders.push_back(b);
  for (WeightBinder* b : binders) {
    LATENT_TRY(b->finish());
    for (const auto& [k, v] : b->storage_dtypes()) info.storage_dtypes[k] += v;
  }
  model->info_ = std::move(info);
  return std::unique_ptr<VaeModel>(std::move(model));
}

bool is_autoencoder_tiny_checkpoint(const WeightStore& weights) {
  return detect_autoencoder_tiny_layout(weights, nullptr);
}

}  // namespace latent
