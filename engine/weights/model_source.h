// Where a model's config and weights are, whatever form the user gave it in.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace latent {

struct ModelSource {
  std::string given;         // the path as the user gave it
  std::string root;          // the folder holding config/weights (or the single file's folder)
  std::string config_path;   // config.json, or empty for a single file
  std::string weights_path;  // a .safetensors file or a *.safetensors.index.json
  bool single_file = false;  // a checkpoint without config.json (layout detected from keys)
  std::string form;          // "diffusers folder", "diffusers pipeline (vae/)", "single file", "built-in"
};

// Resolves `path`:
//  - "" or "default": the built-in default model (see default_model_dir());
//  - a .safetensors file: single file (with a config.json beside it of the same stem, if any,
//    it is used: "x.safetensors" + "x.json" or "config.json" is NOT assumed);
//  - a folder with config.json and diffusion_pytorch_model(.safetensors|.safetensors.index.json)
//    or model(...): a diffusers folder;
//  - a folder with model_index.json and a `subfolder` (default "vae"): a pipeline root;
//  - a folder without model_index.json whose `subfolder` has a config.json: a pipeline root as a
//    partial download leaves it (only vae/, transformer/, scheduler/ fetched);
//  - anything else: an error naming what was looked for.
Result<ModelSource> resolve_model_source(const std::string& path,
                                         const std::string& subfolder = "vae");

// What identifies a resolved model's files, whatever words reached them: the weights' and the
// config's real paths (symbolic links, "..", relative paths resolved). Two sources with the same
// identity load the same model, so callers may share one loaded instance between them.
std::string model_source_identity(const ModelSource& source);

// The folder of the built-in default model: $LATENT_DEFAULT_MODEL if set, else the installed
// data folder, else the source tree's models/default (set at configure time).
std::string default_model_dir();

}  // namespace latent
