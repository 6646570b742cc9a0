// Per-architecture loaders behind load_vae(); the dispatcher (loader.cpp) picks one from
// config.json's _class_name or, for single files, from the checkpoint's key names.
#pragma once

#include <memory>

#include "engine/models/vae/vae.h"
#include "engine/weights/config.h"
#include "engine/weights/safetensors.h"

namespace latent {

// `config` is null for single-file checkpoints (the architecture is inferred from the weights).
Result<std::unique_ptr<VaeModel>> load_autoencoder_kl(const ModelSource& source,
                                                      const Config* config,
                                                      const WeightStore& weights,
                                                      std::shared_ptr<Backend> backend,
                                                      const VaeLoadOptions& options);
Result<std::unique_ptr<VaeModel>> load_autoencoder_tiny(const ModelSource& source,
                                                        const Config* config,
                                                        const WeightStore& weights,
                                                        std::shared_ptr<Backend> backend,
                                                        const VaeLoadOptions& options);
Result<std::unique_ptr<VaeModel>> load_qwen_image_vae(const ModelSource& source,
                                                      const Config* config,
                                                      const WeightStore& weights,
                                                      std::shared_ptr<Backend> backend,
                                                      const VaeLoadOptions& options);
// The TAEHV family (taehv.h); single files only.
Result<std::unique_ptr<VaeModel>> load_taehv(const ModelSource& source, const Config* config,
                                             const WeightStore& weights,
                                             std::shared_ptr<Backend> backend,
                                             const VaeLoadOptions& options);

// Single-file detection from key names.
bool is_qwen_image_vae_checkpoint(const WeightStore& weights);
bool is_autoencoder_tiny_checkpoint(const WeightStore& weights);
bool is_taehv_checkpoint(const WeightStore& weights);  // taehv.h
bool is_autoencoder_kl_checkpoint(const WeightStore& weights);

}  // namespace latent
