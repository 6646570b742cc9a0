/**
 * SECTION:element-ditdenoise
 * @title: ditdenoise
 * @short_description: Restyles (img2img) or edits latent frames with the Qwen-Image MMDiT
 *
 * ## Example launch line
 * |[
 * gst-launch-1.0 filesrc location=in.mp4 ! decodebin ! videoconvert ! videoscale \
 *   ! video/x-raw,width=512,height=512 ! vaeencode model=/models/Qwen-Image \
 *   ! ditdenoise model=/models/Qwen-Image prompt-embeds=watercolour.safetensors strength=0.6 \
 *     steps=30 ! vaedecode model=/models/Qwen-Image ! videoconvert ! x264enc \
 *   ! mp4mux ! filesink location=out.mp4
 * ]| (pipelines/restyle.sh)
 *
 * Latents in, latents out, with the same caps: one frame's normalised Qwen-Image latent
 * (`latent-space=qwen-image`, 16 channels, even width and height), as vaeencode emits it and
 * the transformer consumes it. Other latent spaces are refused when caps are set.
 *
 * `mode=img2img` (QwenImageImg2ImgPipeline): the incoming latents are noised to the sigma at
 * `strength` and the remaining steps of `steps` run. `mode=edit` (QwenImageEditPlusPipeline's
 * loop): the incoming latents are the reference image and a new frame of the same size is
 * generated from noise (with `strength` < 1 the new frame also starts from the incoming latents).
 *
 * The prompt comes as embeddings (`prompt-embeds`, a safetensors file with `prompt_embeds`
 * [1, T, D] and `prompt_embeds_mask` [1, T], as tools/compute_prompt_embeds.py writes them).
 * With `negative-prompt-embeds` and `guidance-scale` > 1, true CFG runs.
 *
 * LoRAs: `lora="style.safetensors:0.8,lightning.safetensors:1.0"` (FILE[:STRENGTH], stacked in
 * order; diffusers/PEFT, ComfyUI, kohya and Qwen-Image-Lightning files). `lora-mode=merged`
 * (default) adds them into the weights at start, at no cost per step; `lora-mode=runtime` adds
 * the low-rank products each step, and setting `lora` to the same files with new strengths while
 * PLAYING takes effect at the next frame. A Lightning LoRA wants `steps=4` or `8`,
 * `guidance-scale=1` (one pass per step) and a model root whose scheduler/ holds Lightning's
 * scheduler_config.json, or `scheduler=` that file (pipelines/lightning.sh).
 *
 * `strength`, `seed`, `steps`, `guidance-scale`, `noise-mode`, `mode` and both embedding files
 * may change while PLAYING: settings are read once per frame, so a change takes effect at the
 * next frame. A new embedding file is loaded on the thread that sets the property and swapped
 * in whole; a file that cannot be loaded then posts a warning and the old prompt stays.
 *
 * QoS: the element is slow, so in a live pipeline it drops frames that are already late
 * (GstBaseTransform's QoS handling, enabled by default: property `qos`) instead of building a
 * backlog, and posts a QoS message for each dropped frame.
 *
 * On a CUDA device the pads also take application/x-latent(memory:CUDAMemory), so latents
 * arrive from vaeencode and go on to vaedecode in GPU memory (the context is shared through
 * GstContext, elements/gstlatentcuda.h; the output buffers come from the CUDA latent pool agreed
 * in the allocation query). The whole denoising loop runs on the device
 * (qwen_image_denoise_on_backend, engine/models/dit/denoise.h): a latent in CUDA memory is read in
 * place and the result written into the output buffer on the device, so no latent byte goes
 * through the host. The prompt embeddings are uploaded once per embedding file (and CFG on/off),
 * the fixed noise once per seed and size; `noise-mode=fresh` uploads one noise a frame.
 */
#include "elements/gstditdenoise.h"

#include <sys/stat.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "elements/gstlatentbase.h"
#include "elements/gstlatentcaps.h"
#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "engine/models/dit/denoise.h"
#include "engine/models/dit/flow_match_scheduler.h"
#include "engine/models/dit/pipeline_inputs.h"
#include "engine/models/dit/qwen_image_mmdit.h"
#include "engine/weights/config.h"
#include "engine/weights/model_source.h"
#include "engine/weights/safetensors.h"

GST_DEBUG_CATEGORY_STATIC(gst_dit_denoise_debug);
#define GST_CAT_DEFAULT gst_dit_denoise_debug

namespace {

constexpr const char* kLatentSpace = "qwen-image";
constexpr int kLatentChannels = 16;

typedef enum { MODE_IMG2IMG, MODE_EDIT } Mode;
typedef enum { NOISE_FIXED, NOISE_FRESH } NoiseMode;

// `model`, `device` and `dtype` are the base class's (elements/gstlatentbase.h).
enum {
  PROP_0,
  PROP_STEPS,
  PROP_STRENGTH,
  PROP_SEED,
  PROP_NOISE_MODE,
  PROP_PROMPT_EMBEDS,
  PROP_NEGATIVE_PROMPT_EMBEDS,
  PROP_GUIDANCE_SCALE,
  PROP_MODE,
  PROP_LORA,
  PROP_LORA_MODE,
  PROP_SCHEDULER,
};

constexpr int kDefaultSteps = 30;
constexpr double kDefaultStrength = 0.6;
constexpr double kDefaultGuidance = 4.0;  // diffusers' true_cfg_scale default

struct Settings {
  int steps = kDefaultSteps;
  double strength = kDefaultStrength;
  guint64 seed = 0;
  NoiseMode noise_mode = NOISE_FIXED;
  std::string prompt_embeds;
  std::string negative_prompt_embeds;
  double guidance_scale = kDefaultGuidance;
  Mode mode = MODE_IMG2IMG;
  // LoRAs (engine/models/dit/lora.h): files fixed at start; strengths change while PLAYING in
  // lora-mode=runtime. `lora_error`: why the `lora` text does not parse (reported at start).
  std::vector<latent::LoraSpec> loras;
  std::string lora_error;
  latent::LoraMode lora_mode = latent::LoraMode::kMerged;
  // scheduler_config.json to use instead of the model's (few-step distilled schedules).
  std::string scheduler;
};

// A loaded embedding file; replaced whole, never modified.
struct Embeds {
  std::string path;
  latent::PromptEmbeds embeds;
};

// Built in start() (model, scheduler) and set_caps() (info); dropped in stop().
struct State {
  std::shared_ptr<latent::Backend> backend;
  std::unique_ptr<latent::QwenImageMmdit> model;
  latent::FlowMatchSchedulerConfig scheduler;
  bool have_info = false;
  GstLatentInfo info;
  // noise-mode=fixed: the noise of `noise_seed` at the negotiated size, drawn once, on the
  // backend ([1, C, h, w]).
  latent::Tensor fixed_noise;
  guint64 noise_seed = 0;
  // The prompt embeddings on the backend, uploaded from `prompts_of` / `negative_of` (null: no
  // CFG); uploaded again when either changes.
  latent::DenoisePrompts prompts;
  std::shared_ptr<const Embeds> prompts_of, negative_of;
  guint64 frames = 0;  // frames denoised since start (fresh noise: seed + frames)
  // Fresh noise: the next frame's (seed + frames + 1), drawn on a thread of its own while this
  // frame runs (torch's CPU generator takes a few ms on the host, which the GPU would otherwise
  // wait for); used when the next frame asks for that seed and shape, else dropped.
  std::future<latent::Result<latent::Tensor>> noise_ahead;
  guint64 noise_ahead_seed = 0;
  latent::Shape noise_ahead_shape;
};

// Reads the prompt embeddings of `path`, checked against the transformer's text width (shared
// with latent-tool denoise).
latent::Result<latent::PromptEmbeds> load_embeds(const std::string& path, bool negative,
                                                 int64_t joint_dim) {
  return latent::load_prompt_embeds(path, negative, joint_dim);
}

}  // namespace

struct _GstDitDenoise {
  GstLatentBase parent;

  struct Impl : GstLatentStage {
    // Settings and the current embeddings: read once per frame, written by set_property.
    std::mutex settings_lock;
    Settings settings;
    std::shared_ptr<const Embeds> prompt;
    std::shared_ptr<const Embeds> negative;
    int64_t joint_dim = 0;  // the loaded transformer's, 0 while stopped
    // The LoRA files and mode the running transformer was loaded with (joint_dim != 0).
    std::vector<std::string> loaded_lora_paths;
    latent::LoraMode loaded_lora_mode = latent::LoraMode::kMerged;

    // State: held by the streaming thread for a whole frame.
    std::mutex state_lock;
    State state;

    std::atomic<bool> cancel{false};  // flushing or stopping: end the running loop early
  };
  Impl* impl;
};

#define gst_dit_denoise_parent_class parent_class
G_DEFINE_TYPE(GstDitDenoise, gst_dit_denoise, GST_TYPE_LATENT_BASE)
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(ditdenoise, "ditdenoise", GST_RANK_NONE, GST_TYPE_DIT_DENOISE,
                                      gst_latent_element_init(plugin));

#ifdef LATENT_HAVE_GST_CUDA
#define DIT_DENOISE_TEMPLATE GST_LATENT_CUDA_CAPS_TEMPLATE "; " GST_LATENT_CAPS_TEMPLATE
#else
#define DIT_DENOISE_TEMPLATE GST_LATENT_CAPS_TEMPLATE
#endif
static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS(DIT_DENOISE_TEMPLATE));
static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(DIT_DENOISE_TEMPLATE));

GType gst_dit_denoise_mode_get_type(void) {
  static gsize type = 0;
  static const GEnumValue values[] = {
      {MODE_IMG2IMG, "Restyle: noise the incoming latents to `strength` and denoise", "img2img"},
      {MODE_EDIT, "Edit: the incoming latents are the reference; generate a new frame", "edit"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) {
    GType t = g_enum_register_static("GstDitDenoiseMode", values);
    g_once_init_leave(&type, t);
  }
  return type;
}

GType gst_dit_denoise_lora_mode_get_type(void) {
  static gsize type = 0;
  static const GEnumValue values[] = {
      {static_cast<gint>(latent::LoraMode::kMerged),
       "Merged into the weights at start: no cost per step, strengths fixed", "merged"},
      {static_cast<gint>(latent::LoraMode::kRuntime),
       "Added at run time (low-rank products each step): strengths change while playing",
       "runtime"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) {
    GType t = g_enum_register_static("GstDitDenoiseLoraMode", values);
    g_once_init_leave(&type, t);
  }
  return type;
}

// A new `lora` value: the list; while running, only new strengths of the loaded files in
// lora-mode=runtime are taken (anything else keeps the old value, with a warning saying why).
static void set_lora_text(GstDitDenoise* self, const std::string& text) {
  auto* impl = self->impl;
  std::string warning;
  {
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    Settings& s = impl->settings;
    auto parsed = latent::parse_lora_list(text);
    const bool running = impl->joint_dim != 0;
    if (!running) {
      s.loras = parsed.ok() ? *parsed : std::vector<latent::LoraSpec>();
      s.lora_error = parsed.ok() ? "" : parsed.status().message();
    } else if (!parsed.ok()) {
      warning = "ditdenoise: ignoring lora=\"" + text + "\": " + parsed.status().message();
    } else {
      bool same_files = parsed->size() == impl->loaded_lora_paths.size();
      for (size_t i = 0; same_files && i < parsed->size(); ++i)
        same_files = (*parsed)[i].path == impl->loaded_lora_paths[i];
      if (!same_files) {
        warning =
            "ditdenoise: LoRA files are loaded at start; change the files of `lora` in the NULL "
            "or READY state (while playing, only the strengths of the loaded files change, in "
            "lora-mode=runtime)";
      } else if (impl->loaded_lora_mode != latent::LoraMode::kRuntime) {
        warning =
            "ditdenoise: lora-mode=merged fixes the LoRA strengths at start; use "
            "lora-mode=runtime to change them while playing";
      } else {
        s.loras = *parsed;
        s.lora_error.clear();
      }
    }
  }
  if (!warning.empty())
    GST_ELEMENT_WARNING(self, RESOURCE, SETTINGS, ("%s", warning.c_str()), (nullptr));
}

GType gst_dit_denoise_noise_mode_get_type(void) {
  static gsize type = 0;
  static const GEnumValue values[] = {
      {NOISE_FIXED, "One noise drawn from `seed` for every frame (temporally stable)", "fixed"},
      {NOISE_FRESH, "Fresh noise per frame (seed + frame number)", "fresh"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) {
    GType t = g_enum_register_static("GstDitDenoiseNoiseMode", values);
    g_once_init_leave(&type, t);
  }
  return type;
}

// Loads an embedding file for a property set while the element runs, on the setter's thread,
// and swaps it in at once; the streaming thread picks it up at its next frame.
static void reload_embeds(GstDitDenoise* self, bool negative, const std::string& path) {
  auto* impl = self->impl;
  int64_t joint_dim = 0;
  {
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    joint_dim = impl->joint_dim;
  }
  if (joint_dim == 0) return;  // stopped: start() loads it
  std::shared_ptr<const Embeds> loaded;
  if (!path.empty()) {
    auto e = load_embeds(path, negative, joint_dim);
    if (!e.ok()) {
      GST_ELEMENT_WARNING(self, RESOURCE, READ,
                          ("ditdenoise: cannot load %s '%s'; keeping the previous one: %s",
                           negative ? "negative-prompt-embeds" : "prompt-embeds", path.c_str(),
                           e.status().message().c_str()),
                          (nullptr));
      return;
    }
    loaded = std::make_shared<const Embeds>(Embeds{path, std::move(*e)});
  }
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  // Only if no newer value was set meanwhile.
  const std::string& current =
      negative ? impl->settings.negative_prompt_embeds : impl->settings.prompt_embeds;
  if (current != path || impl->joint_dim == 0) return;
  if (negative)
    impl->negative = std::move(loaded);
  else if (loaded)
    impl->prompt = std::move(loaded);
  GST_INFO_OBJECT(self, "%s now from '%s'", negative ? "negative prompt" : "prompt", path.c_str());
}

static void gst_dit_denoise_set_property(GObject* object, guint prop_id, const GValue* value,
                                         GParamSpec* pspec) {
  GstDitDenoise* self = GST_DIT_DENOISE(object);
  auto* impl = self->impl;
  int reload = -1;  // 0: prompt, 1: negative
  std::string reload_path;
  std::string lora_text;
  bool set_lora = false, lora_mode_refused = false, scheduler_refused = false;
  {
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    Settings& s = impl->settings;
    const gchar* str = nullptr;
    switch (prop_id) {
      case PROP_STEPS:
        s.steps = g_value_get_int(value);
        break;
      case PROP_STRENGTH:
        s.strength = g_value_get_double(value);
        break;
      case PROP_SEED:
        s.seed = g_value_get_uint64(value);
        break;
      case PROP_NOISE_MODE:
        s.noise_mode = static_cast<NoiseMode>(g_value_get_enum(value));
        break;
      case PROP_PROMPT_EMBEDS:
        str = g_value_get_string(value);
        s.prompt_embeds = str ? str : "";
        reload = 0;
        reload_path = s.prompt_embeds;
        break;
      case PROP_NEGATIVE_PROMPT_EMBEDS:
        str = g_value_get_string(value);
        s.negative_prompt_embeds = str ? str : "";
        reload = 1;
        reload_path = s.negative_prompt_embeds;
        break;
      case PROP_GUIDANCE_SCALE:
        s.guidance_scale = g_value_get_double(value);
        break;
      case PROP_MODE:
        s.mode = static_cast<Mode>(g_value_get_enum(value));
        break;
      case PROP_SCHEDULER:
        str = g_value_get_string(value);
        if (impl->joint_dim != 0)
          scheduler_refused = true;
        else
          s.scheduler = str ? str : "";
        break;
      case PROP_LORA:
        str = g_value_get_string(value);
        lora_text = str ? str : "";
        set_lora = true;
        break;
      case PROP_LORA_MODE: {
        const auto m = static_cast<latent::LoraMode>(g_value_get_enum(value));
        if (impl->joint_dim != 0 && m != impl->loaded_lora_mode)
          lora_mode_refused = true;
        else
          s.lora_mode = m;
        break;
      }
      default:
        G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
        break;
    }
  }
  if (reload >= 0) reload_embeds(self, reload == 1, reload_path);
  if (set_lora) set_lora_text(self, lora_text);
  if (scheduler_refused)
    GST_ELEMENT_WARNING(self, RESOURCE, SETTINGS,
                        ("ditdenoise: scheduler changes only in the NULL or READY state; keeping "
                         "the schedule loaded at start"),
                        (nullptr));
  if (lora_mode_refused)
    GST_ELEMENT_WARNING(self, RESOURCE, SETTINGS,
                        ("ditdenoise: lora-mode changes only in the NULL or READY state; keeping "
                         "the mode the transformer was loaded with"),
                        (nullptr));
}

static void gst_dit_denoise_get_property(GObject* object, guint prop_id, GValue* value,
                                         GParamSpec* pspec) {
  auto* impl = GST_DIT_DENOISE(object)->impl;
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  const Settings& s = impl->settings;
  switch (prop_id) {
    case PROP_STEPS:
      g_value_set_int(value, s.steps);
      break;
    case PROP_STRENGTH:
      g_value_set_double(value, s.strength);
      break;
    case PROP_SEED:
      g_value_set_uint64(value, s.seed);
      break;
    case PROP_NOISE_MODE:
      g_value_set_enum(value, s.noise_mode);
      break;
    case PROP_PROMPT_EMBEDS:
      g_value_set_string(value, s.prompt_embeds.c_str());
      break;
    case PROP_NEGATIVE_PROMPT_EMBEDS:
      g_value_set_string(value, s.negative_prompt_embeds.c_str());
      break;
    case PROP_GUIDANCE_SCALE:
      g_value_set_double(value, s.guidance_scale);
      break;
    case PROP_MODE:
      g_value_set_enum(value, s.mode);
      break;
    case PROP_SCHEDULER:
      g_value_set_string(value, s.scheduler.c_str());
      break;
    case PROP_LORA:
      g_value_set_string(value, latent::format_lora_list(s.loras).c_str());
      break;
    case PROP_LORA_MODE:
      g_value_set_enum(value, static_cast<gint>(s.lora_mode));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
      break;
  }
}

// The scheduler config of `model` (engine/models/dit/pipeline_inputs.h, shared with latent-tool
// denoise): a pipeline root's scheduler/, the scheduler/ beside a transformer folder, else
// Qwen-Image's published config.
static latent::Result<latent::FlowMatchSchedulerConfig> scheduler_for(
    GstDitDenoise* self, const std::string& model, const std::string& explicit_path) {
  LATENT_ASSIGN_OR_RETURN(latent::ResolvedScheduler r,
                          latent::resolve_flow_match_scheduler(model, explicit_path));
  if (r.path.empty())
    GST_INFO_OBJECT(self,
                    "no scheduler/scheduler_config.json for '%s': using Qwen-Image's default "
                    "scheduler config",
                    model.c_str());
  else
    GST_INFO_OBJECT(self, "scheduler config from %s", r.path.c_str());
  return r.config;
}

// start(), on the backend of the `device` and `dtype` settings.
static gboolean gst_dit_denoise_open(GstLatentBase* base,
                                     const std::shared_ptr<latent::Backend>& backend) {
  GstDitDenoise* self = GST_DIT_DENOISE(base);
  auto* impl = self->impl;
  Settings settings;
  {
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    settings = impl->settings;
  }
  const std::string model_path = gst_latent_base_model_setting(base);
  if (model_path.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND,
                      ("ditdenoise: no model set; set `model` to a Qwen-Image pipeline root or "
                       "its transformer/ folder"),
                      (nullptr));
    return FALSE;
  }
  if (settings.prompt_embeds.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND,
                      ("ditdenoise: no prompt set; set `prompt-embeds` to a safetensors file "
                       "with `prompt_embeds` (tools/compute_prompt_embeds.py)"),
                      (nullptr));
    return FALSE;
  }
  if (!settings.lora_error.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("ditdenoise: lora: %s (expected \"FILE[:STRENGTH],FILE[:STRENGTH]...\")",
                       settings.lora_error.c_str()),
                      (nullptr));
    return FALSE;
  }
  // dtype=fp8: the blocks' linear layers in FP8 e4m3, the backend (and the rest) in bf16.
  const latent::LinearFormat linears = gst_latent_base_fp8(base)
                                           ? latent::LinearFormat::kFp8
                                           : latent::LinearFormat::kComputeDtype;
  auto model = latent::QwenImageMmdit::load(
      model_path, backend, latent::MmditLoras{settings.loras, settings.lora_mode}, linears);
  if (!model.ok()) {
    GST_ELEMENT_ERROR(self, RESOURCE, READ,
                      ("ditdenoise: cannot load the transformer of '%s': %s", model_path.c_str(),
                       model.status().message().c_str()),
                      (nullptr));
    return FALSE;
  }
  auto scheduler = scheduler_for(self, model_path, settings.scheduler);
  if (!scheduler.ok()) {
    GST_ELEMENT_ERROR(self, RESOURCE, READ,
                      ("ditdenoise: %s", scheduler.status().message().c_str()), (nullptr));
    return FALSE;
  }
  const int64_t joint_dim = (*model)->config().joint_attention_dim;
  std::shared_ptr<const Embeds> prompt, negative;
  for (bool neg : {false, true}) {
    const std::string& path = neg ? settings.negative_prompt_embeds : settings.prompt_embeds;
    if (path.empty()) continue;
    auto e = load_embeds(path, neg, joint_dim);
    if (!e.ok()) {
      GST_ELEMENT_ERROR(
          self, RESOURCE, READ,
          ("ditdenoise: cannot load %s: %s", neg ? "negative-prompt-embeds" : "prompt-embeds",
           e.status().message().c_str()),
          (nullptr));
      return FALSE;
    }
    (neg ? negative : prompt) = std::make_shared<const Embeds>(Embeds{path, std::move(*e)});
  }
  GST_INFO_OBJECT(self, "loaded the Qwen-Image transformer from %s on %s (%s)", model_path.c_str(),
                  backend->name().c_str(), latent::dtype_name(backend->compute_dtype()));
  {
    std::lock_guard<std::mutex> lock(impl->state_lock);
    impl->state = State();
    impl->state.backend = backend;
    impl->state.model = std::move(*model);
    impl->state.scheduler = *scheduler;
  }
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  impl->joint_dim = joint_dim;
  impl->loaded_lora_paths.clear();
  for (const auto& l : settings.loras) impl->loaded_lora_paths.push_back(l.path);
  impl->loaded_lora_mode = settings.lora_mode;
  // `lora-mode` reads back as loaded (a change made while loading is undone); strengths set while
  // loading apply at the first frame.
  impl->settings.lora_mode = settings.lora_mode;
  // A property set while we were loading wins over what was loaded here.
  if (impl->settings.prompt_embeds == settings.prompt_embeds) impl->prompt = prompt;
  if (impl->settings.negative_prompt_embeds == settings.negative_prompt_embeds)
    impl->negative = negative;
  if (!impl->prompt) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND,
                      ("ditdenoise: prompt-embeds changed while starting; set it again"),
                      (nullptr));
    return FALSE;
  }
  return TRUE;
}

// stop(): before the base class drops the backend.
static void gst_dit_denoise_close(GstLatentBase* base) {
  auto* impl = GST_DIT_DENOISE(base)->impl;
  {
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    impl->joint_dim = 0;
    impl->loaded_lora_paths.clear();
    impl->prompt.reset();
    impl->negative.reset();
  }
  State dropped;
  {
    std::lock_guard<std::mutex> lock(impl->state_lock);
    dropped = std::move(impl->state);
    impl->state = State();
  }
  // Free the weights and cached device tensors outside state_lock but under the backend's run
  // lock: a VAE stage on the same backend may be capturing a graph.
  if (dropped.backend) {
    const std::shared_ptr<std::mutex> run_lock = latent::backend_run_lock(*dropped.backend);
    std::lock_guard<std::mutex> run_guard(*run_lock);
    State gone = std::move(dropped);
  }
}

static GstCaps* gst_dit_denoise_transform_caps(GstBaseTransform* trans, GstPadDirection,
                                               GstCaps* caps, GstCaps* filter) {
  // Same caps on both sides; CUDA memory only while we run on a GPU (or have not started).
  GstCaps* out = nullptr;
  if (!gst_latent_base_offers_cuda(GST_LATENT_BASE(trans)) && !gst_caps_is_any(caps)) {
    out = gst_caps_new_empty();
    for (guint i = 0; i < gst_caps_get_size(caps); ++i) {
      if (gst_latent_caps_features_is_cuda(gst_caps_get_features(caps, i))) continue;
      out = gst_caps_merge_structure_full(out, gst_structure_copy(gst_caps_get_structure(caps, i)),
                                          gst_caps_features_copy(gst_caps_get_features(caps, i)));
    }
  } else {
    out = gst_caps_ref(caps);
  }
  if (filter) {
    GstCaps* tmp = gst_caps_intersect_full(filter, out, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(out);
    out = tmp;
  }
  return out;
}

// A latent buffer -> normalised backend latent [1, C, h, w]. CUDA memory of our context is read
// in place on the device; anything else through a system-memory mapping and one upload.
static latent::Result<latent::Tensor> read_latent(GstDitDenoise* self, latent::Backend& backend,
                                                  const GstLatentInfo& info, GstBuffer* inbuf) {
  const int64_t h = info.height, w = info.width, c = info.channels;
  const size_t expected = info.frame_bytes();
  GstMapInfo map;
  const bool on_device = gst_latent_base_cuda(GST_LATENT_BASE(self))->map(inbuf, &map, GST_MAP_READ);
  // CUDA memory we cannot read in place (another device's) is downloaded by GStreamer, which
  // knows nothing of the write still queued on its writer's stream.
  if (!on_device) LATENT_TRY(gst_latent_buffer_wait_written(inbuf));
  if (!on_device && !gst_buffer_map(inbuf, &map, GST_MAP_READ))
    return latent::Status::error("cannot map the input buffer");
  const gsize got = on_device ? gst_buffer_get_size(inbuf) : map.size;
  // CUDA memory may be larger than the latent (pitched, see gstlatentcuda.h).
  if (got != expected && !(got > expected && gst_latent_buffer_is_cuda(inbuf))) {
    gst_buffer_unmap(inbuf, &map);
    return latent::Status::errorf("a latent buffer of ", got, " bytes does not hold the ",
                                  latent::dtype_name(info.dtype), " [", c, ", ", h, ", ", w,
                                  "] latent of the caps (", expected, " bytes)");
  }
  latent::Result<latent::Tensor> x = latent::Status::error("unset");
  if (on_device) {
    // Queued on the backend's stream after the latent's write, and before the buffer's next
    // write (GstLatentFenceMeta).
    x = gst_latent_buffer_read_latent(inbuf, backend, map.data, info.dtype, info.channels,
                                      info.height, info.width);
  } else {
    // host: [1, 16, h, w] fp32, normalised
    latent::Tensor host = latent::Tensor::empty({1, c, h, w}, latent::DType::kF32);
    latent::convert_elements(map.data, info.dtype, host.data(), latent::DType::kF32,
                             static_cast<size_t>(host.numel()));
    x = backend.upload(host);
  }
  gst_buffer_unmap(inbuf, &map);
  return x;
}

// Normalised backend latent [1, C, h, w] -> `outbuf`: written on the device when it is CUDA
// memory of our context (after the buffer's last reads, with the write's fence on it; waited
// for on the host unless every reader downstream orders its reads by it), else downloaded once.
static latent::Status write_latent(GstDitDenoise* self, latent::Backend& backend,
                                   const GstLatentInfo& info, const latent::Tensor& result,
                                   GstBuffer* outbuf) {
  const size_t expected = info.frame_bytes();
  GstMapInfo map;
  const bool on_device = gst_latent_base_cuda(GST_LATENT_BASE(self))->map(outbuf, &map, GST_MAP_WRITE);
  if (!on_device && !gst_buffer_map(outbuf, &map, GST_MAP_WRITE))
    return latent::Status::error("cannot map the output buffer");
  if (map.size < expected) {
    gst_buffer_unmap(outbuf, &map);
    return latent::Status::error("output buffer of the wrong size");
  }
  latent::Status st = latent::ok_status();
  if (on_device) {
    auto written = gst_latent_buffer_write_latent(outbuf, backend, result, map.data, info.dtype);
    st = written.ok() ? gst_latent_base_wait_unless_ordered(GST_LATENT_BASE(self), written->get())
                      : written.status();
  } else {
    auto host = backend.download(result);  // [1, C, h, w] fp32
    if (host.ok())
      latent::convert_elements(host->data(), latent::DType::kF32, map.data, info.dtype,
                               static_cast<size_t>(host->numel()));
    else
      st = host.status();
  }
  gst_buffer_unmap(outbuf, &map);
  return st;
}

static gboolean gst_dit_denoise_set_info(GstLatentBase* base, GstCaps* incaps, GstCaps*) {
  GstDitDenoise* self = GST_DIT_DENOISE(base);
  auto info = gst_latent_info_from_caps(incaps);
  if (!info.ok())
    return gst_latent_base_refuse_caps(base, incaps, "ditdenoise: " + info.status().message());
  if (info->latent_space != kLatentSpace || info->channels != kLatentChannels)
    return gst_latent_base_refuse_caps(
        base, incaps,
        latent::str_cat("ditdenoise: latent space '", info->latent_space, "' (", info->channels,
                        " channels) from upstream does not match the Qwen-Image transformer's "
                        "latent space '",
                        kLatentSpace, "' (", kLatentChannels,
                        " channels); encode with the Qwen-Image VAE"));
  if (info->width < 2 || info->height < 2 || info->width % 2 || info->height % 2)
    return gst_latent_base_refuse_caps(
        base, incaps,
        latent::str_cat("ditdenoise: a ", info->width, " x ", info->height,
                        " latent cannot be cut into the transformer's 2x2 patches; its width and "
                        "height must be even (frames a multiple of 16 pixels)"));
  auto* impl = self->impl;
  std::lock_guard<std::mutex> lock(impl->state_lock);
  if (!impl->state.have_info || impl->state.info.width != info->width ||
      impl->state.info.height != info->height)
    impl->state.fixed_noise = latent::Tensor();  // redrawn at the new size
  impl->state.info = *info;
  impl->state.have_info = true;
  GST_INFO_OBJECT(self, "denoising %s %d x %d latents", latent::dtype_name(info->dtype),
                  info->width, info->height);
  return TRUE;
}

static gboolean gst_dit_denoise_transform_size(GstBaseTransform*, GstPadDirection, GstCaps*,
                                               gsize size, GstCaps*, gsize* othersize) {
  *othersize = size;
  return TRUE;
}

static gboolean gst_dit_denoise_sink_event(GstBaseTransform* trans, GstEvent* event) {
  auto* impl = GST_DIT_DENOISE(trans)->impl;
  if (GST_EVENT_TYPE(event) == GST_EVENT_FLUSH_START) impl->cancel = true;
  if (GST_EVENT_TYPE(event) == GST_EVENT_FLUSH_STOP) impl->cancel = false;
  return GST_BASE_TRANSFORM_CLASS(parent_class)->sink_event(trans, event);
}

static GstStateChangeReturn gst_dit_denoise_change_state(GstElement* element,
                                                         GstStateChange transition) {
  auto* impl = GST_DIT_DENOISE(element)->impl;
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY) impl->cancel = true;
  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED) impl->cancel = false;
  return GST_ELEMENT_CLASS(parent_class)->change_state(element, transition);
}

// Controlled properties (strength, seed, steps, guidance-scale) take their value at the frame's
// stream time.
static void gst_dit_denoise_before_transform(GstBaseTransform* trans, GstBuffer* buffer) {
  const GstClockTime ts =
      gst_segment_to_stream_time(&trans->segment, GST_FORMAT_TIME, GST_BUFFER_PTS(buffer));
  if (GST_CLOCK_TIME_IS_VALID(ts)) gst_object_sync_values(GST_OBJECT(trans), ts);
}

static GstFlowReturn gst_dit_denoise_transform(GstBaseTransform* trans, GstBuffer* inbuf,
                                               GstBuffer* outbuf) {
  GstDitDenoise* self = GST_DIT_DENOISE(trans);
  auto* impl = self->impl;
  // Settings and prompts once per frame.
  Settings settings;
  std::shared_ptr<const Embeds> prompt, negative;
  {
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    settings = impl->settings;
    prompt = impl->prompt;
    negative = impl->negative;
  }
  const gint64 started_us = g_get_monotonic_time();
  std::lock_guard<std::mutex> lock(impl->state_lock);
  State& st = impl->state;
  if (!st.model || !st.have_info || !prompt) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION,
                      ("ditdenoise: a buffer arrived before the element was started and caps "
                       "were set"),
                      (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  // Runtime LoRAs: this frame's strengths (a few small ops when they changed, none otherwise).
  if (st.model->lora_mode() == latent::LoraMode::kRuntime && !st.model->loras().empty()) {
    std::vector<float> strengths;
    bool same_files = settings.loras.size() == st.model->loras().size();
    for (size_t i = 0; same_files && i < settings.loras.size(); ++i) {
      same_files = settings.loras[i].path == st.model->loras()[i].path;
      strengths.push_back(settings.loras[i].strength);
    }
    if (same_files) {
      const std::shared_ptr<std::mutex> run_lock = latent::backend_run_lock(*st.backend);
      std::lock_guard<std::mutex> run_guard(*run_lock);
      latent::Status s = st.model->set_lora_strengths(strengths);
      if (!s.ok()) {
        GST_ELEMENT_ERROR(self, LIBRARY, FAILED,
                          ("ditdenoise: cannot set the LoRA strengths: %s", s.message().c_str()),
                          (nullptr));
        return GST_FLOW_ERROR;
      }
    }
  }
  const GstLatentInfo& info = st.info;
  const int64_t h = info.height, w = info.width, c = info.channels;
  // The backend (and its stream) may be shared with vaeencode/vaedecode on the same device and
  // dtype: every call on it, and every free of a tensor of this frame (declared below, so gone
  // before the guard), holds the backend's run lock, so a stage capturing its CUDA graph never
  // records our work (elements/gstlatentbase.h).
  const std::shared_ptr<std::mutex> run_lock = latent::backend_run_lock(*st.backend);
  std::lock_guard<std::mutex> run_guard(*run_lock);

  auto read = read_latent(self, *st.backend, info, inbuf);
  if (!read.ok()) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("ditdenoise: %s", read.status().message().c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  // x: [1, 16, h, w] normalised, on the backend
  latent::Tensor x = std::move(*read);

  latent::Tensor result;
  if (settings.strength <= 0.0 && settings.mode == MODE_IMG2IMG) {
    result = x;  // strength 0: nothing to denoise
  } else {
    // The prompts on the backend: uploaded again only when a file or CFG on/off changed.
    const std::shared_ptr<const Embeds> want_negative =
        negative && settings.guidance_scale > 1.0 ? negative : nullptr;
    if (!st.prompts.defined() || st.prompts_of != prompt || st.negative_of != want_negative) {
      st.prompts = latent::DenoisePrompts();
      auto p = latent::upload_denoise_prompts(
          *st.model, prompt->embeds,
          want_negative ? want_negative->embeds : latent::PromptEmbeds());
      if (!p.ok()) {
        GST_ELEMENT_ERROR(
            self, STREAM, FAILED,
            ("ditdenoise: cannot use the prompt embeddings: %s", p.status().message().c_str()),
            (nullptr));
        return GST_FLOW_ERROR;
      }
      st.prompts = std::move(*p);
      st.prompts_of = prompt;
      st.negative_of = want_negative;
    }
    latent::DeviceDenoiseRequest req;
    req.steps = settings.steps;
    req.strength = settings.strength;
    req.true_cfg_scale = static_cast<float>(settings.guidance_scale);
    req.prompts = &st.prompts;
    if (settings.mode == MODE_EDIT) {
      req.reference_latents = {x};
      if (settings.strength > 0.0 && settings.strength < 1.0)
        req.init_latents = x;
      else
        req.strength = 1.0;
    } else {
      req.init_latents = x;
    }
    // Noise drawn on the host like torch's CPU generator: randn_tensor((1, 1, C, h, w)), the same
    // memory as [1, C, h, w]; fixed noise is uploaded once.
    const bool fixed = settings.noise_mode == NOISE_FIXED;
    if (!fixed || !st.fixed_noise.defined() || st.noise_seed != settings.seed) {
      const guint64 seed = fixed ? settings.seed : settings.seed + st.frames;
      const latent::Shape noise_shape = {1, 1, c, h, w};
      latent::Result<latent::Tensor> n = latent::Tensor();
      if (st.noise_ahead.valid()) {
        const bool same = st.noise_ahead_seed == seed && st.noise_ahead_shape == noise_shape;
        n = st.noise_ahead.get();  // (a different seed or shape: waited for, dropped)
        if (!same) n = latent::Tensor();
      }
      if (!n.ok() || !n->defined()) n = latent::torch_randn(noise_shape, seed);
      if (!fixed) {
        st.noise_ahead_seed = seed + 1;
        st.noise_ahead_shape = noise_shape;
        st.noise_ahead = std::async(std::launch::async, [noise_shape, next = seed + 1] {
          return latent::torch_randn(noise_shape, next);
        });
      }
      auto shaped = n.ok() ? n->reshape({1, c, h, w}) : n;
      auto up = shaped.ok() ? st.backend->upload(*shaped) : shaped;
      if (!up.ok()) {
        GST_ELEMENT_ERROR(self, STREAM, FAILED, ("ditdenoise: %s", up.status().message().c_str()),
                          (nullptr));
        return GST_FLOW_ERROR;
      }
      req.noise = std::move(*up);
      if (fixed) {
        st.fixed_noise = req.noise;
        st.noise_seed = settings.seed;
      }
    } else {
      req.noise = st.fixed_noise;
    }
    auto r = latent::qwen_image_denoise_on_backend(
        *st.model, st.scheduler, req, [impl](int, int) { return !impl->cancel.load(); });
    if (!r.ok()) {
      if (impl->cancel) return GST_FLOW_FLUSHING;
      GST_ELEMENT_ERROR(self, STREAM, FAILED,
                        ("ditdenoise: denoising a %d x %d latent failed: %s", info.width,
                         info.height, r.status().message().c_str()),
                        ("model=%s steps=%d strength=%g",
                         gst_latent_base_model_setting(GST_LATENT_BASE(self)).c_str(),
                         settings.steps, settings.strength));
      return GST_FLOW_ERROR;
    }
    result = std::move(r->latents);
    ++st.frames;
  }

  latent::Status written = write_latent(self, *st.backend, info, result, outbuf);
  if (!written.ok()) {
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("ditdenoise: %s", written.message().c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  // Statistics and LATENCY answers (the base class).
  gst_latent_base_frame_done(GST_LATENT_BASE(self),
                             (g_get_monotonic_time() - started_us) * GST_USECOND);
  return GST_FLOW_OK;
}

static void gst_dit_denoise_class_init(GstDitDenoiseClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  GstElementClass* element_class = GST_ELEMENT_CLASS(klass);
  GstBaseTransformClass* trans_class = GST_BASE_TRANSFORM_CLASS(klass);

  GST_DEBUG_CATEGORY_INIT(gst_dit_denoise_debug, "ditdenoise", 0, "Qwen-Image DiT denoiser");
  gst_latent_element_init(nullptr);

  gobject_class->set_property = gst_dit_denoise_set_property;
  gobject_class->get_property = gst_dit_denoise_get_property;

  const auto playing = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                                GST_PARAM_MUTABLE_PLAYING | GST_PARAM_CONTROLLABLE);
  // Files and enums change while playing too, but not through a GstController.
  const auto playing_files = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                                      GST_PARAM_MUTABLE_PLAYING);
  g_object_class_install_property(
      gobject_class, PROP_STEPS,
      g_param_spec_int("steps", "Steps",
                       "Inference steps of the whole schedule (img2img runs the last "
                       "strength x steps of them)",
                       1, 1000, kDefaultSteps, playing));
  g_object_class_install_property(
      gobject_class, PROP_STRENGTH,
      g_param_spec_double("strength", "Strength",
                          "How far the incoming latents are noised: 1 ignores them (img2img), 0 "
                          "passes them through",
                          0.0, 1.0, kDefaultStrength, playing));
  g_object_class_install_property(
      gobject_class, PROP_SEED,
      g_param_spec_uint64("seed", "Seed",
                          "Seed of the noise (torch.Generator('cpu').manual_seed(seed), as "
                          "diffusers draws it)",
                          0, G_MAXUINT64, 0, playing));
  g_object_class_install_property(
      gobject_class, PROP_NOISE_MODE,
      g_param_spec_enum("noise-mode", "Noise mode",
                        "fixed: one noise for every frame (temporal stability); fresh: new noise "
                        "per frame",
                        GST_TYPE_DIT_DENOISE_NOISE_MODE, NOISE_FIXED, playing_files));
  g_object_class_install_property(
      gobject_class, PROP_PROMPT_EMBEDS,
      g_param_spec_string("prompt-embeds", "Prompt embeddings",
                          "safetensors file with `prompt_embeds` [1, T, D] and "
                          "`prompt_embeds_mask` [1, T] (tools/compute_prompt_embeds.py)",
                          "", playing_files));
  g_object_class_install_property(
      gobject_class, PROP_NEGATIVE_PROMPT_EMBEDS,
      g_param_spec_string("negative-prompt-embeds", "Negative prompt embeddings",
                          "safetensors file of the negative prompt (same layout; "
                          "`negative_prompt_embeds` also accepted); enables true CFG",
                          "", playing_files));
  g_object_class_install_property(
      gobject_class, PROP_GUIDANCE_SCALE,
      g_param_spec_double("guidance-scale", "Guidance scale",
                          "True CFG scale (diffusers' true_cfg_scale); CFG runs when > 1 and a "
                          "negative prompt is set",
                          0.0, 100.0, kDefaultGuidance, playing));
  g_object_class_install_property(
      gobject_class, PROP_SCHEDULER,
      g_param_spec_string(
          "scheduler", "Scheduler config",
          "scheduler_config.json (FlowMatchEulerDiscreteScheduler) to use instead of the model's "
          "scheduler/, e.g. the few-step config a distilled model or Lightning LoRA ships; empty: "
          "the model's",
          "",
          static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                   GST_PARAM_MUTABLE_READY)));
  g_object_class_install_property(
      gobject_class, PROP_LORA,
      g_param_spec_string(
          "lora", "LoRAs",
          "Comma-separated LoRA files with strengths, FILE[:STRENGTH] (1 if omitted), applied "
          "in order and stacked: diffusers/PEFT, ComfyUI, kohya or Qwen-Image-Lightning layout. "
          "Files are loaded at start; while PLAYING with lora-mode=runtime, the same files with "
          "new strengths take effect at the next frame",
          "", playing_files));
  g_object_class_install_property(
      gobject_class, PROP_LORA_MODE,
      g_param_spec_enum("lora-mode", "LoRA mode",
                        "merged: added into the weights at start (no cost per step); runtime: "
                        "low-rank products added each step, strengths writable while PLAYING",
                        GST_TYPE_DIT_DENOISE_LORA_MODE,
                        static_cast<gint>(latent::LoraMode::kMerged),
                        static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                                 GST_PARAM_MUTABLE_READY)));
  g_object_class_install_property(
      gobject_class, PROP_MODE,
      g_param_spec_enum("mode", "Mode",
                        "img2img: restyle the incoming frame; edit: the incoming frame is the "
                        "reference of a newly generated one",
                        GST_TYPE_DIT_DENOISE_MODE, MODE_IMG2IMG, playing_files));

  gst_element_class_set_static_metadata(
      element_class, "Qwen-Image DiT denoiser", "Filter/Effect/Video",
      "Restyles or edits latent frames with the Qwen-Image diffusion transformer under a text "
      "prompt. Example (pipelines/restyle.sh): gst-launch-1.0 videotestsrc num-buffers=30 ! "
      "video/x-raw,width=512,height=512,framerate=30/1 ! vaeencode model=/models/Qwen-Image ! "
      "ditdenoise model=/models/Qwen-Image prompt-embeds=prompt.safetensors steps=30 "
      "strength=0.6 ! vaedecode model=/models/Qwen-Image ! videoconvert ! vp8enc ! webmmux ! "
      "filesink location=restyle.webm",
      "gst-latent developers");
  gst_element_class_add_static_pad_template(element_class, &sink_template);
  gst_element_class_add_static_pad_template(element_class, &src_template);
  element_class->change_state = GST_DEBUG_FUNCPTR(gst_dit_denoise_change_state);

  trans_class->transform_caps = GST_DEBUG_FUNCPTR(gst_dit_denoise_transform_caps);
  trans_class->transform_size = GST_DEBUG_FUNCPTR(gst_dit_denoise_transform_size);
  trans_class->sink_event = GST_DEBUG_FUNCPTR(gst_dit_denoise_sink_event);
  trans_class->before_transform = GST_DEBUG_FUNCPTR(gst_dit_denoise_before_transform);
  trans_class->transform = GST_DEBUG_FUNCPTR(gst_dit_denoise_transform);

  GstLatentBaseClass* base_class = GST_LATENT_BASE_CLASS(klass);
  base_class->debug_category = gst_dit_denoise_debug;
  base_class->parts = 0;  // the transformer is loaded by open()
  base_class->takes_fp8 = TRUE;
  base_class->open = gst_dit_denoise_open;
  base_class->close = gst_dit_denoise_close;
  base_class->set_info = gst_dit_denoise_set_info;

  gst_type_mark_as_plugin_api(GST_TYPE_DIT_DENOISE_MODE, static_cast<GstPluginAPIFlags>(0));
  gst_type_mark_as_plugin_api(GST_TYPE_DIT_DENOISE_NOISE_MODE, static_cast<GstPluginAPIFlags>(0));
  gst_type_mark_as_plugin_api(GST_TYPE_DIT_DENOISE_LORA_MODE, static_cast<GstPluginAPIFlags>(0));
}

static void gst_dit_denoise_init(GstDitDenoise* self) {
  self->impl = new _GstDitDenoise::Impl();
  gst_latent_base_set_stage(GST_LATENT_BASE(self), self->impl);
  // QoS (late frames dropped before they are denoised) is on: the base class enables it.
}
