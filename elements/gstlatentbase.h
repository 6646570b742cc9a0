// GstLatentBase: what the latent stages share. Properties `model`, `device` and `dtype` fill a
// Settings struct; start() resolves the backend and loads (or shares) the model, stop() drops
// it. Subclasses say which parts of the model they need and use gst_latent_base_get_model().
#pragma once

#include <gst/base/gstbasetransform.h>
#include <gst/gst.h>

#include <memory>
#include <mutex>
#include <string>

#include "elements/gstlatentcuda.h"
#include "engine/backends/backend.h"
#include "engine/models/vae/vae.h"

G_BEGIN_DECLS

#define GST_TYPE_LATENT_BASE (gst_latent_base_get_type())
G_DECLARE_DERIVABLE_TYPE(GstLatentBase, gst_latent_base, GST, LATENT_BASE, GstBaseTransform)

typedef enum {
  GST_LATENT_PART_ENCODER = 1 << 0,
  GST_LATENT_PART_DECODER = 1 << 1,
} GstLatentParts;

struct _GstLatentBaseClass {
  GstBaseTransformClass parent_class;

  // The GstLatentParts this stage needs; set in the subclass's class_init.
  guint parts;

  gpointer _gst_reserved[GST_PADDING];
};

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
  // engine call on this model's backend holds this lock.
  std::shared_ptr<std::mutex> run_lock;

  // Frees the weights under run_lock: another model may be running on the same backend.
  ~GstLatentModel();

  const latent::LatentSpace& latent_space() const { return vae->latent_space(); }
  // "model 'flux1' in /models/flux/vae" for messages.
  std::string describe() const;
};

// The model loaded by start(), or null while stopped. The returned reference keeps it alive.
std::shared_ptr<GstLatentModel> gst_latent_base_get_model(GstLatentBase* self);

// The stage's user-facing name for messages: the factory name ("vaedecode").
const char* gst_latent_base_stage_name(GstLatentBase* self);

// Resolves "auto" and an empty dtype the way start() will (for caps before start()).
latent::DType gst_latent_base_preferred_dtype(GstLatentBase* self);

// ---- latency --------------------------------------------------------------------------------
// A stage reports how long each frame took (from receiving it to its result being ready);
// LATENCY queries on the src pad add this stage's latency to upstream's: the longest steady
// frame (the first frame, which includes warm-up such as cuDNN autotuning, counts only until a
// second arrives) plus, while frames are held for prefetching, `prefetch-depth` frame
// durations. A latency message is posted when the figure grows by more than a tenth.
void gst_latent_base_frame_done(GstLatentBase* self, GstClockTime processing);
// The input's frame duration (GST_CLOCK_TIME_NONE for a variable rate), set with the caps.
void gst_latent_base_set_frame_duration(GstLatentBase* self, GstClockTime duration);
// Frames a stage holds back for prefetching now (0 on the CPU, or before start()).
void gst_latent_base_set_frames_held(GstLatentBase* self, guint frames);
// The `prefetch-depth` property: frames uploaded ahead while earlier ones compute (GPU only).
guint gst_latent_base_prefetch_depth(GstLatentBase* self);
// This stage's own latency as a LATENCY query would add it.
GstClockTime gst_latent_base_latency(GstLatentBase* self);
// Resets the latency measurement (a new stream: stop(), a flush).
void gst_latent_base_reset_latency(GstLatentBase* self);

// ---- GPU-resident buffers (elements/gstlatentcuda.h) ------------------------------------------
// The stage's CUDA context state: active after start() on a CUDA device. Lives as long as the
// element; context queries and set_context are handled by the base class.
GstLatentCuda* gst_latent_base_cuda(GstLatentBase* self);
// Whether the stage offers CUDA-memory caps: it runs on a CUDA device, or it has not started yet
// (templates and early queries offer both).
bool gst_latent_base_offers_cuda(GstLatentBase* self);
// propose_allocation for an application/x-latent sink pad: with CUDA-memory caps, offers a
// CUDA latent pool on the stage's context. True when it added a pool.
bool gst_latent_base_propose_latent_pool(GstLatentBase* self, GstQuery* query);
// decide_allocation for an application/x-latent src pad with CUDA-memory caps: keeps
// downstream's pool when it is a CUDA pool of our context, else makes one. False when the
// caps are not CUDA memory (the caller takes the default path) or no pool could be made.
bool gst_latent_base_decide_latent_pool(GstLatentBase* self, GstQuery* query);
