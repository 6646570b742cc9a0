// GPU-resident buffers for the latent stages, through GStreamer's CUDA library.
//
// Every stage on a CUDA device uses one GstCudaContext: a wrapper of that device's PRIMARY
// context, the context the engine's CUDA runtime calls use, so device pointers pass between
// GStreamer elements and the engine unchanged. It is shared with neighbours (cudaupload,
// nvh264dec, cudaconvert, cudadownload, ...) through GstContext: announced with a have-context
// message when a stage starts, and answered in context queries, also before start() for the
// device the `device` property names, because states change from the sink upwards and a
// downstream cudadownload asks before we start. Neighbours then adopt it instead of creating
// their own.
//
// A context handed to us from elsewhere (set_context) that is not the primary context is not
// used for our own work: a CUDA-memory buffer belonging to another context is read and written
// through GStreamer's system-memory mapping (GstCudaMemory copies in its own context), never
// with its device pointer in ours. Correct, only slower; a warning says so once.
//
// Latents in CUDA memory: application/x-latent(memory:CUDAMemory) buffers hold one GstCudaMemory
// with the latent [C, h, w] contiguous in the caps' dtype at its start. GstCudaBufferPool
// allocates from video caps only, so the latent pool is configured with one RGBA row holding the
// latent's bytes (the buffer may be longer: pitched).
//
// Ordering on the device (GstLatentFenceMeta, below): our stages queue a latent's write and its
// reads on their backends' CUDA streams, which differ between backends (one per device and
// dtype). A producer attaches to each latent it writes a fence after the write; a reader of ours
// makes its stream wait on that fence before reading and records a fence after its read, which
// the producer's stream waits on before it writes into the same pool buffer again. A producer
// whose readers downstream all say so in their ALLOCATION answers (tee passes on only what every
// branch says) pushes at once; for anyone else (cudadownload, an encoder, latentsink) it waits on
// the host until the latent is complete, as GStreamer 1.22's CUDA memory carries no stream.
// Behind LATENT_FENCED_LATENTS=1 until a GPU has run it (gst_latent_fences_on()); off, no meta is
// offered or attached and every writer waits on the host, as before.
//
// Without GStreamer's CUDA library (the CPU build), everything here reports "no CUDA" and the
// stages stay on system memory.
#pragma once

#include <gst/gst.h>
#include <gst/video/video.h>

#include <memory>
#include <mutex>

#include "engine/backends/backend.h"
#include "engine/core/dtype.h"

#define GST_LATENT_CUDA_FEATURE "memory:CUDAMemory"

// Whether this build can hand buffers over in CUDA memory.
bool gst_latent_cuda_built(void);

// One element's CUDA context state (thread-safe).
class GstLatentCuda {
 public:
  GstLatentCuda() = default;
  ~GstLatentCuda();
  GstLatentCuda(const GstLatentCuda&) = delete;
  GstLatentCuda& operator=(const GstLatentCuda&) = delete;

  // start(): the stage runs on `device`: take the device's primary-context wrapper and announce
  // it. A CPU device (or no CUDA library) clears it. False only when the CUDA library failed.
  bool start(GstElement* element, const latent::Device& device);
  void stop();
  // GstElement::set_context: remembers a foreign context (see above) for queries before start.
  void set_context(GstElement* element, GstContext* context);
  // A context query for GStreamer's CUDA context: answered with ours; before start(), with the
  // primary context of `planned_device` (>= 0: the device the `device` property names), so
  // neighbours that start first (downstream ones) adopt it too. True when answered.
  bool handle_query(GstElement* element, GstQuery* query, int planned_device = -1);

  // True once start() found a CUDA device.
  bool active();
  latent::Device device();

  // Maps `buffer` for device access when it is one GstCudaMemory of our context (flags:
  // GST_MAP_READ or GST_MAP_WRITE). False otherwise (the caller maps system memory instead).
  bool map(GstBuffer* buffer, GstMapInfo* info, GstMapFlags flags);
  // The same for a video frame (plane pointers become device pointers).
  bool map_frame(GstVideoFrame* frame, const GstVideoInfo* info, GstBuffer* buffer,
                 GstMapFlags flags);

  // A GstCudaBufferPool on our context for latents of `bytes`, configured and inactive (null
  // when inactive or on failure).
  GstBufferPool* new_latent_pool(gsize bytes, guint min, guint max);
  // A GstCudaBufferPool on our context for video `caps`, configured (null on failure).
  GstBufferPool* new_video_pool(GstCaps* caps, guint min, guint max);
  // Whether `pool` is a GstCudaBufferPool of our context.
  bool owns_pool(GstBufferPool* pool);

 private:
  // Whether `buffer` is one GstCudaMemory of our (started) context; warns once about memory of
  // another context.
  bool holds_ours(GstBuffer* buffer);

  std::mutex lock_;
  gpointer context_ = nullptr;  // GstCudaContext*, ours (primary) once started
  gpointer foreign_ = nullptr;  // GstCudaContext* set on us from outside
  latent::Device device_;
  bool warned_ = false;
};

// Whether `buffer` is one GstCudaMemory. Such a latent buffer may be larger than the latent
// (the pool allocates pitched rows); the latent is at its start. Buffers keep the pool's size,
// so the pool recycles them instead of freeing (cuMemFree synchronises the device).
bool gst_latent_buffer_is_cuda(GstBuffer* buffer);

// Caps features helpers.
bool gst_latent_caps_features_is_cuda(const GstCapsFeatures* f);
bool gst_latent_caps_features_is_system(const GstCapsFeatures* f);
// Appends `s` to `caps` once with the CUDA-memory feature (when `cuda`) and once in system
// memory; takes `s`.
GstCaps* gst_latent_caps_merge_both(GstCaps* caps, GstStructure* s, bool cuda);
// Whether the first structure of fixed `caps` carries memory:CUDAMemory.
bool gst_latent_caps_is_cuda(const GstCaps* caps);

// decide_allocation's answer: `pool` (with its size and buffer counts) as the query's first pool,
// in place of the one downstream offered, if any.
void gst_latent_query_set_pool(GstQuery* query, GstBufferPool* pool, guint size, guint min,
                               guint max);
// propose_allocation for an application/x-latent sink pad: with CUDA-memory caps, offers a
// latent pool on `cuda`'s context and says that the stage orders its reads by the latents'
// fences (GstLatentFenceMeta). True when it added a pool.
bool gst_latent_cuda_propose_latent_pool(GstLatentCuda* cuda, GstQuery* query);
// decide_allocation for an application/x-latent src pad with CUDA-memory caps: keeps
// downstream's pool when it is a CUDA pool of our context, else makes one. False when the caps
// are not CUDA memory (the caller takes the default path) or no pool could be made.
bool gst_latent_cuda_decide_latent_pool(GstLatentCuda* cuda, GstQuery* query);

// System-memory frames a GPU writes: buffers of page-locked memory (GstMemory of type
// GST_LATENT_PINNED_MEMORY_TYPE, cudaHostAlloc'd for the element's device), so a decoded frame is
// copied by the GPU straight into the buffer pushed downstream, with no copy on the streaming
// thread. decide_allocation for a video src pad with system-memory caps while the element runs on
// a GPU: replaces downstream's pool when it offered none or a generic one (a pool of its own
// kind of memory is kept: false, the caller takes the default path).
#define GST_LATENT_PINNED_MEMORY_TYPE "LatentPinnedHost"
bool gst_latent_cuda_decide_pinned_pool(GstLatentCuda* cuda, GstQuery* query);
// propose_allocation for a video sink pad with system-memory caps while the element runs on a
// GPU: offers upstream a pool of such page-locked buffers (at least `min`) and their allocator,
// so that a producer on the CPU (a source, a software decoder) writes its frames where the GPU's
// copy engine reads them in place (FrameDesc::pinned), with no copy on the streaming thread.
// False (nothing added) for other caps, off a GPU, or when an earlier answer offered a pool.
bool gst_latent_cuda_propose_pinned_pool(GstLatentCuda* cuda, GstQuery* query, guint min);
// Whether `mem` is such page-locked memory.
bool gst_latent_memory_is_pinned(GstMemory* mem);
// Whether all of `buffer` is one such memory (every plane of a frame in it is page-locked).
bool gst_latent_buffer_is_pinned(GstBuffer* buffer);
// The allocator behind that pool, for CUDA device `device` (a new reference). Where page-locked
// memory cannot be had (no CUDA, none left) it hands out plain system memory instead.
GstAllocator* gst_latent_pinned_allocator_new(int device);

// ---- latents ordered on the device between stages (see the top of this file) ----------------
// The meta a latent buffer in CUDA memory carries once one of our stages has written it: the
// fence after its write and those after its readers' reads. It stays on the pool's buffer
// (GST_META_FLAG_POOLED) so that the reads recorded on it reach the next write; a copy of the
// buffer shares it.
GType gst_latent_fence_meta_api_get_type(void);
// LATENT_FENCED_LATENTS=1: the stages offer and attach the meta (read when asked: a test may set
// it). Off by default until a GPU has run it.
bool gst_latent_fences_on(void);
#define GST_LATENT_FENCE_META_API_TYPE (gst_latent_fence_meta_api_get_type())
// decide_allocation of a stage writing latents in CUDA memory: whether every reader downstream
// orders its reads by the meta (its ALLOCATION answer lists it), so the stage may push a latent
// before its write has run.
bool gst_latent_query_orders_reads(GstQuery* query);
// The writer, with the backend's run lock held, before queuing the write into `buffer`
// (writable): makes `backend` wait for the reads recorded on it since its last write.
latent::Status gst_latent_buffer_order_write(GstBuffer* buffer, latent::Backend& backend);
// The writer, after queuing the write: `written` (passed once the latent is complete) goes on the
// buffer's meta, added on its first write (with the fences on; nothing otherwise).
void gst_latent_buffer_set_written(GstBuffer* buffer, std::shared_ptr<latent::DeviceFence> written);
// A reader, with its backend's run lock held, before queuing its read of `buffer`: makes
// `backend` wait for the write (nothing without the meta: a foreign writer's latent is complete
// when pushed).
latent::Status gst_latent_buffer_order_read(GstBuffer* buffer, latent::Backend& backend);
// A reader that maps the buffer on the host instead (CUDA memory of another device or context,
// through GStreamer's download), before mapping it: waits on the host for the write.
latent::Status gst_latent_buffer_wait_written(GstBuffer* buffer);
// A reader, after queuing its read: a fence of `backend` goes on the meta (nothing without it),
// for the buffer's next write.
latent::Status gst_latent_buffer_add_read(GstBuffer* buffer, latent::Backend& backend);
// What the stages call: a latent [C, h, w] (`dtype`) at `data`, the device memory of `buffer`,
// read into a tensor on `backend` after its write, with the read recorded (order_read,
// device_latent_to_tensor, add_read); and `latent` written there after the buffer's last reads,
// the write's fence attached and returned (order_write, queue_tensor_to_device_latent,
// set_written). The caller holds the backend's run lock.
latent::Result<latent::Tensor> gst_latent_buffer_read_latent(GstBuffer* buffer,
                                                             latent::Backend& backend,
                                                             const void* data, latent::DType dtype,
                                                             int channels, int height, int width);
latent::Result<std::shared_ptr<latent::DeviceFence>> gst_latent_buffer_write_latent(
    GstBuffer* buffer, latent::Backend& backend, const latent::Tensor& latent, void* data,
    latent::DType dtype);
// The reads recorded on `buffer` since its last write (0 without the meta).
size_t gst_latent_buffer_reads_pending(GstBuffer* buffer);
