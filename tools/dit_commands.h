// latent-tool's diffusion-transformer commands (hooked into latent_tool.cpp):
//   latent-tool run --part transformer ...   one QwenImageTransformer2DModel forward, timed
//   latent-tool denoise ...                  the whole text-to-image / img2img / edit loop
// Both take latent_tool.cpp's parsed options ("--key value" -> options[key]) and positionals,
// print results or errors and return the process exit status.
#pragma once

#include <map>
#include <string>
#include <vector>

int cmd_run_transformer(const std::map<std::string, std::string>& options,
                        const std::vector<std::string>& positional);
int cmd_denoise(const std::map<std::string, std::string>& options,
                const std::vector<std::string>& positional);

// `latent-tool inspect FILE` of a Qwen-Image transformer checkpoint (diffusers names or
// ComfyUI's prefixed single files): key prefix, dtypes, FP8 and its scales, the config. -1 when
// the file is no such checkpoint (the caller tries other kinds), else the exit status.
int inspect_transformer_file(const std::string& path);

// The usage lines of these commands, to append to latent-tool's usage text.
const char* dit_usage();
