#include "engine/weights/model_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

namespace latent {

namespace {

namespace fs = std::filesystem;

// diffusers weight file names, in the order diffusers itself prefers them; the fp16 variants
// are what `variant="fp16"` repositories ship.
const std::vector<std::string>& weight_file_names() {
  static const std::vector<std::string> names = {
      "diffusion_pytorch_model.safetensors",
      "diffusion_pytorch_model.safetensors.index.json",
      "model.safetensors",
      "model.safetensors.index.json",
      "diffusion_pytorch_model.fp16.safetensors",
      "diffusion_pytorch_model.safetensors.index.fp16.json",
      "model.fp16.safetensors",
      "model.safetensors.index.fp16.json",
  };
  return names;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_pickle_weight(const std::string& name) {
  return ends_with(name, ".bin") || ends_with(name, ".ckpt") || ends_with(name, ".pt") ||
         ends_with(name, ".pth");
}

bool is_regular_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// A readable file, or an error naming it.
Status check_readable(const std::string& p, const std::string& what) {
  if (::access(p.c_str(), R_OK) != 0)
    return Status::errorf("cannot read ", what, " ", p, ": ", std::strerror(errno));
  return ok_status();
}

// A folder with config.json and one of the weight files.
Result<ModelSource> resolve_diffusers_folder(const std::string& given, const std::string& dir) {
  ModelSource src;
  src.given = given;
  src.root = dir;
  src.form = "diffusers folder";
  src.config_path = join(dir, "config.json");
  LATENT_TRY(check_readable(src.config_path, "model config"));
  for (const auto& name : weight_file_names()) {
    const std::string p = join(dir, name);
    if (is_regular_file(p)) {
      LATENT_TRY(check_readable(p, "model weights"));
      src.weights_path = p;
      return src;
    }
  }
  // Say why nothing fits: PyTorch pickles are there but unsupported, or nothing is.
  std::vector<std::string> pickles;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_pickle_weight(name)) pickles.push_back(name);
  }
  std::sort(pickles.begin(), pickles.end());
  if (!pickles.empty())
    return Status::errorf(dir, " holds only PyTorch pickle weights (", pickles.front(),
                          pickles.size() > 1 ? ", ..." : "",
                          "); only safetensors is supported: convert them to "
                          "diffusion_pytorch_model.safetensors");
  std::string looked;
  for (const auto& name : weight_file_names()) looked += (looked.empty() ? "" : ", ") + name;
  return Status::errorf("no weights in ", dir, ": looked for ", looked);
}

Result<ModelSource> resolve_file(const std::string& given, const std::string& p) {
  const std::string name = fs::path(p).filename().string();
  if (is_pickle_weight(name))
    return Status::errorf(p, " is a PyTorch pickle checkpoint; only safetensors is supported");
  const bool sharded = ends_with(name, ".safetensors.index.json");
  if (!ends_with(name, ".safetensors") && !sharded)
    return Status::errorf(p,
                          " is neither a .safetensors file, a *.safetensors.index.json nor a "
                          "model folder");
  LATENT_TRY(check_readable(p, "model weights"));
  ModelSource src;
  src.given = given;
  src.root = fs::path(p).parent_path().string();
  if (src.root.empty()) src.root = ".";
  src.weights_path = p;
  src.single_file = true;
  src.form = "single file";
  // "x.safetensors" may come with its own "x.json"; a config.json beside it is not assumed to
  // belong to it.
  const std::string stem =
      name.substr(0, name.size() - (sharded ? std::strlen(".safetensors.index.json")
                                            : std::strlen(".safetensors")));
  const std::string cfg = join(src.root, stem + ".json");
  if (!sharded && is_regular_file(cfg)) {
    LATENT_TRY(check_readable(cfg, "model config"));
    src.config_path = cfg;
  }
  return src;
}

Result<ModelSource> resolve_path(const std::string& given, const std::string& path,
                                 const std::string& subfolder) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return Status::errorf("model path ", path, " does not exist");
    return Status::errorf("cannot access model path ", path, ": ", std::strerror(errno));
  }
  if (S_ISREG(st.st_mode)) return resolve_file(given, path);
  if (!S_ISDIR(st.st_mode))
    return Status::errorf("model path ", path, " is neither a file nor a folder");
  if (::access(path.c_str(), R_OK | X_OK) != 0)
    return Status::errorf("cannot read model folder ", path, ": ", std::strerror(errno));

  if (is_regular_file(join(path, "config.json"))) return resolve_diffusers_folder(given, path);

  if (is_regular_file(join(path, "model_index.json"))) {
    const std::string sub = join(path, subfolder);
    if (!is_directory(sub))
      return Status::errorf(path, " is a diffusers pipeline (model_index.json) without a '",
                            subfolder, "' subfolder");
    if (!is_regular_file(join(sub, "config.json")))
      return Status::errorf(path, " is a diffusers pipeline, but ", sub, " has no config.json");
    auto src = resolve_diffusers_folder(given, sub);
    if (!src.ok()) return src;
    src->form = "diffusers pipeline (" + subfolder + "/)";
    return src;
  }

  // A pipeline root without model_index.json (a partial download: only the parts fetched, e.g.
  // `huggingface-cli download ... --include "vae/*" "transformer/*"`): the subfolder with its
  // config.json is enough.
  const std::string sub = join(path, subfolder);
  if (is_regular_file(join(sub, "config.json"))) {
    auto src = resolve_diffusers_folder(given, sub);
    if (!src.ok()) return src;
    src->form = "diffusers pipeline (" + subfolder + "/)";
    return src;
  }
  // Other pipeline parts but not this one: name what is missing.
  std::vector<std::string> parts;
  for (const char* part : {"vae", "transformer", "unet", "scheduler", "text_encoder"})
    if (subfolder != part && is_directory(join(path, part))) parts.push_back(part);
  if (!parts.empty()) {
    std::string list;
    for (const auto& p : parts) list += (list.empty() ? "" : ", ") + p + "/";
    if (is_directory(sub))
      return Status::errorf(path, " looks like a diffusers pipeline (", list, "), but ", sub,
                            " has no config.json");
    return Status::errorf(path, " looks like a diffusers pipeline (", list, ") without a '",
                          subfolder, "' subfolder");
  }

  std::vector<std::string> safetensors;
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, ".safetensors")) safetensors.push_back(name);
  }
  std::sort(safetensors.begin(), safetensors.end());
  if (!safetensors.empty())
    return Status::errorf(path,
                          " has no config.json or model_index.json; to load a single "
                          "checkpoint, give the file itself (e.g. ",
                          join(path, safetensors.front()), ")");
  return Status::errorf(path,
                        " is not a model: looked for config.json (a diffusers model "
                        "folder) and model_index.json (a diffusers pipeline)");
}

}  // namespace

std::string default_model_dir() {
  const char* env = std::getenv("LATENT_DEFAULT_MODEL");
  if (env && *env) return env;
  if (is_regular_file(join(LATENT_DEFAULT_MODEL_INSTALL_DIR, "config.json")))
    return LATENT_DEFAULT_MODEL_INSTALL_DIR;
  return LATENT_DEFAULT_MODEL_SOURCE_DIR;
}

Result<ModelSource> resolve_model_source(const std::string& path, const std::string& subfolder) {
  if (path.empty() || path == "default") {
    const std::string dir = default_model_dir();
    auto src = resolve_path(path, dir, subfolder);
    if (!src.ok())
      return src.status().with_context(
          "the built-in default model (set LATENT_DEFAULT_MODEL or give a model path)");
    src->form = "built-in";
    return src;
  }
  return resolve_path(path, path, subfolder);
}

namespace {

std::string real_path(const std::string& path) {
  if (path.empty()) return path;
  char* real = realpath(path.c_str(), nullptr);
  if (!real) return path;
  std::string out(real);
  free(real);
  return out;
}

}  // namespace

std::string model_source_identity(const ModelSource& source) {
  return str_cat(real_path(source.weights_path), "|", real_path(source.config_path));
}

}  // namespace latent
