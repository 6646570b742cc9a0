// load_autoencoder_tiny: the checkpoint side of diffusers AutoencoderTiny / TAESD (config.json,
// or the configuration read off a single file's layers; the bare taesd_encoder / taesd_decoder
// pairs; the latent space). The network itself is in tiny.cpp (bind_autoencoder_tiny).
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <memory>
#include <optional>

#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/autoencoder_kl.h"
#include "engine/models/vae/tiny.h"
#include "engine/models/vae/vae_common.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

using vae_common::fmt_g;
using vae_common::starts_with;

std::string list_str(const std::vector<int64_t>& v);

// Every size a config.json gives, checked against the shapes of the weights before anything is
// sized from it (see the KL loader). Where the sizes cannot be read off the weights, the binder
// names the missing or misshaped tensors instead.
Status check_config_against_weights(const AutoencoderTinyConfig& cfg,
                                    const std::string& config_path,
                                    const AutoencoderTinyLayout& layout,
                                    const WeightStore& enc_store, const WeightStore& dec_store) {
  auto mismatch = [&](const char* key, const std::string& given, const std::string& held,
                      const WeightStore& store) {
    return Status::errorf(config_path, ": '", key, "' is ", given, " but the weights in ",
                          store.path(), " have ", held,
                          " (read from their tensor shapes): the config does not describe "
                          "these weights");
  };
  if (layout.encoder.present) {
    AutoencoderTinyConfig w;
    if (infer_autoencoder_tiny_encoder(enc_store, layout.encoder, &w).ok()) {
      if (cfg.latent_channels != w.latent_channels)
        return mismatch("latent_channels", str_cat(cfg.latent_channels), str_cat(w.latent_channels),
                        enc_store);
      if (cfg.in_channels != w.in_channels)
        return mismatch("in_channels", str_cat(cfg.in_channels), str_cat(w.in_channels), enc_store);
      if (cfg.encoder_block_out_channels != w.encoder_block_out_channels)
        return mismatch("encoder_block_out_channels", list_str(cfg.encoder_block_out_channels),
                        list_str(w.encoder_block_out_channels), enc_store);
      if (cfg.num_encoder_blocks != w.num_encoder_blocks)
        return mismatch("num_encoder_blocks", list_str(cfg.num_encoder_blocks),
                        list_str(w.num_encoder_blocks), enc_store);
    }
  }
  if (layout.decoder.present) {
    AutoencoderTinyConfig w;
    if (infer_autoencoder_tiny_decoder(dec_store, layout.decoder, &w).ok()) {
      if (cfg.latent_channels != w.latent_channels)
        return mismatch("latent_channels", str_cat(cfg.latent_channels), str_cat(w.latent_channels),
                        dec_store);
      if (cfg.out_channels != w.out_channels)
        return mismatch("out_channels", str_cat(cfg.out_channels), str_cat(w.out_channels),
                        dec_store);
      if (cfg.decoder_block_out_channels != w.decoder_block_out_channels)
        return mismatch("decoder_block_out_channels", list_str(cfg.decoder_block_out_channels),
                        list_str(w.decoder_block_out_channels), dec_store);
      if (cfg.num_decoder_blocks != w.num_decoder_blocks)
        return mismatch("num_decoder_blocks", list_str(cfg.num_decoder_blocks),
                        list_str(w.num_decoder_blocks), dec_store);
    }
  }
  return ok_status();
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// "…/taesd_decoder.safetensors" -> "…/taesd_encoder.safetensors" (the last occurrence in the
// file name); empty when the name has no `from`.
std::string sibling_path(const std::string& path, const std::string& from, const std::string& to) {
  size_t slash = path.find_last_of('/');
  size_t base = slash == std::string::npos ? 0 : slash + 1;
  size_t pos = path.rfind(from);
  if (pos == std::string::npos || pos < base) return "";
  return path.substr(0, pos) + to + path.substr(pos + from.size());
}

struct TinySpace {
  const char* name;
  int64_t channels;
};

// TAESD latents live in the big model's normalised space.
std::string tiny_space_name(const ModelSource& source, const std::vector<std::string>& paths,
                            const AutoencoderTinyConfig& cfg) {
  static const TinySpace kSpaces[] = {
      {"sd", 4}, {"sdxl", 4}, {"sd3", 16}, {"flux1", 16}, {"flux2", 32}};
  std::vector<std::string> candidates = paths;
  candidates.push_back(source.given);
  candidates.push_back(source.root);
  for (const auto& p : candidates) {
    if (p.empty()) continue;
    std::string trimmed = p;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const std::string hint = latent_space_from_name(trimmed);
    for (const auto& s : kSpaces)
      if (hint == s.name && s.channels == cfg.latent_channels) return s.name;
  }
  const bool pool = cfg.encoder_pool || cfg.decoder_pool;
  if (cfg.latent_channels == 4) return "sd";
  if (cfg.latent_channels == 16 && !pool) return "flux1";
  if (cfg.latent_channels == 32 && pool) return "flux2";
  return str_cat("autoencoder-tiny-", cfg.latent_channels, "ch");
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + str_cat(x);
  return "[" + s + "]";
}

std::function<std::string(const std::string&)> make_rename(const AutoencoderTinyLayout& layout) {
  return [layout](const std::string& n) -> std::string {
    // "encoder.layers.K.rest" / "decoder.layers.K.rest" -> prefix + (K + offset) + ".rest"
    for (int part = 0; part < 2; ++part) {
      const std::string head = part == 0 ? "encoder.layers." : "decoder.layers.";
      const TinyPartLayout& l = part == 0 ? layout.encoder : layout.decoder;
      if (!starts_with(n, head)) continue;
      size_t dot = n.find('.', head.size());
      if (dot == std::string::npos) return n;
      const std::string idx = n.substr(head.size(), dot - head.size());
      if (idx.empty() || idx.size() > 4 || !std::all_of(idx.begin(), idx.end(), ::isdigit))
        return n;
      return str_cat(l.prefix, std::stoi(idx) + l.offset, n.substr(dot));
    }
    return n;
  };
}

}  // namespace

Result<std::unique_ptr<VaeModel>> load_autoencoder_tiny(const ModelSource& source,
                                                        const Config* config,
                                                        const WeightStore& weights,
                                                        std::shared_ptr<Backend> backend,
                                                        const VaeLoadOptions& options) {
  if (!backend) return Status::error("load_autoencoder_tiny: no backend");
  AutoencoderTinyLayout layout;
  if (!detect_autoencoder_tiny_layout(weights, &layout))
    return Status::errorf(
        weights.path(), ": no AutoencoderTiny tensors found (looked for ",
        "'encoder.layers.0.weight', 'decoder.layers.0.weight', ",
        "'taesd_encoder.0.weight', 'taesd_decoder.1.weight', 'encoder.0.weight', ",
        "'decoder.1.weight', or a bare '0.weight' / '1.weight' layer list)");

  // TAESD ships its encoder and decoder as two files; find the other half beside the given one.
  std::optional<WeightStore> sibling;
  AutoencoderTinyLayout sibling_layout;
  const bool bare = layout.form == "TAESD encoder file" || layout.form == "TAESD decoder file";
  if (bare) {
    const bool have_enc = layout.encoder.present;
    const bool need_other = have_enc ? options.decoder : options.encoder;
    const std::string other = have_enc ? sibling_path(weights.path(), "encoder", "decoder")
                                       : sibling_path(weights.path(), "decoder", "encoder");
    if (need_other && !other.empty() && file_exists(other)) {
      LATENT_ASSIGN_OR_RETURN(WeightStore s, WeightStore::open(other));
      AutoencoderTinyLayout sl;
      if (detect_autoencoder_tiny_layout(s, &sl) &&
          (have_enc ? sl.decoder.present : sl.encoder.present)) {
        sibling = std::move(s);
        sibling_layout = sl;
        LATENT_DEBUG("TAESD: using ", other, " for the ", have_enc ? "decoder" : "encoder");
      }
    }
  }
  const WeightStore& enc_store = layout.encoder.present || !sibling ? weights : *sibling;
  const WeightStore& dec_store = layout.decoder.present || !sibling ? weights : *sibling;
  AutoencoderTinyLayout full = layout;
  if (sibling) {
    if (!full.encoder.present) full.encoder = sibling_layout.encoder;
    if (!full.decoder.present) full.decoder = sibling_layout.decoder;
  }

  const bool want_enc = options.encoder && full.encoder.present;
  const bool want_dec = options.decoder && full.decoder.present;
  if (!want_enc && !want_dec) {
    if (!options.encoder && !options.decoder)
      return Status::errorf(weights.path(), ": no part was requested");
    return Status::errorf(
        weights.path(), " holds only a TAESD ", full.encoder.present ? "encoder" : "decoder",
        "; the ", options.encoder ? "encoder" : "decoder", " is a separate file (e.g. taesd_",
        options.encoder ? "encoder" : "decoder", ".safetensors)");
  }

  // A diffusers folder's config.json is the whole configuration; single files are read from
  // their weights, with the keys of an "x.json" beside the file (if any) merged over that.
  AutoencoderTinyConfig cfg;
  if (config && !source.single_file) {
    LATENT_ASSIGN_OR_RETURN(cfg, AutoencoderTinyConfig::from_config(*config));
    LATENT_TRY(check_config_against_weights(cfg, config->path(), full, enc_store, dec_store));
  } else {
    int64_t enc_latent = -1;
    if (full.encoder.present) {
      LATENT_TRY(infer_autoencoder_tiny_encoder(enc_store, full.encoder, &cfg));
      enc_latent = cfg.latent_channels;
    }
    if (full.decoder.present) {
      LATENT_TRY(infer_autoencoder_tiny_decoder(dec_store, full.decoder, &cfg));
      if (enc_latent >= 0 && enc_latent != cfg.latent_channels)
        return Status::errorf("TAESD encoder (", enc_store.path(), ") makes ", enc_latent,
                              "-channel latents, the decoder (", dec_store.path(), ") reads ",
                              cfg.latent_channels);
    }
    if (config) {
      nlohmann::json merged = cfg.to_json();
      for (const auto& [key, value] : config->json().items())
        if (!value.is_null()) merged[key] = value;
      LATENT_ASSIGN_OR_RETURN(cfg,
                              AutoencoderTinyConfig::from_config(Config(merged, config->path())));
    } else {
      LATENT_TRY(validate_autoencoder_tiny_config(cfg, weights.path()));
    }
  }
  cfg.encoder_pool =
      full.encoder.present && autoencoder_tiny_part_has_pool(enc_store, full.encoder);
  cfg.decoder_pool =
      full.decoder.present && autoencoder_tiny_part_has_pool(dec_store, full.decoder);

  // One binder per file so that every file is checked for unexpected tensors.
  auto rename = make_rename(full);
  WeightBinder enc_binder(enc_store, *backend, rename);
  WeightBinder dec_binder(dec_store, *backend, rename);
  const bool same_store = &enc_store == &dec_store;
  WeightBinder& eb = enc_binder;
  WeightBinder& db = same_store ? enc_binder : dec_binder;
  if (!want_enc && full.encoder.present) eb.ignore_prefix(full.encoder.prefix);
  if (!want_dec && full.decoder.present) db.ignore_prefix(full.decoder.prefix);

  ModelInfo info;
  info.architecture = "AutoencoderTiny";
  info.source = source;
  const int f = full.encoder.present ? cfg.encoder_downsample() : cfg.decoder_upsample();
  if (full.encoder.present && full.decoder.present &&
      cfg.encoder_downsample() != cfg.decoder_upsample())
    return Status::errorf(weights.path(), ": the TAESD encoder downsamples by ",
                          cfg.encoder_downsample(), " but the decoder upsamples by ",
                          cfg.decoder_upsample());
  std::string name = cfg.latent_space;
  if (name.empty()) name = tiny_space_name(source, {enc_store.path(), dec_store.path()}, cfg);
  info.latent_space = LatentSpace::from_scalars(name, static_cast<int>(cfg.latent_channels), f,
                                                cfg.scaling_factor, cfg.shift_factor);
  const bool pool = cfg.encoder_pool || cfg.decoder_pool;
  info.variant = name + (pool ? " (mid-block group norm)" : "");
  info.description =
      str_cat("layout: ", config ? "diffusers folder" : layout.form,
              sibling ? str_cat(" + ", sibling->path()) : std::string(), "\n",
              "in_channels: ", cfg.in_channels, "\n", "out_channels: ", cfg.out_channels, "\n",
              "latent_channels: ", cfg.latent_channels, "\n",
              "encoder_block_out_channels: ", list_str(cfg.encoder_block_out_channels), "\n",
              "num_encoder_blocks: ", list_str(cfg.num_encoder_blocks), "\n",
              "decoder_block_out_channels: ", list_str(cfg.decoder_block_out_channels), "\n",
              "num_decoder_blocks: ", list_str(cfg.num_decoder_blocks), "\n",
              "act_fn: ", cfg.act_fn, "\n", "mid-block group norm: ", pool ? "yes" : "no", "\n",
              "scaling_factor: ", fmt_g(cfg.scaling_factor), "\n",
              "shift_factor: ", fmt_g(cfg.shift_factor), "\n", "downsample: ", f, "\n",
              "latent_space: ", name);
  LATENT_ASSIGN_OR_RETURN(auto model,
                          bind_autoencoder_tiny(backend, cfg, want_enc ? &eb : nullptr,
                                                want_dec ? &db : nullptr, std::move(info)));
  LATENT_INFO("loaded AutoencoderTiny from ", source.given.empty() ? weights.path() : source.given,
              " (", model->info().variant, ")");
  return model;
}

}  // namespace latent
