/**
 * SECTION:gstlatentbase
 * @title: GstLatentBase
 * @short_description: Base class of the latent stages (vaeencode, vaedecode, ditdenoise)
 *
 * Holds the properties every stage has (`model`, `device`, `dtype`; the VAE stages add
 * `prefetch-depth` and `cuda-graphs`), resolves the backend and loads the VAE in start() through
 * the engine (sharing one instance between elements that ask for the same model) and releases it
 * in stop(); keeps a VAE stage's plan (built at caps negotiation, dropped at the next one and in
 * stop()); shares the CUDA context and latent pools; answers LATENCY queries.
 */
#include "elements/gstlatentbase.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <thread>

#include "elements/gstlatentcaps.h"
#include "engine/backends/registry.h"
#include "engine/core/log.h"
#include "engine/weights/model_source.h"

GST_DEBUG_CATEGORY_STATIC(gst_latent_base_debug);
#define GST_CAT_DEFAULT gst_latent_base_debug
GST_DEBUG_CATEGORY_STATIC(latent_engine_debug);

namespace {

constexpr const char* kDefaultDevice = "auto";

enum {
  PROP_0,
  PROP_MODEL,
  PROP_DEVICE,
  PROP_DTYPE,
  PROP_FRAMES_PROCESSED,
  PROP_FRAMES_DROPPED,
  PROP_MEAN_FRAME_MS
};
// Installed on the VAE stages' classes (gst_latent_base_class_install_plan_properties), with ids
// their own properties leave free; their set/get_property chain up to ours for them.
enum { PROP_PREFETCH_DEPTH = 100, PROP_CUDA_GRAPHS, PROP_VAE_MODE, PROP_PLANS_REUSED };
constexpr bool kDefaultCudaGraphs = true;
constexpr guint kDefaultPrefetchDepth = 2;
constexpr guint kMaxPrefetchDepth = 16;

struct Settings {
  std::string model;                    // empty: the built-in default model (VAE stages)
  std::string device = kDefaultDevice;  // auto (or empty), cpu, cuda, cuda:N
  GstLatentDtype dtype = GST_LATENT_DTYPE_AUTO;
  guint prefetch_depth = kDefaultPrefetchDepth;
  bool cuda_graphs = kDefaultCudaGraphs;
  GstLatentVaeMode mode = GST_LATENT_VAE_MODE_AUTO;
  // A `device` refused while the element had no bus (set before it was in a pipeline, as
  // gst-launch and gst_parse_launch do): its warning went nowhere, so start() fails naming it.
  std::string device_refused;
};

// Counters behind the statistics properties (since start()).
struct Stats {
  guint64 processed = 0;
  guint64 dropped = 0;
  GstClockTime total = 0;  // processing time of the processed frames
};

// Per-frame processing times for LATENCY answers.
struct LatencyStats {
  guint64 frames = 0;
  GstClockTime first = 0;       // the first frame (warm-up included)
  GstClockTime steady_max = 0;  // the longest frame after the first
  GstClockTime frame_duration = GST_CLOCK_TIME_NONE;
  guint held = 0;             // frames held back for prefetching
  GstClockTime reported = 0;  // the figure the last latency message announced
};

struct State {
  std::shared_ptr<latent::Backend> backend;
  std::shared_ptr<std::mutex> run_lock;   // backend's (latent::backend_run_lock)
  std::shared_ptr<GstLatentModel> model;  // VAE stages
  // This stage's plan (on model's backend); destroyed under model->run_lock only.
  std::shared_ptr<latent::PlannedPart> plan;
  bool plan_graphs = false;  // the cuda-graphs setting it was built with
};

// ---- engine log -> GStreamer debug log ----------------------------------------------------

GstDebugLevel to_gst_level(latent::LogLevel level) {
  switch (level) {
    case latent::LogLevel::kError:
      return GST_LEVEL_ERROR;
    case latent::LogLevel::kWarning:
      return GST_LEVEL_WARNING;
    case latent::LogLevel::kInfo:
      return GST_LEVEL_INFO;
    case latent::LogLevel::kDebug:
      return GST_LEVEL_DEBUG;
    case latent::LogLevel::kTrace:
      return GST_LEVEL_TRACE;
  }
  return GST_LEVEL_LOG;
}

void engine_log(latent::LogLevel level, const char* file, int line, const char* message, void*) {
  const GstDebugLevel gst_level = to_gst_level(level);
  if (gst_level > gst_debug_category_get_threshold(latent_engine_debug)) return;
  gst_debug_log(latent_engine_debug, gst_level, file ? file : "", "", line, nullptr, "%s", message);
}

// ---- the process-wide model cache ---------------------------------------------------------

struct ModelCache {
  std::mutex mutex;  // held while loading, so concurrent starts of one model load it once
  std::map<std::string, std::weak_ptr<GstLatentModel>> models;
};

ModelCache& model_cache() {
  static ModelCache* cache = new ModelCache();  // never destroyed: elements may outlive exit
  return *cache;
}

std::string cache_key(const latent::ModelSource& src, const latent::Backend& backend, guint parts) {
  return latent::str_cat(latent::model_source_identity(src), "|", backend.name(), "|",
                         latent::dtype_name(backend.compute_dtype()), "|", parts);
}

std::string parts_name(guint parts) {
  if (parts == (GST_LATENT_PART_ENCODER | GST_LATENT_PART_DECODER)) return "encoder+decoder";
  if (parts == GST_LATENT_PART_ENCODER) return "encoder";
  if (parts == GST_LATENT_PART_DECODER) return "decoder";
  return "nothing";
}

enum class LoadFailure { kNone, kNotFound, kRead };

struct LoadResult {
  std::shared_ptr<GstLatentModel> model;
  LoadFailure failure = LoadFailure::kNone;
  std::string message;
  bool shared = false;
};

// Source resolution, then the cache or a fresh load on `backend`. The cache lock is held
// throughout so two elements starting together load the model once.
LoadResult load_shared_model(const std::string& model_path,
                             const std::shared_ptr<latent::Backend>& backend, guint parts) {
  LoadResult r;
  auto source = latent::resolve_model_source(model_path);
  if (!source.ok()) {
    r.failure = LoadFailure::kNotFound;
    r.message = source.status().message();  // names the path and what was looked for
    return r;
  }

  ModelCache& cache = model_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  // An instance with every part also serves a stage that needs only one.
  for (guint candidate : {parts, guint(GST_LATENT_PART_ENCODER | GST_LATENT_PART_DECODER)}) {
    auto it = cache.models.find(cache_key(*source, *backend, candidate));
    if (it == cache.models.end()) continue;
    if (auto existing = it->second.lock()) {
      r.model = existing;
      r.shared = true;
      return r;
    }
  }
  latent::VaeLoadOptions lo;
  lo.encoder = (parts & GST_LATENT_PART_ENCODER) != 0;
  lo.decoder = (parts & GST_LATENT_PART_DECODER) != 0;
  auto vae = latent::load_vae(*source, backend, lo);
  if (!vae.ok()) {
    r.failure = LoadFailure::kRead;
    r.message =
        latent::str_cat("cannot load model '", source->given.empty() ? source->root : source->given,
                        "': ", vae.status().message());
    return r;
  }
  auto model = std::make_shared<GstLatentModel>();
  model->key = cache_key(*source, *backend, parts);
  model->source = *source;
  model->backend = backend;
  model->vae = std::move(*vae);
  model->parts = parts;
  model->run_lock = latent::backend_run_lock(*backend);
  // Drop entries whose models are gone, then remember this one.
  for (auto it = cache.models.begin(); it != cache.models.end();)
    it = it->second.expired() ? cache.models.erase(it) : std::next(it);
  cache.models[model->key] = model;
  r.model = std::move(model);
  return r;
}

}  // namespace

GstLatentModel::~GstLatentModel() {
  if (!run_lock) return;
  std::lock_guard<std::mutex> lock(*run_lock);
  parked_plans.clear();  // their graphs read the weights
  vae.reset();
}

std::string GstLatentModel::describe() const {
  return latent::str_cat("model '", vae->latent_space().name, "' in ",
                         source.single_file ? source.weights_path : source.root);
}

struct GstLatentBasePrivate {
  struct Impl {
    std::mutex settings_lock;
    Settings settings;
    std::mutex state_lock;
    State state;
    guint64 plans_reused = 0;  // under state_lock (property plans-reused)
    std::mutex latency_lock;
    LatencyStats latency;
    Stats stats;  // under latency_lock
    GstLatentCuda cuda;
    // decide_allocation: every reader downstream orders its reads by the latents' fences.
    std::atomic<bool> downstream_orders_reads{false};
    GstLatentStage* stage = nullptr;  // the subclass's, deleted in finalize
    std::mutex refusal_lock;
    std::string last_refusal;  // posted once (gst_latent_base_refuse_caps) until new caps or stop
    std::atomic<bool> fp8{false};  // started with dtype=fp8 (gst_latent_base_fp8)
  };
  Impl* impl;
};

#define gst_latent_base_parent_class parent_class
G_DEFINE_ABSTRACT_TYPE_WITH_PRIVATE(GstLatentBase, gst_latent_base, GST_TYPE_BASE_TRANSFORM)

static GstLatentBasePrivate::Impl* impl_of(GstLatentBase* self) {
  return static_cast<GstLatentBasePrivate*>(gst_latent_base_get_instance_private(self))->impl;
}

// What the base class logs about a stage goes to the stage's own category ("vaeencode", ...), so
// GST_DEBUG=vaeencode:6 shows all of it; "latentbase" only for a class that set none.
static GstDebugCategory* stage_category(gpointer self) {
  GstDebugCategory* c = GST_LATENT_BASE_GET_CLASS(self)->debug_category;
  return c ? c : gst_latent_base_debug;
}
#undef GST_CAT_DEFAULT
#define GST_CAT_DEFAULT stage_category(self)

void gst_latent_element_init(GstPlugin*) {
  static gsize done = 0;
  if (g_once_init_enter(&done)) {
    GST_DEBUG_CATEGORY_INIT(latent_engine_debug, "latent-engine", 0, "gst-latent inference engine");
    GST_DEBUG_CATEGORY_INIT(gst_latent_base_debug, "latentbase", 0, "latent stage base class");
    latent::set_log_callback(engine_log, nullptr);
    g_once_init_leave(&done, 1);
  }
}

GType gst_latent_dtype_get_type(void) {
  static gsize type = 0;
  static const GEnumValue values[] = {
      {GST_LATENT_DTYPE_AUTO, "The device's default (fp32 on the CPU, bf16 on CUDA)", "auto"},
      {GST_LATENT_DTYPE_FP32, "32-bit float (TF32 matrix units on CUDA)", "fp32"},
      {GST_LATENT_DTYPE_BF16, "bfloat16", "bf16"},
      {GST_LATENT_DTYPE_FP16, "IEEE half precision", "fp16"},
      {GST_LATENT_DTYPE_FP8,
       "ditdenoise: the transformer's linear layers in FP8 e4m3 (Hopper; emulated on the CPU), "
       "the rest as auto",
       "fp8"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) {
    GType t = g_enum_register_static("GstLatentDtype", values);
    g_once_init_leave(&type, t);
  }
  return type;
}

GType gst_latent_vae_mode_get_type(void) {
  static gsize type = 0;
  static const GEnumValue values[] = {
      {GST_LATENT_VAE_MODE_AUTO,
       "video for a causal video VAE (AutoencoderKLWan, TAEW), image otherwise", "auto"},
      {GST_LATENT_VAE_MODE_IMAGE, "Every frame alone (a latent a frame)", "image"},
      {GST_LATENT_VAE_MODE_VIDEO,
       "Causal chunks: frame 0 alone, then 4 frames a latent frame (video VAEs only)", "video"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) {
    GType t = g_enum_register_static("GstLatentVaeMode", values);
    g_once_init_leave(&type, t);
  }
  return type;
}

static const char* vae_mode_nick(GstLatentVaeMode mode) {
  GEnumValue* v = g_enum_get_value(G_ENUM_CLASS(g_type_class_peek(GST_TYPE_LATENT_VAE_MODE)), mode);
  return v ? v->value_nick : "auto";
}

// The engine's name of a `dtype` value ("auto" for the device's default).
static const char* dtype_nick(GstLatentDtype dtype) {
  GEnumValue* v = g_enum_get_value(G_ENUM_CLASS(g_type_class_peek(GST_TYPE_LATENT_DTYPE)), dtype);
  return v ? v->value_nick : "auto";
}

// Refuses a change of a property flagged GST_PARAM_MUTABLE_READY while it is in use, with a
// warning naming the value that stays in effect. True when refused.
static bool refuse_while_running(GstLatentBase* self, GParamSpec* pspec,
                                 const std::string& current) {
  return gst_latent_refuse_while_running(GST_ELEMENT(self), gst_latent_base_stage_name(self), pspec,
                                         current);
}

static void gst_latent_base_set_property(GObject* object, guint prop_id, const GValue* value,
                                         GParamSpec* pspec) {
  GstLatentBase* self = GST_LATENT_BASE(object);
  auto* impl = impl_of(self);
  const bool ready_only = prop_id == PROP_MODEL || prop_id == PROP_DEVICE ||
                          prop_id == PROP_DTYPE || prop_id == PROP_VAE_MODE;
  std::string current;
  if (ready_only) {
    {
      std::lock_guard<std::mutex> lock(impl->settings_lock);
      const Settings& st = impl->settings;
      current = prop_id == PROP_MODEL      ? st.model
                : prop_id == PROP_DEVICE   ? st.device
                : prop_id == PROP_VAE_MODE ? vae_mode_nick(st.mode)
                                           : dtype_nick(st.dtype);
    }
    if (refuse_while_running(self, pspec, current)) return;
  }
  const gchar* s = nullptr;
  if (prop_id == PROP_DEVICE) {
    s = g_value_get_string(value);
    if (latent::Status valid = latent::check_device_name(s ? s : ""); !valid.ok()) {
      GstBus* bus = gst_element_get_bus(GST_ELEMENT(self));
      if (bus) {
        gst_object_unref(bus);
      } else {
        std::lock_guard<std::mutex> lock(impl->settings_lock);
        impl->settings.device_refused = s;
      }
      GST_ELEMENT_WARNING(self, RESOURCE, SETTINGS,
                          ("%s: device '%s' is not a device (auto, cpu, cuda or cuda:N); it stays "
                           "'%s'",
                           gst_latent_base_stage_name(self), s, current.c_str()),
                          ("%s", valid.message().c_str()));
      return;
    }
  }
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  switch (prop_id) {
    case PROP_MODEL:
      s = g_value_get_string(value);
      impl->settings.model = s ? s : "";
      break;
    case PROP_DEVICE:
      s = g_value_get_string(value);
      impl->settings.device = s ? s : "";
      impl->settings.device_refused.clear();
      break;
    case PROP_DTYPE:
      impl->settings.dtype = static_cast<GstLatentDtype>(g_value_get_enum(value));
      break;
    case PROP_PREFETCH_DEPTH:
      impl->settings.prefetch_depth = g_value_get_uint(value);
      break;
    case PROP_CUDA_GRAPHS:
      impl->settings.cuda_graphs = g_value_get_boolean(value);
      break;
    case PROP_VAE_MODE:
      impl->settings.mode = static_cast<GstLatentVaeMode>(g_value_get_enum(value));
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
      break;
  }
}

static void gst_latent_base_get_property(GObject* object, guint prop_id, GValue* value,
                                         GParamSpec* pspec) {
  auto* impl = impl_of(GST_LATENT_BASE(object));
  if (prop_id == PROP_PLANS_REUSED) {
    std::lock_guard<std::mutex> lock(impl->state_lock);
    g_value_set_uint64(value, impl->plans_reused);
    return;
  }
  if (prop_id == PROP_FRAMES_PROCESSED || prop_id == PROP_FRAMES_DROPPED ||
      prop_id == PROP_MEAN_FRAME_MS) {
    std::lock_guard<std::mutex> lock(impl->latency_lock);
    const Stats& st = impl->stats;
    if (prop_id == PROP_FRAMES_PROCESSED)
      g_value_set_uint64(value, st.processed);
    else if (prop_id == PROP_FRAMES_DROPPED)
      g_value_set_uint64(value, st.dropped);
    else
      g_value_set_double(
          value, st.processed ? GST_TIME_AS_USECONDS(st.total) / 1000.0 / st.processed : 0.0);
    return;
  }
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  switch (prop_id) {
    case PROP_MODEL:
      g_value_set_string(value, impl->settings.model.c_str());
      break;
    case PROP_DEVICE:
      g_value_set_string(value, impl->settings.device.c_str());
      break;
    case PROP_DTYPE:
      g_value_set_enum(value, impl->settings.dtype);
      break;
    case PROP_PREFETCH_DEPTH:
      g_value_set_uint(value, impl->settings.prefetch_depth);
      break;
    case PROP_CUDA_GRAPHS:
      g_value_set_boolean(value, impl->settings.cuda_graphs);
      break;
    case PROP_VAE_MODE:
      g_value_set_enum(value, impl->settings.mode);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
      break;
  }
}

static void gst_latent_base_finalize(GObject* object) {
  auto* priv = static_cast<GstLatentBasePrivate*>(
      gst_latent_base_get_instance_private(GST_LATENT_BASE(object)));
  delete priv->impl->stage;
  delete priv->impl;
  priv->impl = nullptr;
  G_OBJECT_CLASS(parent_class)->finalize(object);
}

static gboolean gst_latent_base_start(GstBaseTransform* trans) {
  GstLatentBase* self = GST_LATENT_BASE(trans);
  auto* impl = impl_of(self);
  GstLatentBaseClass* klass = GST_LATENT_BASE_GET_CLASS(self);
  Settings settings;
  {
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    settings = impl->settings;
  }
  const char* stage = gst_latent_base_stage_name(self);
  {
    std::lock_guard<std::mutex> lock(impl->latency_lock);
    impl->stats = Stats();
  }
  if (!settings.device_refused.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("%s: device '%s' is not a device (auto, cpu, cuda or cuda:N)", stage,
                       settings.device_refused.c_str()),
                      ("refused when set, before the element had a bus to warn on"));
    return FALSE;
  }
  const bool fp8 = settings.dtype == GST_LATENT_DTYPE_FP8;
  if (fp8 && !klass->takes_fp8) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("%s: dtype fp8 applies to ditdenoise's transformer; %s runs in fp32, bf16 "
                       "or fp16",
                       stage, stage),
                      ("dtype=fp8"));
    return FALSE;
  }
  impl->fp8 = fp8;
  latent::BackendOptions bo;
  bo.device = settings.device;
  bo.dtype = fp8 ? "auto" : dtype_nick(settings.dtype);  // fp8: the rest as the device's default
  auto backend = latent::get_backend(bo);
  if (!backend.ok()) {
    // The message names the device or dtype at fault.
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("%s: %s", stage, backend.status().message().c_str()),
                      ("device=%s dtype=%s", settings.device.c_str(), dtype_nick(settings.dtype)));
    return FALSE;
  }
  std::shared_ptr<GstLatentModel> model;
  if (klass->parts != 0) {
    LoadResult r = load_shared_model(settings.model, *backend, klass->parts);
    switch (r.failure) {
      case LoadFailure::kNone:
        break;
      case LoadFailure::kNotFound:
        GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("%s: %s", stage, r.message.c_str()),
                          ("model=%s", settings.model.c_str()));
        return FALSE;
      case LoadFailure::kRead:
        GST_ELEMENT_ERROR(self, RESOURCE, READ, ("%s: %s", stage, r.message.c_str()),
                          ("model=%s", settings.model.c_str()));
        return FALSE;
    }
    GST_INFO_OBJECT(self, "%s %s (%s, %s on %s)", r.shared ? "sharing the loaded" : "loaded",
                    r.model->describe().c_str(), parts_name(r.model->parts).c_str(),
                    r.model->vae->info().architecture.c_str(), r.model->backend->name().c_str());
    model = std::move(r.model);
  }
  // The context first: until the state holds the backend, caps queries offer CUDA memory (as
  // before start()); from then on they ask whether the context is active.
  if (!impl->cuda.start(GST_ELEMENT(self), (*backend)->device()))
    GST_WARNING_OBJECT(self, "no CUDA context for GStreamer: buffers stay in system memory");
  {
    std::lock_guard<std::mutex> lock(impl->state_lock);
    impl->state.backend = *backend;
    impl->state.run_lock = latent::backend_run_lock(**backend);
    impl->state.model = std::move(model);
  }
  if (klass->open && !klass->open(self, *backend)) {
    State dropped;  // freed after the state lock is released
    {
      std::lock_guard<std::mutex> lock(impl->state_lock);
      dropped = std::move(impl->state);
      impl->state = State();
    }
    impl->cuda.stop();
    return FALSE;
  }
  return TRUE;
}

static gboolean gst_latent_base_stop(GstBaseTransform* trans) {
  GstLatentBase* self = GST_LATENT_BASE(trans);
  auto* impl = impl_of(self);
  GstLatentBaseClass* klass = GST_LATENT_BASE_GET_CLASS(self);
  if (klass->drop_held) klass->drop_held(self);
  // Left with the model for the next start (freed with it, before the weights its graph reads).
  gst_latent_base_drop_plan(self, /*park=*/true);
  if (klass->close) klass->close(self);
  State dropped;
  {
    std::lock_guard<std::mutex> lock(impl->state_lock);
    dropped = std::move(impl->state);
    impl->state = State();
  }
  impl->cuda.stop();
  // The last user frees the weights here, outside the state lock.
  dropped = State();
  gst_latent_base_reset_latency(self);
  {
    std::lock_guard<std::mutex> lock(impl->refusal_lock);
    impl->last_refusal.clear();
  }
  return TRUE;
}

gboolean gst_latent_base_refuse_caps(GstLatentBase* self, GstCaps* caps,
                                     const std::string& message) {
  auto* impl = impl_of(self);
  GST_WARNING_OBJECT(self, "refusing %" GST_PTR_FORMAT ": %s", caps, message.c_str());
  {
    std::lock_guard<std::mutex> lock(impl->refusal_lock);
    if (impl->last_refusal == message) return FALSE;
    impl->last_refusal = message;
  }
  GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("%s", message.c_str()),
                    ("caps %" GST_PTR_FORMAT, caps));
  return FALSE;
}

// ---- GPU timeline trace ---------------------------------------------------------------------

namespace {

int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One thread waits for the marks in the order they were placed and writes their lines.
class TraceWriter {
 public:
  static TraceWriter* get() {
    static TraceWriter* writer = []() -> TraceWriter* {
      const char* path = std::getenv("LATENT_TRACE");
      if (!path || !*path) return nullptr;
      FILE* f = std::fopen(path, "a");
      if (!f) {
        GST_CAT_WARNING(gst_latent_base_debug,
                        "LATENT_TRACE: cannot open %s for appending; no trace is written", path);
        return nullptr;
      }
      return new TraceWriter(f);  // lives as long as the process (its thread is detached)
    }();
    return writer;
  }

  void add(std::unique_ptr<latent::DeviceFence> fence, int64_t queued_us, std::string line) {
    {
      std::lock_guard<std::mutex> lock(lock_);
      items_.push_back(Item{std::move(fence), queued_us, std::move(line)});
    }
    cv_.notify_one();
  }

 private:
  struct Item {
    std::unique_ptr<latent::DeviceFence> fence;
    int64_t queued_us;
    std::string rest;
  };

  explicit TraceWriter(FILE* f) : file_(f) {
    std::thread([this] { run(); }).detach();
  }

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(lock_);
        cv_.wait(lock, [this] { return !items_.empty(); });
        item = std::move(items_.front());
        items_.pop_front();
      }
      const bool reached = item.fence && item.fence->wait().ok();
      std::fprintf(file_, "%lld %lld %s\n", static_cast<long long>(item.queued_us),
                   reached ? static_cast<long long>(wall_us()) : -1LL, item.rest.c_str());
      std::fflush(file_);
    }
  }

  FILE* file_;
  std::mutex lock_;
  std::condition_variable cv_;
  std::deque<Item> items_;
};

}  // namespace

bool gst_latent_trace_enabled() { return TraceWriter::get() != nullptr; }

void gst_latent_trace_mark(GstLatentBase* self, latent::Backend& backend, const char* label,
                           int64_t n) {
  TraceWriter* w = TraceWriter::get();
  if (!w) return;
  const int64_t queued = wall_us();
  auto fence = backend.fence();
  gchar* name = gst_object_get_name(GST_OBJECT(self));
  GstObject* parent = gst_object_get_parent(GST_OBJECT(self));
  gchar* pipeline = parent ? gst_object_get_name(parent) : g_strdup("-");
  if (parent) gst_object_unref(parent);
  w->add(fence.ok() ? std::move(*fence) : nullptr, queued,
         latent::str_cat(pipeline, "/", name, " ", label, " ", n));
  g_free(pipeline);
  g_free(name);
}

static GstClockTime own_latency(const LatencyStats& l, guint /*depth*/) {
  const GstClockTime processing = l.frames > 1 ? l.steady_max : l.first;
  GstClockTime held = 0;
  if (l.held > 0)
    held =
        GST_CLOCK_TIME_IS_VALID(l.frame_duration) ? l.held * l.frame_duration : l.held * processing;
  return processing + held;
}

// The CUDA device the `device` property names ("cuda", "cuda:N"; "auto": the first GPU when
// there is one, as start() will most likely decide), else -1.
static int planned_cuda_device(GstLatentBase* self) {
  if (!gst_latent_cuda_built()) return -1;
  std::string device;
  {
    auto* impl = impl_of(self);
    std::lock_guard<std::mutex> lock(impl->settings_lock);
    device = impl->settings.device;
  }
  auto resolved = latent::resolve_device(device);
  return resolved.ok() && resolved->kind == latent::DeviceKind::kCUDA ? resolved->index : -1;
}

static gboolean gst_latent_base_query(GstBaseTransform* trans, GstPadDirection direction,
                                      GstQuery* query) {
  if (GST_QUERY_TYPE(query) == GST_QUERY_CONTEXT &&
      impl_of(GST_LATENT_BASE(trans))
          ->cuda.handle_query(GST_ELEMENT(trans), query,
                              planned_cuda_device(GST_LATENT_BASE(trans))))
    return TRUE;
  if (GST_QUERY_TYPE(query) != GST_QUERY_LATENCY || direction != GST_PAD_SRC)
    return GST_BASE_TRANSFORM_CLASS(parent_class)->query(trans, direction, query);
  GstLatentBase* self = GST_LATENT_BASE(trans);
  GstPad* sinkpad = GST_BASE_TRANSFORM_SINK_PAD(trans);
  if (!gst_pad_peer_query(sinkpad, query)) return FALSE;
  gboolean live = FALSE;
  GstClockTime min = 0, max = GST_CLOCK_TIME_NONE;
  gst_query_parse_latency(query, &live, &min, &max);
  const GstClockTime ours = gst_latent_base_latency(self);
  min += ours;
  if (GST_CLOCK_TIME_IS_VALID(max)) max += ours;
  GST_DEBUG_OBJECT(self,
                   "latency: ours %" GST_TIME_FORMAT ", total min %" GST_TIME_FORMAT
                   " max %" GST_TIME_FORMAT,
                   GST_TIME_ARGS(ours), GST_TIME_ARGS(min), GST_TIME_ARGS(max));
  gst_query_set_latency(query, live, min, max);
  return TRUE;
}

static void gst_latent_base_set_context(GstElement* element, GstContext* context) {
  impl_of(GST_LATENT_BASE(element))->cuda.set_context(element, context);
  GST_ELEMENT_CLASS(parent_class)->set_context(element, context);
}

static gboolean gst_latent_base_set_caps(GstBaseTransform* trans, GstCaps* incaps,
                                         GstCaps* outcaps) {
  GstLatentBase* self = GST_LATENT_BASE(trans);
  GstLatentBaseClass* klass = GST_LATENT_BASE_GET_CLASS(self);
  if (klass->set_info && !klass->set_info(self, incaps, outcaps)) return FALSE;
  {
    auto* impl = impl_of(self);
    std::lock_guard<std::mutex> lock(impl->refusal_lock);
    impl->last_refusal.clear();
  }
  // Video and latent caps both carry the frame rate.
  gint fps_n = 0, fps_d = 1;
  if (!gst_structure_get_fraction(gst_caps_get_structure(incaps, 0), "framerate", &fps_n, &fps_d))
    fps_n = 0;
  gst_latent_base_set_frame_rate(self, fps_n, fps_d);
  return TRUE;
}

static gboolean gst_latent_base_propose_allocation(GstBaseTransform* trans, GstQuery* decide_query,
                                                   GstQuery* query) {
  if (!GST_BASE_TRANSFORM_CLASS(parent_class)->propose_allocation(trans, decide_query, query))
    return FALSE;
  // Latents in CUDA memory: upstream writes them into our context's pool.
  gst_latent_cuda_propose_latent_pool(&impl_of(GST_LATENT_BASE(trans))->cuda, query);
  return TRUE;
}

static gboolean gst_latent_base_decide_allocation(GstBaseTransform* trans, GstQuery* query) {
  auto* impl = impl_of(GST_LATENT_BASE(trans));
  impl->downstream_orders_reads = gst_latent_fences_on() && gst_latent_query_orders_reads(query);
  if (gst_latent_cuda_decide_latent_pool(&impl->cuda, query)) return TRUE;
  return GST_BASE_TRANSFORM_CLASS(parent_class)->decide_allocation(trans, query);
}

static gboolean gst_latent_base_sink_event(GstBaseTransform* trans, GstEvent* event) {
  GstLatentBase* self = GST_LATENT_BASE(trans);
  GstLatentBaseClass* klass = GST_LATENT_BASE_GET_CLASS(self);
  switch (GST_EVENT_TYPE(event)) {
    case GST_EVENT_CAPS: {
      // The same caps again (some elements resend them) change nothing: the held frames, and a
      // video-mode clip in progress, carry on.
      GstCaps* caps = nullptr;
      gst_event_parse_caps(event, &caps);
      GstCaps* current = gst_pad_get_current_caps(GST_BASE_TRANSFORM_SINK_PAD(trans));
      const bool same = current && caps && gst_caps_is_equal(current, caps);
      if (current) gst_caps_unref(current);
      if (same) break;
      if (klass->drain_held) klass->drain_held(self);
      if (klass->drop_held) klass->drop_held(self);  // new frame size
      break;
    }
    case GST_EVENT_EOS:
    case GST_EVENT_SEGMENT:
      if (klass->drain_held) klass->drain_held(self);
      break;
    case GST_EVENT_FLUSH_STOP:
      if (klass->drop_held) klass->drop_held(self);
      break;
    default:
      break;
  }
  return GST_BASE_TRANSFORM_CLASS(parent_class)->sink_event(trans, event);
}

// Counts the frames GstBaseTransform's QoS handling dropped, from the QoS messages it posts.
static gboolean gst_latent_base_post_message(GstElement* element, GstMessage* message) {
  if (GST_MESSAGE_TYPE(message) == GST_MESSAGE_QOS &&
      GST_MESSAGE_SRC(message) == GST_OBJECT_CAST(element)) {
    GstFormat format;
    guint64 processed = 0, dropped = 0;
    gst_message_parse_qos_stats(message, &format, &processed, &dropped);
    GstLatentBase* self = GST_LATENT_BASE(element);
    GST_DEBUG_OBJECT(self, "QoS: dropped a late frame (%" G_GUINT64_FORMAT " so far)", dropped);
    auto* impl = impl_of(self);
    std::lock_guard<std::mutex> lock(impl->latency_lock);
    impl->stats.dropped++;
  }
  return GST_ELEMENT_CLASS(parent_class)->post_message(element, message);
}

static void gst_latent_base_class_init(GstLatentBaseClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  GstBaseTransformClass* trans_class = GST_BASE_TRANSFORM_CLASS(klass);

  gst_latent_element_init(nullptr);

  gobject_class->set_property = gst_latent_base_set_property;
  gobject_class->get_property = gst_latent_base_get_property;
  gobject_class->finalize = gst_latent_base_finalize;

  const auto flags = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                              GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      gobject_class, PROP_MODEL,
      g_param_spec_string("model", "Model",
                          "Model path: a diffusers folder or pipeline root (or a .safetensors "
                          "file for the VAE stages; empty: the built-in default VAE)",
                          "", flags));
  g_object_class_install_property(
      gobject_class, PROP_DEVICE,
      g_param_spec_string("device", "Device",
                          "Where to run: auto (the first GPU if usable, else the CPU), cpu, cuda "
                          "or cuda:N",
                          kDefaultDevice, flags));
  g_object_class_install_property(
      gobject_class, PROP_DTYPE,
      g_param_spec_enum("dtype", "Compute dtype",
                        "The compute dtype; auto: the device's default (fp32 on the CPU, bf16 on "
                        "CUDA)",
                        GST_TYPE_LATENT_DTYPE, GST_LATENT_DTYPE_AUTO, flags));
  const auto stat = static_cast<GParamFlags>(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      gobject_class, PROP_FRAMES_PROCESSED,
      g_param_spec_uint64("frames-processed", "Frames processed",
                          "Frames computed since the element started", 0, G_MAXUINT64, 0, stat));
  g_object_class_install_property(
      gobject_class, PROP_FRAMES_DROPPED,
      g_param_spec_uint64("frames-dropped", "Frames dropped",
                          "Late frames dropped by QoS before they were computed, since the "
                          "element started",
                          0, G_MAXUINT64, 0, stat));
  g_object_class_install_property(
      gobject_class, PROP_MEAN_FRAME_MS,
      g_param_spec_double("mean-frame-ms", "Mean milliseconds per frame",
                          "Mean processing time of the frames computed since the element started "
                          "(from receiving a frame to its result being ready)",
                          0.0, G_MAXDOUBLE, 0.0, stat));

  GST_ELEMENT_CLASS(klass)->set_context = GST_DEBUG_FUNCPTR(gst_latent_base_set_context);
  GST_ELEMENT_CLASS(klass)->post_message = GST_DEBUG_FUNCPTR(gst_latent_base_post_message);
  trans_class->passthrough_on_same_caps = FALSE;
  trans_class->query = GST_DEBUG_FUNCPTR(gst_latent_base_query);
  trans_class->start = GST_DEBUG_FUNCPTR(gst_latent_base_start);
  trans_class->stop = GST_DEBUG_FUNCPTR(gst_latent_base_stop);
  trans_class->set_caps = GST_DEBUG_FUNCPTR(gst_latent_base_set_caps);
  trans_class->propose_allocation = GST_DEBUG_FUNCPTR(gst_latent_base_propose_allocation);
  trans_class->decide_allocation = GST_DEBUG_FUNCPTR(gst_latent_base_decide_allocation);
  trans_class->sink_event = GST_DEBUG_FUNCPTR(gst_latent_base_sink_event);

  gst_type_mark_as_plugin_api(GST_TYPE_LATENT_BASE, static_cast<GstPluginAPIFlags>(0));
  gst_type_mark_as_plugin_api(GST_TYPE_LATENT_DTYPE, static_cast<GstPluginAPIFlags>(0));
}

static void gst_latent_base_init(GstLatentBase* self) {
  auto* priv = static_cast<GstLatentBasePrivate*>(gst_latent_base_get_instance_private(self));
  priv->impl = new GstLatentBasePrivate::Impl();
  gst_base_transform_set_in_place(GST_BASE_TRANSFORM(self), FALSE);
  gst_base_transform_set_passthrough(GST_BASE_TRANSFORM(self), FALSE);
  // As core video filters do: in a live pipeline, a frame already later than downstream's QoS
  // reports is dropped before it is computed (with a QoS message), so the stage does not build a
  // backlog behind a source faster than itself. Property `qos`; without QoS events (a pipeline
  // that is not synchronised to a clock) nothing is ever dropped.
  gst_base_transform_set_qos_enabled(GST_BASE_TRANSFORM(self), TRUE);
}

void gst_latent_base_class_install_plan_properties(GstLatentBaseClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  // GObject does not inherit these two: a stage without properties of its own gets ours.
  if (!gobject_class->set_property) gobject_class->set_property = gst_latent_base_set_property;
  if (!gobject_class->get_property) gobject_class->get_property = gst_latent_base_get_property;
  const auto flags = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                              GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      gobject_class, PROP_PREFETCH_DEPTH,
      g_param_spec_uint("prefetch-depth", "Prefetch depth",
                        "On a GPU: frames uploaded (and downloaded) on a copy stream while earlier "
                        "frames compute; each adds one frame of latency (0: none). vaeencode in "
                        "video mode stages every frame (at least 4 slots) without holding any",
                        0, kMaxPrefetchDepth, kDefaultPrefetchDepth, flags));
  g_object_class_install_property(
      gobject_class, PROP_CUDA_GRAPHS,
      g_param_spec_boolean("cuda-graphs", "CUDA graphs",
                           "On a GPU: capture the model part as a CUDA graph when caps are "
                           "negotiated and replay it for every frame (off: the plain forward, "
                           "still warmed up at negotiation)",
                           kDefaultCudaGraphs, flags));
  g_object_class_install_property(
      gobject_class, PROP_PLANS_REUSED,
      g_param_spec_uint64("plans-reused", "Plans reused",
                          "Starts (since the element was created) that took over the plan a "
                          "stopped stage left with the shared model for the same input, instead "
                          "of a warm-up forward and a CUDA graph capture",
                          0, G_MAXUINT64, 0,
                          static_cast<GParamFlags>(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));
}

void gst_latent_base_class_install_mode_property(GstLatentBaseClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  if (!gobject_class->set_property) gobject_class->set_property = gst_latent_base_set_property;
  if (!gobject_class->get_property) gobject_class->get_property = gst_latent_base_get_property;
  g_object_class_install_property(
      gobject_class, PROP_VAE_MODE,
      g_param_spec_enum("mode", "Mode",
                        "image: every frame alone; video: causal chunks of a video VAE (frame 0 "
                        "alone, then 4 frames a latent frame; caps temporal-factor=4); auto: "
                        "video for AutoencoderKLWan and TAEW models, image otherwise",
                        GST_TYPE_LATENT_VAE_MODE, GST_LATENT_VAE_MODE_AUTO,
                        static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                                 GST_PARAM_MUTABLE_READY)));
  gst_type_mark_as_plugin_api(GST_TYPE_LATENT_VAE_MODE, static_cast<GstPluginAPIFlags>(0));
}

GstLatentVaeMode gst_latent_base_vae_mode(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  return impl->settings.mode;
}

gboolean gst_latent_base_checked_vae_mode(GstLatentBase* self, const GstLatentModel& model,
                                          GstLatentVaeMode* mode) {
  *mode = gst_latent_base_vae_mode(self);
  if (*mode == GST_LATENT_VAE_MODE_VIDEO && !model.vae->supports_video()) {
    GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                      ("%s: mode=video needs a causal video VAE (AutoencoderKLWan, "
                       "AutoencoderKLQwenImage or a TAEW model) but %s is an image model (%s); "
                       "use mode=image or mode=auto",
                       gst_latent_base_stage_name(self), model.describe().c_str(),
                       model.vae->info().architecture.c_str()),
                      ("model=%s", gst_latent_base_model_setting(self).c_str()));
    return FALSE;
  }
  return TRUE;
}

bool gst_latent_model_video_by_default(const GstLatentModel& model) {
  if (!model.vae->supports_video()) return false;
  const std::string& arch = model.vae->info().architecture;
  return arch == "AutoencoderKLWan" || arch == "TAEHV";
}

guint gst_latent_model_encoder_frames_held(const GstLatentModel& model) {
  const int f = model.vae->temporal_factor();
  if (f <= 1) return 0;
  return static_cast<guint>(model.vae->info().architecture == "TAEHV" ? 2 * f - 2 : f - 1);
}

void gst_latent_base_set_stage(GstLatentBase* self, GstLatentStage* stage) {
  auto* impl = impl_of(self);
  delete impl->stage;
  impl->stage = stage;
}

std::shared_ptr<GstLatentModel> gst_latent_base_get_model(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->state_lock);
  return impl->state.model;
}

std::shared_ptr<latent::Backend> gst_latent_base_backend(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->state_lock);
  return impl->state.backend;
}

std::shared_ptr<std::mutex> gst_latent_base_run_lock(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->state_lock);
  return impl->state.run_lock;
}

std::string gst_latent_base_model_setting(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  return impl->settings.model;
}

const char* gst_latent_base_stage_name(GstLatentBase* self) {
  GstElementFactory* factory = gst_element_get_factory(GST_ELEMENT(self));
  if (factory) return gst_plugin_feature_get_name(GST_PLUGIN_FEATURE(factory));
  return GST_ELEMENT_NAME(self);
}

gboolean gst_latent_base_fp8(GstLatentBase* self) { return impl_of(self)->fp8; }

latent::DType gst_latent_base_preferred_dtype(GstLatentBase* self) {
  if (auto backend = gst_latent_base_backend(self)) return backend->compute_dtype();
  return latent::DType::kF32;
}

void gst_latent_base_frame_done(GstLatentBase* self, GstClockTime processing) {
  auto* impl = impl_of(self);
  bool post = false;
  {
    std::lock_guard<std::mutex> lock(impl->latency_lock);
    impl->stats.processed++;
    impl->stats.total += processing;
    GST_LOG_OBJECT(self, "frame %" G_GUINT64_FORMAT " took %.2f ms", impl->stats.processed,
                   GST_TIME_AS_USECONDS(processing) / 1000.0);
    LatencyStats& l = impl->latency;
    if (l.frames == 0)
      l.first = processing;
    else
      l.steady_max = std::max(l.steady_max, processing);
    ++l.frames;
    const GstClockTime now = own_latency(l, 0);
    // Announce the first figure, then only growth beyond a tenth (no message storms).
    if (l.frames <= 2 ? now != l.reported : now > l.reported + l.reported / 10) {
      l.reported = now;
      post = true;
    }
  }
  if (post) {
    GST_DEBUG_OBJECT(self, "frame took %" GST_TIME_FORMAT ", posting a latency message",
                     GST_TIME_ARGS(processing));
    gst_element_post_message(GST_ELEMENT(self), gst_message_new_latency(GST_OBJECT(self)));
  }
}

void gst_latent_base_set_frame_duration(GstLatentBase* self, GstClockTime duration) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->latency_lock);
  impl->latency.frame_duration = duration;
}

void gst_latent_base_set_frame_rate(GstLatentBase* self, gint fps_n, gint fps_d) {
  gst_latent_base_set_frame_duration(
      self, fps_n > 0 ? gst_util_uint64_scale_int(GST_SECOND, fps_d, fps_n) : GST_CLOCK_TIME_NONE);
}

void gst_latent_base_set_frames_held(GstLatentBase* self, guint frames) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->latency_lock);
  impl->latency.held = frames;
}

GstFlowReturn gst_latent_base_acquire_output(GstLatentBase* self, gsize bytes, GstBuffer** out) {
  *out = nullptr;
  GstBufferPool* pool = gst_base_transform_get_buffer_pool(GST_BASE_TRANSFORM(self));
  if (!pool) {
    *out = gst_buffer_new_allocate(nullptr, bytes, nullptr);
    return *out ? GST_FLOW_OK : GST_FLOW_ERROR;
  }
  GstFlowReturn ret = GST_FLOW_OK;
  if (!gst_buffer_pool_is_active(pool) && !gst_buffer_pool_set_active(pool, TRUE)) {
    if (GST_PAD_IS_FLUSHING(GST_BASE_TRANSFORM_SRC_PAD(self))) {
      ret = GST_FLOW_FLUSHING;
    } else {
      GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS,
                        ("%s: cannot activate the output buffer pool %s", GST_ELEMENT_NAME(self),
                         GST_OBJECT_NAME(pool)),
                        (nullptr));
      ret = GST_FLOW_ERROR;
    }
  }
  if (ret == GST_FLOW_OK) ret = gst_buffer_pool_acquire_buffer(pool, out, nullptr);
  GST_LOG_OBJECT(self, "output buffer from %" GST_PTR_FORMAT ": %s", pool, gst_flow_get_name(ret));
  gst_object_unref(pool);
  return ret;
}

GstFlowReturn gst_latent_base_drain(GstLatentBase* self, bool* draining,
                                    const std::function<bool()>& held,
                                    const std::function<GstFlowReturn(GstBuffer**)>& next) {
  GstBaseTransform* trans = GST_BASE_TRANSFORM(self);
  GstFlowReturn ret = GST_FLOW_OK;
  *draining = true;
  while (ret == GST_FLOW_OK && held()) {
    GstBuffer* out = nullptr;
    ret = next(&out);
    if (out) ret = gst_pad_push(GST_BASE_TRANSFORM_SRC_PAD(trans), out);
  }
  *draining = false;
  if (ret != GST_FLOW_OK) GST_DEBUG_OBJECT(self, "drain stopped: %s", gst_flow_get_name(ret));
  return ret;
}

guint gst_latent_base_prefetch_depth(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  return impl->settings.prefetch_depth;
}

GstClockTime gst_latent_base_latency(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->latency_lock);
  return own_latency(impl->latency, 0);
}

void gst_latent_base_reset_latency(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->latency_lock);
  const GstClockTime duration = impl->latency.frame_duration;
  impl->latency = LatencyStats();
  impl->latency.frame_duration = duration;
}

// ---- caps -------------------------------------------------------------------------------------

// Caps features the stages convert: system memory, and CUDA memory (offered back as both).
static bool handled_memory(GstCapsFeatures* f) {
  return gst_latent_caps_features_is_system(f) || gst_latent_caps_features_is_cuda(f);
}

GstCaps* gst_latent_base_transform_caps(
    GstLatentBase* self, GstPadDirection direction, GstCaps* caps, GstCaps* filter,
    const std::function<GstStructure*(const GstStructure*)>& map) {
  GstBaseTransform* trans = GST_BASE_TRANSFORM(self);
  const bool cuda = gst_latent_base_offers_cuda(self);

  GstCaps* out = gst_caps_new_empty();
  if (gst_caps_is_any(caps)) {
    GstPad* other = direction == GST_PAD_SINK ? GST_BASE_TRANSFORM_SRC_PAD(trans)
                                              : GST_BASE_TRANSFORM_SINK_PAD(trans);
    gst_caps_unref(out);
    out = gst_pad_get_pad_template_caps(other);
  } else {
    for (guint i = 0; i < gst_caps_get_size(caps); ++i) {
      if (!handled_memory(gst_caps_get_features(caps, i))) continue;
      GstStructure* o = map(gst_caps_get_structure(caps, i));
      if (o) out = gst_latent_caps_merge_both(out, o, cuda);
    }
  }
  if (filter) {
    GstCaps* tmp = gst_caps_intersect_full(filter, out, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(out);
    out = tmp;
  }
  return out;
}

gboolean gst_latent_base_transform_size(GstLatentBase* self, GstCaps* othercaps,
                                        bool other_is_latent, gsize* othersize) {
  if (other_is_latent) {
    auto info = gst_latent_info_from_caps(othercaps);
    if (!info.ok()) {
      GST_WARNING_OBJECT(self, "%s", info.status().message().c_str());
      return FALSE;
    }
    *othersize = info->frame_bytes();
  } else {
    GstVideoInfo vinfo;
    if (!gst_video_info_from_caps(&vinfo, othercaps)) return FALSE;
    *othersize = GST_VIDEO_INFO_SIZE(&vinfo);
  }
  return TRUE;
}

latent::Status gst_latent_base_wait_unless_ordered(GstLatentBase* self,
                                                   latent::DeviceFence* written) {
  if (!written || impl_of(self)->downstream_orders_reads) return latent::ok_status();
  return written->wait();
}

GstLatentCuda* gst_latent_base_cuda(GstLatentBase* self) { return &impl_of(self)->cuda; }

bool gst_latent_base_offers_cuda(GstLatentBase* self) {
  if (!gst_latent_cuda_built()) return false;
  auto backend = gst_latent_base_backend(self);
  if (!backend) return true;
  return !backend->device().is_cpu() && impl_of(self)->cuda.active();
}

// ---- plans ------------------------------------------------------------------------------------

bool gst_latent_base_cuda_graphs(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->settings_lock);
  return impl->settings.cuda_graphs;
}

latent::Status gst_latent_base_build_plan(GstLatentBase* self, GstLatentModel& model,
                                          latent::VaePart part, const latent::Tensor& example) {
  auto* impl = impl_of(self);
  latent::PlanOptions options;
  options.graph = gst_latent_base_cuda_graphs(self);
  std::shared_ptr<latent::PlannedPart> old;
  {
    std::lock_guard<std::mutex> lock(impl->state_lock);
    // Renegotiation to the same input shape (another pixel format, framerate): keep the plan.
    if (impl->state.plan && impl->state.plan->part() == part &&
        impl->state.plan->accepts(example) && impl->state.plan_graphs == options.graph)
      return latent::ok_status();
    old = std::move(impl->state.plan);
  }
  old.reset();  // the caller holds model.run_lock: its graph and buffers go now
  latent::Backend& backend = *model.backend;
  if (backend.device().is_cpu()) return latent::ok_status();  // the plain forward, unplanned
  // A plan a stopped stage left with the model for this input (the caller holds run_lock).
  for (auto it = model.parked_plans.begin(); it != model.parked_plans.end(); ++it) {
    if (it->graphs != options.graph || it->plan->part() != part || !it->plan->accepts(example))
      continue;
    std::shared_ptr<latent::PlannedPart> plan = std::move(it->plan);
    model.parked_plans.erase(it);
    GST_INFO_OBJECT(self, "took the %s plan for %s a stopped stage left (%s)",
                    latent::vae_part_name(part), latent::shape_str(example.shape()).c_str(),
                    plan->uses_graph() ? "CUDA graph" : "plain forward");
    std::lock_guard<std::mutex> lock(impl->state_lock);
    impl->state.plan = std::move(plan);
    impl->state.plan_graphs = options.graph;
    impl->plans_reused++;
    return latent::ok_status();
  }
  const gint64 started_us = g_get_monotonic_time();
  auto built = latent::PlannedPart::build(*model.vae, part, example, options);
  if (!built.ok()) return built.status();
  const double ms = (g_get_monotonic_time() - started_us) / 1000.0;
  std::shared_ptr<latent::PlannedPart> plan = std::move(built).value();
  if (!plan->graph_failure().empty())
    GST_WARNING_OBJECT(self, "%s: no CUDA graph for the %s (plain forward per frame): %s",
                       gst_latent_base_stage_name(self), latent::vae_part_name(part),
                       plan->graph_failure().c_str());
  GST_INFO_OBJECT(self, "planned the %s for %s on %s in %.1f ms (%s)", latent::vae_part_name(part),
                  latent::shape_str(example.shape()).c_str(), backend.name().c_str(), ms,
                  plan->uses_graph() ? "CUDA graph"
                  : options.graph    ? "plain forward: capture failed"
                                     : "plain forward: cuda-graphs=false");
  std::lock_guard<std::mutex> lock(impl->state_lock);
  impl->state.plan = std::move(plan);
  impl->state.plan_graphs = options.graph;
  return latent::ok_status();
}

latent::Status gst_latent_base_plan_for(
    GstLatentBase* self, GstLatentModel& model, latent::VaePart part,
    const std::function<latent::Result<latent::Tensor>(latent::Backend&)>& example) {
  if (model.backend->device().is_cpu()) return latent::Status();
  std::lock_guard<std::mutex> run(*model.run_lock);
  auto input = example(*model.backend);
  latent::Status planned =
      input.ok() ? gst_latent_base_build_plan(self, model, part, *input) : input.status();
  input = latent::Status::error("released");  // device memory: freed under the run lock
  return planned;
}

void gst_latent_base_drop_plan(GstLatentBase* self, bool park) {
  auto* impl = impl_of(self);
  std::shared_ptr<latent::PlannedPart> plan;
  std::shared_ptr<GstLatentModel> model;
  bool graphs = false;
  {
    std::lock_guard<std::mutex> lock(impl->state_lock);
    plan = std::move(impl->state.plan);
    graphs = impl->state.plan_graphs;
    model = impl->state.model;
  }
  if (!plan) return;
  if (model && model->run_lock) {
    std::lock_guard<std::mutex> run(*model->run_lock);
    if (park) {
      // Oldest first out: the plans of a pipeline restarted clip after clip stay.
      while (model->parked_plans.size() >= GstLatentModel::kMaxParkedPlans)
        model->parked_plans.erase(model->parked_plans.begin());
      model->parked_plans.push_back({std::move(plan), graphs});
    }
    plan.reset();
  }
  plan.reset();
}

latent::Result<latent::Tensor> gst_latent_base_run_part(GstLatentBase* self, GstLatentModel& model,
                                                        latent::VaePart part,
                                                        const latent::Tensor& x) {
  std::shared_ptr<latent::PlannedPart> plan;
  {
    auto* impl = impl_of(self);
    std::lock_guard<std::mutex> lock(impl->state_lock);
    plan = impl->state.plan;
  }
  if (plan && plan->part() == part && plan->accepts(x)) return plan->run(x);
  if (plan)
    GST_LOG_OBJECT(self, "%s plan for %s does not take %s: plain forward",
                   latent::vae_part_name(part), latent::shape_str(plan->input_shape()).c_str(),
                   x.describe().c_str());
  return part == latent::VaePart::kEncode ? model.vae->encode(x) : model.vae->decode(x);
}

latent::Tensor gst_latent_base_plan_input(GstLatentBase* self, latent::VaePart part,
                                          const latent::Shape& shape) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->state_lock);
  const std::shared_ptr<latent::PlannedPart>& plan = impl->state.plan;
  if (!plan || plan->part() != part || !plan->uses_graph() || plan->input().shape() != shape)
    return latent::Tensor();
  return plan->input();
}

bool gst_latent_base_plan_uses_graph(GstLatentBase* self) {
  auto* impl = impl_of(self);
  std::lock_guard<std::mutex> lock(impl->state_lock);
  return impl->state.plan && impl->state.plan->uses_graph();
}
