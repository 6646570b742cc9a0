// latent-tool's LoRA options and `inspect` of LoRA files; see lora_commands.h.
#include "tools/lora_commands.h"

#include <cstdio>

#include "engine/models/dit/lora.h"
#include "engine/weights/safetensors.h"

latent::Result<latent::MmditLoras> lora_options(const std::vector<std::string>& specs,
                                                const std::string& mode) {
  latent::MmditLoras out;
  if (!mode.empty()) {
    LATENT_ASSIGN_OR_RETURN(out.mode, latent::parse_lora_mode(mode));
  }
  for (const std::string& s : specs) {
    LATENT_ASSIGN_OR_RETURN(latent::LoraSpec spec, latent::parse_lora_spec(s));
    out.specs.push_back(spec);
  }
  if (!mode.empty() && out.specs.empty())
    return latent::Status::error("--lora-mode given without --lora");
  return out;
}

int inspect_lora(const std::string& path) {
  if (path.size() < 12 || path.compare(path.size() - 12, 12, ".safetensors") != 0) return -1;
  auto file = latent::SafetensorsFile::open(path);
  if (!file.ok()) return -1;  // the model inspection reports it
  std::vector<std::string> keys;
  for (const auto& r : (*file)->records()) keys.push_back(r.name);
  if (!latent::looks_like_lora_keys(keys)) return -1;
  auto lora = latent::load_lora_file(path);
  if (!lora.ok()) {
    std::printf("kind: LoRA (%zu tensors)\nfile: %s\nfits: no Qwen-Image transformer\n",
                keys.size(), path.c_str());
    std::fprintf(stderr, "latent-tool: %s\n", lora.status().message().c_str());
    return 1;
  }
  std::printf("%s", latent::describe_lora(*lora).c_str());
  std::printf("use: ditdenoise lora=\"%s:1.0\" lora-mode=merged|runtime; latent-tool denoise "
              "(or run --part transformer) --lora %s:1.0\n",
              path.c_str(), path.c_str());
  return 0;
}

const char* lora_usage() {
  return "  LoRAs (transformer): --lora FILE[:STRENGTH] (repeatable, they stack; strength 1 if\n"
         "          omitted) in the diffusers/PEFT, ComfyUI, kohya or Qwen-Image-Lightning layout;\n"
         "          --lora-mode merged (into the weights at load, default) | runtime (low-rank\n"
         "          products added every step). `latent-tool inspect FILE` describes a LoRA file.\n";
}
