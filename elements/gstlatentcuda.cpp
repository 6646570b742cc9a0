// GPU-resident buffers and the shared CUDA context; see gstlatentcuda.h.
#include "elements/gstlatentcuda.h"

#include <cstring>
#include <map>
#include <vector>

#include "elements/gstlatentcaps.h"
#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "engine/core/env.h"

#ifdef LATENT_HAVE_GST_CUDA
#ifndef GST_USE_UNSTABLE_API
#define GST_USE_UNSTABLE_API
#endif
#include <gst/cuda/gstcudabufferpool.h>
#include <gst/cuda/gstcudacontext.h>
#include <gst/cuda/gstcudaloader.h>
#include <gst/cuda/gstcudamemory.h>
#include <gst/cuda/gstcudautils.h>
#endif

GST_DEBUG_CATEGORY_STATIC(gst_latent_cuda_debug);
#define GST_CAT_DEFAULT gst_latent_cuda_debug

namespace {

void init_debug() {
  static gsize done = 0;
  if (g_once_init_enter(&done)) {
    GST_DEBUG_CATEGORY_INIT(gst_latent_cuda_debug, "latentcuda", 0,
                            "gst-latent CUDA memory and context sharing");
    g_once_init_leave(&done, 1);
  }
}

#ifdef LATENT_HAVE_GST_CUDA
// The process-wide wrapper of device `index`'s primary context (null on failure), which the
// engine retains for the life of the process (latent::retain_cuda_primary_context).
GstCudaContext* primary_context(int index) {
  static std::mutex mutex;
  static std::map<int, GstCudaContext*>* wrappers = new std::map<int, GstCudaContext*>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = wrappers->find(index);
  if (it != wrappers->end()) return it->second;
  // A failure is remembered too (warned about once, not at every context query).
  GstCudaContext*& wrapped = (*wrappers)[index];
  if (!gst_cuda_load_library()) {
    GST_WARNING("GStreamer's CUDA library could not load libcuda: buffers stay in system memory");
    return nullptr;
  }
  auto handle = latent::retain_cuda_primary_context(index);
  if (!handle.ok()) {
    GST_WARNING("no primary context of cuda:%d to share: %s", index,
                handle.status().message().c_str());
    return nullptr;
  }
  wrapped =
      gst_cuda_context_new_wrapped(static_cast<CUcontext>(*handle), static_cast<CUdevice>(index));
  if (wrapped) gst_object_ref_sink(wrapped);
  GST_INFO("cuda:%d: sharing the primary context %p as %" GST_PTR_FORMAT, index, *handle, wrapped);
  return wrapped;
}

bool same_context(GstCudaContext* a, GstCudaContext* b) {
  return a && b && (a == b || gst_cuda_context_get_handle(a) == gst_cuda_context_get_handle(b));
}

// The one GstCudaMemory of `buffer`, or null.
GstCudaMemory* single_cuda_memory(GstBuffer* buffer) {
  if (!buffer || gst_buffer_n_memory(buffer) != 1) return nullptr;
  GstMemory* mem = gst_buffer_peek_memory(buffer, 0);
  return gst_is_cuda_memory(mem) ? GST_CUDA_MEMORY_CAST(mem) : nullptr;
}
#endif

}  // namespace

bool gst_latent_cuda_built(void) {
#ifdef LATENT_HAVE_GST_CUDA
  return true;
#else
  return false;
#endif
}

GstLatentCuda::~GstLatentCuda() {
  stop();
  if (foreign_) gst_object_unref(foreign_);
}

bool GstLatentCuda::start(GstElement* element, const latent::Device& device) {
  init_debug();
  stop();
  if (device.is_cpu()) return true;
#ifdef LATENT_HAVE_GST_CUDA
  gst_cuda_memory_init_once();
  GstCudaContext* ctx = primary_context(device.index);
  if (!ctx) return false;
  {
    std::lock_guard<std::mutex> lock(lock_);
    context_ = gst_object_ref(ctx);
    device_ = device;
    if (foreign_ && !same_context(GST_CUDA_CONTEXT(foreign_), ctx))
      GST_INFO_OBJECT(element,
                      "a CUDA context other than cuda:%d's primary one was set on us; CUDA "
                      "memory of that context is read through system memory",
                      device.index);
  }
  GstContext* c = gst_context_new_cuda_context(ctx);
  gst_element_post_message(element, gst_message_new_have_context(GST_OBJECT(element), c));
  return true;
#else
  (void)element;
  return true;
#endif
}

void GstLatentCuda::stop() {
  std::lock_guard<std::mutex> lock(lock_);
  if (context_) gst_object_unref(context_);
  context_ = nullptr;
  device_ = latent::Device();
}

void GstLatentCuda::set_context(GstElement* element, GstContext* context) {
#ifdef LATENT_HAVE_GST_CUDA
  init_debug();
  GstCudaContext* got = nullptr;
  if (!gst_cuda_handle_set_context(element, context, -1, &got) || !got) return;
  std::lock_guard<std::mutex> lock(lock_);
  if (foreign_) gst_object_unref(foreign_);
  foreign_ = got;  // owned
#else
  (void)element;
  (void)context;
#endif
}

bool GstLatentCuda::handle_query(GstElement* element, GstQuery* query, int planned_device) {
#ifdef LATENT_HAVE_GST_CUDA
  if (GST_QUERY_TYPE(query) != GST_QUERY_CONTEXT) return false;
  const gchar* type = nullptr;
  if (!gst_query_parse_context_type(query, &type) || g_strcmp0(type, GST_CUDA_CONTEXT_TYPE) != 0)
    return false;
  GstCudaContext* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(lock_);
    if (context_) ctx = GST_CUDA_CONTEXT(gst_object_ref(context_));
  }
  if (!ctx && planned_device >= 0) {
    init_debug();
    GstCudaContext* primary = primary_context(planned_device);
    if (primary) ctx = GST_CUDA_CONTEXT(gst_object_ref(primary));
  }
  if (!ctx) return false;
  const bool answered = gst_cuda_handle_context_query(element, query, ctx);
  gst_object_unref(ctx);
  return answered;
#else
  (void)element;
  (void)query;
  (void)planned_device;
  return false;
#endif
}

bool GstLatentCuda::active() {
  std::lock_guard<std::mutex> lock(lock_);
  return context_ != nullptr;
}

latent::Device GstLatentCuda::device() {
  std::lock_guard<std::mutex> lock(lock_);
  return device_;
}

#ifdef LATENT_HAVE_GST_CUDA
bool GstLatentCuda::holds_ours(GstBuffer* buffer) {
  GstCudaMemory* mem = single_cuda_memory(buffer);
  std::lock_guard<std::mutex> lock(lock_);
  if (!mem || !context_) return false;
  if (!same_context(mem->context, GST_CUDA_CONTEXT(context_))) {
    if (!warned_)
      GST_WARNING("CUDA memory of another context (%p): going through system memory", mem->context);
    warned_ = true;
    return false;
  }
  return true;
}
#endif

bool GstLatentCuda::map(GstBuffer* buffer, GstMapInfo* info, GstMapFlags flags) {
#ifdef LATENT_HAVE_GST_CUDA
  if (!holds_ours(buffer)) return false;
  return gst_buffer_map(buffer, info, static_cast<GstMapFlags>(flags | GST_MAP_CUDA));
#else
  (void)buffer;
  (void)info;
  (void)flags;
  return false;
#endif
}

bool GstLatentCuda::map_frame(GstVideoFrame* frame, const GstVideoInfo* info, GstBuffer* buffer,
                              GstMapFlags flags) {
#ifdef LATENT_HAVE_GST_CUDA
  if (!holds_ours(buffer)) return false;
  return gst_video_frame_map(frame, const_cast<GstVideoInfo*>(info), buffer,
                             static_cast<GstMapFlags>(flags | GST_MAP_CUDA));
#else
  (void)frame;
  (void)info;
  (void)buffer;
  (void)flags;
  return false;
#endif
}

GstBufferPool* GstLatentCuda::new_latent_pool(gsize bytes, guint min, guint max) {
  // One RGBA row holding the latent's bytes: GstCudaBufferPool sizes memory from video caps, and
  // GStreamer 1.22's CUDA allocator accepts only the formats its kernels use (GRAY8 aborts in
  // gst_cuda_allocator_alloc_internal), RGBA among them.
  const gint width = static_cast<gint>((bytes + 3) / 4);
  GstCaps* caps = gst_caps_new_simple("video/x-raw", "format", G_TYPE_STRING, "RGBA", "width",
                                      G_TYPE_INT, width, "height", G_TYPE_INT, 1, "framerate",
                                      GST_TYPE_FRACTION, 0, 1, nullptr);
  GstBufferPool* pool = new_video_pool(caps, min, max);
  gst_caps_unref(caps);
  return pool;
}

GstBufferPool* GstLatentCuda::new_video_pool(GstCaps* caps, guint min, guint max) {
#ifdef LATENT_HAVE_GST_CUDA
  GstCudaContext* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(lock_);
    if (context_) ctx = GST_CUDA_CONTEXT(gst_object_ref(context_));
  }
  if (!ctx) return nullptr;
  GstVideoInfo info;
  GstBufferPool* pool = nullptr;
  if (gst_video_info_from_caps(&info, caps)) {
    pool = gst_cuda_buffer_pool_new(ctx);
    GstStructure* config = gst_buffer_pool_get_config(pool);
    gst_buffer_pool_config_set_params(config, caps, GST_VIDEO_INFO_SIZE(&info), min, max);
    gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
    if (!gst_buffer_pool_set_config(pool, config)) {
      GST_WARNING("cannot configure a CUDA buffer pool for %" GST_PTR_FORMAT, caps);
      gst_object_unref(pool);
      pool = nullptr;
    }
  }
  gst_object_unref(ctx);
  return pool;
#else
  (void)caps;
  (void)min;
  (void)max;
  return nullptr;
#endif
}

bool GstLatentCuda::owns_pool(GstBufferPool* pool) {
#ifdef LATENT_HAVE_GST_CUDA
  if (!pool || !GST_IS_CUDA_BUFFER_POOL(pool)) return false;
  std::lock_guard<std::mutex> lock(lock_);
  return context_ && same_context(GST_CUDA_BUFFER_POOL(pool)->context, GST_CUDA_CONTEXT(context_));
#else
  (void)pool;
  return false;
#endif
}

bool gst_latent_buffer_is_cuda(GstBuffer* buffer) {
  return buffer && gst_buffer_n_memory(buffer) == 1 &&
         gst_memory_is_type(gst_buffer_peek_memory(buffer, 0), "gst.cuda.memory");
}

bool gst_latent_caps_features_is_cuda(const GstCapsFeatures* f) {
  return f && !gst_caps_features_is_any(f) &&
         gst_caps_features_contains(f, GST_LATENT_CUDA_FEATURE);
}

bool gst_latent_caps_features_is_system(const GstCapsFeatures* f) {
  return !f || gst_caps_features_is_any(f) ||
         gst_caps_features_is_equal(f, GST_CAPS_FEATURES_MEMORY_SYSTEM_MEMORY);
}

GstCaps* gst_latent_caps_merge_both(GstCaps* caps, GstStructure* s, bool cuda) {
  if (cuda && gst_latent_cuda_built())
    caps = gst_caps_merge_structure_full(caps, gst_structure_copy(s),
                                         gst_caps_features_new(GST_LATENT_CUDA_FEATURE, nullptr));
  return gst_caps_merge_structure(caps, s);
}

bool gst_latent_caps_is_cuda(const GstCaps* caps) {
  return caps && gst_caps_get_size(caps) > 0 &&
         gst_latent_caps_features_is_cuda(gst_caps_get_features(caps, 0));
}

bool gst_latent_cuda_propose_latent_pool(GstLatentCuda* cuda, GstQuery* query) {
  GstCaps* caps = nullptr;
  gst_query_parse_allocation(query, &caps, nullptr);
  if (!caps || !gst_latent_caps_is_cuda(caps) || !cuda->active()) return false;
  auto info = gst_latent_info_from_caps(caps);
  if (!info.ok()) return false;
  // We order our reads by the latents' fences: upstream need not wait for its writes.
  if (gst_latent_fences_on() &&
      !gst_query_find_allocation_meta(query, GST_LATENT_FENCE_META_API_TYPE, nullptr))
    gst_query_add_allocation_meta(query, GST_LATENT_FENCE_META_API_TYPE, nullptr);
  GstBufferPool* pool = cuda->new_latent_pool(info->frame_bytes(), 0, 0);
  if (!pool) return false;
  gst_query_add_allocation_pool(query, pool, static_cast<guint>(info->frame_bytes()), 0, 0);
  gst_object_unref(pool);
  return true;
}

void gst_latent_query_set_pool(GstQuery* query, GstBufferPool* pool, guint size, guint min,
                               guint max) {
  if (gst_query_get_n_allocation_pools(query) > 0)
    gst_query_set_nth_allocation_pool(query, 0, pool, size, min, max);
  else
    gst_query_add_allocation_pool(query, pool, size, min, max);
}

bool gst_latent_cuda_decide_latent_pool(GstLatentCuda* cuda, GstQuery* query) {
  GstCaps* caps = nullptr;
  gst_query_parse_allocation(query, &caps, nullptr);
  if (!caps || !gst_latent_caps_is_cuda(caps) || !cuda->active()) return false;
  auto info = gst_latent_info_from_caps(caps);
  if (!info.ok()) return false;
  GstBufferPool* pool = nullptr;
  guint min = 0, max = 0, size = 0;
  if (gst_query_get_n_allocation_pools(query) > 0) {
    gst_query_parse_nth_allocation_pool(query, 0, &pool, &size, &min, &max);
    if (pool && (!cuda->owns_pool(pool) || size < info->frame_bytes())) {
      gst_object_unref(pool);
      pool = nullptr;
    }
  }
  if (!pool) pool = cuda->new_latent_pool(info->frame_bytes(), min, max);
  if (!pool) return false;
  // Configured by whoever made it (propose_latent_pool or new_latent_pool): latent caps are not
  // video caps, so the base class must not configure it again.
  size = static_cast<guint>(info->frame_bytes());
  gst_latent_query_set_pool(query, pool, size, min, max);
  gst_object_unref(pool);
  GST_DEBUG("latents in CUDA memory (%u bytes a buffer)", size);
  return true;
}

// ---- page-locked system memory for frames a GPU writes ---------------------------------------

namespace {

struct GstLatentPinnedAllocator {
  GstAllocator parent;
  int device;
};
struct GstLatentPinnedAllocatorClass {
  GstAllocatorClass parent_class;
};

// One allocation (or a share of one: `parent` set, `data` the parent's).
struct PinnedMemory {
  GstMemory mem;
  guint8* data;
  int device;
};

GType gst_latent_pinned_allocator_get_type();
G_DEFINE_TYPE(GstLatentPinnedAllocator, gst_latent_pinned_allocator, GST_TYPE_ALLOCATOR)

GstMemory* pinned_alloc(GstAllocator* allocator, gsize size, GstAllocationParams* params) {
  auto* self = reinterpret_cast<GstLatentPinnedAllocator*>(allocator);
  const gsize maxsize = size + params->prefix + params->padding;
  // Page-aligned, so any alignment GStreamer asks for (at most a page) holds.
  latent::Result<void*> data = latent::alloc_pinned_host(self->device, maxsize);
  if (!data.ok()) {
    // Out of page-locked memory (a downstream queue holding many frames, say): plain system
    // memory instead, which vaedecode fills through its pinned slots; nothing fails.
    GST_WARNING("no page-locked memory for a %" G_GSIZE_FORMAT
                "-byte buffer (%s): system memory instead",
                maxsize, data.status().message().c_str());
    return gst_allocator_alloc(nullptr, size, params);
  }
  auto* m = g_new0(PinnedMemory, 1);
  gst_memory_init(GST_MEMORY_CAST(m), params->flags, allocator, nullptr, maxsize, params->align,
                  params->prefix, size);
  m->data = static_cast<guint8*>(*data);
  m->device = self->device;
  if (params->prefix && (params->flags & GST_MEMORY_FLAG_ZERO_PREFIXED))
    std::memset(m->data, 0, params->prefix);
  if (params->padding && (params->flags & GST_MEMORY_FLAG_ZERO_PADDED))
    std::memset(m->data + params->prefix + size, 0, params->padding);
  return GST_MEMORY_CAST(m);
}

void pinned_free(GstAllocator*, GstMemory* mem) {
  auto* m = reinterpret_cast<PinnedMemory*>(mem);
  if (!mem->parent) latent::free_pinned_host(m->device, m->data);
  g_free(m);
}

gpointer pinned_map(GstMemory* mem, gsize, GstMapFlags) {
  return reinterpret_cast<PinnedMemory*>(mem)->data;  // GStreamer adds the offset
}

void pinned_unmap(GstMemory*) {}

GstMemory* pinned_share(GstMemory* mem, gssize offset, gssize size) {
  auto* m = reinterpret_cast<PinnedMemory*>(mem);
  GstMemory* parent = mem->parent ? mem->parent : mem;
  if (size == -1) size = static_cast<gssize>(mem->size) - offset;
  auto* sub = g_new0(PinnedMemory, 1);
  gst_memory_init(GST_MEMORY_CAST(sub),
                  static_cast<GstMemoryFlags>(GST_MINI_OBJECT_FLAGS(parent) |
                                              GST_MINI_OBJECT_FLAG_LOCK_READONLY),
                  mem->allocator, parent, mem->maxsize, mem->align,
                  mem->offset + static_cast<gsize>(offset), static_cast<gsize>(size));
  sub->data = m->data;
  sub->device = m->device;
  return GST_MEMORY_CAST(sub);
}

void gst_latent_pinned_allocator_class_init(GstLatentPinnedAllocatorClass* klass) {
  GstAllocatorClass* allocator_class = GST_ALLOCATOR_CLASS(klass);
  allocator_class->alloc = pinned_alloc;
  allocator_class->free = pinned_free;
}

void gst_latent_pinned_allocator_init(GstLatentPinnedAllocator* self) {
  GstAllocator* alloc = GST_ALLOCATOR_CAST(self);
  alloc->mem_type = GST_LATENT_PINNED_MEMORY_TYPE;
  alloc->mem_map = pinned_map;
  alloc->mem_unmap = pinned_unmap;
  alloc->mem_share = pinned_share;
  self->device = 0;
}

// Downstream's pool is one we may replace: none, or a generic (system-memory) one.
bool generic_pool(GstBufferPool* pool) {
  return !pool || G_OBJECT_TYPE(pool) == GST_TYPE_BUFFER_POOL ||
         G_OBJECT_TYPE(pool) == GST_TYPE_VIDEO_BUFFER_POOL;
}

}  // namespace

GstAllocator* gst_latent_pinned_allocator_new(int device) {
  init_debug();
  auto* allocator = static_cast<GstLatentPinnedAllocator*>(
      g_object_new(gst_latent_pinned_allocator_get_type(), nullptr));
  gst_object_ref_sink(allocator);
  allocator->device = device;
  return GST_ALLOCATOR_CAST(allocator);
}

bool gst_latent_memory_is_pinned(GstMemory* mem) {
  return mem && gst_memory_is_type(mem, GST_LATENT_PINNED_MEMORY_TYPE);
}

bool gst_latent_buffer_is_pinned(GstBuffer* buffer) {
  return buffer && gst_buffer_n_memory(buffer) == 1 &&
         gst_latent_memory_is_pinned(gst_buffer_peek_memory(buffer, 0));
}

// A frame's bytes in a pool for raw video `caps`; 0 for caps that are no raw video.
static guint video_frame_size(GstCaps* caps) {
  GstVideoInfo info;
  return gst_video_info_from_caps(&info, caps) ? static_cast<guint>(GST_VIDEO_INFO_SIZE(&info)) : 0;
}

// A video pool of page-locked buffers of `cuda`'s device for raw video `caps`, `size` bytes a
// buffer (null where the pool refuses its configuration).
static GstBufferPool* new_pinned_pool(GstLatentCuda* cuda, GstCaps* caps, guint size, guint min,
                                      guint max) {
  GstAllocator* allocator = gst_latent_pinned_allocator_new(cuda->device().index);
  GstBufferPool* pool = gst_video_buffer_pool_new();
  GstStructure* config = gst_buffer_pool_get_config(pool);
  gst_buffer_pool_config_set_params(config, caps, size, min, max);
  gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
  GstAllocationParams params;
  gst_allocation_params_init(&params);
  gst_buffer_pool_config_set_allocator(config, allocator, &params);
  gst_object_unref(allocator);  // the config holds it
  if (!gst_buffer_pool_set_config(pool, config)) {
    gst_object_unref(pool);
    return nullptr;
  }
  return pool;
}

bool gst_latent_cuda_decide_pinned_pool(GstLatentCuda* cuda, GstQuery* query) {
  GstCaps* caps = nullptr;
  gst_query_parse_allocation(query, &caps, nullptr);
  if (!caps || gst_latent_caps_is_cuda(caps) || !cuda->active()) return false;
  GstBufferPool* theirs = nullptr;
  guint size = 0, min = 0, max = 0;
  if (gst_query_get_n_allocation_pools(query) > 0)
    gst_query_parse_nth_allocation_pool(query, 0, &theirs, &size, &min, &max);
  const bool replace = generic_pool(theirs);
  if (theirs) gst_object_unref(theirs);
  if (!replace) return false;  // downstream's own kind of pool (its memory) wins
  size = video_frame_size(caps);
  GstBufferPool* pool = size ? new_pinned_pool(cuda, caps, size, min, max) : nullptr;
  if (!pool) return false;
  gst_latent_query_set_pool(query, pool, size, min, max);
  gst_object_unref(pool);
  GST_DEBUG("frames in page-locked system memory of cuda:%d (%u bytes a buffer)",
            cuda->device().index, size);
  return true;
}

bool gst_latent_cuda_propose_pinned_pool(GstLatentCuda* cuda, GstQuery* query, guint min) {
  GstCaps* caps = nullptr;
  gboolean need_pool = FALSE;
  gst_query_parse_allocation(query, &caps, &need_pool);
  if (!caps || gst_latent_caps_is_cuda(caps) || !cuda->active() ||
      gst_query_get_n_allocation_pools(query) > 0)
    return false;
  const guint size = video_frame_size(caps);
  if (size == 0) return false;
  if (need_pool) {
    GstBufferPool* pool = new_pinned_pool(cuda, caps, size, min, 0);
    if (!pool) return false;
    gst_query_add_allocation_pool(query, pool, size, min, 0);
    gst_object_unref(pool);
  }
  // The allocator too, for producers that allocate their own buffers.
  GstAllocator* allocator = gst_latent_pinned_allocator_new(cuda->device().index);
  GstAllocationParams params;
  gst_allocation_params_init(&params);
  gst_query_add_allocation_param(query, allocator, &params);
  gst_object_unref(allocator);
  GST_DEBUG("offered upstream page-locked frames of cuda:%d (%u bytes a buffer, at least %u)",
            cuda->device().index, size, min);
  return true;
}

// ---- latents ordered on the device between stages --------------------------------------------

namespace {

// What a latent buffer's meta holds; shared by the copies of the buffer.
struct FenceState {
  std::mutex lock;
  std::shared_ptr<latent::DeviceFence> written;
  std::vector<std::shared_ptr<latent::DeviceFence>> reads;
};

struct GstLatentFenceMeta {
  GstMeta meta;
  std::shared_ptr<FenceState>* state;
};

const GstMetaInfo* fence_meta_info();

gboolean fence_meta_init(GstMeta* meta, gpointer, GstBuffer*) {
  reinterpret_cast<GstLatentFenceMeta*>(meta)->state =
      new std::shared_ptr<FenceState>(std::make_shared<FenceState>());
  return TRUE;
}

void fence_meta_free(GstMeta* meta, GstBuffer*) {
  auto* m = reinterpret_cast<GstLatentFenceMeta*>(meta);
  delete m->state;
  m->state = nullptr;
}

// A copy of the buffer shares the state: a copy that shares the memory needs its reads ordered
// the same way. (A deep copy, which GStreamer's CUDA memory makes without waiting for the write,
// is not ordered by this; no stage of ours makes one.)
gboolean fence_meta_transform(GstBuffer* dest, GstMeta* meta, GstBuffer*, GQuark type, gpointer) {
  if (!GST_META_TRANSFORM_IS_COPY(type)) return FALSE;
  auto* from = reinterpret_cast<GstLatentFenceMeta*>(meta);
  auto* to = reinterpret_cast<GstLatentFenceMeta*>(
      gst_buffer_get_meta(dest, GST_LATENT_FENCE_META_API_TYPE));
  if (!to)
    to = reinterpret_cast<GstLatentFenceMeta*>(
        gst_buffer_add_meta(dest, fence_meta_info(), nullptr));
  if (!to) return FALSE;
  *to->state = *from->state;
  return TRUE;
}

const GstMetaInfo* fence_meta_info() {
  static const GstMetaInfo* info = nullptr;
  if (g_once_init_enter(&info)) {
    const GstMetaInfo* i = gst_meta_register(GST_LATENT_FENCE_META_API_TYPE, "GstLatentFenceMeta",
                                             sizeof(GstLatentFenceMeta), fence_meta_init,
                                             fence_meta_free, fence_meta_transform);
    g_once_init_leave(&info, i);
  }
  return info;
}

std::shared_ptr<FenceState> fence_state(GstBuffer* buffer) {
  auto* m = buffer ? reinterpret_cast<GstLatentFenceMeta*>(
                         gst_buffer_get_meta(buffer, GST_LATENT_FENCE_META_API_TYPE))
                   : nullptr;
  return m ? *m->state : nullptr;
}

// The fence of the buffer's last write (null: no meta, or none written yet).
std::shared_ptr<latent::DeviceFence> written_fence(GstBuffer* buffer) {
  std::shared_ptr<FenceState> st = fence_state(buffer);
  if (!st) return nullptr;
  std::lock_guard<std::mutex> lock(st->lock);
  return st->written;
}

}  // namespace

GType gst_latent_fence_meta_api_get_type(void) {
  static GType type = 0;
  if (g_once_init_enter(&type)) {
    // Tied to the buffer's memory: an element that replaces the memory drops it.
    static const gchar* tags[] = {GST_META_TAG_MEMORY_STR, nullptr};
    const GType t = gst_meta_api_type_register("GstLatentFenceMetaAPI", tags);
    g_once_init_leave(&type, t);
  }
  return type;
}

bool gst_latent_fences_on(void) {
  return latent::env_choice("LATENT_FENCED_LATENTS", {{"0", "off"}, {"1", "on"}}, 0) == 1;
}

bool gst_latent_query_orders_reads(GstQuery* query) {
  return query && gst_query_find_allocation_meta(query, GST_LATENT_FENCE_META_API_TYPE, nullptr);
}

latent::Status gst_latent_buffer_order_write(GstBuffer* buffer, latent::Backend& backend) {
  std::shared_ptr<FenceState> st = fence_state(buffer);
  if (!st) return latent::ok_status();
  std::vector<std::shared_ptr<latent::DeviceFence>> reads;
  {
    std::lock_guard<std::mutex> lock(st->lock);
    reads.swap(st->reads);
  }
  for (const auto& r : reads) LATENT_TRY(backend.queue_wait(*r));
  return latent::ok_status();
}

void gst_latent_buffer_set_written(GstBuffer* buffer,
                                   std::shared_ptr<latent::DeviceFence> written) {
  std::shared_ptr<FenceState> st = fence_state(buffer);
  if (!st && gst_latent_fences_on() && gst_buffer_is_writable(buffer)) {
    GstMeta* meta = gst_buffer_add_meta(buffer, fence_meta_info(), nullptr);
    if (!meta) return;
    // Kept when the buffer goes back to its pool: the reads recorded meanwhile reach the next
    // write.
    meta->flags = static_cast<GstMetaFlags>(meta->flags | GST_META_FLAG_POOLED);
    st = *reinterpret_cast<GstLatentFenceMeta*>(meta)->state;
  }
  if (!st) return;
  std::lock_guard<std::mutex> lock(st->lock);
  st->written = std::move(written);
  st->reads.clear();
}

latent::Status gst_latent_buffer_order_read(GstBuffer* buffer, latent::Backend& backend) {
  std::shared_ptr<latent::DeviceFence> written = written_fence(buffer);
  return written ? backend.queue_wait(*written) : latent::ok_status();
}

latent::Status gst_latent_buffer_wait_written(GstBuffer* buffer) {
  std::shared_ptr<latent::DeviceFence> written = written_fence(buffer);
  return written ? written->wait() : latent::ok_status();
}

latent::Status gst_latent_buffer_add_read(GstBuffer* buffer, latent::Backend& backend) {
  std::shared_ptr<FenceState> st = fence_state(buffer);
  if (!st) return latent::ok_status();
  latent::Result<std::unique_ptr<latent::DeviceFence>> fence = backend.fence();
  if (!fence.ok()) return fence.status();
  std::lock_guard<std::mutex> lock(st->lock);
  st->reads.push_back(std::move(*fence));
  return latent::ok_status();
}

latent::Result<latent::Tensor> gst_latent_buffer_read_latent(GstBuffer* buffer,
                                                             latent::Backend& backend,
                                                             const void* data, latent::DType dtype,
                                                             int channels, int height, int width) {
  LATENT_TRY(gst_latent_buffer_order_read(buffer, backend));
  LATENT_ASSIGN_OR_RETURN(latent::Tensor t, latent::device_latent_to_tensor(
                                                backend, data, dtype, channels, height, width));
  LATENT_TRY(gst_latent_buffer_add_read(buffer, backend));
  return t;
}

latent::Result<std::shared_ptr<latent::DeviceFence>> gst_latent_buffer_write_latent(
    GstBuffer* buffer, latent::Backend& backend, const latent::Tensor& latent, void* data,
    latent::DType dtype) {
  LATENT_TRY(gst_latent_buffer_order_write(buffer, backend));
  LATENT_ASSIGN_OR_RETURN(std::unique_ptr<latent::DeviceFence> fence,
                          latent::queue_tensor_to_device_latent(backend, latent, data, dtype));
  std::shared_ptr<latent::DeviceFence> written = std::move(fence);
  gst_latent_buffer_set_written(buffer, written);
  return written;
}

size_t gst_latent_buffer_reads_pending(GstBuffer* buffer) {
  std::shared_ptr<FenceState> st = fence_state(buffer);
  if (!st) return 0;
  std::lock_guard<std::mutex> lock(st->lock);
  return st->reads.size();
}
