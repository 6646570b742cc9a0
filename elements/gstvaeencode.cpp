/**
 * SECTION:element-vaeencode
 * @title: vaeencode
 *
 * |[
 * gst-launch-1.0 videotestsrc num-buffers=30 ! video/x-raw,width=320,height=240 ! \
 *     vaeencode ! vaedecode ! videoconvert ! vp8enc ! webmmux ! filesink location=out.webm
 * ]| (pipelines/encode_decode.sh)
 *
 * Encodes each video frame into a diffusion model's latent space with the encoder of a VAE
 * (diffusers AutoencoderKL, AutoencoderKLQwenImage or AutoencoderTiny; `model` is a diffusers
 * folder, a pipeline root or a .safetensors file, the built-in default model when empty).
 *
 * The output is application/x-latent: one buffer a frame holding the normalised latent
 * [C, h, w] in the negotiated `format` (fp32, bf16 or fp16). The caps name the latent space,
 * so vaedecode (or a denoiser) can refuse latents from another model, and carry the original
 * frame size and `size-policy`, so vaedecode restores the frame size exactly.
 *
 * Frames of any size are accepted: `size-policy` fits them to the model's downsampling grid
 * (pad: replicate the edges up to the next multiple; crop: centre crop; scale: resize).
 *
 * On a CUDA device, frames and latents can stay in GPU memory:
 *
 * |[
 * gst-launch-1.0 videotestsrc num-buffers=30 ! video/x-raw,format=NV12,width=320,height=240 ! \
 *     cudaupload ! vaeencode device=cuda ! vaedecode device=cuda ! \
 *     "video/x-raw(memory:CUDAMemory),format=RGBA" ! cudadownload ! videoconvert ! autovideosink
 * ]| (pipelines/cuda_memory.sh writes the same to a WebM file)
 *
 * The sink pad takes video/x-raw(memory:CUDAMemory) (RGB/BGR/RGBA/BGRA/RGBx/BGRx/xRGB/xBGR/
 * ARGB/ABGR, NV12, I420) from cudaupload or an NVDEC decoder and reads it in place; the src pad
 * offers application/x-latent(memory:CUDAMemory) first, so a vaedecode or ditdenoise on the
 * same GPU takes the latent without it leaving device memory. All of them share the device's
 * primary CUDA context through GstContext (elements/gstlatentcuda.h). With a neighbour on the
 * CPU, caps fall back to system memory.
 *
 * On a GPU the encoder is planned when caps are negotiated (warm-up, then a CUDA graph that each
 * frame replays; `cuda-graphs=false` keeps the plain forward); system-memory frames are uploaded
 * through pinned memory `prefetch-depth` frames ahead: upstream is offered a pool of page-locked
 * buffers for them (ALLOCATION query; LATENT_PINNED_INPUT=0 turns the offer off, for A/Bs):
 * frames a source or software decoder writes there go up in place, with no copy on the streaming
 * thread; frames in other memory are copied into the stager's page-locked slots first.
 *
 * Video mode (`mode=video`, the default for AutoencoderKLWan and TAEW models) streams a clip
 * through the causal video VAE:
 *
 * |[
 * gst-launch-1.0 filesrc location=clip.mp4 ! decodebin ! videoconvert ! \
 *     vaeencode model=/models/Wan2.1-T2V-1.3B-Diffusers mode=video ! \
 *     latentsink location=clip.safetensors
 * ]| (pipelines/video_latents.sh)
 *
 * Latent frame 0 goes out after frame 0, then one latent frame per 4 frames (caps
 * `temporal-factor=4`), with the PTS of the first frame it covers, the DURATION of all it covers,
 * OFFSET the first frame's index in the clip and OFFSET_END one past its last real frame. At
 * EOS (and at a DISCONT buffer, a new segment or new caps, which start a new clip) a partial
 * chunk is padded by repeating its last frame; a flush drops it. No QoS dropping in video mode;
 * LATENCY answers add the 3 frames held for a chunk (6 for TAEW). README "Video mode".
 */
#include "elements/gstvaeencode.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>

#include "elements/gstlatentcaps.h"
#include "engine/backends/frames.h"
#include "engine/core/env.h"

GST_DEBUG_CATEGORY_STATIC(gst_vae_encode_debug);
#define GST_CAT_DEFAULT gst_vae_encode_debug

namespace {

enum { PROP_0, PROP_SIZE_POLICY };
constexpr latent::SizePolicy kDefaultSizePolicy = latent::SizePolicy::kPad;

// The packed formats plus NV12 and I420 (converted to RGB on the model's device).
#define VAE_ENCODE_VIDEO_FORMATS \
  "{ RGB, RGBA, BGRA, BGR, RGBx, BGRx, xRGB, xBGR, ARGB, ABGR, NV12, I420 }"
#define VAE_ENCODE_VIDEO_FIELDS                                                      \
  " format = (string) " VAE_ENCODE_VIDEO_FORMATS                                     \
  ", width = (int) [ 1, 8192 ], height = (int) [ 1, 8192 ], framerate = (fraction) " \
  "[ 0/1, 2147483647/1 ]"
#define VAE_ENCODE_SINK_CAPS "video/x-raw," VAE_ENCODE_VIDEO_FIELDS
#ifdef LATENT_HAVE_GST_CUDA
// Frames and latents may also stay in GPU memory (elements/gstlatentcuda.h).
#define VAE_ENCODE_SINK_TEMPLATE \
  "video/x-raw(" GST_LATENT_CUDA_FEATURE ")," VAE_ENCODE_VIDEO_FIELDS "; " VAE_ENCODE_SINK_CAPS
#define VAE_ENCODE_SRC_TEMPLATE GST_LATENT_CUDA_CAPS_TEMPLATE "; " GST_LATENT_CAPS_TEMPLATE
#else
#define VAE_ENCODE_SINK_TEMPLATE VAE_ENCODE_SINK_CAPS
#define VAE_ENCODE_SRC_TEMPLATE GST_LATENT_CAPS_TEMPLATE
#endif
GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS(VAE_ENCODE_SINK_TEMPLATE));
GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(VAE_ENCODE_SRC_TEMPLATE));

// What set_caps() fixed for the stream.
struct Negotiated {
  GstVideoInfo in_info;
  latent::FrameFormat frame_format = latent::FrameFormat::kRGB;
  latent::YuvColor color;  // NV12/I420
  GstLatentInfo out_info;
  latent::FrameGeometry geometry;
  bool cuda_in = false;   // frames arrive in CUDA memory
  bool cuda_out = false;  // latents leave in CUDA memory
  bool video = false;     // mode=video: causal chunks through a VaeStream
};

// ---- video mode ----
// One latent frame ready to go out: a view of the normalised latents [1, C, h, w] on the
// backend (freed under the run lock) and the buffer fields of the frames it covers.
struct VideoLatent {
  latent::Tensor latent;
  GstClockTime pts = GST_CLOCK_TIME_NONE;
  GstClockTime duration = GST_CLOCK_TIME_NONE;
  guint64 offset = 0;      // first source frame covered (from the start of the clip)
  guint64 offset_end = 0;  // one past the last real frame covered
  bool discont = false;
};

// A frame pushed into the stream and not yet covered by a latent that went out.
struct VideoFrame {
  GstClockTime pts = GST_CLOCK_TIME_NONE;
  GstClockTime duration = GST_CLOCK_TIME_NONE;
};

// The clip in progress; touched by the streaming thread only (and stop(), after streaming ended).
struct VideoEncode {
  std::unique_ptr<latent::VaeStream> stream;  // freed under the run lock
  std::deque<VideoFrame> frames;              // frames first_frame, first_frame + 1, ...
  int64_t first_frame = 0;
  int64_t frames_in = 0;    // frames pushed into this clip
  int64_t latents_out = 0;  // latent frames made from this clip
  bool discont = true;      // the next latent starts a clip
  std::deque<VideoLatent> ready;
  bool draining = false;
  // Frames go to the device through a stager (GPU backends, prefetch-depth > 0): staged and
  // converted at once, so nothing is held back, but the streaming thread never waits behind
  // the work queued on a shared stream (frames in CUDA memory are copied out on the stager's
  // copy stream). Kept for the run; freed at stop.
  bool stager_checked = false;
  std::unique_ptr<latent::FrameStager> stager;
};

// A frame whose upload is under way (prefetching on a GPU).
struct Pending {
  GstBuffer* buffer = nullptr;  // owned until handed to the base class
  uint64_t ticket = 0;
  bool pinned = false;  // uploaded from the buffer itself: it must live until its conversion
};

// Prefetch state; touched by the streaming thread only (and stop(), after streaming ended).
struct Prefetch {
  bool checked = false;  // stager created, or found unneeded, for this run
  std::unique_ptr<latent::FrameStager> stager;
  std::deque<Pending> pending;
  bool draining = false;
  bool has_current = false;        // transform() converts `current` from the stager
  bool current_converted = false;  // it did (QoS may drop the frame before transform())
  Pending current;
};

struct Impl : GstLatentStage {
  std::mutex lock;
  latent::SizePolicy size_policy = kDefaultSizePolicy;  // setting
  bool negotiated = false;
  Negotiated stream;
  Prefetch prefetch;
  bool video = false;  // resolved `mode` of this run (open())
  int temporal_factor = 1;
  VideoEncode clip;
};

// video/x-raw structure -> the latent structure this element would output for it.
GstStructure* video_to_latent(const GstStructure* s, const GstLatentModel* model,
                              latent::SizePolicy policy, latent::DType dtype, int temporal_factor) {
  GstStructure* out = gst_structure_new_empty(GST_LATENT_MEDIA_TYPE);
  // Video mode: every latent frame after the first covers this many frames.
  if (temporal_factor > 1)
    gst_structure_set(out, "temporal-factor", G_TYPE_INT, temporal_factor, nullptr);
  gst_latent_set_format_list(out, dtype);
  const int factor = model ? model->latent_space().downsample : 1;
  if (model) {
    gst_structure_set(out, "channels", G_TYPE_INT, model->latent_space().channels, "latent-space",
                      G_TYPE_STRING, model->latent_space().name.c_str(), nullptr);
  } else {
    gst_structure_set(out, "channels", GST_TYPE_INT_RANGE, 1, kGstLatentMaxChannels, nullptr);
  }
  gst_structure_set(out, "size-policy", G_TYPE_STRING, latent::size_policy_name(policy), nullptr);
  struct Axis {
    const char* video;
    const char* latent;
    const char* frame;
  };
  for (const Axis& a :
       {Axis{"width", "width", "frame-width"}, Axis{"height", "height", "frame-height"}}) {
    int v = 0;
    if (model && gst_structure_get_int(s, a.video, &v)) {
      auto plan = latent::plan_axis(v, factor, policy);
      if (!plan.ok() && policy == latent::SizePolicy::kCrop && v >= 1 && v <= kGstLatentMaxSide) {
        // A side too small to crop to one block: set_caps refuses it with a sentence naming
        // the side and the way out (pad or scale), instead of a bare not-negotiated here.
        gst_structure_set(out, a.latent, G_TYPE_INT, 1, a.frame, G_TYPE_INT, v, nullptr);
        continue;
      }
      if (!plan.ok()) {
        GST_DEBUG("no latent for %s %d: %s", a.video, v, plan.status().message().c_str());
        gst_structure_free(out);
        return nullptr;
      }
      gst_structure_set(out, a.latent, G_TYPE_INT, plan->model / factor, a.frame, G_TYPE_INT, v,
                        nullptr);
    } else {
      if (!gst_latent_copy_field(s, a.video, out, a.frame))
        gst_structure_set(out, a.frame, GST_TYPE_INT_RANGE, 1, kGstLatentMaxSide, nullptr);
      gst_structure_set(out, a.latent, GST_TYPE_INT_RANGE, 1,
                        std::max(1, kGstLatentMaxSide / factor), nullptr);
    }
  }
  gst_latent_copy_field(s, "framerate", out, "framerate");
  return out;
}

// Latent structure (what downstream wants) -> the video this element would need for it.
GstStructure* latent_to_video(const GstStructure* s, const GstLatentModel* model,
                              latent::SizePolicy policy, int temporal_factor) {
  int wanted_factor = 1;
  if (model && gst_structure_get_int(s, "temporal-factor", &wanted_factor) &&
      wanted_factor != temporal_factor)
    return nullptr;
  if (model) {
    const gchar* space = gst_structure_get_string(s, "latent-space");
    if (space && model->latent_space().name != space) return nullptr;
    int channels = 0;
    if (gst_structure_get_int(s, "channels", &channels) &&
        channels != model->latent_space().channels)
      return nullptr;
  }
  const gchar* wanted_policy = gst_structure_get_string(s, "size-policy");
  if (wanted_policy && std::strcmp(wanted_policy, latent::size_policy_name(policy)) != 0)
    return nullptr;
  GstStructure* out = gst_latent_video_structure_new(VAE_ENCODE_VIDEO_FORMATS);
  gst_latent_set_video_size(s, out);
  return out;
}

}  // namespace

struct _GstVaeEncode {
  GstLatentBase parent;
  Impl* impl;
};

#define gst_vae_encode_parent_class parent_class
G_DEFINE_TYPE(GstVaeEncode, gst_vae_encode, GST_TYPE_LATENT_BASE)
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(vaeencode, "vaeencode", GST_RANK_NONE, GST_TYPE_VAE_ENCODE,
                                      gst_latent_element_init(plugin));

static void gst_vae_encode_set_property(GObject* object, guint prop_id, const GValue* value,
                                        GParamSpec* pspec) {
  GstVaeEncode* self = GST_VAE_ENCODE(object);
  switch (prop_id) {
    case PROP_SIZE_POLICY: {
      const auto policy = static_cast<latent::SizePolicy>(g_value_get_enum(value));
      bool changed;
      {
        std::lock_guard<std::mutex> lock(self->impl->lock);
        changed = policy != self->impl->size_policy;
        self->impl->size_policy = policy;
      }
      // Mid-stream: the output caps change, so negotiate again.
      if (changed) gst_base_transform_reconfigure_src(GST_BASE_TRANSFORM(self));
      break;
    }
    default:  // prefetch-depth, cuda-graphs
      G_OBJECT_CLASS(parent_class)->set_property(object, prop_id, value, pspec);
      break;
  }
}

static void gst_vae_encode_get_property(GObject* object, guint prop_id, GValue* value,
                                        GParamSpec* pspec) {
  GstVaeEncode* self = GST_VAE_ENCODE(object);
  switch (prop_id) {
    case PROP_SIZE_POLICY: {
      std::lock_guard<std::mutex> lock(self->impl->lock);
      g_value_set_enum(value, static_cast<gint>(self->impl->size_policy));
      break;
    }
    default:
      G_OBJECT_CLASS(parent_class)->get_property(object, prop_id, value, pspec);
      break;
  }
}

static latent::SizePolicy current_policy(GstVaeEncode* self) {
  std::lock_guard<std::mutex> lock(self->impl->lock);
  return self->impl->size_policy;
}

static GstCaps* gst_vae_encode_transform_caps(GstBaseTransform* trans, GstPadDirection direction,
                                              GstCaps* caps, GstCaps* filter) {
  GstVaeEncode* self = GST_VAE_ENCODE(trans);
  GstLatentBase* base = GST_LATENT_BASE(trans);
  auto model = gst_latent_base_get_model(base);
  const latent::SizePolicy policy = current_policy(self);
  const latent::DType dtype = gst_latent_base_preferred_dtype(base);
  int temporal_factor = 1;
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    if (self->impl->video) temporal_factor = self->impl->temporal_factor;
  }

  GstCaps* out = gst_latent_base_transform_caps(
      base, direction, caps, filter, [&](const GstStructure* s) -> GstStructure* {
        if (direction == GST_PAD_SINK && gst_structure_has_name(s, "video/x-raw"))
          return video_to_latent(s, model.get(), policy, dtype, temporal_factor);
        if (direction == GST_PAD_SRC && gst_structure_has_name(s, GST_LATENT_MEDIA_TYPE))
          return latent_to_video(s, model.get(), policy, temporal_factor);
        return nullptr;
      });
  GST_DEBUG_OBJECT(self, "%s caps %" GST_PTR_FORMAT " -> %" GST_PTR_FORMAT,
                   direction == GST_PAD_SINK ? "sink" : "src", caps, out);
  return out;
}

static GstCaps* gst_vae_encode_fixate_caps(GstBaseTransform* trans, GstPadDirection direction,
                                           GstCaps*, GstCaps* othercaps) {
  othercaps = gst_caps_make_writable(gst_caps_truncate(othercaps));
  if (direction == GST_PAD_SINK) {
    // Prefer handing latents over in the model's compute dtype (no conversion downstream).
    const latent::DType dtype = gst_latent_base_preferred_dtype(GST_LATENT_BASE(trans));
    gst_structure_fixate_field_string(gst_caps_get_structure(othercaps, 0), "format",
                                      latent::dtype_name(dtype));
  }
  return gst_caps_fixate(othercaps);
}

static gboolean gst_vae_encode_set_info(GstLatentBase* base, GstCaps* incaps, GstCaps* outcaps) {
  GstVaeEncode* self = GST_VAE_ENCODE(base);
  auto model = gst_latent_base_get_model(base);
  if (!model) {
    GST_ERROR_OBJECT(self, "caps set before a model was loaded");
    return FALSE;
  }
  Negotiated n;
  if (!gst_video_info_from_caps(&n.in_info, incaps)) {
    GST_ERROR_OBJECT(self, "invalid input caps %" GST_PTR_FORMAT, incaps);
    return FALSE;
  }
  const GstVideoFormat vformat = GST_VIDEO_INFO_FORMAT(&n.in_info);
  if (vformat == GST_VIDEO_FORMAT_NV12 || vformat == GST_VIDEO_FORMAT_I420) {
    n.frame_format =
        vformat == GST_VIDEO_FORMAT_NV12 ? latent::FrameFormat::kNV12 : latent::FrameFormat::kI420;
    const GstVideoColorimetry& c = GST_VIDEO_INFO_COLORIMETRY(&n.in_info);
    n.color.full_range = c.range == GST_VIDEO_COLOR_RANGE_0_255;
    n.color.matrix = c.matrix == GST_VIDEO_COLOR_MATRIX_BT709    ? latent::YuvMatrix::kBT709
                     : c.matrix == GST_VIDEO_COLOR_MATRIX_BT2020 ? latent::YuvMatrix::kBT2020
                                                                 : latent::YuvMatrix::kBT601;
  } else {
    auto format = gst_latent_pixel_format(vformat);
    if (!format.ok()) {
      GST_ERROR_OBJECT(self, "%s", format.status().message().c_str());
      return FALSE;
    }
    n.frame_format = latent::frame_format(*format);
  }
  auto info = gst_latent_info_from_caps(outcaps);
  if (!info.ok()) {
    GST_ERROR_OBJECT(self, "output caps %" GST_PTR_FORMAT ": %s", outcaps,
                     info.status().message().c_str());
    return FALSE;
  }
  n.out_info = *info;
  const latent::LatentSpace& space = model->latent_space();
  const int w = GST_VIDEO_INFO_WIDTH(&n.in_info), h = GST_VIDEO_INFO_HEIGHT(&n.in_info);
  auto geometry = latent::plan_frame_geometry(w, h, space.downsample, info->size_policy);
  std::string problem;
  if (info->latent_space != space.name || info->channels != space.channels) {
    problem = latent::str_cat("output caps ask for ", info->channels, "-channel '",
                              info->latent_space, "' latents but ", model->describe(), " makes ",
                              space.channels, "-channel '", space.name, "' latents");
  } else if (!geometry.ok()) {
    problem = geometry.status().message();
  } else if (info->width != geometry->latent_width() || info->height != geometry->latent_height() ||
             info->frame_width != w || info->frame_height != h) {
    problem =
        latent::str_cat("output caps ", info->width, "x", info->height, " (frame ",
                        info->frame_width, "x", info->frame_height, ") do not match a ", w, "x", h,
                        " frame under size-policy ", latent::size_policy_name(info->size_policy),
                        " (latent ", geometry->latent_width(), "x", geometry->latent_height(), ")");
  }
  if (!problem.empty()) return gst_latent_base_refuse_caps(base, incaps, "vaeencode: " + problem);
  n.geometry = *geometry;
  n.cuda_in = gst_latent_caps_is_cuda(incaps);
  n.cuda_out = gst_latent_caps_is_cuda(outcaps);
  GST_INFO_OBJECT(self, "frames in %s memory, latents out in %s memory",
                  n.cuda_in ? "CUDA" : "system", n.cuda_out ? "CUDA" : "system");
  GST_INFO_OBJECT(self, "%dx%d %s -> %s latent [%d, %d, %d] (%s, model input %dx%d)", w, h,
                  latent::frame_format_name(n.frame_format), latent::dtype_name(info->dtype),
                  info->channels, info->height, info->width,
                  latent::size_policy_name(info->size_policy), geometry->model_width(),
                  geometry->model_height());
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    n.video = self->impl->video;
  }
  if (n.video) {
    // Video mode runs the engine's stream (not captured as a graph): nothing to plan. The
    // frames waiting for a chunk count in LATENCY answers.
    gst_latent_base_set_frames_held(base, gst_latent_model_encoder_frames_held(*model));
    std::lock_guard<std::mutex> lock(self->impl->lock);
    self->impl->stream = n;
    self->impl->negotiated = true;
    return TRUE;
  }
  // The encoder's plan for this input size (warm-up, CUDA graph), before the first frame.
  const latent::Status planned = gst_latent_base_plan_for(
      GST_LATENT_BASE(self), *model, latent::VaePart::kEncode,
      [&](latent::Backend& b) { return latent::zero_image_tensor(b, n.geometry); });
  if (!planned.ok()) {
    GST_ELEMENT_ERROR(self, STREAM, FAILED,
                      ("vaeencode: cannot prepare %s for %dx%d frames: %s",
                       model->describe().c_str(), w, h, planned.message().c_str()),
                      ("model input %dx%d on %s", n.geometry.model_width(),
                       n.geometry.model_height(), model->backend->name().c_str()));
    return FALSE;
  }
  std::lock_guard<std::mutex> lock(self->impl->lock);
  self->impl->stream = n;
  self->impl->negotiated = true;
  return TRUE;
}

static gboolean gst_vae_encode_transform_size(GstBaseTransform* trans, GstPadDirection direction,
                                              GstCaps*, gsize, GstCaps* othercaps,
                                              gsize* othersize) {
  // One frame in, one latent out, whatever the input buffer's size (transform() checks it).
  return gst_latent_base_transform_size(GST_LATENT_BASE(trans), othercaps,
                                        direction == GST_PAD_SINK, othersize);
}

static gboolean gst_vae_encode_propose_allocation(GstBaseTransform* trans, GstQuery* decide_query,
                                                  GstQuery* query) {
  if (!GST_BASE_TRANSFORM_CLASS(parent_class)->propose_allocation(trans, decide_query, query))
    return FALSE;
  // (The base class offered a latent pool: not for video caps.) Strided frames are fine: the frame
  // is read through GstVideoFrame.
  gst_query_add_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
  GstCaps* caps = nullptr;
  gst_query_parse_allocation(query, &caps, nullptr);
  if (caps && gst_latent_caps_is_cuda(caps) && gst_query_get_n_allocation_pools(query) == 0) {
    // Upstream (cudaupload, a decoder) may write frames straight into our context's memory.
    GstBufferPool* pool = gst_latent_base_cuda(GST_LATENT_BASE(trans))->new_video_pool(caps, 0, 0);
    GstVideoInfo info;
    if (pool && gst_video_info_from_caps(&info, caps))
      gst_query_add_allocation_pool(query, pool, GST_VIDEO_INFO_SIZE(&info), 0, 0);
    if (pool) gst_object_unref(pool);
  } else if (caps && !gst_latent_caps_is_cuda(caps)) {
    // Frames in system memory on a GPU with prefetching: upstream may write them into
    // page-locked buffers, which the stager uploads in place (no copy on the streaming thread).
    // Enough for the frames held back, the one converted and the one upstream fills.
    // On by default (H100, 1080p, default model, source behind a queue: 163-179 -> 209-233
    // frames/s, bench/NOTES.md session 35); LATENT_PINNED_INPUT=0 offers no pool, for A/Bs.
    const guint depth = gst_latent_base_prefetch_depth(GST_LATENT_BASE(trans));
    const bool offer =
        latent::env_choice("LATENT_PINNED_INPUT", {{"0", "off"}, {"1", "on"}}, 1) == 1;
    if (depth > 0 && offer)
      gst_latent_cuda_propose_pinned_pool(gst_latent_base_cuda(GST_LATENT_BASE(trans)), query,
                                          depth + 2);
  }
  return TRUE;
}

// The input frame `frame` (mapped from `buffer`; its planes host pointers, or device pointers
// on `device`) as the engine's FrameDesc, `pinned` where the host planes lie in one of our
// page-locked buffers (propose_allocation), which a stager uploads in place.
static latent::FrameDesc input_desc(const Negotiated& n, const GstVideoFrame& frame,
                                    GstBuffer* buffer, latent::Device device = latent::Device()) {
  latent::FrameDesc desc;
  desc.format = n.frame_format;
  desc.width = GST_VIDEO_FRAME_WIDTH(&frame);
  desc.height = GST_VIDEO_FRAME_HEIGHT(&frame);
  desc.color = n.color;
  desc.device = device;
  for (guint i = 0; i < GST_VIDEO_FRAME_N_PLANES(&frame) && i < 3; ++i) {
    desc.planes[i] = GST_VIDEO_FRAME_PLANE_DATA(&frame, i);
    desc.strides[i] = GST_VIDEO_FRAME_PLANE_STRIDE(&frame, i);
  }
  desc.pinned = device.is_cpu() && gst_latent_buffer_is_pinned(buffer);
  return desc;
}

// A frame -> model input [1, 3, H, W] on the model's backend: its planes go
// to the device as raw bytes and are converted there (engine/backends/frames.h).
// Frames in CUDA memory of our context are read in place on the device (no host copy); any
// other buffer through a system-memory mapping.
// `wait_for_read`: a frame in device memory has been read when this returns, so the caller may
// hand its buffer back to upstream's pool at once (video mode, which does not wait for the
// frame's latent before taking the next frame; image mode waits for the latent anyway). The
// wait is for the work queued on the shared stream so far, without the run lock held.
// `stager` (video mode on a GPU): the frame is staged (copied out, without the run lock) and
// converted from its slot instead, so the caller may hand the buffer back at once without
// waiting for the shared stream.
// `into` (image mode with a plan): the plan's input buffer, which the frame is converted into.
static latent::Result<latent::Tensor> read_frame(GstVaeEncode* self, const Negotiated& n,
                                                 GstBuffer* inbuf, GstLatentModel& model,
                                                 bool wait_for_read = false,
                                                 latent::FrameStager* stager = nullptr,
                                                 const latent::Tensor* into = nullptr) {
  GstVideoFrame frame;
  GstLatentCuda* cuda = gst_latent_base_cuda(GST_LATENT_BASE(self));
  const bool on_device = n.cuda_in && cuda->map_frame(&frame, &n.in_info, inbuf, GST_MAP_READ);
  if (!on_device &&
      !gst_video_frame_map(&frame, const_cast<GstVideoInfo*>(&n.in_info), inbuf, GST_MAP_READ)) {
    return latent::Status::errorf("input buffer of ", gst_buffer_get_size(inbuf),
                                  " bytes does not hold a ", GST_VIDEO_INFO_WIDTH(&n.in_info), "x",
                                  GST_VIDEO_INFO_HEIGHT(&n.in_info), " ",
                                  latent::frame_format_name(n.frame_format), " frame (",
                                  GST_VIDEO_INFO_SIZE(&n.in_info), " bytes)");
  }
  // A frame in our page-locked buffers uploads in place; convert() below waits for that copy,
  // and the caller keeps `inbuf` until then.
  const latent::FrameDesc desc =
      input_desc(n, frame, inbuf, on_device ? cuda->device() : latent::Device());
  if (stager) {
    latent::Result<uint64_t> ticket = stager->stage(desc);
    gst_video_frame_unmap(&frame);
    if (!ticket.ok()) return ticket.status();
    std::lock_guard<std::mutex> lock(*model.run_lock);
    return stager->convert(*ticket, n.geometry);
  }
  latent::Result<latent::Tensor> t = latent::Status::error("unset");
  std::unique_ptr<latent::DeviceFence> read;
  latent::Status waited;
  {
    std::lock_guard<std::mutex> lock(*model.run_lock);
    t = latent::frame_to_tensor(*model.backend, desc, n.geometry, into);
    if (t.ok() && on_device && wait_for_read) {
      auto fence = model.backend->fence();
      if (fence.ok())
        read = std::move(*fence);
      else
        waited = fence.status();
    }
  }
  if (read) waited = read->wait();
  gst_video_frame_unmap(&frame);
  if (!waited.ok()) {
    std::lock_guard<std::mutex> lock(*model.run_lock);  // device memory: freed under the lock
    t = waited;
  }
  return t;
}

// sample [1, 3, H, W] on the backend -> normalised latent [1, C, h, w] on the backend (the
// caller holds model.run_lock). The plan's output buffer is consumed by normalize() (a fresh
// tensor) before the next frame's replay.
static latent::Result<latent::Tensor> encode_frame(GstVaeEncode* self, GstLatentModel& model,
                                                   const latent::Tensor& sample) {
  latent::Backend& b = *model.backend;
  LATENT_ASSIGN_OR_RETURN(
      latent::Tensor raw,
      gst_latent_base_run_part(GST_LATENT_BASE(self), model, latent::VaePart::kEncode, sample));
  return model.latent_space().normalize(b, raw);
}

// Latent [1, C, h, w] on the backend -> `outbuf`: in place on the device when it is CUDA memory
// of our context, else downloaded and converted to the caps' dtype on the host. The caller holds
// model.run_lock. Returns a message on failure. A latent in CUDA memory is queued after the reads
// of the buffer's last latent and carries its write's fence (GstLatentFenceMeta); it is complete
// once *done's wait() returns, which the caller calls (after releasing the run lock: the other
// stages on the backend keep the device busy meanwhile) unless every reader downstream orders
// its reads by the fence. One in system memory is complete on return (*done stays null).
static std::string write_latent(GstVaeEncode* self, const Negotiated& n, GstLatentModel& model,
                                const latent::Tensor& latents, GstBuffer* outbuf,
                                std::shared_ptr<latent::DeviceFence>* done) {
  const size_t bytes = n.out_info.frame_bytes();
  GstMapInfo map;
  if (n.cuda_out && gst_latent_base_cuda(GST_LATENT_BASE(self))->map(outbuf, &map, GST_MAP_WRITE)) {
    std::string problem;
    if (map.size < bytes) {
      problem = latent::str_cat("output buffer of ", map.size, " bytes is smaller than a latent (",
                                bytes, ")");
    } else {
      auto written = gst_latent_buffer_write_latent(outbuf, *model.backend, latents, map.data,
                                                    n.out_info.dtype);
      if (written.ok())
        *done = std::move(*written);
      else
        problem = written.status().message();
    }
    gst_buffer_unmap(outbuf, &map);
    return problem;  // the buffer keeps the pool's (pitched) size, see gstlatentcuda.h
  }
  auto host = model.backend->download(latents);
  if (!host.ok()) return host.status().message();
  if (!gst_buffer_map(outbuf, &map, GST_MAP_WRITE)) return "cannot map the output buffer";
  if (map.size < bytes) {
    gst_buffer_unmap(outbuf, &map);
    return latent::str_cat("output buffer of ", map.size, " bytes is smaller than a latent (",
                           bytes, ")");
  }
  latent::convert_elements(host->data(), host->dtype(), map.data, n.out_info.dtype,
                           static_cast<size_t>(host->numel()));
  gst_buffer_unmap(outbuf, &map);
  gst_buffer_set_size(outbuf, bytes);
  return std::string();
}

static GstFlowReturn gst_vae_encode_transform(GstBaseTransform* trans, GstBuffer* inbuf,
                                              GstBuffer* outbuf) {
  GstVaeEncode* self = GST_VAE_ENCODE(trans);
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(trans));
  Negotiated n;
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    if (!self->impl->negotiated || !model) {
      GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, (nullptr), ("buffer before caps were set"));
      return GST_FLOW_NOT_NEGOTIATED;
    }
    n = self->impl->stream;
  }
  const gint64 started_us = g_get_monotonic_time();

  latent::Result<latent::Tensor> sample = latent::Status::error("unset");
  Prefetch& pf = self->impl->prefetch;
  // With a plan, the frame is converted straight into the plan's input buffer: it then runs
  // with no copy and no frame-sized tensor beside the plan's (one input less at the peak).
  latent::Tensor plan_in =
      gst_latent_base_plan_input(GST_LATENT_BASE(self), latent::VaePart::kEncode,
                                 {1, 3, n.geometry.model_height(), n.geometry.model_width()});
  // (Plans with graphs are CUDA's, whose images are NHWC; anything else is not offered.)
  const latent::Tensor* into = plan_in.defined() &&
                                       plan_in.dtype() == model->backend->compute_dtype() &&
                                       plan_in.layout() == latent::Layout::kNHWC
                                   ? &plan_in
                                   : nullptr;
  if (pf.has_current) {
    std::lock_guard<std::mutex> lock(*model->run_lock);
    pf.current_converted = true;
    sample = pf.stager->convert(pf.current.ticket, n.geometry, into);
  } else {
    sample = read_frame(self, n, inbuf, *model, false, nullptr, into);
  }
  {
    // Our handle on the plan's buffer goes under the lock, like every device tensor (a plan
    // dropped meanwhile would otherwise be freed here, off the shared stream's order).
    std::lock_guard<std::mutex> lock(*model->run_lock);
    plan_in = latent::Tensor();
  }
  if (!sample.ok()) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("vaeencode: %s", sample.status().message().c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  std::unique_lock<std::mutex> run(*model->run_lock);
  latent::Result<latent::Tensor> latents = encode_frame(self, *model, *sample);
  // Device tensors are freed on the shared stream: only under the run lock.
  auto release = [&] {
    sample = latent::Status::error("released");
    latents = latent::Status::error("released");
    run.unlock();
  };
  if (!latents.ok()) {
    const std::string message = latents.status().message();
    release();
    GST_ELEMENT_ERROR(
        self, STREAM, FAILED,
        ("vaeencode: encoding a %dx%d frame with %s failed: %s", n.geometry.frame_width(),
         n.geometry.frame_height(), model->describe().c_str(), message.c_str()),
        (nullptr));
    return GST_FLOW_ERROR;
  }
  const latent::Shape want{1, n.out_info.channels, n.out_info.height, n.out_info.width};
  if (latents->shape() != want) {
    const std::string got = latents->describe();
    release();
    GST_ELEMENT_ERROR(self, STREAM, FAILED,
                      ("vaeencode: %s returned %s, expected %s", model->describe().c_str(),
                       got.c_str(), latent::shape_str(want).c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  std::shared_ptr<latent::DeviceFence> done;
  std::string problem = write_latent(self, n, *model, *latents, outbuf, &done);
  release();
  if (latent::Status st = gst_latent_base_wait_unless_ordered(GST_LATENT_BASE(self), done.get());
      !st.ok() && problem.empty())
    problem = st.message();
  if (!problem.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("vaeencode: %s", problem.c_str()), (nullptr));
    return GST_FLOW_ERROR;
  }
  gst_latent_base_frame_done(GST_LATENT_BASE(self),
                             (g_get_monotonic_time() - started_us) * GST_USECOND);
  return GST_FLOW_OK;
}

// ---- video mode: frames go through the encoder's causal stream (engine/models/vae/vae.h) ----
//
// Each frame is converted as in image mode, joined into the clip ([1, 3, 1, H, W]) and pushed
// into the stream; every latent frame the stream completes is queued (submit_input_buffer) and
// handed out one at a time (generate_output), so one output buffer is taken from the pool at a
// time. Latent frame j covers frames 4j-3 .. 4j of the clip (frame 0 alone for j = 0), whatever
// the model's own chunking (TAEW completes it 3 frames later than Wan's VAE): PTS of its first
// frame, DURATION of all it covers, OFFSET the first frame's index in the clip and OFFSET_END
// one past the last real frame (a chunk padded at the end of a clip covers fewer).

// Forgets the clip's bookkeeping: the next frame starts a new clip (offsets from 0).
static void video_new_clip(VideoEncode& v) {
  v.frames.clear();
  v.first_frame = 0;
  v.frames_in = 0;
  v.latents_out = 0;
  v.discont = true;
}

// Raw latent frames [1, C, t, h, w] from the stream -> normalised, queued with the fields of
// the frames they cover. The caller holds model.run_lock.
static latent::Status video_queue(GstVaeEncode* self, GstLatentModel& model,
                                  const latent::Tensor& raw) {
  VideoEncode& v = self->impl->clip;
  latent::Backend& b = *model.backend;
  // frames: [t, C, h, w]
  LATENT_ASSIGN_OR_RETURN(latent::Tensor frames, b.clip_to_frames(raw));
  LATENT_ASSIGN_OR_RETURN(latent::Tensor norm, model.latent_space().normalize(b, frames));
  const int64_t f = self->impl->temporal_factor;
  for (int64_t i = 0; i < norm.dim(0); ++i) {
    const int64_t j = v.latents_out++;
    const int64_t first = j == 0 ? 0 : f * (j - 1) + 1;
    const int64_t end = std::min<int64_t>(f * j + 1, v.frames_in);
    if (first >= end || first < v.first_frame || v.frames.empty()) {
      GST_WARNING_OBJECT(self,
                         "latent frame %" G_GINT64_FORMAT
                         " covers no frame of the clip "
                         "(%" G_GINT64_FORMAT " frames in): dropped",
                         j, v.frames_in);
      continue;
    }
    VideoLatent out;
    out.latent = latent::frame_view(norm, i);
    out.offset = static_cast<guint64>(first);
    out.offset_end = static_cast<guint64>(end);
    out.discont = v.discont;
    v.discont = false;
    out.pts = v.frames.front().pts;
    GstClockTime duration = 0;
    for (int64_t k = first; k < end && !v.frames.empty(); ++k) {
      const GstClockTime d = v.frames.front().duration;
      duration = GST_CLOCK_TIME_IS_VALID(duration) && GST_CLOCK_TIME_IS_VALID(d)
                     ? duration + d
                     : GST_CLOCK_TIME_NONE;
      v.frames.pop_front();
      ++v.first_frame;
    }
    out.duration = duration;
    v.ready.push_back(std::move(out));
  }
  return latent::ok_status();
}

// Ends the clip: a partial chunk is completed by repeating its last frame (VaeStream::finish)
// and its latent queued, covering only the real frames. The caller holds model.run_lock.
static latent::Status video_finish(GstVaeEncode* self, GstLatentModel& model) {
  VideoEncode& v = self->impl->clip;
  latent::Status status;
  if (v.stream && v.frames_in > 0) {
    int padded = 0;
    auto tail = v.stream->finish(&padded);
    if (!tail.ok()) {
      status = tail.status();
    } else if (tail->defined()) {
      GST_DEBUG_OBJECT(self,
                       "clip of %" G_GINT64_FORMAT
                       " frames ends; last chunk padded with %d "
                       "repeated frames",
                       v.frames_in, padded);
      status = video_queue(self, model, *tail);
    }
  }
  if (v.stream) v.stream->reset();
  video_new_clip(v);
  return status;
}

// Drops the clip (a flush, new caps, stop): its stream, queued latents and bookkeeping.
static void video_drop(GstVaeEncode* self) {
  VideoEncode& v = self->impl->clip;
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(self));
  {
    std::unique_lock<std::mutex> run;
    if (model) run = std::unique_lock<std::mutex>(*model->run_lock);  // device tensors go here
    v.ready.clear();
    v.stream.reset();
  }
  video_new_clip(v);
  v.draining = false;
  v.stager.reset();  // waits for its copies and conversions (events), then frees its slots
  v.stager_checked = false;
}

// Video mode's stager for this run (null: frames are read in turn), made on the first frame.
// At least a chunk of frames (4) may wait for their conversion, so that a clip collects its
// next chunk while another stage's work holds the shared stream.
static latent::FrameStager* video_stager(GstVaeEncode* self, GstLatentModel& model) {
  VideoEncode& v = self->impl->clip;
  if (v.stager_checked) return v.stager.get();
  v.stager_checked = true;
  const guint depth = gst_latent_base_prefetch_depth(GST_LATENT_BASE(self));
  if (depth == 0) return nullptr;
  auto stager = latent::create_frame_stager(*model.backend, std::max<int>(depth, 4));
  if (!stager.ok()) {
    GST_WARNING_OBJECT(self, "frames are read in turn: %s", stager.status().message().c_str());
    return nullptr;
  }
  v.stager = std::move(*stager);
  return v.stager.get();
}

static GstFlowReturn video_submit(GstVaeEncode* self, const Negotiated& n, GstLatentModel& model,
                                  gboolean, GstBuffer* input) {
  VideoEncode& v = self->impl->clip;
  const gint64 started_us = g_get_monotonic_time();
  std::string problem;
  // The buffer's own flag: GstBaseTransform's is_discont stays set until its default
  // generate_output (not used in video mode) clears it.
  if (GST_BUFFER_IS_DISCONT(input) && v.frames_in > 0) {
    // A discontinuity starts a new clip: the frames before it are finished as at EOS.
    GST_DEBUG_OBJECT(self, "discontinuity after %" G_GINT64_FORMAT " frames: a new clip starts",
                     v.frames_in);
    std::lock_guard<std::mutex> run(*model.run_lock);
    if (latent::Status st = video_finish(self, model); !st.ok()) problem = st.message();
  }
  latent::Result<latent::Tensor> sample = latent::Status::error("unset");
  const bool trace = gst_latent_trace_enabled();
  const int64_t index = v.frames_in;  // this frame's index in the clip (the marks' n)
  if (trace) gst_latent_trace_mark(GST_LATENT_BASE(self), *model.backend, "in", index);
  if (problem.empty()) {
    sample = read_frame(self, n, input, model, /*wait_for_read=*/true, video_stager(self, model));
    if (!sample.ok()) {
      const std::string message = sample.status().message();
      gst_buffer_unref(input);
      GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("vaeencode: %s", message.c_str()), (nullptr));
      return GST_FLOW_ERROR;
    }
  }
  std::unique_lock<std::mutex> run(*model.run_lock);
  if (trace) gst_latent_trace_mark(GST_LATENT_BASE(self), *model.backend, "locked", index);
  if (problem.empty() && !v.stream) {
    auto stream = model.vae->open_stream(true);
    if (stream.ok())
      v.stream = std::move(*stream);
    else
      problem = stream.status().message();
  }
  if (problem.empty()) {
    latent::Result<latent::Tensor> clip =
        model.backend->frames_to_clip(*sample);  // [1, 3, 1, H, W]
    v.frames.push_back(VideoFrame{GST_BUFFER_PTS(input), GST_BUFFER_DURATION(input)});
    ++v.frames_in;
    latent::Result<latent::Tensor> raw =
        clip.ok() ? v.stream->push(*clip) : latent::Result<latent::Tensor>(clip.status());
    if (!raw.ok())
      problem = raw.status().message();
    else if (raw->defined())
      if (latent::Status st = video_queue(self, model, *raw); !st.ok()) problem = st.message();
    clip = latent::Status::error("released");
    raw = latent::Status::error("released");
  }
  sample = latent::Status::error("released");  // device memory: under the run lock
  if (trace) gst_latent_trace_mark(GST_LATENT_BASE(self), *model.backend, "out", index);
  run.unlock();
  gst_buffer_unref(input);
  if (!problem.empty()) {
    GST_ELEMENT_ERROR(
        self, STREAM, FAILED,
        ("vaeencode: encoding %dx%d video with %s failed: %s", n.geometry.frame_width(),
         n.geometry.frame_height(), model.describe().c_str(), problem.c_str()),
        (nullptr));
    return GST_FLOW_ERROR;
  }
  gst_latent_base_frame_done(GST_LATENT_BASE(self),
                             (g_get_monotonic_time() - started_us) * GST_USECOND);
  return GST_FLOW_OK;
}

// Hands out the oldest queued latent frame (none: *outbuf stays null).
static GstFlowReturn video_generate(GstVaeEncode* self, GstBuffer** outbuf) {
  VideoEncode& v = self->impl->clip;
  *outbuf = nullptr;
  if (v.ready.empty()) return GST_FLOW_OK;
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(self));
  Negotiated n;
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    n = self->impl->stream;
  }
  VideoLatent l = std::move(v.ready.front());
  v.ready.pop_front();
  auto release = [&] {
    if (!model) return;
    std::lock_guard<std::mutex> run(*model->run_lock);
    l.latent = latent::Tensor();
  };
  if (!model) return GST_FLOW_FLUSHING;
  GstBuffer* out = nullptr;
  const size_t bytes = n.out_info.frame_bytes();
  if (const GstFlowReturn ret = gst_latent_base_acquire_output(GST_LATENT_BASE(self), bytes, &out);
      ret != GST_FLOW_OK) {
    release();
    return ret;
  }
  std::string problem;
  std::shared_ptr<latent::DeviceFence> done;
  {
    std::lock_guard<std::mutex> run(*model->run_lock);
    problem = write_latent(self, n, *model, l.latent, out, &done);
    l.latent = latent::Tensor();
  }
  if (latent::Status st = gst_latent_base_wait_unless_ordered(GST_LATENT_BASE(self), done.get());
      !st.ok() && problem.empty())
    problem = st.message();
  if (!problem.empty()) {
    gst_buffer_unref(out);
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("vaeencode: %s", problem.c_str()), (nullptr));
    return GST_FLOW_ERROR;
  }
  GST_BUFFER_PTS(out) = l.pts;
  GST_BUFFER_DTS(out) = GST_CLOCK_TIME_NONE;
  GST_BUFFER_DURATION(out) = l.duration;
  GST_BUFFER_OFFSET(out) = l.offset;
  GST_BUFFER_OFFSET_END(out) = l.offset_end;
  if (l.discont)
    GST_BUFFER_FLAG_SET(out, GST_BUFFER_FLAG_DISCONT);
  else
    GST_BUFFER_FLAG_UNSET(out, GST_BUFFER_FLAG_DISCONT);
  GST_LOG_OBJECT(self,
                 "latent frame: frames %" G_GUINT64_FORMAT "..%" G_GUINT64_FORMAT
                 " pts %" GST_TIME_FORMAT " duration %" GST_TIME_FORMAT,
                 l.offset, l.offset_end, GST_TIME_ARGS(l.pts), GST_TIME_ARGS(l.duration));
  *outbuf = out;
  return GST_FLOW_OK;
}

// EOS, a new segment, new caps: the clip ends (its partial chunk padded) and every queued latent
// goes out.
static GstFlowReturn video_drain(GstVaeEncode* self) {
  VideoEncode& v = self->impl->clip;
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(self));
  if (model && v.frames_in > 0) {
    latent::Status st;
    {
      std::lock_guard<std::mutex> run(*model->run_lock);
      st = video_finish(self, *model);
    }
    if (!st.ok()) {
      GST_ELEMENT_ERROR(self, STREAM, FAILED,
                        ("vaeencode: finishing the clip with %s failed: %s",
                         model->describe().c_str(), st.message().c_str()),
                        (nullptr));
      return GST_FLOW_ERROR;
    }
  }
  return gst_latent_base_drain(
      GST_LATENT_BASE(self), &v.draining, [&] { return !v.ready.empty(); },
      [&](GstBuffer** out) { return video_generate(self, out); });
}

static bool video_mode(GstVaeEncode* self, Negotiated* n) {
  std::lock_guard<std::mutex> lock(self->impl->lock);
  if (n) *n = self->impl->stream;
  return self->impl->video;
}

// ---- prefetch: frames are staged on submission and converted `prefetch-depth` frames later ----

static void drop_prefetch(GstLatentBase* base) {
  GstVaeEncode* self = GST_VAE_ENCODE(base);
  Prefetch& pf = self->impl->prefetch;
  // The stager first: it waits for its copies and kernels (events), then frees its slots; only
  // then may the frames it uploaded in place go back upstream.
  pf.stager.reset();
  for (Pending& p : pf.pending) gst_buffer_unref(p.buffer);
  pf.pending.clear();
  pf.checked = false;
  pf.has_current = false;
  video_drop(self);
  auto model = gst_latent_base_get_model(base);
  gst_latent_base_set_frames_held(
      base, video_mode(self, nullptr) && model ? gst_latent_model_encoder_frames_held(*model) : 0);
}

// The stager for this run, created on the first frame when the model runs on a GPU.
static latent::FrameStager* prefetch_stager(GstVaeEncode* self, GstLatentModel& model) {
  Prefetch& pf = self->impl->prefetch;
  if (pf.checked) return pf.stager.get();
  pf.checked = true;
  const guint depth = gst_latent_base_prefetch_depth(GST_LATENT_BASE(self));
  if (depth == 0) return nullptr;
  auto stager = latent::create_frame_stager(*model.backend, static_cast<int>(depth));
  if (!stager.ok()) {
    GST_WARNING_OBJECT(self, "no prefetching (frames upload in turn): %s",
                       stager.status().message().c_str());
    return nullptr;
  }
  pf.stager = std::move(*stager);
  if (pf.stager)
    GST_INFO_OBJECT(self, "prefetching %u frames on %s", depth, model.backend->name().c_str());
  gst_latent_base_set_frames_held(GST_LATENT_BASE(self), pf.stager ? depth : 0);
  return pf.stager.get();
}

static GstFlowReturn gst_vae_encode_submit_input_buffer(GstBaseTransform* trans,
                                                        gboolean is_discont, GstBuffer* input) {
  GstVaeEncode* self = GST_VAE_ENCODE(trans);
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(trans));
  Negotiated n;
  bool negotiated;
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    negotiated = self->impl->negotiated;
    n = self->impl->stream;
  }
  // Video mode: no QoS dropping (a frame missing inside a chunk would break the causal stream)
  // and no frames held back (each is staged and converted as it comes; video_stager()).
  if (negotiated && model && n.video) return video_submit(self, n, *model, is_discont, input);
  // Frames already in device memory need no staging.
  latent::FrameStager* stager =
      negotiated && model && !n.cuda_in ? prefetch_stager(self, *model) : nullptr;
  if (!stager)
    return GST_BASE_TRANSFORM_CLASS(parent_class)->submit_input_buffer(trans, is_discont, input);
  // The base class's submission does the QoS check (a frame already late is dropped there, with
  // its QoS message, before anything is uploaded) and stashes the frame; take it back to stage it.
  const GstFlowReturn submitted =
      GST_BASE_TRANSFORM_CLASS(parent_class)->submit_input_buffer(trans, is_discont, input);
  if (submitted != GST_FLOW_OK) return submitted;
  input = trans->queued_buf;
  trans->queued_buf = nullptr;
  if (!input) return GST_FLOW_OK;
  GstVideoFrame frame;
  if (!gst_video_frame_map(&frame, &n.in_info, input, GST_MAP_READ)) {
    // transform() reports the bad buffer in its own words.
    trans->queued_buf = input;
    return GST_FLOW_OK;
  }
  const latent::FrameDesc desc = input_desc(n, frame, input);  // pinned: uploaded in place
  auto ticket = stager->stage(desc);
  gst_video_frame_unmap(&frame);
  if (!ticket.ok()) {
    gst_buffer_unref(input);
    GST_ELEMENT_ERROR(self, STREAM, FAILED,
                      ("vaeencode: cannot upload a %dx%d frame: %s", desc.width, desc.height,
                       ticket.status().message().c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  self->impl->prefetch.pending.push_back(Pending{input, *ticket, desc.pinned});
  return GST_FLOW_OK;
}

// A staged frame that transform() never converted (the base class refused it before transform(),
// e.g. a flush) still holds its slot of the stager's ring: convert it and drop
// the result, so the slot is free for the frame `depth` + 1 later (stage() refuses a busy slot).
static void release_staged(GstVaeEncode* self, uint64_t ticket) {
  Prefetch& pf = self->impl->prefetch;
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(self));
  latent::FrameGeometry geometry;
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    geometry = self->impl->stream.geometry;
  }
  if (!model || !pf.stager) return;
  std::lock_guard<std::mutex> run(*model->run_lock);  // the discarded tensor is freed under it
  auto discarded = pf.stager->convert(ticket, geometry);
  if (!discarded.ok())
    GST_DEBUG_OBJECT(self, "releasing a dropped frame's upload: %s",
                     discarded.status().message().c_str());
  GST_LOG_OBJECT(self, "released the upload of a frame dropped before encoding");
}

static GstFlowReturn gst_vae_encode_generate_output(GstBaseTransform* trans, GstBuffer** outbuf) {
  GstVaeEncode* self = GST_VAE_ENCODE(trans);
  if (!self->impl->clip.ready.empty()) return video_generate(self, outbuf);
  Prefetch& pf = self->impl->prefetch;
  if (pf.pending.empty())
    return GST_BASE_TRANSFORM_CLASS(parent_class)->generate_output(trans, outbuf);
  *outbuf = nullptr;
  const size_t depth = pf.stager ? static_cast<size_t>(pf.stager->depth()) : 0;
  if (pf.pending.size() <= depth && !pf.draining) return GST_FLOW_OK;
  pf.current = pf.pending.front();
  pf.pending.pop_front();
  pf.has_current = true;
  pf.current_converted = false;
  trans->queued_buf = pf.current.buffer;  // the base class takes it over
  // A frame uploaded in place is read by the copy engine until its conversion: keep it until
  // then, also when the base class drops it first (QoS) and release_staged() converts it.
  GstBuffer* keep = pf.current.pinned ? gst_buffer_ref(pf.current.buffer) : nullptr;
  const GstFlowReturn ret = GST_BASE_TRANSFORM_CLASS(parent_class)->generate_output(trans, outbuf);
  if (!pf.current_converted) release_staged(self, pf.current.ticket);
  if (keep) gst_buffer_unref(keep);
  pf.has_current = false;
  return ret;
}

// Pushes out every frame still held back (before EOS and before new caps).
static GstFlowReturn drain_prefetch(GstLatentBase* base) {
  if (video_mode(GST_VAE_ENCODE(base), nullptr)) return video_drain(GST_VAE_ENCODE(base));
  GstBaseTransform* trans = GST_BASE_TRANSFORM(base);
  Prefetch& pf = GST_VAE_ENCODE(base)->impl->prefetch;
  return gst_latent_base_drain(
      base, &pf.draining, [&] { return !pf.pending.empty(); },
      [&](GstBuffer** out) { return gst_vae_encode_generate_output(trans, out); });
}

// Held frames were dropped by the base class's stop().
static void gst_vae_encode_close(GstLatentBase* base) {
  GstVaeEncode* self = GST_VAE_ENCODE(base);
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    self->impl->negotiated = false;
    self->impl->video = false;
    self->impl->temporal_factor = 1;
  }
}

// After the model is loaded: resolves `mode` for it.
static gboolean gst_vae_encode_open(GstLatentBase* base, const std::shared_ptr<latent::Backend>&) {
  GstVaeEncode* self = GST_VAE_ENCODE(base);
  auto model = gst_latent_base_get_model(base);
  if (!model) return FALSE;
  GstLatentVaeMode mode;
  if (!gst_latent_base_checked_vae_mode(base, *model, &mode)) return FALSE;
  bool video = mode == GST_LATENT_VAE_MODE_VIDEO ||
               (mode == GST_LATENT_VAE_MODE_AUTO && gst_latent_model_video_by_default(*model));
  GST_INFO_OBJECT(self, "%s mode (%s, temporal factor %d)", video ? "video" : "image",
                  model->vae->info().architecture.c_str(), model->vae->temporal_factor());
  std::lock_guard<std::mutex> lock(self->impl->lock);
  self->impl->video = video;
  self->impl->temporal_factor = video ? model->vae->temporal_factor() : 1;
  return TRUE;
}

static void gst_vae_encode_class_init(GstVaeEncodeClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  GstElementClass* element_class = GST_ELEMENT_CLASS(klass);
  GstBaseTransformClass* trans_class = GST_BASE_TRANSFORM_CLASS(klass);

  GST_DEBUG_CATEGORY_INIT(gst_vae_encode_debug, "vaeencode", 0, "VAE encoder");

  gobject_class->set_property = gst_vae_encode_set_property;
  gobject_class->get_property = gst_vae_encode_get_property;

  g_object_class_install_property(
      gobject_class, PROP_SIZE_POLICY,
      g_param_spec_enum("size-policy", "Size policy",
                        "How frames whose sides are not multiples of the model's downsampling "
                        "factor are fitted to it (vaedecode undoes it)",
                        GST_TYPE_LATENT_SIZE_POLICY, static_cast<gint>(kDefaultSizePolicy),
                        static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                                 GST_PARAM_MUTABLE_PLAYING)));

  gst_element_class_set_static_metadata(
      element_class, "VAE encoder", "Filter/Converter/Video",
      "Encodes video frames into a diffusion model's latent space with its VAE encoder. "
      "Example (pipelines/encode_decode.sh): gst-launch-1.0 videotestsrc num-buffers=30 ! "
      "video/x-raw,width=320,height=240 ! vaeencode ! vaedecode ! videoconvert ! vp8enc ! "
      "webmmux ! filesink location=out.webm",
      "gst-latent developers");
  gst_element_class_add_static_pad_template(element_class, &sink_template);
  gst_element_class_add_static_pad_template(element_class, &src_template);

  trans_class->transform_caps = GST_DEBUG_FUNCPTR(gst_vae_encode_transform_caps);
  trans_class->fixate_caps = GST_DEBUG_FUNCPTR(gst_vae_encode_fixate_caps);
  trans_class->transform_size = GST_DEBUG_FUNCPTR(gst_vae_encode_transform_size);
  trans_class->propose_allocation = GST_DEBUG_FUNCPTR(gst_vae_encode_propose_allocation);
  trans_class->transform = GST_DEBUG_FUNCPTR(gst_vae_encode_transform);
  trans_class->submit_input_buffer = GST_DEBUG_FUNCPTR(gst_vae_encode_submit_input_buffer);
  trans_class->generate_output = GST_DEBUG_FUNCPTR(gst_vae_encode_generate_output);

  GstLatentBaseClass* base_class = GST_LATENT_BASE_CLASS(klass);
  base_class->debug_category = gst_vae_encode_debug;
  gst_latent_base_class_install_plan_properties(base_class);
  base_class->parts = GST_LATENT_PART_ENCODER;
  base_class->drain_held = drain_prefetch;
  base_class->close = gst_vae_encode_close;
  base_class->open = gst_vae_encode_open;
  gst_latent_base_class_install_mode_property(base_class);
  base_class->set_info = gst_vae_encode_set_info;
  base_class->drop_held = drop_prefetch;
  gst_type_mark_as_plugin_api(GST_TYPE_LATENT_SIZE_POLICY, static_cast<GstPluginAPIFlags>(0));
}

static void gst_vae_encode_init(GstVaeEncode* self) {
  self->impl = new Impl();
  gst_latent_base_set_stage(GST_LATENT_BASE(self), self->impl);
}
