// latent-tool on latent files (as latentsink writes them): `inspect FILE` prints what the file
// holds, and `decode` reads its `latents` tensor.
#pragma once

#include <string>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/weights/safetensors.h"

// Whether `path` names a latent file (a .safetensors whose metadata says it is one).
bool is_latent_file(const std::string& path);
// Prints a latent file's description; the exit status (0, or 1 with the error on stderr).
int inspect_latent_file(const std::string& path);
// The image-mode latents [T, C, h, w] of a latent file opened as `file`, for `decode` (which
// decodes each latent frame as an image); a video-mode file is an error pointing at latentsrc.
latent::Result<latent::Tensor> latent_file_images(const latent::SafetensorsFile& file);
