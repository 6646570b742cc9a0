// The checkpoint side of AutoencoderKLQwenImage / AutoencoderKLWan (Wan 2.1): config.json
// parsing and checks, the key names of the original Wan-Video / ComfyUI single files, and the
// architecture read back from the weight shapes of a file without config. The network itself is
// in qwen_image.cpp.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <optional>

#include "engine/models/vae/architectures.h"
#include "engine/models/vae/qwen_image.h"
#include "engine/models/vae/vae_common.h"

namespace latent {

namespace {

using vae_common::starts_with;

bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

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

// Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json.
const std::vector<double>& wan22_latents_mean() {
  static const std::vector<double> k = {
      -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174,  0.1838,  0.1557,  -0.1382, 0.0542,
      0.2813,  0.0891,  0.1570,  -0.0098, 0.0375,  -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,
      0.2665,  -0.2108, -0.2158, 0.2502,  -0.2055, -0.0322, 0.1109,  0.1567,  -0.0729, 0.0899,
      -0.2799, -0.1230, -0.0313, -0.1649, 0.0117,  0.0723,  -0.2839, -0.2083, -0.0520, 0.3748,
      0.0152,  0.1957,  0.1433,  -0.2944, 0.3573,  -0.0548, -0.1681, -0.0667};
  return k;
}

const std::vector<double>& wan22_latents_std() {
  static const std::vector<double> k = {
      0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344,
      0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804,
      0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999,
      0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
      0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744};
  return k;
}

std::string qwen_image_latent_space_name(const std::vector<double>& mean,
                                         const std::vector<double>& std, bool residual) {
  if (residual) {
    // TAEW2.2 (taehv.cpp) names the same latents "wan2.2".
    if (nearly_equal(mean, wan22_latents_mean()) && nearly_equal(std, wan22_latents_std()))
      return "wan2.2";
    return "wan2.2-vae-custom";
  }
  if (nearly_equal(mean, qwen_image_latents_mean()) && nearly_equal(std, qwen_image_latents_std()))
    return "qwen-image";
  return "qwen-image-vae-custom";
}

namespace {

// Checks a config for the structure the model builder relies on.
Status validate_config(const QwenImageVaeConfig& c, const std::string& what) {
  auto bad = [&](auto&&... args) { return Status::errorf(what, ": ", args...); };
  if (c.base_dim < 1) return bad("'base_dim' must be positive, got ", c.base_dim);
  if (c.decoder_base_dim < 0)
    return bad("'decoder_base_dim' must be positive, got ", c.decoder_base_dim);
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
  if (c.patch_size < 1 || c.patch_size > 8)
    return bad("'patch_size' must be null or 1 to 8, got ", c.patch_size);
  if (c.input_channels % (c.patch_size * c.patch_size) != 0)
    return bad("'in_channels' ", c.input_channels,
               " is not a multiple of patch_size^2 = ", c.patch_size * c.patch_size);
  if (c.is_residual) {
    // The checks diffusers' AvgDown3D / DupUp3D make when they are built.
    const size_t n = c.dim_mult.size();
    const int64_t d = c.decoder_dim();
    for (size_t i = 0; i < n; ++i) {
      const bool down = i + 1 < n;
      const int64_t in = c.base_dim * (i == 0 ? 1 : c.dim_mult[i - 1]);
      const int64_t out = c.base_dim * c.dim_mult[i];
      const int64_t factor = down ? (c.temperal_downsample[i] ? 8 : 4) : 1;
      if ((in * factor) % out != 0)
        return bad("encoder level ", i, ": ", in, " channels times the downsampling factor ",
                   factor, " is not a multiple of ", out, " (AvgDown3D)");
      if (!down) continue;
      const int64_t din = d * c.dim_mult[n - 1 - (i == 0 ? 0 : i - 1)];
      const int64_t dout = d * c.dim_mult[n - 1 - i];
      const int64_t dfactor = c.temperal_downsample[n - 2 - i] ? 8 : 4;
      if ((dout * dfactor) % din != 0)
        return bad("decoder level ", i, ": ", dout, " channels times the upsampling factor ",
                   dfactor, " is not a multiple of ", din, " (DupUp3D)");
    }
  }
  // diffusers (and the original Wan code) put an attention block after each residual block of a
  // down level whose scale is in attn_scales, then call it with the causal cache arguments it
  // does not take: such a model cannot encode there, so there is nothing to match. (The Wan 2.2
  // residual down blocks ignore attn_scales.)
  double scale = 1.0;
  for (size_t i = 0; !c.is_residual && i < c.dim_mult.size(); ++i, scale /= 2.0) {
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
    // The Wan 2.2 VAE shares the class: residual down/up blocks and patchified frames.
    LATENT_ASSIGN_OR_RETURN(c.is_residual, config.get_bool("is_residual", false));
    if (config.has("patch_size") && !config.json()["patch_size"].is_null()) {
      LATENT_ASSIGN_OR_RETURN(c.patch_size, config.get_int("patch_size", 1));
    }
  }
  LATENT_ASSIGN_OR_RETURN(c.base_dim, config.get_int("base_dim", c.base_dim));
  if (wan) {
    LATENT_ASSIGN_OR_RETURN(c.decoder_base_dim, config.get_int("decoder_base_dim", 0));
    if (config.has("decoder_base_dim") && c.decoder_base_dim < 1)
      return Status::errorf(what, ": 'decoder_base_dim' must be positive or null, got ",
                            c.decoder_base_dim);
    LATENT_ASSIGN_OR_RETURN(int64_t out_channels, config.get_int("out_channels", 3));
    LATENT_ASSIGN_OR_RETURN(int64_t in_channels, config.get_int("in_channels", 3));
    if (out_channels != in_channels)
      return Status::errorf(what, ": 'out_channels' ", out_channels, " differs from 'in_channels' ",
                            in_channels,
                            "; only models whose decoder outputs what the encoder "
                            "takes are supported");
  }
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
  if (c.patch_size > 1 && c.input_channels != 3 * c.patch_size * c.patch_size)
    return Status::errorf(what, ": '", wan ? "in_channels" : "input_channels", "' is ",
                          c.input_channels, "; RGB frames in ", c.patch_size, "x", c.patch_size,
                          " patches need ", 3 * c.patch_size * c.patch_size);
  LATENT_ASSIGN_OR_RETURN(c.latents_mean,
                          config.get_float_list("latents_mean", qwen_image_latents_mean()));
  LATENT_ASSIGN_OR_RETURN(c.latents_std,
                          config.get_float_list("latents_std", qwen_image_latents_std()));
  LATENT_TRY(validate_config(c, what));
  return c;
}

// ---------------------------------------------------------------------------------------------
// Layouts and single files

std::string qwen_image_vae_original_name(const std::string& name, int64_t num_res_blocks,
                                         bool residual) {
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
    if (residual) {
      // Wan 2.2: each level is a block of its own whose residual blocks and resampler form one
      // flat sequence ("downsamples" / "upsamples" again inside).
      if (strip_index(&r, "down_blocks.", &i)) {
        if (strip_index(&r, "resnets.", &j))
          return str_cat(part, "downsamples.", i, ".downsamples.", j, ".", original_resnet_leaf(r));
        if (starts_with(r, "downsampler."))
          return str_cat(part, "downsamples.", i, ".downsamples.", num_res_blocks, ".",
                         r.substr(12));
        return name;
      }
      if (strip_index(&r, "up_blocks.", &i)) {
        if (strip_index(&r, "resnets.", &j))
          return str_cat(part, "upsamples.", i, ".upsamples.", j, ".", original_resnet_leaf(r));
        if (starts_with(r, "upsampler."))
          return str_cat(part, "upsamples.", i, ".upsamples.", num_res_blocks + 1, ".",
                         r.substr(10));
        return name;
      }
    }
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
  // The Wan 2.2 VAE nests residual blocks in its down/up levels.
  for (const char* wan22 : {"encoder.downsamples.0.downsamples.", "decoder.upsamples.0.upsamples.",
                            "encoder.down_blocks.0.resnets.", "decoder.up_blocks.0.upsampler."}) {
    for (const std::string& n : weights.names()) {
      if (starts_with(n, p + wan22)) {
        found->residual = true;
        break;
      }
    }
  }
  return *found;
}

namespace {

// The Wan 2.2 VAE (residual down/up blocks) read from its weight shapes.
Result<QwenImageVaeConfig> infer_residual_config(const WeightStore& weights,
                                                 const QwenImageVaeLayout& layout,
                                                 const std::string& what) {
  int64_t nrb = 2;  // only the resamplers' original names depend on it; counted below
  auto stored = [&](const std::string& n) {
    return layout.prefix + (layout.original ? qwen_image_vae_original_name(n, nrb, true) : n);
  };
  auto shape_of = [&](const std::string& n) { return stored_shape(weights, stored(n)); };
  auto has = [&](const std::string& n) { return weights.contains(stored(n)); };
  auto need = [&](const std::string& n) -> Result<Shape> {
    Shape s = shape_of(n);
    if (s.size() != 5)
      return Status::errorf(what, ": ", s.empty() ? "missing" : "misshaped", " tensor '", stored(n),
                            "' (needed to read the model size)");
    return s;
  };
  // Residual blocks of a level: their count and output width.
  auto count_resnets = [&](const std::string& level, int64_t* width) -> Result<int64_t> {
    int64_t j = 0;
    for (;; ++j) {
      const std::string r = str_cat(level, ".resnets.", j, ".conv1.weight");
      if (!has(r)) break;
      LATENT_ASSIGN_OR_RETURN(Shape w, need(r));
      if (j > 0 && w[0] != *width)
        return Status::errorf(what, ": residual blocks of '", stored(level), "' have ", *width,
                              " and ", w[0], " output channels");
      *width = w[0];
    }
    return j;
  };

  QwenImageVaeConfig c;
  c.is_residual = true;
  c.attn_scales.clear();
  const bool has_encoder = has("encoder.conv_in.weight");
  const bool has_decoder = has("decoder.conv_in.weight");
  if (!has_encoder && !has_decoder)
    return Status::errorf(what, ": neither '", stored("encoder.conv_in.weight"), "' nor '",
                          stored("decoder.conv_in.weight"), "' found");
  std::vector<int64_t> enc_widths, dec_widths;
  std::vector<bool> enc_temporal, dec_temporal;
  if (has_encoder) {
    LATENT_ASSIGN_OR_RETURN(Shape conv_in, need("encoder.conv_in.weight"));
    LATENT_ASSIGN_OR_RETURN(Shape conv_out, need("encoder.conv_out.weight"));
    c.base_dim = conv_in[0];
    c.input_channels = conv_in[1];
    if (conv_out[0] % 2 != 0)
      return Status::errorf(what, ": encoder output has ", conv_out[0],
                            " channels, expected 2 * z_dim");
    c.z_dim = conv_out[0] / 2;
    for (int64_t i = 0;; ++i) {
      const std::string level = str_cat("encoder.down_blocks.", i);
      int64_t width = 0;
      LATENT_ASSIGN_OR_RETURN(int64_t n, count_resnets(level, &width));
      if (n == 0) break;
      if (i == 0) nrb = n;
      if (n != nrb)
        return Status::errorf(what, ": encoder levels have ", nrb, " and ", n, " residual blocks");
      enc_widths.push_back(width);
      if (has(level + ".downsampler.resample.1.weight"))
        enc_temporal.push_back(has(level + ".downsampler.time_conv.weight") ||
                               has(level + ".downsampler.time_conv.bias"));
      else
        break;  // the last level has no downsampler
    }
    if (enc_widths.empty())
      return Status::errorf(what, ": no residual blocks under '", stored("encoder.down_blocks.0"),
                            "'");
  }
  if (has_decoder) {
    LATENT_ASSIGN_OR_RETURN(Shape conv_in, need("decoder.conv_in.weight"));
    LATENT_ASSIGN_OR_RETURN(Shape conv_out, need("decoder.conv_out.weight"));
    if (has_encoder && (conv_in[1] != c.z_dim || conv_out[0] != c.input_channels))
      return Status::errorf(what, ": the decoder takes ", conv_in[1], " latent channels and makes ",
                            conv_out[0], ", the encoder ", c.z_dim, " and ", c.input_channels);
    c.z_dim = conv_in[1];
    c.input_channels = conv_out[0];
    int64_t dec_nrb = -1;
    for (int64_t i = 0;; ++i) {
      const std::string level = str_cat("decoder.up_blocks.", i);
      int64_t width = 0;
      if (!has_encoder && i == 0) {
        // The original names of the upsampler need num_res_blocks: count the residual blocks.
        int64_t n = 0;
        while (weights.contains(
            layout.prefix +
            (layout.original ? str_cat("decoder.upsamples.0.upsamples.", n, ".residual.2.weight")
                             : str_cat("decoder.up_blocks.0.resnets.", n, ".conv1.weight"))))
          ++n;
        nrb = n - 1;
      }
      LATENT_ASSIGN_OR_RETURN(int64_t n, count_resnets(level, &width));
      if (n == 0) break;
      if (dec_nrb < 0) dec_nrb = n - 1;
      if (n != dec_nrb + 1)
        return Status::errorf(what, ": decoder levels have ", dec_nrb + 1, " and ", n,
                              " residual blocks");
      dec_widths.push_back(width);
      if (has(level + ".upsampler.resample.1.weight"))
        dec_temporal.push_back(has(level + ".upsampler.time_conv.weight") ||
                               has(level + ".upsampler.time_conv.bias"));
      else
        break;
    }
    if (dec_widths.empty() || dec_nrb < 1)
      return Status::errorf(what, ": the decoder's levels under '", stored("decoder.up_blocks.0"),
                            "' need num_res_blocks + 1 >= 2 residual blocks each");
    if (has_encoder && dec_nrb != nrb)
      return Status::errorf(what, ": the decoder has ", dec_nrb + 1,
                            " residual blocks a level, the encoder ", nrb);
    nrb = dec_nrb;
  }
  c.num_res_blocks = nrb;
  // Level widths: encoder base_dim * dim_mult[i]; decoder decoder_base_dim * dim_mult[L-1-i].
  std::vector<int64_t> widths = enc_widths;
  int64_t base = c.base_dim;
  if (!has_encoder) {
    widths.assign(dec_widths.rbegin(), dec_widths.rend());
    base = 0;
    for (int64_t w : widths) base = std::gcd(base, w);
    c.base_dim = base;
    c.temperal_downsample.assign(dec_temporal.rbegin(), dec_temporal.rend());
  } else {
    c.temperal_downsample = enc_temporal;
  }
  c.dim_mult.clear();
  for (int64_t w : widths) {
    if (w % base != 0)
      return Status::errorf(what, ": level width ", w, " is not a multiple of base_dim ", base);
    c.dim_mult.push_back(w / base);
  }
  if (has_encoder && has_decoder) {
    const size_t n = c.dim_mult.size();
    bool match = dec_widths.size() == n && dec_widths.back() % c.dim_mult[0] == 0 &&
                 dec_temporal.size() + 1 == n;
    const int64_t dbd = match ? dec_widths.back() / c.dim_mult[0] : 0;
    for (size_t i = 0; match && i < n; ++i) {
      match = dec_widths[i] == dbd * c.dim_mult[n - 1 - i] &&
              (i + 1 == n || dec_temporal[i] == c.temperal_downsample[n - 2 - i]);
    }
    if (!match)
      return Status::errorf(what, ": the decoder's levels do not mirror the encoder's (dim_mult ",
                            join(c.dim_mult), ", num_res_blocks ", c.num_res_blocks, ")");
    if (dbd != c.base_dim) c.decoder_base_dim = dbd;
  }
  // in_channels = 3 * patch_size^2
  c.patch_size = 0;
  for (int64_t p = 1; p <= 8; ++p)
    if (3 * p * p == c.input_channels) c.patch_size = p;
  if (c.patch_size == 0)
    return Status::errorf(what, ": the first convolution takes ", c.input_channels,
                          " channels, not 3 * patch_size^2 for RGB frames in patches");
  if (c.z_dim == 48) {
    c.latents_mean = wan22_latents_mean();
    c.latents_std = wan22_latents_std();
  } else {
    c.latents_mean.assign(static_cast<size_t>(c.z_dim), 0.0);
    c.latents_std.assign(static_cast<size_t>(c.z_dim), 1.0);
  }
  LATENT_TRY(validate_config(c, what));
  return c;
}

}  // namespace

Result<QwenImageVaeConfig> infer_qwen_image_vae_config(const WeightStore& weights,
                                                       const QwenImageVaeLayout& layout) {
  const std::string what =
      str_cat(weights.path(), " (", layout.original ? "Wan-Video" : "diffusers", " key names)");
  if (layout.residual) return infer_residual_config(weights, layout, what);
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
  const bool has_encoder = has("encoder.conv_in.weight");
  const bool has_decoder = has("decoder.conv_in.weight");
  if (!has_encoder && !has_decoder)
    return Status::errorf(what,
                          ": neither 'encoder.conv_in.weight' nor 'decoder.conv_in.weight' "
                          "found (as '",
                          stored("encoder.conv_in.weight"), "' / '",
                          stored("decoder.conv_in.weight"), "')");
  if (has_encoder) {
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
  }
  if (has_decoder) {
    LATENT_ASSIGN_OR_RETURN(Shape conv_in, need("decoder.conv_in.weight", 5));
    LATENT_ASSIGN_OR_RETURN(Shape conv_out, need("decoder.conv_out.weight", 5));
    if (has_encoder && (conv_in[1] != c.z_dim || conv_out[0] != c.input_channels))
      return Status::errorf(what, ": the decoder takes ", conv_in[1], " latent channels and makes ",
                            conv_out[0], ", the encoder ", c.z_dim, " and ", c.input_channels);
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
    if (has_encoder) {
      // Level i of the decoder has decoder_base_dim * dim_mult[L-1-i] channels.
      const size_t n = c.dim_mult.size();
      bool match = levels.size() == n && levels[0].resnets == c.num_res_blocks + 1 &&
                   levels.back().out % c.dim_mult[0] == 0;
      const int64_t dbd = match ? levels.back().out / c.dim_mult[0] : 0;
      for (size_t i = 0; match && i < n; ++i) {
        match = levels[i].out == dbd * c.dim_mult[n - 1 - i] &&
                (i + 1 == n || levels[i].temporal == c.temperal_downsample[n - 2 - i]);
      }
      if (!match)
        return Status::errorf(what, ": the decoder's levels do not mirror the encoder's (dim_mult ",
                              join(c.dim_mult), ", num_res_blocks ", c.num_res_blocks, ")");
      if (dbd != c.base_dim) c.decoder_base_dim = dbd;
    } else {
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
    }
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

std::string describe_qwen_image_vae(const QwenImageVaeConfig& cfg, const QwenImageVaeLayout& layout,
                                    const std::string& config_path) {
  std::string temporal;
  for (bool t : cfg.temperal_downsample)
    temporal += str_cat(temporal.empty() ? "" : ", ", t ? "true" : "false");
  std::string attn;
  for (double s : cfg.attn_scales) attn += str_cat(attn.empty() ? "" : ", ", s);
  const int f = cfg.temporal_factor();
  return str_cat(
      cfg.is_residual
          ? str_cat("network: Wan 2.2 VAE (residual down/up blocks with AvgDown3D / DupUp3D "
                    "shortcuts; frames in ",
                    cfg.patch_size, "x", cfg.patch_size, " patches: ", cfg.input_channels,
                    " channels)\n")
          : "network: Wan 2.1 VAE\n",
      "key names: ", layout.original ? "Wan-Video / ComfyUI" : "diffusers",
      layout.prefix.empty() ? "" : str_cat(" under '", layout.prefix, "'"), "\n",
      "config: ", config_path.empty() ? "inferred from the weights" : config_path, "\n",
      "base_dim: ", cfg.base_dim, "\n",
      cfg.decoder_base_dim > 0 ? str_cat("decoder_base_dim: ", cfg.decoder_base_dim, "\n") : "",
      "z_dim: ", cfg.z_dim, "\n", "dim_mult: ", join(cfg.dim_mult), "\n",
      "num_res_blocks: ", cfg.num_res_blocks, "\n", "attn_scales: [", attn, "]\n",
      "temperal_downsample: [", temporal, "]\n", "input_channels: ", cfg.input_channels, "\n",
      cfg.patch_size > 1 ? str_cat("patch_size: ", cfg.patch_size, "\n") : "",
      "spatial downsample: ", cfg.downsample(), "\n",
      f == 4 ? "video: temporal factor 4 (frame 0 alone, then 4 frames per latent frame)\n"
             : str_cat("video: no (temporal factor ", f,
                       "; diffusers' 4-frame chunks need 4), images only\n"),
      "latent space: ",
      qwen_image_latent_space_name(cfg.latents_mean, cfg.latents_std, cfg.is_residual),
      " (normalised = (raw - latents_mean) / latents_std)");
}

}  // namespace latent
