// latent-tool run --part transformer / latent-tool denoise; see dit_commands.h and dit_usage().
#include "tools/dit_commands.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "engine/backends/registry.h"
#include "engine/models/dit/denoise.h"
#include "engine/models/dit/flow_match_scheduler.h"
#include "engine/models/dit/pipeline_inputs.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/config.h"
#include "engine/weights/model_source.h"
#include "engine/weights/safetensors.h"
#include "tools/lora_commands.h"

#if LATENT_TOOL_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace {

using latent::Result;
using latent::Status;
using latent::Tensor;
using Options = std::map<std::string, std::string>;

const char* kDitUsage =
    "  run     --model M --part transformer --inputs IN.safetensors --outputs OUT.safetensors\n"
    "          [--case NAME] [--warmup N] [--repeat N] [--json]\n"
    "          [--lora FILE[:STRENGTH]]... [--lora-mode merged|runtime]\n"
    "          transformer (QwenImageTransformer2DModel; M: pipeline root or transformer/):\n"
    "          `hidden_states` [B,T,C], `encoder_hidden_states` [B,Tt,D], optional\n"
    "          `encoder_hidden_states_mask` [B,Tt], `timestep` [B] (t/1000), `img_shapes` [n,3]\n"
    "          (frames, height, width in patches) -> `sample`; --case reads NAME.<tensor>\n"
    "  denoise --model ROOT --embeds E.safetensors [--steps 50] [--true-cfg-scale 4] [--seed 0]\n"
    "          [--width W --height H (pixels)] [--noise N.safetensors] [--init L.safetensors\n"
    "          --strength S] [--reference L.safetensors[,L2...]] [--batch-cfg 0|1]\n"
    "          [--output-latents OUT.safetensors] [--output IMG] [--output-sample "
    "OUT.safetensors]\n"
    "          [--transformer PATH] [--vae PATH] [--scheduler scheduler_config.json]\n"
    "          [--inputs IO.safetensors --case NAME]\n"
    "          [--lora FILE[:STRENGTH]]... [--lora-mode merged|runtime]\n"
    "          Qwen-Image text-to-image / img2img / edit from a pipeline root (transformer/,\n"
    "          scheduler/, vae/ to decode). E holds `prompt_embeds` [1,T,D], optional\n"
    "          `prompt_embeds_mask` and `negative_prompt_embeds(_mask)` (true CFG). Latent files\n"
    "          hold one normalised latent [1,16,h,w] or [1,16,1,h,w] (e.g. `latent` from encode);\n"
    "          --noise gives the initial noise explicitly (else torch.randn from --seed).\n"
    "          --inputs/--case read every input from one file of NAME.<tensor> entries.\n"
    "          --true-cfg-scale <= 1: guidance off, one transformer pass per step (few-step\n"
    "          distilled models and Lightning LoRAs: --steps 4 or 8 --true-cfg-scale 1).\n"
    "  LoRAs:  --lora FILE[:STRENGTH] (repeatable, they stack; strength 1 if omitted) in the\n"
    "          diffusers/PEFT, ComfyUI, kohya or Qwen-Image-Lightning layout; --lora-mode\n"
    "          merged (into the weights at load, the default) | runtime (low-rank products\n"
    "          added every step). `latent-tool inspect FILE` describes a LoRA file.\n"
    "  FP8:    --dtype fp8 quantises the transformer blocks' linear layers to FP8 e4m3 at load\n"
    "          (a scale per output channel, inputs per token at run time; FP8 tensor cores on\n"
    "          Hopper, emulated on the CPU); attention, norms and the rest run in bf16 on CUDA\n"
    "          (fp32 on the CPU).\n";

std::string get(const Options& o, const std::string& k, const std::string& def = "") {
  auto it = o.find(k);
  return it == o.end() ? def : it->second;
}

int fail(const Status& s) {
  std::fprintf(stderr, "latent-tool: error: %s\n", s.message().c_str());
  return 1;
}

Result<double> number(const Options& o, const std::string& key, double def) {
  const std::string v = get(o, key);
  if (v.empty()) return def;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !std::isfinite(d))
    return Status::errorf("--", key, " expects a number, got '", v, "'");
  return d;
}

Result<int64_t> integer(const Options& o, const std::string& key, int64_t def, int64_t lo,
                        int64_t hi) {
  LATENT_ASSIGN_OR_RETURN(double d, number(o, key, static_cast<double>(def)));
  if (d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi))
    return Status::errorf("--", key, " expects an integer in [", lo, ", ", hi, "], got ",
                          get(o, key));
  return static_cast<int64_t>(d);
}

// --dtype fp8: the transformer's block linear layers in FP8 (QwenImageMmdit, LinearFormat),
// everything else in the device's default dtype (bf16 on CUDA, fp32 on the CPU).
bool fp8_of(const Options& o) { return get(o, "dtype") == "fp8"; }

latent::LinearFormat linears_of(const Options& o) {
  return fp8_of(o) ? latent::LinearFormat::kFp8 : latent::LinearFormat::kComputeDtype;
}

Result<std::shared_ptr<latent::Backend>> backend_for(const Options& o) {
  latent::BackendOptions b;
  b.device = get(o, "device", "auto");
  b.dtype = fp8_of(o) ? "" : get(o, "dtype", "");
  return latent::get_backend(b);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A tensor of `file` named prefix + name; optional ones come back undefined when absent.
Result<Tensor> tensor_of(const latent::SafetensorsFile& file, const std::string& prefix,
                         const std::string& name, bool optional) {
  const std::string full = prefix + name;
  if (!file.find(full)) {
    if (optional) return Tensor();
    return Status::errorf(file.path(), " has no tensor '", full, "'");
  }
  return file.tensor(full);
}

std::string prefix_of(const Options& o) {
  const std::string c = get(o, "case");
  return c.empty() ? "" : c + ".";
}

}  // namespace

const char* dit_usage() { return kDitUsage; }

// --lora (newline-joined values, latent_tool.cpp) and --lora-mode.
Result<latent::MmditLoras> loras_of(const Options& o) {
  std::vector<std::string> specs;
  const std::string all = get(o, "lora");
  size_t start = 0;
  // Given, even as "", each value is a spec (an empty one is refused, not ignored).
  while (o.count("lora") && start <= all.size()) {
    const size_t nl = all.find('\n', start);
    specs.push_back(all.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return lora_options(specs, get(o, "lora-mode"));
}

// --- run --part transformer --------------------------------------------------------------
int cmd_run_transformer(const Options& o, const std::vector<std::string>& positional) {
  const std::string in = get(o, "inputs"), out = get(o, "outputs");
  if (in.empty() || out.empty())
    return fail(Status::error("run --part transformer needs --inputs FILE and --outputs FILE"));
  auto backend = backend_for(o);
  if (!backend.ok()) return fail(backend.status());
  const std::string path = get(o, "model", positional.empty() ? "" : positional[0]);
  if (path.empty()) return fail(Status::error("run --part transformer needs --model PATH"));
  auto loras = loras_of(o);
  if (!loras.ok()) return fail(loras.status());
  auto model = latent::QwenImageMmdit::load(path, *backend, *loras, linears_of(o));
  if (!model.ok()) return fail(model.status());
  latent::QwenImageMmdit& m = **model;
  latent::Backend& b = m.backend();
  auto file = latent::SafetensorsFile::open(in);
  if (!file.ok()) return fail(file.status());
  const std::string pre = prefix_of(o);

  latent::MmditInputs inputs;
  Tensor host_hs;
  {
    auto hs = tensor_of(**file, pre, "hidden_states", false);
    auto ehs = tensor_of(**file, pre, "encoder_hidden_states", false);
    auto mask = tensor_of(**file, pre, "encoder_hidden_states_mask", true);
    auto ts = tensor_of(**file, pre, "timestep", false);
    auto shapes = tensor_of(**file, pre, "img_shapes", false);
    for (const auto* r : {&hs, &ehs, &mask, &ts, &shapes})
      if (!r->ok()) return fail(r->status());
    host_hs = *hs;
    auto dev_hs = b.upload(*hs);
    if (!dev_hs.ok()) return fail(dev_hs.status());
    auto dev_ehs = b.upload(*ehs);
    if (!dev_ehs.ok()) return fail(dev_ehs.status());
    inputs.hidden_states = *dev_hs;
    inputs.encoder_hidden_states = *dev_ehs;
    if (mask->defined()) inputs.encoder_hidden_states_mask = mask->to_floats();
    inputs.timestep = ts->to_floats();
    if (shapes->rank() != 2 || shapes->dim(1) != 3)
      return fail(Status::errorf(in,
                                 ": img_shapes must be [n, 3] (frames, height, width in "
                                 "patches), got ",
                                 latent::shape_str(shapes->shape())));
    const std::vector<float> s = shapes->to_floats();
    for (size_t i = 0; i < s.size(); i += 3) {
      for (size_t k = 0; k < 3; ++k)
        if (s[i + k] != std::floor(s[i + k]) || s[i + k] < 1 || s[i + k] > 65536)
          return fail(Status::errorf(in, ": img_shapes row ", i / 3, " holds ", s[i + k],
                                     ", expected positive integers"));
      inputs.img_shapes.push_back({static_cast<int64_t>(s[i]), static_cast<int64_t>(s[i + 1]),
                                   static_cast<int64_t>(s[i + 2])});
    }
  }
  auto warmup = integer(o, "warmup", 1, 0, 1000);
  auto repeat = integer(o, "repeat", 1, 1, 100000);
  if (!warmup.ok()) return fail(warmup.status());
  if (!repeat.ok()) return fail(repeat.status());
  std::vector<double> times;
  Tensor y;
  b.reset_peak_memory();
  for (int64_t i = 0; i < *warmup + *repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = m.forward(inputs);
    if (!r.ok()) return fail(r.status());
    Status s = b.synchronize();
    if (!s.ok()) return fail(s);
    if (i >= *warmup) times.push_back(ms_since(t0));
    y = std::move(r).value();
  }
  auto host = b.download(y);
  if (!host.ok()) return fail(host.status());
  // "fp8" when the linear layers ran in FP8 (the rest in the compute dtype).
  const std::string dtype = m.linear_format() == latent::LinearFormat::kFp8
                                ? "fp8"
                                : latent::dtype_name(b.compute_dtype());
  Status s = latent::write_safetensors(out, {{"sample", *host}},
                                       {{"model", path},
                                        {"part", "transformer"},
                                        {"device", b.name()},
                                        {"dtype", dtype}});
  if (!s.ok()) return fail(s);
  const double med = median(times), mn = *std::min_element(times.begin(), times.end());
  std::printf(
      "QwenImageTransformer2DModel transformer: %s -> sample %s on %s (%s%s): median %.3f ms "
      "over %lld runs (min %.3f)\n",
      latent::shape_str(host_hs.shape()).c_str(), latent::shape_str(host->shape()).c_str(),
      b.name().c_str(), dtype.c_str(),
      m.loras().empty() ? ""
                        : latent::str_cat(", ", m.loras().size(), " LoRA(s) ",
                                          latent::lora_mode_name(m.lora_mode()))
                              .c_str(),
      med, static_cast<long long>(*repeat), mn);
  if (o.count("json"))
    std::printf(
        "{\"part\": \"transformer\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"runs\": %lld, "
        "\"peak_bytes\": %lld, \"held_bytes\": %lld, \"device\": \"%s\", \"dtype\": \"%s\"}\n",
        med, mn, static_cast<long long>(*repeat), static_cast<long long>(b.peak_memory_bytes()),
        static_cast<long long>(b.memory_use().held), b.name().c_str(), dtype.c_str());
  return 0;
}

// --- denoise -----------------------------------------------------------------------------
namespace {

// The latent of a file: its only tensor, else `latent` / `latents`.
Result<Tensor> latent_file(const std::string& path) {
  LATENT_ASSIGN_OR_RETURN(auto file, latent::SafetensorsFile::open(path));
  if (file->records().size() == 1) return file->tensor(file->records()[0].name);
  for (const char* n : {"latent", "latents", "noise"})
    if (file->find(n)) return file->tensor(n);
  return Status::errorf(path, " holds several tensors and none is named 'latent'");
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

#if LATENT_TOOL_OPENCV
Status write_image(const std::string& path, const Tensor& t) {  // [1, 3, H, W] in [-1, 1]
  const int h = static_cast<int>(t.dim(2)), w = static_cast<int>(t.dim(3));
  cv::Mat bgr(h, w, CV_8UC3);
  const std::vector<float> v = t.to_floats();
  const int64_t plane = static_cast<int64_t>(h) * w;
  for (int y = 0; y < h; ++y) {
    uint8_t* row = bgr.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const float f = (v[c * plane + static_cast<int64_t>(y) * w + x] + 1.f) * 127.5f;
        row[x * 3 + (2 - c)] = static_cast<uint8_t>(std::lround(std::clamp(f, 0.f, 255.f)));
      }
  }
  try {
    if (!cv::imwrite(path, bgr)) return Status::errorf("cannot write image '", path, "'");
  } catch (const cv::Exception& e) {
    return Status::errorf("cannot write image '", path, "': ", e.what());
  }
  return Status();
}
#else
Status write_image(const std::string& path, const Tensor&) {
  return Status::errorf("cannot write image '", path,
                        "': this latent-tool was built without "
                        "OpenCV (use --output-sample)");
}
#endif

}  // namespace

int cmd_denoise(const Options& o, const std::vector<std::string>& positional) {
  const std::string root = get(o, "model", positional.empty() ? "" : positional[0]);
  if (root.empty())
    return fail(Status::error("denoise needs --model ROOT (a Qwen-Image pipeline root)"));
  const std::string out_latents = get(o, "output-latents"), out_image = get(o, "output"),
                    out_sample = get(o, "output-sample");
  if (out_latents.empty() && out_image.empty() && out_sample.empty())
    return fail(Status::error(
        "denoise needs --output-latents FILE, --output IMAGE or --output-sample FILE"));
  auto backend = backend_for(o);
  if (!backend.ok()) return fail(backend.status());

  // Request.
  latent::DenoiseRequest req;
  auto steps = integer(o, "steps", 50, 1, 10000);
  auto seed = integer(o, "seed", 0, 0, INT64_MAX);
  auto cfg_scale = number(o, "true-cfg-scale", 4.0);
  auto strength = number(o, "strength", 1.0);
  auto batch_cfg = integer(o, "batch-cfg", 1, 0, 1);
  auto width = integer(o, "width", 0, 0, 1 << 16), height = integer(o, "height", 0, 0, 1 << 16);
  for (const auto* r : {&steps, &seed, &batch_cfg, &width, &height})
    if (!r->ok()) return fail(r->status());
  for (const auto* r : {&cfg_scale, &strength})
    if (!r->ok()) return fail(r->status());
  req.steps = static_cast<int>(*steps);
  req.seed = static_cast<uint64_t>(*seed);
  req.true_cfg_scale = static_cast<float>(*cfg_scale);
  req.strength = *strength;
  req.batch_cfg = *batch_cfg != 0;
  if ((*width == 0) != (*height == 0))
    return fail(Status::error("denoise: give both --width and --height (pixels), or neither"));
  if (*width % 16 || *height % 16)
    return fail(
        Status::errorf("denoise: --width and --height must be multiples of 16 (8x VAE, "
                       "2x2 patches), got ",
                       *width, " x ", *height));
  req.width = *width / 8;
  req.height = *height / 8;

  // The transformer first: the prompt embeddings are checked against its text width.
  auto loras = loras_of(o);
  if (!loras.ok()) return fail(loras.status());
  auto model =
      latent::QwenImageMmdit::load(get(o, "transformer", root), *backend, *loras, linears_of(o));
  if (!model.ok()) return fail(model.status());
  const int64_t joint_dim = (*model)->config().joint_attention_dim;
  // The scheduler as ditdenoise finds it (engine/models/dit/pipeline_inputs.h), or --scheduler.
  auto sched_r = latent::resolve_flow_match_scheduler(root, get(o, "scheduler"));
  if (!sched_r.ok()) return fail(sched_r.status().with_context("denoise: reading the scheduler"));
  if (sched_r->path.empty())
    std::fprintf(stderr,
                 "latent-tool: note: no scheduler/scheduler_config.json in %s: using Qwen-Image's "
                 "published scheduler config\n",
                 root.c_str());
  const latent::FlowMatchSchedulerConfig sched = sched_r->config;

  const std::string io = get(o, "inputs");
  if (io.empty() && o.count("case"))
    return fail(Status::error("denoise: --case names the cases of --inputs FILE; give both"));
  if (!io.empty()) {  // every input from one file: NAME.prompt_embeds, NAME.noise, ...
    auto file = latent::SafetensorsFile::open(io);
    if (!file.ok()) return fail(file.status());
    const std::string pre = prefix_of(o);
    auto p = latent::read_prompt_embeds(**file, pre + "prompt_embeds", joint_dim);
    auto n = latent::read_prompt_embeds(**file, pre + "negative_prompt_embeds", joint_dim, true);
    auto noise = tensor_of(**file, pre, "noise", true);
    auto init = tensor_of(**file, pre, "image_latents", true);
    if (!p.ok()) return fail(p.status());
    if (!n.ok()) return fail(n.status());
    if (!noise.ok()) return fail(noise.status());
    if (!init.ok()) return fail(init.status());
    req.prompt = *p;
    req.negative = *n;
    if (!o.count("seed")) req.noise = *noise;  // --seed overrides a stored noise
    req.init_latents = *init;
    for (int i = 0;; ++i) {
      auto r = tensor_of(**file, pre, "reference_latents_" + std::to_string(i), true);
      if (!r.ok()) return fail(r.status());
      if (!r->defined()) break;
      req.reference_latents.push_back(*r);
    }
  }
  if (o.count("embeds")) {
    auto file = latent::SafetensorsFile::open(get(o, "embeds"));
    if (!file.ok()) return fail(file.status());
    auto p = latent::read_prompt_embeds(**file, "prompt_embeds", joint_dim);
    auto n = latent::read_prompt_embeds(**file, "negative_prompt_embeds", joint_dim, true);
    if (!p.ok()) return fail(p.status());
    if (!n.ok()) return fail(n.status());
    req.prompt = *p;
    req.negative = *n;
  }
  if (!req.prompt.defined())
    return fail(Status::error("denoise needs --embeds FILE (prompt_embeds)"));
  if (o.count("noise")) {
    auto t = latent_file(get(o, "noise"));
    if (!t.ok()) return fail(t.status());
    req.noise = *t;
  }
  if (o.count("init")) {
    auto t = latent_file(get(o, "init"));
    if (!t.ok()) return fail(t.status());
    req.init_latents = *t;
  }
  if (o.count("reference")) {
    req.reference_latents.clear();
    for (const std::string& f : split_commas(get(o, "reference"))) {
      auto t = latent_file(f);
      if (!t.ok()) return fail(t.status());
      req.reference_latents.push_back(*t);
    }
  }
  if (req.height == 0 && !req.noise.defined() && !req.init_latents.defined())
    return fail(Status::error("denoise: give --width and --height, --noise or --init"));

  std::unique_ptr<latent::VaeModel> vae;
  if (!out_image.empty() || !out_sample.empty()) {
    auto v = latent::load_vae(get(o, "vae", root), *backend, {false, true});
    if (!v.ok()) return fail(v.status());
    vae = std::move(v).value();
  }

  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  auto result = latent::qwen_image_denoise(**model, sched, req, [&](int step, int total) {
    std::fprintf(stderr, "step %d/%d: %.1f ms\n", step, total, ms_since(last));
    last = std::chrono::steady_clock::now();
    return true;
  });
  if (!result.ok()) return fail(result.status());
  const double loop_ms = ms_since(t0);
  const Tensor& lat = result->latents;  // [1, C, 1, h, w]
  const int64_t c = lat.dim(1), h = lat.dim(3), w = lat.dim(4);
  const std::string space = vae ? vae->latent_space().name : "qwen-image";
  if (!out_latents.empty()) {
    Status s = latent::write_safetensors(
        out_latents, {{"latent", Tensor::from_floats({1, c, h, w}, lat.to_floats())}},
        {{"latent_space", space},
         {"normalised", "true"},
         {"frame_width", std::to_string(w * 8)},
         {"frame_height", std::to_string(h * 8)},
         {"steps", std::to_string(req.steps)},
         {"seed", std::to_string(req.seed)}});
    if (!s.ok()) return fail(s);
  }
  if (vae) {
    auto img = latent::decode_latents(*vae, lat);
    if (!img.ok()) return fail(img.status());
    if (!out_sample.empty()) {
      Status s =
          latent::write_safetensors(out_sample, {{"sample", *img}}, {{"latent_space", space}});
      if (!s.ok()) return fail(s);
    }
    if (!out_image.empty()) {
      Status s = write_image(out_image, *img);
      if (!s.ok()) return fail(s);
    }
  }
  std::printf(
      "denoised %lld x %lld latent (%d of %d steps, %zu reference(s), %s) on %s in %.1f ms\n",
      static_cast<long long>(h), static_cast<long long>(w), result->schedule.steps_to_run(),
      req.steps, req.reference_latents.size(),
      req.negative.defined() && req.true_cfg_scale > 1 ? "true CFG" : "no CFG",
      (*backend)->name().c_str(), loop_ms);
  return 0;
}

// --- inspect FILE (a transformer checkpoint) ---------------------------------------------
int inspect_transformer_file(const std::string& path) {
  auto ends_with = [&](const std::string& s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (!ends_with(".safetensors") && !ends_with(".safetensors.index.json")) return -1;
  auto store = latent::WeightStore::open(path);
  if (!store.ok()) return -1;  // the model inspection reports it
  const std::string prefix = latent::qwen_image_mmdit_key_prefix(*store);
  if (!store->contains(prefix + "img_in.weight") ||
      !store->contains(prefix + "transformer_blocks.0.img_mod.1.weight"))
    return -1;
  std::printf("kind:       Qwen-Image transformer (QwenImageTransformer2DModel), one checkpoint\n");
  std::printf("file:       %s\n", path.c_str());
  std::printf("key prefix: %s\n",
              prefix.empty() ? "none (diffusers names)" : (prefix + " (ComfyUI)").c_str());

  // Tensors and parameters by stored dtype; FP8 weights with their scales.
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // dtype -> tensors, parameters
  int64_t fp8 = 0, scaled = 0, per_row = 0, input_scales = 0;
  std::string marker;
  for (const std::string& n : store->names()) {
    const latent::TensorRecord* r = store->find(n);
    const std::string dt = r->fp8 != latent::Fp8Format::kNone ? latent::fp8_format_name(r->fp8)
                                                              : latent::dtype_name(r->dtype);
    by_dtype[dt].first += 1;
    by_dtype[dt].second += latent::shape_numel(r->shape);
    const latent::Fp8Companion c = latent::fp8_companion(n);
    if (c.kind == latent::Fp8Companion::kInputScale) ++input_scales;
    if (c.kind == latent::Fp8Companion::kMarker) marker = dt;
    if (r->fp8 == latent::Fp8Format::kNone || c.kind != latent::Fp8Companion::kNone) continue;
    ++fp8;
    if (const latent::TensorRecord* s = store->fp8_scale_of(n)) {
      ++scaled;
      per_row += latent::shape_numel(s->shape) > 1;
    }
  }
  std::printf("dtypes:    ");
  for (const auto& [dt, c] : by_dtype)
    std::printf("%s %s %lld tensors (%lld parameters)", dt == by_dtype.begin()->first ? "" : ";",
                dt.c_str(), static_cast<long long>(c.first), static_cast<long long>(c.second));
  std::printf("\n");
  if (fp8 == 0)
    std::printf("fp8:        no\n");
  else if (scaled == 0)
    std::printf("fp8:        %lld weights, unscaled (cast to FP8)%s\n", static_cast<long long>(fp8),
                marker.empty() ? "" : ", scaled_fp8 marker");
  else
    std::printf(
        "fp8:        %lld weights, scaled: %lld with a scale_weight (%lld per row), %lld "
        "scale_input (ignored)%s\n",
        static_cast<long long>(fp8), static_cast<long long>(scaled),
        static_cast<long long>(per_row), static_cast<long long>(input_scales),
        marker.empty() ? "" : latent::str_cat(", scaled_fp8 marker (", marker, ")").c_str());
  if (fp8 > 0)
    std::printf("            dequantised at load to the compute dtype%s\n",
                scaled > 0 ? " (weight x scale_weight)" : "");

  // The config: the file's own x.json, else from the shapes.
  auto source = latent::resolve_model_source(path, "transformer");
  if (source.ok() && !source->config_path.empty()) {
    std::printf("config:     %s\n", source->config_path.c_str());
    return 0;
  }
  auto cfg = latent::infer_qwen_image_mmdit_config(*store, prefix);
  if (!cfg.ok()) {
    std::printf("config:     not from the shapes: %s\n", cfg.status().message().c_str());
    return 0;
  }
  std::printf(
      "config:     from the shapes: %lld layers, %lld x %lld heads, joint_attention_dim "
      "%lld, in/out channels %lld / %lld\n",
      static_cast<long long>(cfg->num_layers), static_cast<long long>(cfg->num_attention_heads),
      static_cast<long long>(cfg->attention_head_dim),
      static_cast<long long>(cfg->joint_attention_dim), static_cast<long long>(cfg->in_channels),
      static_cast<long long>(cfg->out_channels));
  return 0;
}
