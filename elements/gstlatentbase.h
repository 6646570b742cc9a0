// GstLatentBase: the base class of the latent stages (vaeencode, vaedecode, ditdenoise), in the
// shape of gst-plugins-bad's GstCudaBaseTransform: the base class owns what every stage has and
// calls a subclass hook where they differ.
//
// The base class holds the properties `model`, `device` and `dtype` (a Settings struct; they
// change only in NULL/READY, see below), resolves the backend and, for the VAE stages, loads (or
// shares) the model in start() and drops it in stop(); shares the CUDA context (context queries,
// set_context), offers CUDA latent pools in the allocation queries, answers LATENCY queries and
// drains/drops frames a stage holds (sink events). Subclasses fill in the hooks of
// GstLatentBaseClass.
#pragma once

#include <gst/base/gstbasetransform.h>
#include <gst/gst.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "elements/gstlatentcuda.h"
#include "engine/backends/backend.h"
#include "engine/models/vae/planned_vae.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/model_source.h"

G_BEGIN_DECLS

#define GST_TYPE_LATENT_BASE (gst_latent_base_get_type())
G_DECLARE_DERIVABLE_TYPE(GstLatentBase, gst_latent_base, GST, LATENT_BASE, GstBaseTransform)

typedef enum {
  GST_LATENT_PART_ENCODER = 1 << 0,
  GST_LATENT_PART_DECODER = 1 << 1,
} GstLatentParts;

struct _GstLatentBaseClass {
  GstBaseTransformClass parent_class;

  // The stage's own debug category ("vaeencode", ...), set in its class_init: the base class logs
  // what it does for the stage (loading, planning, refusals, frame times) there.
  GstDebugCategory* debug_category;

  // The GstLatentParts of a VAE this stage needs, loaded (or shared) by start() on the stage's
  // backend; 0 for a stage that loads its own model in `open` (ditdenoise).
  guint parts;

  // Whether `dtype=fp8` applies to this stage (ditdenoise: its transformer's linear layers in
  // FP8, the rest in the device's default dtype); elsewhere start() refuses fp8, naming the
  // stage.
  gboolean takes_fp8;

  // start(), once the backend of the `device` and `dtype` settings exists (and the VAE of `parts`
  // is loaded): loads what else the stage needs. On failure posts an element error and returns
  // FALSE. Optional.
  gboolean (*open)(GstLatentBase* self, const std::shared_ptr<latent::Backend>& backend);
  // stop(), after drop_held and before the base class drops the model, the plan and the
  // backend: frees what `open` made (device tensors under gst_latent_base_run_lock) and forgets
  // the negotiated stream. Optional.
  void (*close)(GstLatentBase* self);
  // set_caps(): the stage checks the negotiated caps and fixes its stream (refusing with FALSE).
  // The base class then takes the input's frame rate for its latency answers.
  gboolean (*set_info)(GstLatentBase* self, GstCaps* incaps, GstCaps* outcaps);

  // Frames the stage holds back on a GPU (input prefetching, output staging); null when it holds
  // none. The base class's sink_event pushes them out (drain_held) before EOS, a new segment and
  // new caps, and discards them (drop_held) on new caps (a new frame size) and after a flush.
  GstFlowReturn (*drain_held)(GstLatentBase* self);
  void (*drop_held)(GstLatentBase* self);

  gpointer _gst_reserved[GST_PADDING];
};

// The `dtype` property: the compute dtype, or the device's default.
typedef enum {
  GST_LATENT_DTYPE_AUTO = 0,
  GST_LATENT_DTYPE_FP32,
  GST_LATENT_DTYPE_BF16,
  GST_LATENT_DTYPE_FP16,
  GST_LATENT_DTYPE_FP8,  // ditdenoise only (GstLatentBaseClass::takes_fp8)
} GstLatentDtype;
#define GST_TYPE_LATENT_DTYPE (gst_latent_dtype_get_type())
GType gst_latent_dtype_get_type(void);

// The `mode` property of the VAE stages (gst_latent_base_class_install_mode_property).
typedef enum {
  GST_LATENT_VAE_MODE_AUTO = 0,  // video for AutoencoderKLWan and TAEW models, image otherwise
  GST_LATENT_VAE_MODE_IMAGE,     // every frame alone
  GST_LATENT_VAE_MODE_VIDEO,     // causal chunks (engine/models/vae/vae.h VaeStream)
} GstLatentVaeMode;
#define GST_TYPE_LATENT_VAE_MODE (gst_latent_vae_mode_get_type())
GType gst_latent_vae_mode_get_type(void);

// A stage's own C++ state, hung on the instance by its init (gst_latent_base_set_stage); the
// base class's finalize deletes it.
struct GstLatentStage {
  virtual ~GstLatentStage() = default;
};
void gst_latent_base_set_stage(GstLatentBase* self, GstLatentStage* stage);

// Installs `prefetch-depth`, `cuda-graphs` and the read-only `plans-reused` on a stage's class
// (the VAE stages, which plan a model part at negotiation and stage frames on a GPU). The
// stage's set_property/get_property chain up to the base class's for property ids it does not
// know (a stage with no properties of its own gets the base class's handlers).
void gst_latent_base_class_install_plan_properties(GstLatentBaseClass* klass);

// Installs `mode` (GstLatentVaeMode, MUTABLE_READY like `model`) on a VAE stage's class.
void gst_latent_base_class_install_mode_property(GstLatentBaseClass* klass);
// The `mode` setting.
GstLatentVaeMode gst_latent_base_vae_mode(GstLatentBase* self);

// Refuses the caps set_info was given: posts `message` (naming the stage and both sides, e.g.
// "vaedecode: latent space 'flux1' from upstream does not match model 'sd' in /models/x") as a
// negotiation error once, however often upstream retries the same caps (it resends them with
// every buffer), and returns FALSE. Called from set_info only, on the streaming thread: never
// from a caps or accept-caps query, which answer with FALSE alone.
gboolean gst_latent_base_refuse_caps(GstLatentBase* self, GstCaps* caps,
                                     const std::string& message);

// Debug categories and the engine's log callback (pointed at gst_debug_log under
// "latent-engine"). Idempotent; every element registration calls it.
void gst_latent_element_init(GstPlugin* plugin);

G_END_DECLS

// A loaded model. Elements asking for the same source, device, dtype and parts share one
// instance (a process-wide cache of weak references), so weights are in memory once.
struct GstLatentModel {
  std::string key;             // cache key
  latent::ModelSource source;  // where it came from
  std::shared_ptr<latent::Backend> backend;
  std::unique_ptr<latent::VaeModel> vae;
  guint parts = 0;  // GstLatentParts loaded
  // Backends are shared between models and elements and are not assumed thread-safe: every
  // engine call on this model's backend holds this lock (latent::backend_run_lock).
  std::shared_ptr<std::mutex> run_lock;

  // Plans that stopped stages left with the model (gst_latent_base_drop_plan at stop()), for the
  // next start() of a stage that negotiates the same input: a pipeline restarted clip after
  // clip (the precompute job) skips the warm-up forward and the graph capture. Each plan is
  // used by one stage at a time (its replay writes the plan's own buffers), so a stage takes
  // one out and a stopping stage puts its own back. At most kMaxParkedPlans, the oldest freed
  // first; all of them go with the model. Guarded by run_lock (device memory).
  static constexpr size_t kMaxParkedPlans = 2;
  struct ParkedPlan {
    std::shared_ptr<latent::PlannedPart> plan;
    bool graphs = false;  // the cuda-graphs setting it was built with
  };
  std::vector<ParkedPlan> parked_plans;

  // Frees the parked plans, then the weights, under run_lock: another model may be running on
  // the same backend.
  ~GstLatentModel();

  const latent::LatentSpace& latent_space() const { return vae->latent_space(); }
  // "model 'flux1' in /models/flux/vae" for messages.
  std::string describe() const;
};

// The model loaded by start(), or null while stopped (or for a stage with no `parts`). The
// returned reference keeps it alive.
std::shared_ptr<GstLatentModel> gst_latent_base_get_model(GstLatentBase* self);
// The stage's backend (start() to stop()), or null.
std::shared_ptr<latent::Backend> gst_latent_base_backend(GstLatentBase* self);
// The run lock of the stage's backend (latent::backend_run_lock), or null while stopped: hold it
// around engine calls on the backend and the destruction of device tensors on it.
std::shared_ptr<std::mutex> gst_latent_base_run_lock(GstLatentBase* self);
// The `model` setting as the user gave it.
std::string gst_latent_base_model_setting(GstLatentBase* self);

// The `mode` setting for `model`, checked at open(): mode=video with an image model is an element
// error naming the stage and the model (FALSE).
gboolean gst_latent_base_checked_vae_mode(GstLatentBase* self, const GstLatentModel& model,
                                          GstLatentVaeMode* mode);
// Whether mode=auto means video for this model: a causal video VAE (supports_video()) whose
// config class is AutoencoderKLWan, or a TAEW (TAEHV family) model. AutoencoderKLQwenImage
// folders and single files without a config stay in image mode (Qwen-Image is an image model).
bool gst_latent_model_video_by_default(const GstLatentModel& model);
// Frames a video-mode encoder of `model` holds before the latent covering the oldest of them
// is out: the Wan VAE emits latent j (frames 4j-3 .. 4j) with frame 4j, so 3; TAEW emits it only
// with frame 4j+3 (it pools 4j .. 4j+3), so 6. For LATENCY answers.
guint gst_latent_model_encoder_frames_held(const GstLatentModel& model);

// The stage's user-facing name for messages: the factory name ("vaedecode").
const char* gst_latent_base_stage_name(GstLatentBase* self);

// Resolves "auto" and an empty dtype the way start() will (for caps before start()).
latent::DType gst_latent_base_preferred_dtype(GstLatentBase* self);
// Whether the stage was started with dtype=fp8 (its backend then computes in the device's
// default dtype: bf16 on CUDA, fp32 on the CPU).
gboolean gst_latent_base_fp8(GstLatentBase* self);

// ---- caps -------------------------------------------------------------------------------------
// Whether the stage offers CUDA-memory caps: it runs on a CUDA device, or it has not started yet
// (templates and early queries offer both).
bool gst_latent_base_offers_cuda(GstLatentBase* self);
// transform_caps of a stage converting between video and latents: ANY caps give the other pad's
// template; otherwise each structure of `caps` in system or CUDA memory is mapped through
// `map` (null: no such output) and offered in CUDA memory too while the stage offers it
// (gst_latent_base_offers_cuda), then intersected with `filter`.
GstCaps* gst_latent_base_transform_caps(
    GstLatentBase* self, GstPadDirection direction, GstCaps* caps, GstCaps* filter,
    const std::function<GstStructure*(const GstStructure*)>& map);
// transform_size of such a stage: one buffer in, one out, whatever the input buffer's size.
// `othercaps` are latent caps (`other_is_latent`) or video caps; *othersize is one buffer's size.
gboolean gst_latent_base_transform_size(GstLatentBase* self, GstCaps* othercaps,
                                        bool other_is_latent, gsize* othersize);

// ---- GPU timeline trace -----------------------------------------------------------------------
// With LATENT_TRACE=FILE in the environment, every mark appends a line to FILE (shared by all
// elements of the process) once the device has reached it:
//   <queued> <reached> <element> <label> <n>
// `queued`: when the mark was placed on the backend's stream, `reached`: when everything queued
// before it had run (both microseconds of the wall clock, as Python's time.time() * 1e6; -1 when
// the wait failed). vaeencode in video mode marks each frame: `in` when it starts reading it,
// `locked` once it holds the model's run lock, `out` after the work it queued (n = frames before
// it in the clip). The lines show when the device had nothing queued and what each element's
// thread was doing then (bench/trace_gaps.py reads them). Off (no cost but a test of a flag)
// without the variable.
bool gst_latent_trace_enabled();
void gst_latent_trace_mark(GstLatentBase* self, latent::Backend& backend, const char* label,
                           int64_t n);

// ---- latency --------------------------------------------------------------------------------
// Statistics (read-only properties `frames-processed`, `frames-dropped` and `mean-frame-ms`, since
// the last start()): every frame a stage finishes is reported with gst_latent_base_frame_done;
// frames dropped by QoS are counted from the stage's own QoS messages.
//
// A stage reports how long each frame took (from receiving it to its result being ready);
// LATENCY queries on the src pad add this stage's latency to upstream's: the longest steady
// frame (the first frame, which includes warm-up such as cuDNN autotuning, counts only until a
// second arrives) plus, while frames are held for prefetching, `prefetch-depth` frame
// durations. A latency message is posted when the figure grows by more than a tenth.
void gst_latent_base_frame_done(GstLatentBase* self, GstClockTime processing);
// The input's frame duration (GST_CLOCK_TIME_NONE for a variable rate), set with the caps.
void gst_latent_base_set_frame_duration(GstLatentBase* self, GstClockTime duration);
// The same from the input's frame rate (fps_n <= 0: a variable rate).
void gst_latent_base_set_frame_rate(GstLatentBase* self, gint fps_n, gint fps_d);
// Frames a stage holds back for prefetching now (0 on the CPU, or before start()).
void gst_latent_base_set_frames_held(GstLatentBase* self, guint frames);
// Pushes out every frame the stage holds (drain_held), in order: while `held()`, `next` hands
// out the oldest one (or none); stops at the first flow error. *draining is true meanwhile.
GstFlowReturn gst_latent_base_drain(GstLatentBase* self, bool* draining,
                                    const std::function<bool()>& held,
                                    const std::function<GstFlowReturn(GstBuffer**)>& next);
// An output buffer for a result made outside GstBaseTransform's generate_output (the video modes
// hand out results that no single input buffer maps to): from the negotiated pool, activated
// first as the base class's prepare_output_buffer would (a fresh pool is inactive, and acquiring
// from it answers FLUSHING, which pauses upstream's task without a word), else `bytes` of system
// memory. FLUSHING while really flushing; an element error when the pool cannot be activated.
GstFlowReturn gst_latent_base_acquire_output(GstLatentBase* self, gsize bytes, GstBuffer** out);
// The `prefetch-depth` property: frames uploaded ahead while earlier ones compute (GPU only).
guint gst_latent_base_prefetch_depth(GstLatentBase* self);
// This stage's own latency as a LATENCY query would add it.
GstClockTime gst_latent_base_latency(GstLatentBase* self);
// Resets the latency measurement (a new stream: stop(), a flush).
void gst_latent_base_reset_latency(GstLatentBase* self);

// ---- plans (engine/models/vae/planned_vae.h): VAE stages --------------------------------------
// At negotiation a stage plans its part of the model for the negotiated input shape: a warm-up
// forward (cuDNN chooses and caches its algorithms) then, with `cuda-graphs` on, a CUDA graph
// capture; each frame then replays it. One plan a stage, kept until the next negotiation or
// stop(), where it is left with the model for the next start that negotiates the same input.
// On the CPU nothing is planned and frames run the plain forward.
//
// Locking: the backend and its one stream are shared by every stage on the same device and
// dtype. Every engine call on it, the destruction of every device tensor (frees are queued on
// that stream) and the plan's capture hold the model's run_lock, so a capture records no
// other stage's work and nothing else is queued on the stream while it lasts.

// The `cuda-graphs` property.
bool gst_latent_base_cuda_graphs(GstLatentBase* self);
// Plans `part` for inputs like `example` (on the model's backend), replacing the stage's
// plan. The caller holds model.run_lock. A failed capture falls back to the plain forward with
// a warning; a failed warm-up is returned (the caller posts the element error).
latent::Status gst_latent_base_build_plan(GstLatentBase* self, GstLatentModel& model,
                                          latent::VaePart part, const latent::Tensor& example);
// On a GPU, plans `part` at negotiation: under model.run_lock, makes an example input with
// `example` and builds the plan for it (gst_latent_base_build_plan), freeing the example there
// too. Does nothing on the CPU. A failure is returned (the caller posts the element error).
latent::Status gst_latent_base_plan_for(
    GstLatentBase* self, GstLatentModel& model, latent::VaePart part,
    const std::function<latent::Result<latent::Tensor>(latent::Backend&)>& example);
// Drops the stage's plan (takes the model's run_lock itself; not while holding it); with `park`
// (stop()) it is left with the model (GstLatentModel::parked_plans) for the next start.
void gst_latent_base_drop_plan(GstLatentBase* self, bool park = false);
// Runs `part` on `x`: the plan's replay when the stage has a plan taking `x`, else the plain
// forward. The caller holds model.run_lock; with a graph the result is the plan's output
// buffer, valid until the stage's next run (consume it, or queue what reads it, first).
latent::Result<latent::Tensor> gst_latent_base_run_part(GstLatentBase* self, GstLatentModel& model,
                                                        latent::VaePart part,
                                                        const latent::Tensor& x);
// Whether the stage's plan replays a graph (for tests and logs).
bool gst_latent_base_plan_uses_graph(GstLatentBase* self);
// The input buffer of the stage's plan for `part` when it replays a graph and its input is
// shaped `shape` (else undefined): a frame converted into it (on the backend's stream, after the
// previous run was queued; the caller holds model.run_lock) is run in place, with no copy and no
// frame-sized tensor beside it.
latent::Tensor gst_latent_base_plan_input(GstLatentBase* self, latent::VaePart part,
                                          const latent::Shape& shape);

// ---- GPU-resident buffers (elements/gstlatentcuda.h) ------------------------------------------
// The stage's CUDA context state: active after start() on a CUDA device. Lives as long as the
// element; context queries and set_context are handled by the base class, and so are the
// allocation queries of latent pads: propose_allocation offers a CUDA latent pool on the stage's
// context for application/x-latent(memory:CUDAMemory) input, decide_allocation keeps
// downstream's pool when it is a CUDA pool of our context, else makes one. A stage whose pad
// carries video overrides that query and chains up for the rest.
GstLatentCuda* gst_latent_base_cuda(GstLatentBase* self);
// After a latent's write into CUDA memory was queued (`written`: its fence; null: nothing to wait
// for): waits on the host until it has run, unless every reader downstream orders its reads by
// the latent's fence (GstLatentFenceMeta, as the latent stages do; from the last ALLOCATION
// answer), in which case the latent may be pushed at once. Call it without the run lock where
// the caller can, so the other stages on the backend keep the device busy meanwhile.
latent::Status gst_latent_base_wait_unless_ordered(GstLatentBase* self,
                                                   latent::DeviceFence* written);
