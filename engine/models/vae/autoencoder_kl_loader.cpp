// load_autoencoder_kl: the checkpoint side of diffusers AutoencoderKL (config.json, or a single
// file's configuration inferred from its tensor shapes, the LDM / diffusers name layouts, the
// latent space). The network itself is in autoencoder_kl.cpp (bind_autoencoder_kl).
#include <algorithm>
#include <functional>
#include <memory>

#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/models/vae/vae_common.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

using vae_common::fmt_g;
using vae_common::has_prefix;
using vae_common::starts_with;

std::string list_str(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + str_cat(x);
  return "[" + s + "]";
}

// Every size a config.json gives, checked against the shapes of the weights before anything is
// sized from it: a config of another model (or a typo such as latent_channels 1000000000) is
// named here instead of reaching an allocation. Where the sizes cannot be read off the weights
// (tensors missing), the binder reports the missing tensors by name instead.
Status check_config_against_weights(const AutoencoderKLConfig& cfg, const std::string& config_path,
                                    const WeightStore& weights, const AutoencoderKLLayout& layout) {
  auto inferred = infer_autoencoder_kl_config(weights, layout);
  if (!inferred.ok()) return ok_status();
  const AutoencoderKLConfig& w = *inferred;
  const std::vector<std::string> names = weights.names();
  const bool has_enc = has_prefix(names, layout.prefix + "encoder.");
  const bool has_dec = has_prefix(names, layout.prefix + "decoder.");
  auto mismatch = [&](const char* key, const std::string& given, const std::string& held) {
    return Status::errorf(config_path, ": '", key, "' is ", given, " but the weights in ",
                          weights.path(), " have ", held,
                          " (read from their tensor shapes): the config does not describe "
                          "these weights");
  };
  if (cfg.block_out_channels != w.block_out_channels)
    return mismatch("block_out_channels", list_str(cfg.block_out_channels),
                    list_str(w.block_out_channels));
  if (cfg.latent_channels != w.latent_channels)
    return mismatch("latent_channels", str_cat(cfg.latent_channels), str_cat(w.latent_channels));
  if (has_enc && cfg.in_channels != w.in_channels)
    return mismatch("in_channels", str_cat(cfg.in_channels), str_cat(w.in_channels));
  if (has_dec && cfg.out_channels != w.out_channels)
    return mismatch("out_channels", str_cat(cfg.out_channels), str_cat(w.out_channels));
  if (cfg.layers_per_block != w.layers_per_block)
    return mismatch("layers_per_block", str_cat(cfg.layers_per_block), str_cat(w.layers_per_block));
  return ok_status();
}

struct KnownSpace {
  const char* name;
  int64_t channels;
  double scaling, shift;
};
const KnownSpace* known_space(const std::string& name) {
  static const KnownSpace kSpaces[] = {{"sd", 4, 0.18215, 0.0},
                                       {"sdxl", 4, 0.13025, 0.0},
                                       {"sd3", 16, 1.5305, 0.0609},
                                       {"flux1", 16, 0.3611, 0.1159}};
  for (const auto& k : kSpaces)
    if (name == k.name) return &k;
  return nullptr;
}

// The latent space of a checkpoint without config.json: from its file (or folder) name when
// that names a space of matching channel count, from the rest of a full checkpoint, else by the
// channel count (4 -> SD, 16 -> FLUX.1).
std::string single_file_space(const ModelSource& source, const WeightStore& weights,
                              int64_t channels) {
  for (const std::string& p : {source.weights_path, source.given, source.root}) {
    const KnownSpace* k = known_space(latent_space_from_name(p));
    if (k && k->channels == channels) return k->name;
  }
  const std::vector<std::string> names = weights.names();
  if (channels == 4 && has_prefix(names, "conditioner.embedders.1.")) return "sdxl";
  if (channels == 16 && has_prefix(names, "model.diffusion_model.joint_blocks.")) return "sd3";
  if (channels == 4) return "sd";
  if (channels == 16) return "flux1";
  return "";
}

}  // namespace

Result<std::unique_ptr<VaeModel>> load_autoencoder_kl(const ModelSource& source,
                                                      const Config* config,
                                                      const WeightStore& weights,
                                                      std::shared_ptr<Backend> backend,
                                                      const VaeLoadOptions& options) {
  if (!backend) return Status::error("load_autoencoder_kl: no backend");
  AutoencoderKLLayout layout;
  if (!detect_autoencoder_kl_layout(weights, &layout))
    return Status::errorf(weights.path(), ": no AutoencoderKL tensors found (looked for ",
                          "'encoder.conv_in.weight' or 'decoder.conv_in.weight', optionally under ",
                          "'first_stage_model.' or 'vae.')");
  // A diffusers folder's config.json is the whole configuration; a single file's is inferred
  // from the weights, with the keys of an "x.json" beside it (if any) merged over it.
  AutoencoderKLConfig cfg;
  if (!config || source.single_file) {
    LATENT_ASSIGN_OR_RETURN(cfg, infer_autoencoder_kl_config(weights, layout));
    const std::string name = single_file_space(source, weights, cfg.latent_channels);
    if (const KnownSpace* k = known_space(name)) {
      cfg.scaling_factor = k->scaling;
      cfg.shift_factor = k->shift;
      cfg.latent_space = k->name;
    } else {
      cfg.scaling_factor = 1.0;
      cfg.shift_factor = 0.0;
    }
  }
  if (!config) {
    Status valid = validate_autoencoder_kl_config(cfg, weights.path());
    if (!valid.ok())
      return Status::error(valid.message() +
                           " (a single file does not record norm_num_groups; diffusers' default "
                           "32 was assumed: give the configuration in a .json of the same stem "
                           "beside the file)");
  } else {
    if (source.single_file) {
      nlohmann::json merged = cfg.to_json();
      for (const auto& [key, value] : config->json().items())
        if (!value.is_null()) merged[key] = value;
      // Scaling keys without a latent space name: the name follows from them.
      if (config->has("scaling_factor") || config->has("shift_factor") ||
          config->has("latents_mean"))
        if (!config->has("latent_space")) merged.erase("latent_space");
      LATENT_ASSIGN_OR_RETURN(cfg,
                              AutoencoderKLConfig::from_config(Config(merged, config->path())));
    } else {
      LATENT_ASSIGN_OR_RETURN(cfg, AutoencoderKLConfig::from_config(*config));
    }
    LATENT_TRY(check_config_against_weights(cfg, config->path(), weights, layout));
  }
  const int levels = static_cast<int>(cfg.block_out_channels.size());

  // Latent space.
  LatentSpace space;
  const int f = cfg.downsample();
  const int C = static_cast<int>(cfg.latent_channels);
  std::string space_name = cfg.latent_space;
  if (!cfg.latents_mean.empty()) {
    // normalised = (raw - mean) * scaling_factor / std
    std::vector<double> std_scaled;
    for (double s : cfg.latents_std) std_scaled.push_back(s / cfg.scaling_factor);
    if (space_name.empty()) space_name = str_cat("autoencoder-kl-", C, "ch-mean-std");
    space = LatentSpace::from_mean_std(space_name, C, f, cfg.latents_mean, std_scaled);
  } else {
    if (space_name.empty())
      space_name = autoencoder_kl_latent_space_name(C, cfg.scaling_factor, cfg.shift_factor);
    space = LatentSpace::from_scalars(space_name, C, f, cfg.scaling_factor, cfg.shift_factor);
  }

  // Parts present in the checkpoint; a requested part that is absent altogether is skipped when
  // the other one is there (decoder-only files), and is an error when nothing is left.
  const std::vector<std::string> names = weights.names();
  const bool has_enc = has_prefix(names, layout.prefix + "encoder.");
  const bool has_dec = has_prefix(names, layout.prefix + "decoder.");
  const bool want_enc = options.encoder && has_enc;
  const bool want_dec = options.decoder && has_dec;
  if (!want_enc && !want_dec)
    return Status::errorf(weights.path(), " holds no AutoencoderKL ",
                          options.encoder && options.decoder ? "encoder or decoder"
                          : options.encoder                  ? "encoder"
                                                             : "decoder",
                          (!options.encoder && !options.decoder) ? " (no part was requested)" : "");

  auto rename = [&weights, layout, levels](const std::string& n) {
    std::string s = autoencoder_kl_store_name(n, layout, levels);
    if (!layout.ldm && !weights.contains(s)) {
      // Checkpoints saved before diffusers renamed the mid-block attention.
      static const std::pair<const char*, const char*> kOld[] = {{".to_q.", ".query."},
                                                                 {".to_k.", ".key."},
                                                                 {".to_v.", ".value."},
                                                                 {".to_out.0.", ".proj_attn."}};
      for (const auto& [from, to] : kOld) {
        size_t pos = s.find(from);
        if (pos != std::string::npos && s.find(".attentions.") != std::string::npos) {
          std::string old = s.substr(0, pos) + to + s.substr(pos + std::string(from).size());
          if (weights.contains(old)) return old;
        }
      }
    }
    return s;
  };
  WeightBinder binder(weights, *backend, rename);
  if (!layout.prefix.empty()) {
    // A full SD checkpoint: everything outside the VAE belongs to other models.
    std::string last;
    for (const auto& n : names) {
      if (starts_with(n, layout.prefix)) continue;
      size_t dot = n.find('.');
      std::string top = dot == std::string::npos ? n : n.substr(0, dot + 1);
      if (top != last) binder.ignore_prefix(top);
      last = top;
    }
  }
  if (!want_enc) {
    binder.ignore_prefix(layout.prefix + "encoder.");
    binder.ignore_prefix(layout.prefix + "quant_conv.");
  }
  if (!want_dec) {
    binder.ignore_prefix(layout.prefix + "decoder.");
    binder.ignore_prefix(layout.prefix + "post_quant_conv.");
  }
  std::string channels;
  for (int64_t ch : cfg.block_out_channels)
    channels += (channels.empty() ? "" : ", ") + str_cat(ch);
  ModelInfo info;
  info.architecture = "AutoencoderKL";
  info.source = source;
  info.latent_space = space;
  const bool single = !config || source.single_file;
  info.variant = space.name + (!single      ? ""
                               : layout.ldm ? " (single file, LDM layout)"
                                            : " (single file, diffusers layout)");
  info.description = str_cat(
      "layout: ",
      !single      ? "diffusers folder"
      : layout.ldm ? "LDM single file"
                   : "diffusers single file",
      layout.prefix.empty() ? "" : str_cat(" (under '", layout.prefix, "')"), "\n",
      "in_channels: ", cfg.in_channels, "\n", "out_channels: ", cfg.out_channels, "\n",
      "block_out_channels: [", channels, "]\n", "layers_per_block: ", cfg.layers_per_block, "\n",
      "latent_channels: ", cfg.latent_channels, "\n", "norm_num_groups: ", cfg.norm_num_groups,
      "\n", "use_quant_conv: ", cfg.use_quant_conv ? "true" : "false", "\n",
      "use_post_quant_conv: ", cfg.use_post_quant_conv ? "true" : "false", "\n",
      "mid_block_add_attention: ", cfg.mid_block_add_attention ? "true" : "false", "\n",
      "scaling_factor: ", fmt_g(cfg.scaling_factor), "\n",
      "shift_factor: ", fmt_g(cfg.shift_factor), "\n", "downsample: ", cfg.downsample(), "\n",
      "latent_space: ", space.name);
  LATENT_ASSIGN_OR_RETURN(auto model, bind_autoencoder_kl(backend, cfg, weights, binder, rename,
                                                          want_enc, want_dec, std::move(info)));
  LATENT_INFO("loaded AutoencoderKL from ", source.given.empty() ? weights.path() : source.given,
              " (", model->info().variant, ")");
  return model;
}

}  // namespace latent
