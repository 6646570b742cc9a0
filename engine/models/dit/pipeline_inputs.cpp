#include "engine/models/dit/pipeline_inputs.h"

#include <sys/stat.h>

#include <cmath>

#include "engine/core/log.h"
#include "engine/weights/config.h"

namespace latent {

namespace {

bool is_regular_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

Result<ResolvedScheduler> read_scheduler(const std::string& path) {
  ResolvedScheduler r;
  LATENT_ASSIGN_OR_RETURN(Config cfg, Config::load(path));
  LATENT_ASSIGN_OR_RETURN(r.config, parse_flow_match_scheduler_config(cfg));
  r.path = path;
  return r;
}

}  // namespace

Result<ResolvedScheduler> resolve_flow_match_scheduler(const std::string& model,
                                                       const std::string& explicit_path) {
  if (!explicit_path.empty()) {
    if (!is_regular_file(explicit_path))
      return Status::errorf("scheduler config ", explicit_path, " does not exist");
    return read_scheduler(explicit_path);
  }
  if (!model.empty()) {
    const std::string own = model + "/scheduler/scheduler_config.json";
    if (is_regular_file(own)) return read_scheduler(own);
    // A transformer/ folder or a weights file: the scheduler/ of the pipeline root around it.
    if (is_regular_file(model) || is_regular_file(model + "/config.json")) {
      const std::string beside = parent_dir(model) + "/scheduler/scheduler_config.json";
      if (is_regular_file(beside)) return read_scheduler(beside);
    }
  }
  ResolvedScheduler r;
  r.config = qwen_image_scheduler_config();
  return r;
}

Result<PromptEmbeds> read_prompt_embeds(const SafetensorsFile& file, const std::string& name,
                                        int64_t joint_dim, bool optional) {
  const std::string& path = file.path();
  const std::string mask_name = name + "_mask";
  PromptEmbeds p;
  if (!file.find(name)) {
    auto probe = file.tensor(name);  // names an unsupported dtype
    if (!probe.ok() && probe.status().message().rfind("unsupported dtype", 0) == 0)
      return probe.status();
    if (file.find(mask_name))
      return Status::errorf(path, " has '", mask_name, "' without '", name, "'");
    if (optional) return p;
    return Status::errorf(path, " has no tensor '", name,
                          "' (a [1, T, D] prompt embedding, as tools/compute_prompt_embeds.py "
                          "writes it)");
  }
  LATENT_ASSIGN_OR_RETURN(Tensor e, file.tensor(name));
  if (e.rank() != 3 || e.dim(0) != 1 || e.dim(1) < 1)
    return Status::errorf(path, ": tensor '", name, "' has shape ", shape_str(e.shape()),
                          ", expected [1, T, ", joint_dim > 0 ? str_cat(joint_dim) : "D", "]");
  if (joint_dim > 0 && e.dim(2) != joint_dim)
    return Status::errorf(path, ": tensor '", name, "' has shape ", shape_str(e.shape()),
                          " but the transformer expects ", joint_dim,
                          " features per token (joint_attention_dim)");
  p.embeds = e.to_dtype(DType::kF32);
  {
    // A NaN or inf (a text encoder overflowing in fp16) would make every frame NaN, silently.
    const float* v = p.embeds.data_as<float>();
    const int64_t n = p.embeds.numel(), d = e.dim(2);
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i]))
        return Status::errorf(path, ": tensor '", name, "' holds ", v[i], " (token ", i / d,
                              ", feature ", i % d,
                              "); recompute the embeddings (in bf16 or fp32: the text encoder "
                              "overflows in fp16)");
  }
  if (!file.find(mask_name)) {
    // Present in a dtype the engine skips (diffusers' masks are int64): say so, never ignore it.
    auto m = file.tensor(mask_name);
    if (!m.ok() && m.status().message().rfind("unsupported dtype", 0) == 0)
      return Status::errorf(m.status().message(),
                            "; store the mask as float32 1 / 0 "
                            "(tools/compute_prompt_embeds.py does)");
    return p;
  }
  LATENT_ASSIGN_OR_RETURN(Tensor m, file.tensor(mask_name));
  if (m.numel() != e.dim(1) || (m.rank() == 2 && m.dim(0) != 1) || m.rank() > 2)
    return Status::errorf(path, ": tensor '", mask_name, "' has shape ", shape_str(m.shape()),
                          ", expected [1, ", e.dim(1), "] to match '", name, "'");
  p.mask = m.to_floats();
  bool any = false;
  for (float v : p.mask) any = any || v != 0.f;
  if (!any) return Status::errorf(path, ": tensor '", mask_name, "' masks every token");
  return p;
}

Result<PromptEmbeds> load_prompt_embeds(const std::string& path, bool negative, int64_t joint_dim) {
  LATENT_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  std::string name = "prompt_embeds";
  if (negative && !file->find(name) && file->find("negative_prompt_embeds"))
    name = "negative_prompt_embeds";
  return read_prompt_embeds(*file, name, joint_dim);
}

}  // namespace latent
