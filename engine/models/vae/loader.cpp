// load_vae(): reads config.json when there is one, opens the weights and hands them to the
// architecture named by _class_name, or, for single files, to the one whose key names match.
#include <optional>

#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"

namespace latent {

namespace {

constexpr char kSupported[] =
    "AutoencoderKL, AutoencoderKLQwenImage, AutoencoderTiny, AutoencoderKLWan (Wan 2.1, Wan 2.2), "
    "TAEHV "
    "(taew2_1, taew2_2 files)";

// A few tensor names of an unrecognised checkpoint, for the error message.
std::string sample_names(const WeightStore& weights) {
  const std::vector<std::string> names = weights.names();
  if (names.empty()) return "it holds no tensors";
  std::string s;
  size_t shown = 0;
  for (const auto& n : names) {
    if (shown == 3) break;
    s += (shown ? ", '" : "'") + n + "'";
    ++shown;
  }
  if (names.size() > shown) s += str_cat(" and ", names.size() - shown, " more");
  return "its tensors are " + s;
}

}  // namespace

Result<std::unique_ptr<VaeModel>> load_vae(const ModelSource& source,
                                           std::shared_ptr<Backend> backend,
                                           const VaeLoadOptions& options) {
  if (!backend) return Status::error("load_vae: no backend given");
  if (!options.encoder && !options.decoder)
    return Status::errorf("load_vae: neither the encoder nor the decoder of ", source.given,
                          " was requested");
  if (source.weights_path.empty())
    return Status::errorf("load_vae: ", source.given, ": no weights file was resolved");

  std::optional<Config> config;
  if (!source.config_path.empty()) {
    LATENT_ASSIGN_OR_RETURN(Config c, Config::load(source.config_path));
    config = std::move(c);
  }
  LATENT_ASSIGN_OR_RETURN(WeightStore weights, WeightStore::open(source.weights_path));
  const Config* cfg = config ? &*config : nullptr;

  if (config && !config->class_name().empty()) {
    const std::string cls = config->class_name();
    LATENT_DEBUG("load_vae: ", source.given, ": ", cls, " (", source.form, ")");
    if (cls == "AutoencoderKL") return load_autoencoder_kl(source, cfg, weights, backend, options);
    if (cls == "AutoencoderKLQwenImage" || cls == "AutoencoderKLWan")
      return load_qwen_image_vae(source, cfg, weights, backend, options);
    if (cls == "AutoencoderTiny")
      return load_autoencoder_tiny(source, cfg, weights, backend, options);
    return Status::errorf("unsupported architecture '", cls, "' in ", source.config_path,
                          " (supported: ", kSupported, ")");
  }
  if (config && config->has("_class_name"))
    return Status::errorf(source.config_path, ": '_class_name' must be a string");

  // No class name: tell the architectures apart by their tensor names (Qwen-Image first: its
  // diffusers names share encoder.conv_in with AutoencoderKL, whose detector wants 4-D convs).
  LATENT_DEBUG("load_vae: ", source.given, ": detecting the architecture from tensor names");
  if (is_qwen_image_vae_checkpoint(weights))
    return load_qwen_image_vae(source, cfg, weights, backend, options);
  // TAEHV before TAESD: both store taehv.py / taesd.py Sequentials as encoder.N / decoder.N.
  if (is_taehv_checkpoint(weights)) return load_taehv(source, cfg, weights, backend, options);
  if (is_autoencoder_tiny_checkpoint(weights))
    return load_autoencoder_tiny(source, cfg, weights, backend, options);
  if (is_autoencoder_kl_checkpoint(weights))
    return load_autoencoder_kl(source, cfg, weights, backend, options);
  return Status::errorf(source.weights_path,
                        " is not a recognised VAE checkpoint (supported: ", kSupported, "; ",
                        sample_names(weights), ")");
}

Result<std::unique_ptr<VaeModel>> load_vae(const std::string& path,
                                           std::shared_ptr<Backend> backend,
                                           const VaeLoadOptions& options) {
  LATENT_ASSIGN_OR_RETURN(ModelSource source, resolve_model_source(path));
  return load_vae(source, std::move(backend), options);
}

}  // namespace latent
