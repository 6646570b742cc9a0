// LoRA files for the Qwen-Image transformer; see lora.h for the layouts.
#include "engine/models/dit/lora.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/safetensors.h"

namespace latent {

namespace {

// The linear layers of one QwenImageTransformerBlock (module name after "transformer_blocks.<i>.").
const char* const kBlockLinears[] = {
    "img_mod.1",          "txt_mod.1",          "attn.to_q",          "attn.to_k",
    "attn.to_v",          "attn.to_out.0",      "attn.add_q_proj",    "attn.add_k_proj",
    "attn.add_v_proj",    "attn.to_add_out",    "img_mlp.net.0.proj", "img_mlp.net.2",
    "txt_mlp.net.0.proj", "txt_mlp.net.2",
};
// The top-level linear layers.
const char* const kTopLinears[] = {
    "img_in",
    "txt_in",
    "time_text_embed.timestep_embedder.linear_1",
    "time_text_embed.timestep_embedder.linear_2",
    "norm_out.linear",
    "proj_out",
};
constexpr const char* kBlockPrefix = "transformer_blocks.";

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}
std::string underscored(std::string s) {
  std::replace(s.begin(), s.end(), '.', '_');
  return s;
}

// A diffusers module name of the Qwen-Image transformer ("transformer_blocks.<i>.<linear>" or a
// top-level linear), or nothing.
bool is_qwen_module(const std::string& m) {
  for (const char* t : kTopLinears)
    if (m == t) return true;
  if (!starts_with(m, kBlockPrefix)) return false;
  const size_t dot = m.find('.', std::string(kBlockPrefix).size());
  if (dot == std::string::npos) return false;
  const std::string index = m.substr(std::string(kBlockPrefix).size(), dot - 19);
  if (index.empty() || index.size() > 4 ||
      !std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  const std::string rest = m.substr(dot + 1);
  for (const char* b : kBlockLinears)
    if (rest == b) return true;
  return false;
}

// kohya's flattened name ("transformer_blocks_0_attn_to_out_0") -> the module, or nothing.
std::optional<std::string> kohya_module(const std::string& flat) {
  for (const char* t : kTopLinears)
    if (flat == underscored(t)) return std::string(t);
  const std::string prefix = "transformer_blocks_";
  if (!starts_with(flat, prefix)) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < flat.size() && flat[j] >= '0' && flat[j] <= '9') ++j;
  if (j == i || j >= flat.size() || flat[j] != '_' || j - i > 4) return std::nullopt;
  const std::string rest = flat.substr(j + 1);
  for (const char* b : kBlockLinears)
    if (rest == underscored(b)) return str_cat(kBlockPrefix, flat.substr(i, j - i), ".", b);
  return std::nullopt;
}

// What another model's LoRA key looks like, for the refusal ("" when nothing is recognised).
std::string other_model(const std::string& key) {
  auto has = [&](const char* s) { return key.find(s) != std::string::npos; };
  if (has("lora_te") || has("text_encoder") || has("text_model") || has("lora_te1") ||
      has("lora_te2"))
    return "a text encoder (CLIP / T5 / Qwen2.5-VL weights run outside the transformer)";
  if (has("single_transformer_blocks") || has("double_blocks") || has("single_blocks") ||
      has("x_embedder") || has("context_embedder"))
    return "FLUX.1 (or another FLUX-style MMDiT)";
  if (has("joint_blocks")) return "Stable Diffusion 3";
  if (has("input_blocks") || has("output_blocks") || has("down_blocks") || has("up_blocks") ||
      has("mid_block") || has("middle_block"))
    return "a Stable Diffusion / SDXL UNet";
  if (has("self_attn") || has("cross_attn") || has("ffn")) return "Wan 2.x (or another video DiT)";
  if (has("layers.") || has("layers_") || has("attention.to_")) return "Lumina / Z-Image";
  return "";
}

enum class Part : uint8_t { kDown, kUp, kAlpha };

struct KeyInfo {
  LoraLayout layout;
  std::string module;
  Part part;
};

// Splits a key into (layout, module, part); an error message otherwise.
Result<KeyInfo> parse_key(const std::string& key, const std::string& path) {
  struct Suffix {
    const char* text;
    Part part;
    bool peft;  // lora_A / lora_B naming
  };
  static const Suffix kSuffixes[] = {
      {".lora_A.weight", Part::kDown, true},        {".lora_B.weight", Part::kUp, true},
      {".lora_A.default.weight", Part::kDown, true}, {".lora_B.default.weight", Part::kUp, true},
      {".lora_down.weight", Part::kDown, false},    {".lora_up.weight", Part::kUp, false},
      {".alpha", Part::kAlpha, false},
  };
  const Suffix* suffix = nullptr;
  for (const Suffix& s : kSuffixes)
    if (ends_with(key, s.text)) {
      suffix = &s;
      break;
    }
  auto unknown = [&](const std::string& why) -> Status {
    return Status::errorf(path, ": LoRA key '", key, "' ", why);
  };
  if (!suffix)
    return unknown(
        "is not a LoRA tensor this loader reads (expected <module>.lora_A/.lora_B.weight, "
        ".lora_down/.lora_up.weight or .alpha; LoHa, LoKr, DoRA, biases and full weight "
        "differences are not supported)");
  const std::string base = key.substr(0, key.size() - std::string(suffix->text).size());
  KeyInfo info;
  info.part = suffix->part;
  if (starts_with(base, "lora_unet_")) {
    info.layout = LoraLayout::kKohya;
    auto m = kohya_module(base.substr(10));
    if (!m) return unknown("names no linear layer of the Qwen-Image transformer");
    info.module = *m;
    return info;
  }
  std::string module = base;
  if (starts_with(base, "base_model.model.")) {  // PEFT's save_pretrained of a PeftModel
    info.layout = LoraLayout::kDiffusers;
    module = base.substr(17);
  } else if (starts_with(base, "diffusion_model.")) {
    info.layout = LoraLayout::kComfyUI;
    module = base.substr(16);
  } else if (starts_with(base, "transformer.")) {
    info.layout = LoraLayout::kDiffusers;
    module = base.substr(12);
  } else {
    // Unprefixed: PEFT's save of the transformer alone (lora_A/B) or Lightning V1 (lora_down/up).
    info.layout = suffix->peft ? LoraLayout::kDiffusers : LoraLayout::kBare;
  }
  if (!is_qwen_module(module)) {
    const std::string other = other_model(key);
    return unknown(str_cat("names no linear layer of the Qwen-Image transformer",
                           other.empty() ? "" : str_cat(" (it looks like ", other, ")")));
  }
  info.module = module;
  return info;
}

// Alpha of `module` from diffusers' adapter metadata (lora_alpha, alpha_pattern), bare or under
// "transformer.".
struct MetadataAlpha {
  std::optional<double> lora_alpha;
  std::map<std::string, double> pattern;
  std::optional<double> for_module(const std::string& module) const {
    for (const auto& [p, a] : pattern)
      if (module == p || ends_with(module, "." + p)) return a;
    return lora_alpha;
  }
};

Result<MetadataAlpha> metadata_alpha(const std::map<std::string, std::string>& metadata,
                                     const std::string& path) {
  MetadataAlpha out;
  auto it = metadata.find("lora_adapter_metadata");
  if (it == metadata.end()) return out;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const std::exception& e) {
    return Status::errorf(path, ": __metadata__ 'lora_adapter_metadata' is not JSON: ", e.what());
  }
  if (!j.is_object()) return out;
  auto get = [&](const std::string& k) -> const nlohmann::json* {
    for (const std::string& name : {k, "transformer." + k})
      if (j.contains(name) && !j[name].is_null()) return &j[name];
    return nullptr;
  };
  for (const char* flag : {"use_dora", "use_rslora"})
    if (const auto* v = get(flag); v && v->is_boolean() && v->get<bool>())
      return Status::errorf(path, ": the adapter metadata sets ", flag,
                            "; only plain LoRA (scale alpha / rank) is supported");
  if (const auto* a = get("lora_alpha")) {
    if (!a->is_number())
      return Status::errorf(path, ": adapter metadata lora_alpha is not a number");
    out.lora_alpha = a->get<double>();
  }
  if (const auto* p = get("alpha_pattern"); p && p->is_object())
    for (const auto& [k, v] : p->items())
      if (v.is_number()) out.pattern[k] = v.get<double>();
  return out;
}

Result<Tensor> read_2d(const SafetensorsFile& f, const std::string& key) {
  LATENT_ASSIGN_OR_RETURN(Tensor t, f.tensor(key));
  if (t.rank() != 2)
    return Status::errorf(f.path(), ": LoRA tensor '", key, "' is ", shape_str(t.shape()),
                          ", expected a matrix (2-D; convolution LoRAs do not apply here)");
  Tensor f32 = t.to_dtype(DType::kF32);
  const float* p = f32.data_as<float>();
  for (int64_t i = 0; i < f32.numel(); ++i)
    if (!std::isfinite(p[i]))
      return Status::errorf(f.path(), ": LoRA tensor '", key, "' holds a non-finite value");
  return f32;
}

}  // namespace

const char* lora_layout_name(LoraLayout layout) {
  switch (layout) {
    case LoraLayout::kDiffusers:
      return "diffusers/PEFT";
    case LoraLayout::kComfyUI:
      return "ComfyUI";
    case LoraLayout::kKohya:
      return "kohya";
    case LoraLayout::kBare:
      return "bare lora_down/lora_up (Qwen-Image-Lightning V1)";
  }
  return "unknown";
}

const char* lora_mode_name(LoraMode mode) {
  return mode == LoraMode::kMerged ? "merged" : "runtime";
}

Result<LoraMode> parse_lora_mode(const std::string& text) {
  if (text == "merged") return LoraMode::kMerged;
  if (text == "runtime") return LoraMode::kRuntime;
  return Status::errorf("LoRA mode '", text, "' is not merged or runtime");
}

std::map<std::string, std::pair<int64_t, int64_t>> qwen_image_lora_targets(
    const QwenImageMmditConfig& c) {
  const int64_t d = c.inner_dim();
  std::map<std::string, std::pair<int64_t, int64_t>> t;
  t["img_in"] = {d, c.in_channels};
  t["txt_in"] = {d, c.joint_attention_dim};
  t["time_text_embed.timestep_embedder.linear_1"] = {d, 256};
  t["time_text_embed.timestep_embedder.linear_2"] = {d, d};
  t["norm_out.linear"] = {2 * d, d};
  t["proj_out"] = {c.out_features(), d};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = str_cat(kBlockPrefix, i, ".");
    for (const char* m : {"img_mod.1", "txt_mod.1"}) t[p + m] = {6 * d, d};
    for (const char* m : {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                          "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                          "attn.to_add_out"})
      t[p + m] = {d, d};
    for (const char* m : {"img_mlp.net.0.proj", "txt_mlp.net.0.proj"}) t[p + m] = {4 * d, d};
    for (const char* m : {"img_mlp.net.2", "txt_mlp.net.2"}) t[p + m] = {d, 4 * d};
  }
  return t;
}

bool looks_like_lora_keys(const std::vector<std::string>& keys) {
  for (const std::string& k : keys)
    if (ends_with(k, ".lora_A.weight") || ends_with(k, ".lora_down.weight") ||
        ends_with(k, ".lora_A.default.weight") || ends_with(k, ".lora_up.weight") ||
        ends_with(k, ".lora_B.weight"))
      return true;
  return false;
}

Result<LoraFile> load_lora_file(const std::string& path) {
  LATENT_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  const auto& records = file->records();
  if (records.empty()) return Status::errorf(path, ": holds no tensors, so no LoRA");
  std::vector<std::string> keys;
  for (const auto& r : records) keys.push_back(r.name);
  std::sort(keys.begin(), keys.end());

  // Every key must map; if none does and the names are another model's, say so in one sentence.
  std::map<std::string, KeyInfo> info;
  std::optional<Status> first_error;
  for (const std::string& k : keys) {
    auto ki = parse_key(k, path);
    if (ki.ok()) {
      info.emplace(k, *ki);
    } else if (!first_error) {
      first_error = ki.status();
    }
  }
  if (first_error) {
    // No LoRA key at all (a model's weights: a VAE, a UNet): not a LoRA, whatever its names
    // resemble.
    if (info.empty() && !looks_like_lora_keys(keys))
      return Status::errorf(path, " is not a LoRA file (no lora_A / lora_down keys; e.g. '",
                            keys.front(), "')");
    std::string other;
    for (const std::string& k : keys)
      if (other.empty() && !info.count(k)) other = other_model(k);
    if (info.empty() && !other.empty())
      return Status::errorf(path, " is not a LoRA for Qwen-Image (QwenImageTransformer2DModel): ",
                            "its keys (e.g. '", keys.front(), "') are for ", other);
    return *first_error;
  }
  LoraLayout layout = info.begin()->second.layout;
  for (const auto& [k, ki] : info)
    if (ki.layout != layout)
      return Status::errorf(path, ": mixes LoRA layouts: '", info.begin()->first, "' is ",
                            lora_layout_name(layout), ", '", k, "' is ",
                            lora_layout_name(ki.layout));

  LATENT_ASSIGN_OR_RETURN(MetadataAlpha meta, metadata_alpha(file->metadata(), path));
  struct Parts {
    std::string down, up, alpha;
  };
  std::map<std::string, Parts> parts;
  for (const auto& [k, ki] : info) {
    Parts& p = parts[ki.module];
    std::string& slot = ki.part == Part::kDown ? p.down : ki.part == Part::kUp ? p.up : p.alpha;
    if (!slot.empty())
      return Status::errorf(path, ": keys '", slot, "' and '", k, "' both give module ",
                            ki.module);
    slot = k;
  }
  LoraFile out;
  out.path = path;
  out.layout = layout;
  std::set<std::string> sources;
  for (const auto& [module, p] : parts) {
    if (p.down.empty() || p.up.empty())
      return Status::errorf(path, ": LoRA key '", p.down.empty() ? (p.up.empty() ? p.alpha : p.up)
                                                                 : p.down,
                            "' has no matching ", p.down.empty() ? "down (lora_A/lora_down)"
                                                                 : "up (lora_B/lora_up)",
                            " tensor for module ", module);
    LoraModule m;
    m.module = module;
    m.down_key = p.down;
    m.up_key = p.up;
    LATENT_ASSIGN_OR_RETURN(m.down, read_2d(*file, p.down));
    LATENT_ASSIGN_OR_RETURN(m.up, read_2d(*file, p.up));
    if (m.up.dim(1) != m.down.dim(0))
      return Status::errorf(path, ": LoRA key '", p.up, "' is ", shape_str(m.up.shape()),
                            " but '", p.down, "' is ", shape_str(m.down.shape()),
                            ": the ranks differ");
    if (m.rank() < 1) return Status::errorf(path, ": LoRA key '", p.down, "' has rank 0");
    if (!p.alpha.empty()) {
      LATENT_ASSIGN_OR_RETURN(Tensor a, file->tensor(p.alpha));
      if (a.numel() != 1)
        return Status::errorf(path, ": LoRA key '", p.alpha, "' is ", shape_str(a.shape()),
                              ", expected one value");
      m.alpha = a.to_floats()[0];
      sources.insert(".alpha tensors");
    } else if (auto a = meta.for_module(module)) {
      m.alpha = static_cast<float>(*a);
      sources.insert("adapter metadata");
    } else {
      m.alpha = static_cast<float>(m.rank());
      sources.insert("none (alpha = rank)");
    }
    if (!std::isfinite(m.alpha))
      return Status::errorf(path, ": alpha of module ", module, " is not finite");
    out.modules.push_back(std::move(m));
  }
  for (const std::string& s : sources)
    out.alpha_source += str_cat(out.alpha_source.empty() ? "" : ", ", s);
  return out;
}

std::string LoraFile::rank_summary() const {
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& m : modules) lo = std::min(lo, m.rank()), hi = std::max(hi, m.rank());
  if (modules.empty()) return "-";
  return lo == hi ? str_cat(lo) : str_cat(lo, "-", hi);
}

std::string LoraFile::alpha_summary() const {
  if (modules.empty()) return "-";
  float lo = modules[0].alpha, hi = lo;
  for (const auto& m : modules) lo = std::min(lo, m.alpha), hi = std::max(hi, m.alpha);
  return lo == hi ? str_cat(lo) : str_cat(lo, "-", hi);
}

int64_t LoraFile::inner_dim() const {
  for (const auto& m : modules)
    if (starts_with(m.module, kBlockPrefix) && ends_with(m.module, ".attn.to_q"))
      return m.in_features();
  for (const auto& m : modules)
    if (starts_with(m.module, kBlockPrefix) && !ends_with(m.module, "mlp.net.2"))
      return m.in_features();
  for (const auto& m : modules)
    if (ends_with(m.module, "mlp.net.2")) return m.out_features();
  return -1;
}

int64_t LoraFile::blocks_touched() const {
  int64_t n = -1;
  for (const auto& m : modules)
    if (starts_with(m.module, kBlockPrefix))
      n = std::max<int64_t>(n, std::atoll(m.module.c_str() + 19) + 1);
  return n;
}

Status check_lora_fits(const LoraFile& lora, const QwenImageMmditConfig& config) {
  const auto targets = qwen_image_lora_targets(config);
  // Per module: "" when it fits, else the problem.
  std::vector<std::string> problems;
  size_t fitting = 0;
  for (const auto& m : lora.modules) {
    auto it = targets.find(m.module);
    std::string p;
    if (it == targets.end()) {
      p = str_cat(lora.path, ": LoRA key '", m.down_key, "' adapts ", m.module,
                  ", which this transformer (", config.num_layers, " blocks) does not have");
    } else if (m.in_features() != it->second.second) {
      p = str_cat(lora.path, ": LoRA key '", m.down_key, "' is ", shape_str(m.down.shape()),
                  " but ", m.module, " takes ", it->second.second, " inputs (expected [rank, ",
                  it->second.second, "])");
    } else if (m.out_features() != it->second.first) {
      p = str_cat(lora.path, ": LoRA key '", m.up_key, "' is ", shape_str(m.up.shape()), " but ",
                  m.module, " has ", it->second.first, " outputs (expected [", it->second.first,
                  ", rank])");
    }
    fitting += p.empty();
    problems.push_back(p);
  }
  // Nothing fits, and everything would fit a transformer of another width: one sentence for the
  // whole file.
  const int64_t dim = lora.inner_dim();
  bool other_width = fitting == 0 && dim > 0 && dim != config.inner_dim();
  if (other_width) {
    QwenImageMmditConfig alt = config;
    alt.num_attention_heads = 1;
    alt.attention_head_dim = dim;
    alt.num_layers = std::max<int64_t>(config.num_layers, lora.blocks_touched());
    const auto alt_targets = qwen_image_lora_targets(alt);
    for (const auto& m : lora.modules) {
      auto it = alt_targets.find(m.module);
      other_width = other_width && it != alt_targets.end() &&
                    it->second == std::make_pair(m.out_features(), m.in_features());
    }
  }
  if (other_width)
    return Status::errorf(lora.path, " is a LoRA for a Qwen-Image transformer of inner dim ", dim,
                          " (Qwen-Image 20B: 3072); this transformer's inner dim is ",
                          config.inner_dim(), ", so it does not fit");
  for (const std::string& p : problems)
    if (!p.empty()) return Status::error(p);
  return ok_status();
}

std::string describe_lora(const LoraFile& lora) {
  // Module kinds by the last part of the name.
  std::map<std::string, int> kinds;
  for (const auto& m : lora.modules) {
    std::string kind = m.module;
    if (starts_with(kind, kBlockPrefix)) kind = kind.substr(kind.find('.', 19) + 1);
    ++kinds[kind];
  }
  std::string kind_list;
  for (const auto& [k, n] : kinds) kind_list += str_cat(kind_list.empty() ? "" : ", ", k, " x", n);
  const int64_t dim = lora.inner_dim();
  std::string fits = "the Qwen-Image family (QwenImageTransformer2DModel: Qwen-Image, "
                     "Qwen-Image-Edit, -Edit-2509, -Edit-2511 share the layout)";
  if (dim == 3072) fits += ", 20B (inner dim 3072)";
  else if (dim > 0) fits += str_cat(", inner dim ", dim);
  if (lora.blocks_touched() > 0) fits += str_cat(", at least ", lora.blocks_touched(), " blocks");
  std::string s = str_cat("kind: LoRA\n", "file: ", lora.path, "\n",
                          "layout: ", lora_layout_name(lora.layout), "\n",
                          "modules: ", lora.modules.size(), " (", kind_list, ")\n",
                          "rank: ", lora.rank_summary(), "\n", "alpha: ", lora.alpha_summary(),
                          " (from ", lora.alpha_source, ")\n", "fits: ", fits, "\n");
  // What the file says about its base model, when it says anything.
  auto file = SafetensorsFile::open(lora.path);
  if (file.ok())
    for (const char* k : {"modelspec.architecture", "ss_base_model_version", "base_model",
                          "modelspec.title"})
      if (auto it = (*file)->metadata().find(k); it != (*file)->metadata().end())
        s += str_cat("metadata ", k, ": ", it->second, "\n");
  return s;
}

Result<LoraSpec> parse_lora_spec(const std::string& text) {
  LoraSpec spec;
  spec.path = text;
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    const std::string tail = text.substr(colon + 1);
    errno = 0;
    char* end = nullptr;
    const float v = std::strtof(tail.c_str(), &end);
    if (!tail.empty() && end == tail.c_str() + tail.size() && errno == 0) {
      if (!std::isfinite(v))
        return Status::errorf("LoRA '", text, "': strength ", tail, " is not finite");
      spec.strength = v;
      spec.path = text.substr(0, colon);
    } else {
      // Not a number: the whole text is the path (a ':' in a file name), unless only the part
      // before the ':' is a file, where the strength is what is wrong.
      std::error_code ec;
      if (!std::filesystem::exists(text, ec) &&
          std::filesystem::is_regular_file(text.substr(0, colon), ec))
        return Status::errorf("LoRA '", text, "': strength '", tail,
                              "' is not a number (FILE[:STRENGTH], e.g. ", text.substr(0, colon),
                              ":0.8)");
    }
  }
  // Surrounding spaces ("a.safetensors:0.8, b.safetensors") are not part of a path.
  auto trim = [](std::string s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
    return s;
  };
  spec.path = trim(spec.path);
  if (spec.path.empty()) return Status::errorf("LoRA '", text, "': no file named");
  return spec;
}

Result<std::vector<LoraSpec>> parse_lora_list(const std::string& text) {
  std::vector<LoraSpec> out;
  size_t start = 0;
  bool blank = true;
  for (char c : text) blank = blank && std::isspace(static_cast<unsigned char>(c));
  if (blank) return out;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos
                                                                           : comma - start);
    LATENT_ASSIGN_OR_RETURN(LoraSpec spec, parse_lora_spec(item));
    out.push_back(spec);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string format_lora_list(const std::vector<LoraSpec>& specs) {
  std::string s;
  for (const auto& spec : specs) s += str_cat(s.empty() ? "" : ",", spec.path, ":", spec.strength);
  return s;
}

}  // namespace latent
