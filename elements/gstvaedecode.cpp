/**
 * SECTION:element-vaedecode
 * @title: vaedecode
 *
 * |[
 * gst-launch-1.0 videotestsrc num-buffers=30 ! video/x-raw,width=320,height=240 ! \
 *     vaeencode ! vaedecode ! videoconvert ! vp8enc ! webmmux ! filesink location=out.webm
 * ]| (pipelines/encode_decode.sh; pipelines/decode_latents.sh decodes a saved latent dump)
 *
 * Decodes latents (application/x-latent, as vaeencode or a denoiser makes them) back into
 * video frames with the decoder of a VAE. The output has the caps' `frame-width` x
 * `frame-height`: the model's output is cropped, extended or resized back according to the
 * caps' `size-policy`.
 *
 * Latents of another latent space (or channel count) than the model's are refused when caps
 * are negotiated, with an error naming both.
 *
 * On a CUDA device, application/x-latent(memory:CUDAMemory) input (from vaeencode or
 * ditdenoise on the same GPU) is read without a host copy, and video/x-raw(memory:CUDAMemory)
 * output (packed RGB formats) is written into a GstCudaBufferPool on the context it shares with
 * cudaconvert / cudadownload through GstContext; see vaeencode's second launch line.
 *
 * On a GPU the decoder is planned when caps are negotiated (warm-up, then a CUDA graph that each
 * latent replays; `cuda-graphs=false` keeps the plain forward). Frames in system memory are
 * downloaded through pinned memory on a copy stream while the next latents decode, and pushed
 * `prefetch-depth` frames later (or once their copy is done) with their own timestamps; EOS, a
 * new segment and new caps push them first, a flush drops them (`prefetch-depth=0`: each frame
 * is written before the next is decoded). LATENCY answers include the held frames. Where
 * downstream offers no pool or a generic one, the system-memory frames are page-locked buffers
 * (gst_latent_cuda_decide_pinned_pool) and the GPU copies each frame straight into the buffer
 * pushed; otherwise through a pinned slot and one host copy.
 *
 * Video-mode latents (caps `temporal-factor=4` from vaeencode mode=video or a video-mode latent
 * file; or `mode=video`) go through the causal video VAE's decoder:
 *
 * |[
 * gst-launch-1.0 latentsrc location=clip.safetensors ! \
 *     vaedecode model=/models/Wan2.1-T2V-1.3B-Diffusers ! \
 *     videoconvert ! vp8enc ! webmmux ! filesink location=clip.webm
 * ]| (pipelines/video_latents.sh)
 *
 * Latent frame 0 of a clip gives 1 frame, every later one 4, spread over the latent's PTS and
 * DURATION; frames beyond OFFSET_END - OFFSET (the chunk padded at the end of a clip) are
 * dropped, so a clip comes back with as many frames as went in. A DISCONT latent, a flush, a new
 * segment and new caps start a new clip. README "Video mode".
 */
#include "elements/gstvaedecode.h"

#include <cstring>
#include <deque>
#include <memory>
#include <mutex>

#include "elements/gstlatentcaps.h"
#include "engine/backends/frames.h"

GST_DEBUG_CATEGORY_STATIC(gst_vae_decode_debug);
#define GST_CAT_DEFAULT gst_vae_decode_debug

namespace {

#ifdef LATENT_HAVE_GST_CUDA
// Latents and frames may also stay in GPU memory (elements/gstlatentcuda.h).
#define VAE_DECODE_SINK_TEMPLATE GST_LATENT_CUDA_CAPS_TEMPLATE "; " GST_LATENT_CAPS_TEMPLATE
#define VAE_DECODE_SRC_TEMPLATE \
  GST_LATENT_CUDA_VIDEO_CAPS_TEMPLATE "; " GST_LATENT_VIDEO_CAPS_TEMPLATE
#else
#define VAE_DECODE_SINK_TEMPLATE GST_LATENT_CAPS_TEMPLATE
#define VAE_DECODE_SRC_TEMPLATE GST_LATENT_VIDEO_CAPS_TEMPLATE
#endif
GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS(VAE_DECODE_SINK_TEMPLATE));
GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(VAE_DECODE_SRC_TEMPLATE));

struct Negotiated {
  GstLatentInfo in_info;
  GstVideoInfo out_info;
  latent::PixelFormat pixel_format = latent::PixelFormat::kRGB;
  latent::FrameGeometry geometry;
  bool cuda_in = false;   // latents arrive in CUDA memory
  bool cuda_out = false;  // frames leave in CUDA memory
  bool video = false;     // video-mode latents: decoded through the causal stream
};

// ---- video mode ----
// A decoded frame ready to go out: a view [1, 3, H, W] of the decoded clip on the backend (freed
// under the run lock) and its buffer fields.
struct VideoFrameOut {
  latent::Tensor image;
  GstClockTime pts = GST_CLOCK_TIME_NONE;
  GstClockTime duration = GST_CLOCK_TIME_NONE;
  guint64 offset = GST_BUFFER_OFFSET_NONE;
  bool discont = false;
};

// The clip in progress; touched by the streaming thread only (and stop(), after streaming ended).
struct VideoDecode {
  std::unique_ptr<latent::VaeStream> stream;  // freed under the run lock
  std::deque<VideoFrameOut> ready;
  bool draining = false;
};

// A decoded frame whose download is under way (output staging on a GPU).
struct Pending {
  GstBuffer* buffer = nullptr;  // the output buffer (timestamps set), owned until pushed
  uint64_t ticket = 0;
  gint64 submit_us = 0;  // time its transform() took
  // The buffer is page-locked memory (gstlatentcuda.h) the GPU copies the frame straight into:
  // mapped for writing from the queue() until the fetch.
  bool direct = false;
  GstVideoFrame frame{};
};

// Output staging; touched by the streaming thread only (and stop(), after streaming ended).
struct Staging {
  bool checked = false;  // downloader created, or found unneeded, for this run
  std::unique_ptr<latent::FrameDownloader> downloader;
  std::deque<Pending> pending;
  bool draining = false;
  bool staged_current = false;  // transform() queued the frame instead of writing it
  Pending current;
};

struct Impl : GstLatentStage {
  std::mutex lock;
  Staging staging;
  bool negotiated = false;
  Negotiated stream;
  GstLatentVaeMode mode = GST_LATENT_VAE_MODE_AUTO;  // the setting, as start() found it
  VideoDecode clip;
};

// Empty when the latents described by `s` can be this model's; else a message for the user.
std::string model_mismatch(const GstStructure* s, const GstLatentModel& model) {
  const latent::LatentSpace& space = model.latent_space();
  const gchar* name = gst_structure_get_string(s, "latent-space");
  if (name && space.name != name)
    return latent::str_cat("vaedecode: latent space '", name, "' from upstream does not match ",
                           model.describe());
  int channels = 0;
  if (gst_structure_get_int(s, "channels", &channels) && channels != space.channels)
    return latent::str_cat("vaedecode: ", channels, "-channel latents from upstream do not match ",
                           model.describe(), " (", space.channels, " channels)");
  return std::string();
}

// Latent structure -> the video it decodes to. Another model's latents still transform (see
// video_to_latent); set_caps refuses them.
GstStructure* latent_to_video(const GstStructure* s) {
  GstStructure* out = gst_latent_video_structure_new();
  gst_latent_set_video_size(s, out);
  return out;
}

// Video structure (what downstream takes) -> the latents that would give it. The latent space
// and channel count are deliberately left open: a caps query that hid the model's space would
// make a mismatched upstream fail with a bare "not-negotiated"; set_caps refuses it instead, on
// the streaming thread, with one error naming both spaces.
GstStructure* video_to_latent(const GstStructure* s, latent::DType dtype) {
  GstStructure* out = gst_structure_new_empty(GST_LATENT_MEDIA_TYPE);
  gst_latent_set_format_list(out, dtype);
  gst_structure_set(out, "channels", GST_TYPE_INT_RANGE, 1, kGstLatentMaxChannels, nullptr);
  // The latent size depends on the size policy upstream chose; only the frame size follows.
  gst_structure_set(out, "width", GST_TYPE_INT_RANGE, 1, kGstLatentMaxSide, "height",
                    GST_TYPE_INT_RANGE, 1, kGstLatentMaxSide, nullptr);
  if (!gst_latent_copy_field(s, "width", out, "frame-width"))
    gst_structure_set(out, "frame-width", GST_TYPE_INT_RANGE, 1, kGstLatentMaxSide, nullptr);
  if (!gst_latent_copy_field(s, "height", out, "frame-height"))
    gst_structure_set(out, "frame-height", GST_TYPE_INT_RANGE, 1, kGstLatentMaxSide, nullptr);
  gst_latent_copy_field(s, "framerate", out, "framerate");
  return out;
}

}  // namespace

struct _GstVaeDecode {
  GstLatentBase parent;
  Impl* impl;
};

#define gst_vae_decode_parent_class parent_class
G_DEFINE_TYPE(GstVaeDecode, gst_vae_decode, GST_TYPE_LATENT_BASE)
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE(vaedecode, "vaedecode", GST_RANK_NONE, GST_TYPE_VAE_DECODE,
                                      gst_latent_element_init(plugin));

static GstCaps* gst_vae_decode_transform_caps(GstBaseTransform* trans, GstPadDirection direction,
                                              GstCaps* caps, GstCaps* filter) {
  const latent::DType dtype = gst_latent_base_preferred_dtype(GST_LATENT_BASE(trans));

  GstCaps* out = gst_latent_base_transform_caps(
      GST_LATENT_BASE(trans), direction, caps, filter, [&](const GstStructure* s) -> GstStructure* {
        if (direction == GST_PAD_SINK && gst_structure_has_name(s, GST_LATENT_MEDIA_TYPE))
          return latent_to_video(s);
        if (direction == GST_PAD_SRC && gst_structure_has_name(s, "video/x-raw"))
          return video_to_latent(s, dtype);
        return nullptr;
      });
  GST_DEBUG_OBJECT(trans, "%s caps %" GST_PTR_FORMAT " -> %" GST_PTR_FORMAT,
                   direction == GST_PAD_SINK ? "sink" : "src", caps, out);
  return out;
}

// Checks fixed latent caps against the model. On success fills *info and *geometry and returns
// ""; otherwise returns a sentence for the user.
static std::string check_input_caps(const GstCaps* caps, const GstLatentModel& model,
                                    GstLatentInfo* info, latent::FrameGeometry* geometry) {
  const std::string mismatch = model_mismatch(gst_caps_get_structure(caps, 0), model);
  if (!mismatch.empty()) return mismatch;
  auto parsed = gst_latent_info_from_caps(caps);
  if (!parsed.ok()) return "vaedecode: " + parsed.status().message();
  const int factor = model.latent_space().downsample;
  auto g = latent::plan_frame_geometry(parsed->frame_width, parsed->frame_height, factor,
                                       parsed->size_policy);
  if (!g.ok())
    return latent::str_cat("vaedecode: cannot restore a ", parsed->frame_width, "x",
                           parsed->frame_height, " frame: ", g.status().message());
  if (g->latent_width() != parsed->width || g->latent_height() != parsed->height)
    return latent::str_cat(
        "vaedecode: a ", parsed->width, "x", parsed->height, " latent does not fit a ",
        parsed->frame_width, "x", parsed->frame_height, " frame under size-policy ",
        latent::size_policy_name(parsed->size_policy), " with ", model.describe(),
        " (downsampling ", factor, ": expected ", g->latent_width(), "x", g->latent_height(), ")");
  *info = *parsed;
  *geometry = *g;
  return std::string();
}

static gboolean gst_vae_decode_set_info(GstLatentBase* base, GstCaps* incaps, GstCaps* outcaps) {
  GstVaeDecode* self = GST_VAE_DECODE(base);
  auto model = gst_latent_base_get_model(base);
  if (!model) {
    GST_ERROR_OBJECT(self, "caps set before a model was loaded");
    return FALSE;
  }
  Negotiated n;
  const std::string problem = check_input_caps(incaps, *model, &n.in_info, &n.geometry);
  if (!problem.empty()) return gst_latent_base_refuse_caps(base, incaps, problem);
  if (!gst_video_info_from_caps(&n.out_info, outcaps)) {
    GST_ERROR_OBJECT(self, "invalid output caps %" GST_PTR_FORMAT, outcaps);
    return FALSE;
  }
  auto format = gst_latent_pixel_format(GST_VIDEO_INFO_FORMAT(&n.out_info));
  if (!format.ok()) {
    GST_ERROR_OBJECT(self, "%s", format.status().message().c_str());
    return FALSE;
  }
  n.pixel_format = *format;
  {
    // Video mode: latents whose caps say temporal-factor > 1 (vaeencode mode=video, latentsrc
    // of a video-mode file), or mode=video for caps that do not say (absent means image mode).
    GstLatentVaeMode mode;
    {
      std::lock_guard<std::mutex> lock(self->impl->lock);
      mode = self->impl->mode;
    }
    const GstStructure* s = gst_caps_get_structure(incaps, 0);
    int factor = 0;
    const bool says = gst_structure_has_field(s, "temporal-factor");
    if (says && (!gst_structure_get_int(s, "temporal-factor", &factor) || factor < 1))
      return gst_latent_base_refuse_caps(
          base, incaps, "vaedecode: caps field 'temporal-factor' must be a positive integer");
    const int model_factor = model->vae->temporal_factor();
    std::string refusal;
    if (says && factor > 1 && mode == GST_LATENT_VAE_MODE_IMAGE)
      refusal = latent::str_cat("vaedecode: the latents are video-mode (temporal-factor=", factor,
                                ") but mode=image; use mode=auto or mode=video");
    else if (says && factor > 1 && factor != model_factor)
      refusal = latent::str_cat(
          "vaedecode: the latents are video-mode with temporal-factor=", factor, " but ",
          model->describe(), " (", model->vae->info().architecture, ") has ",
          model_factor > 1 ? latent::str_cat("temporal factor ", model_factor)
                           : std::string("no video mode"));
    else if (says && factor == 1 && mode == GST_LATENT_VAE_MODE_VIDEO)
      refusal =
          "vaedecode: mode=video but the latents are image-mode (temporal-factor=1); use "
          "mode=auto or mode=image";
    const bool video = says ? factor > 1 : mode == GST_LATENT_VAE_MODE_VIDEO;
    if (!refusal.empty()) return gst_latent_base_refuse_caps(base, incaps, refusal);
    n.video = video;
  }
  n.cuda_in = gst_latent_caps_is_cuda(incaps);
  n.cuda_out = gst_latent_caps_is_cuda(outcaps);
  GST_INFO_OBJECT(self, "latents in %s memory, frames out in %s memory",
                  n.cuda_in ? "CUDA" : "system", n.cuda_out ? "CUDA" : "system");
  const GstLatentInfo& info = n.in_info;
  if (GST_VIDEO_INFO_WIDTH(&n.out_info) != info.frame_width ||
      GST_VIDEO_INFO_HEIGHT(&n.out_info) != info.frame_height) {
    GST_ERROR_OBJECT(self, "output caps %dx%d differ from the frame size %dx%d",
                     GST_VIDEO_INFO_WIDTH(&n.out_info), GST_VIDEO_INFO_HEIGHT(&n.out_info),
                     info.frame_width, info.frame_height);
    return FALSE;
  }
  GST_INFO_OBJECT(self, "%s latent [%d, %d, %d] '%s' -> %dx%d %s (%s, model output %dx%d)",
                  latent::dtype_name(info.dtype), info.channels, info.height, info.width,
                  info.latent_space.c_str(), info.frame_width, info.frame_height,
                  latent::pixel_format_name(n.pixel_format),
                  latent::size_policy_name(info.size_policy), n.geometry.model_width(),
                  n.geometry.model_height());
  if (n.video) {
    // The engine's stream is not captured as a graph: nothing to plan.
    GST_INFO_OBJECT(self, "video mode: latent frame 0 -> 1 frame, every later one -> %d",
                    model->vae->temporal_factor());
    std::lock_guard<std::mutex> lock(self->impl->lock);
    self->impl->stream = n;
    self->impl->negotiated = true;
    return TRUE;
  }
  // The decoder's plan for this latent size (warm-up, CUDA graph), before the first latent.
  const latent::Status planned = gst_latent_base_plan_for(
      GST_LATENT_BASE(self), *model, latent::VaePart::kDecode,
      [&](latent::Backend& b) -> latent::Result<latent::Tensor> {
        auto example = latent::zero_latent_tensor(b, info.channels, info.height, info.width);
        if (example.ok()) example = model->latent_space().denormalize(b, *example);
        return example;
      });
  if (!planned.ok()) {
    GST_ELEMENT_ERROR(
        self, STREAM, FAILED,
        ("vaedecode: cannot prepare %s for %dx%d latents: %s", model->describe().c_str(),
         info.width, info.height, planned.message().c_str()),
        ("on %s", model->backend->name().c_str()));
    return FALSE;
  }
  std::lock_guard<std::mutex> lock(self->impl->lock);
  self->impl->stream = n;
  self->impl->negotiated = true;
  return TRUE;
}

static gboolean gst_vae_decode_transform_size(GstBaseTransform* trans, GstPadDirection direction,
                                              GstCaps*, gsize, GstCaps* othercaps,
                                              gsize* othersize) {
  // One latent in, one frame out, whatever the input buffer's size (transform() checks it).
  return gst_latent_base_transform_size(GST_LATENT_BASE(trans), othercaps, direction == GST_PAD_SRC,
                                        othersize);
}

// A latent buffer in system memory -> host tensor [1, C, h, w] in the caps' dtype.
static latent::Result<latent::Tensor> read_latent_sysmem(const GstLatentInfo& info,
                                                         GstBuffer* inbuf) {
  const size_t want = info.frame_bytes();
  const size_t have = gst_buffer_get_size(inbuf);
  // CUDA memory read through system memory may be larger (pitched, see gstlatentcuda.h).
  if (have != want && !(have > want && gst_latent_buffer_is_cuda(inbuf)))
    return latent::Status::errorf("latent buffer has ", have, " bytes, expected ", want, " for ",
                                  latent::dtype_name(info.dtype), "[", info.channels, ", ",
                                  info.height, ", ", info.width, "]");
  latent::Tensor t = latent::Tensor::empty({1, info.channels, info.height, info.width}, info.dtype);
  gst_buffer_extract(inbuf, 0, t.data(), want);
  return t;
}

// A latent buffer -> normalised latent [1, C, h, w] on the model's backend: CUDA memory of our
// context is copied device-to-device, after the latent's write and before its next one
// (GstLatentFenceMeta), anything else is read on the host and uploaded. The caller holds
// model.run_lock.
static latent::Result<latent::Tensor> read_latent(GstVaeDecode* self, const GstLatentInfo& info,
                                                  bool cuda_in, GstBuffer* inbuf,
                                                  GstLatentModel& model) {
  GstMapInfo map;
  if (cuda_in && gst_latent_base_cuda(GST_LATENT_BASE(self))->map(inbuf, &map, GST_MAP_READ)) {
    const size_t want = info.frame_bytes();
    latent::Result<latent::Tensor> t = latent::Status::error("unset");
    if (gst_buffer_get_size(inbuf) < want)
      t = latent::Status::errorf("latent buffer has ", gst_buffer_get_size(inbuf),
                                 " bytes, expected ", want, " for ", latent::dtype_name(info.dtype),
                                 "[", info.channels, ", ", info.height, ", ", info.width, "]");
    else
      t = gst_latent_buffer_read_latent(inbuf, *model.backend, map.data, info.dtype, info.channels,
                                        info.height, info.width);
    gst_buffer_unmap(inbuf, &map);
    return t;
  }
  // CUDA memory we cannot read in place (another device's) is downloaded by GStreamer, which
  // knows nothing of the write still queued on its writer's stream.
  LATENT_TRY(gst_latent_buffer_wait_written(inbuf));
  LATENT_ASSIGN_OR_RETURN(latent::Tensor host, read_latent_sysmem(info, inbuf));
  return model.backend->upload(host);
}

// Normalised latent [1, C, h, w] on the backend -> image [1, 3, H, W] (the caller holds
// model.run_lock). With a graph the image is the plan's output buffer: the caller converts it
// (tensor_to_frame, or the downloader's queued kernel) before the next frame's replay.
static latent::Result<latent::Tensor> decode_latent(GstVaeDecode* self, GstLatentModel& model,
                                                    const latent::Tensor& normalised) {
  latent::Backend& b = *model.backend;
  LATENT_ASSIGN_OR_RETURN(latent::Tensor raw, model.latent_space().denormalize(b, normalised));
  return gst_latent_base_run_part(GST_LATENT_BASE(self), model, latent::VaePart::kDecode, raw);
}

// The downloader for this run, created on the first frame when the model runs on a GPU and
// frames leave in system memory (null: frames are written in turn).
static latent::FrameDownloader* staging_downloader(GstVaeDecode* self, GstLatentModel& model) {
  Staging& st = self->impl->staging;
  if (st.checked) return st.downloader.get();
  st.checked = true;
  const guint depth = gst_latent_base_prefetch_depth(GST_LATENT_BASE(self));
  if (depth == 0) return nullptr;
  auto d = latent::create_frame_downloader(*model.backend, static_cast<int>(depth));
  if (!d.ok()) {
    GST_WARNING_OBJECT(self, "no output staging (frames download in turn): %s",
                       d.status().message().c_str());
    return nullptr;
  }
  st.downloader = std::move(*d);
  if (st.downloader)
    GST_INFO_OBJECT(self, "staging %u decoded frames through pinned memory on %s", depth,
                    model.backend->name().c_str());
  gst_latent_base_set_frames_held(GST_LATENT_BASE(self), st.downloader ? depth : 0);
  return st.downloader.get();
}

// The packed output frame `frame` (mapped; its plane pointer a host or, on `device`, a device
// pointer) as the engine's FrameDesc.
static latent::FrameDesc output_desc(const Negotiated& n, const GstVideoFrame& frame,
                                     latent::Device device = latent::Device()) {
  latent::FrameDesc desc;
  desc.format = latent::frame_format(n.pixel_format);
  desc.width = GST_VIDEO_FRAME_WIDTH(&frame);
  desc.height = GST_VIDEO_FRAME_HEIGHT(&frame);
  desc.device = device;
  desc.planes[0] = GST_VIDEO_FRAME_PLANE_DATA(&frame, 0);
  desc.strides[0] = GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0);
  return desc;
}

// Image [1, 3, H, W] on the backend -> `outbuf` (CUDA memory of our context in place, else
// through a system-memory mapping). The caller holds model.run_lock. A message on failure;
// *mapped says whether the buffer could be mapped (if not, the message says so).
static std::string write_frame(GstVaeDecode* self, const Negotiated& n, GstLatentModel& model,
                               const latent::Tensor& image, GstBuffer* outbuf,
                               bool* mapped = nullptr) {
  GstVideoFrame frame;
  GstLatentCuda* cuda = gst_latent_base_cuda(GST_LATENT_BASE(self));
  const bool on_device = n.cuda_out && cuda->map_frame(&frame, &n.out_info, outbuf, GST_MAP_WRITE);
  const bool ok = on_device || gst_video_frame_map(&frame, &n.out_info, outbuf, GST_MAP_WRITE);
  if (mapped) *mapped = ok;
  if (!ok)
    return latent::str_cat("cannot map the ", gst_buffer_get_size(outbuf),
                           "-byte output buffer as a ", GST_VIDEO_INFO_WIDTH(&n.out_info), "x",
                           GST_VIDEO_INFO_HEIGHT(&n.out_info), " frame");
  // On a GPU the image is converted to the frame's bytes there; only those come back.
  const latent::FrameDesc desc =
      output_desc(n, frame, on_device ? cuda->device() : latent::Device());
  latent::Status s = latent::tensor_to_frame(*model.backend, image, n.geometry, desc);
  gst_video_frame_unmap(&frame);
  return s.ok() ? std::string() : s.message();
}

static GstFlowReturn gst_vae_decode_transform(GstBaseTransform* trans, GstBuffer* inbuf,
                                              GstBuffer* outbuf) {
  GstVaeDecode* self = GST_VAE_DECODE(trans);
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
  Staging& st = self->impl->staging;
  st.staged_current = false;
  latent::FrameDownloader* downloader = n.cuda_out ? nullptr : staging_downloader(self, *model);

  std::unique_lock<std::mutex> run(*model->run_lock);
  latent::Result<latent::Tensor> normalised =
      read_latent(self, n.in_info, n.cuda_in, inbuf, *model);
  latent::Result<latent::Tensor> image = latent::Status::error("not decoded");
  // Device tensors are freed on the shared stream: only under the run lock.
  auto release = [&] {
    normalised = latent::Status::error("released");
    image = latent::Status::error("released");
    run.unlock();
  };
  if (!normalised.ok()) {
    const std::string message = normalised.status().message();
    release();
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("vaedecode: %s", message.c_str()), (nullptr));
    return GST_FLOW_ERROR;
  }
  image = decode_latent(self, *model, *normalised);
  if (!image.ok()) {
    const std::string message = image.status().message();
    release();
    GST_ELEMENT_ERROR(self, STREAM, DECODE,
                      ("vaedecode: decoding a %dx%d latent with %s failed: %s", n.in_info.width,
                       n.in_info.height, model->describe().c_str(), message.c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }

  if (downloader) {
    // Converted on the compute stream, downloaded on the copy stream while the next frames
    // compute; generate_output() pushes it `prefetch-depth` frames later. Into `outbuf` itself
    // when it is page-locked memory (our pool: gst_latent_cuda_decide_pinned_pool), else into a
    // pinned slot that generate_output() copies into `outbuf`.
    Pending p{nullptr, 0, 0, false, {}};
    latent::FrameDesc direct;
    if (gst_latent_buffer_is_pinned(outbuf) &&
        gst_video_frame_map(&p.frame, &n.out_info, outbuf, GST_MAP_WRITE)) {
      p.direct = true;
      direct = output_desc(n, p.frame);
    }
    auto ticket = downloader->queue(*image, n.geometry, latent::frame_format(n.pixel_format),
                                    p.direct ? &direct : nullptr);
    release();
    if (!ticket.ok() && p.direct) gst_video_frame_unmap(&p.frame);
    if (!ticket.ok()) {
      GST_ELEMENT_ERROR(
          self, STREAM, DECODE,
          ("vaedecode: cannot download a decoded %dx%d frame: %s", n.geometry.frame_width(),
           n.geometry.frame_height(), ticket.status().message().c_str()),
          (nullptr));
      return GST_FLOW_ERROR;
    }
    st.staged_current = true;
    p.ticket = *ticket;
    p.submit_us = g_get_monotonic_time() - started_us;
    st.current = p;
    return GST_FLOW_OK;
  }

  bool mapped = false;
  const std::string problem = write_frame(self, n, *model, *image, outbuf, &mapped);
  release();
  if (!mapped) {
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("vaedecode: %s", problem.c_str()), (nullptr));
    return GST_FLOW_ERROR;
  }
  if (!problem.empty()) {
    GST_ELEMENT_ERROR(self, STREAM, DECODE,
                      ("vaedecode: %s returned an unexpected image: %s", model->describe().c_str(),
                       problem.c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  gst_latent_base_frame_done(GST_LATENT_BASE(self),
                             (g_get_monotonic_time() - started_us) * GST_USECOND);
  return GST_FLOW_OK;
}

// ---- video mode: latents go through the decoder's causal stream (engine/models/vae/vae.h) ----
//
// Latent frame 0 of a clip gives 1 frame, every later one 4 (the temporal factor). The frames of
// a latent share its PTS and DURATION evenly (the caps' frame rate when it has no duration);
// frames beyond OFFSET_END - OFFSET (the chunk vaeencode padded at the end of a clip) are
// dropped, so a clip comes back with as many frames as went in. A DISCONT latent, a flush, a
// new segment and new caps start a new clip (the causal cache is dropped).

// Drops the clip: its stream (caches) and the frames not yet out.
static void video_drop(GstVaeDecode* self) {
  VideoDecode& v = self->impl->clip;
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(self));
  std::unique_lock<std::mutex> run;
  if (model) run = std::unique_lock<std::mutex>(*model->run_lock);  // device tensors go here
  v.ready.clear();
  v.stream.reset();
  v.draining = false;
}

static GstFlowReturn video_submit(GstVaeDecode* self, const Negotiated& n, GstLatentModel& model,
                                  gboolean, GstBuffer* input) {
  VideoDecode& v = self->impl->clip;
  const gint64 started_us = g_get_monotonic_time();
  std::unique_lock<std::mutex> run(*model.run_lock);
  // The buffer's own flag: GstBaseTransform's is_discont stays set until its default
  // generate_output (not used in video mode) clears it.
  if (GST_BUFFER_IS_DISCONT(input) && v.stream && v.stream->frames_seen() > 0) {
    GST_DEBUG_OBJECT(self, "discontinuity after %" G_GINT64_FORMAT " latent frames: a new clip",
                     v.stream->frames_seen());
    v.stream->reset();
  }
  const bool first = !v.stream || v.stream->frames_seen() == 0;
  std::string problem;
  int64_t produced = 0;
  latent::Result<latent::Tensor> normalised = read_latent(self, n.in_info, n.cuda_in, input, model);
  if (!normalised.ok()) {
    const std::string message = normalised.status().message();
    normalised = latent::Status::error("released");
    run.unlock();
    gst_buffer_unref(input);
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("vaedecode: %s", message.c_str()), (nullptr));
    return GST_FLOW_ERROR;
  }
  if (!v.stream) {
    auto stream = model.vae->open_stream(false);
    if (stream.ok())
      v.stream = std::move(*stream);
    else
      problem = stream.status().message();
  }
  latent::Result<latent::Tensor> frames = latent::Status::error("not decoded");
  if (problem.empty()) {
    latent::Backend& b = *model.backend;
    auto raw = model.latent_space().denormalize(b, *normalised);
    auto clip = raw.ok() ? b.frames_to_clip(*raw) : raw;      // [1, C, 1, h, w]
    auto decoded = clip.ok() ? v.stream->push(*clip) : clip;  // [1, 3, T', H, W]
    if (decoded.ok() && decoded->defined())
      frames = b.clip_to_frames(*decoded);  // [T', 3, H, W]
    else if (decoded.ok())
      frames = latent::Status::error("the stream returned no frame");
    else
      frames = decoded.status();
    if (!frames.ok()) problem = frames.status().message();
    raw = clip = decoded = latent::Status::error("released");
  }
  if (problem.empty()) {
    produced = frames->dim(0);
    // The real frames: a chunk padded at the end of a clip covers fewer (OFFSET_END - OFFSET).
    int64_t keep = produced;
    const guint64 off = GST_BUFFER_OFFSET(input), end = GST_BUFFER_OFFSET_END(input);
    if (off != GST_BUFFER_OFFSET_NONE && end != GST_BUFFER_OFFSET_NONE && end > off)
      keep = std::min<int64_t>(produced, static_cast<int64_t>(end - off));
    if (keep < produced)
      GST_DEBUG_OBJECT(self,
                       "latent covers %" G_GINT64_FORMAT " real frames: dropping %" G_GINT64_FORMAT
                       " padded ones",
                       keep, produced - keep);
    const GstClockTime pts = GST_BUFFER_PTS(input), dur = GST_BUFFER_DURATION(input);
    GstClockTime frame_dur = GST_CLOCK_TIME_NONE;
    if (n.in_info.fps_n > 0)
      frame_dur = gst_util_uint64_scale_int(GST_SECOND, n.in_info.fps_d, n.in_info.fps_n);
    auto at = [&](int64_t i) -> GstClockTime {
      if (!GST_CLOCK_TIME_IS_VALID(pts)) return GST_CLOCK_TIME_NONE;
      if (GST_CLOCK_TIME_IS_VALID(dur)) return pts + gst_util_uint64_scale(dur, i, keep);
      if (GST_CLOCK_TIME_IS_VALID(frame_dur)) return pts + frame_dur * i;
      return i == 0 ? pts : GST_CLOCK_TIME_NONE;
    };
    for (int64_t i = 0; i < keep; ++i) {
      VideoFrameOut f;
      f.image = latent::frame_view(*frames, i);
      f.pts = at(i);
      const GstClockTime next = at(i + 1);
      f.duration = GST_CLOCK_TIME_IS_VALID(f.pts) && GST_CLOCK_TIME_IS_VALID(next)
                       ? next - f.pts
                       : (GST_CLOCK_TIME_IS_VALID(dur) ? dur / keep : frame_dur);
      f.offset = off != GST_BUFFER_OFFSET_NONE ? off + i : GST_BUFFER_OFFSET_NONE;
      f.discont = i == 0 && (first || GST_BUFFER_IS_DISCONT(input));
      v.ready.push_back(std::move(f));
    }
  }
  normalised = latent::Status::error("released");
  frames = latent::Status::error("released");  // the views in `ready` keep the storage
  run.unlock();
  gst_buffer_unref(input);
  if (!problem.empty()) {
    GST_ELEMENT_ERROR(
        self, STREAM, DECODE,
        ("vaedecode: decoding %dx%d video latents with %s failed: %s", n.in_info.width,
         n.in_info.height, model.describe().c_str(), problem.c_str()),
        (nullptr));
    return GST_FLOW_ERROR;
  }
  gst_latent_base_frame_done(GST_LATENT_BASE(self),
                             (g_get_monotonic_time() - started_us) * GST_USECOND);
  return GST_FLOW_OK;
}

// Hands out the oldest decoded frame (none: *outbuf stays null).
static GstFlowReturn video_generate(GstVaeDecode* self, GstBuffer** outbuf) {
  VideoDecode& v = self->impl->clip;
  *outbuf = nullptr;
  if (v.ready.empty()) return GST_FLOW_OK;
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(self));
  if (!model) return GST_FLOW_FLUSHING;
  Negotiated n;
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    n = self->impl->stream;
  }
  VideoFrameOut f = std::move(v.ready.front());
  v.ready.pop_front();
  GstBuffer* out = nullptr;
  if (const GstFlowReturn ret = gst_latent_base_acquire_output(
          GST_LATENT_BASE(self), GST_VIDEO_INFO_SIZE(&n.out_info), &out);
      ret != GST_FLOW_OK) {
    std::lock_guard<std::mutex> run(*model->run_lock);
    f.image = latent::Tensor();
    return ret;
  }
  std::string problem;
  {
    std::lock_guard<std::mutex> run(*model->run_lock);
    problem = write_frame(self, n, *model, f.image, out);
    f.image = latent::Tensor();
  }
  if (!problem.empty()) {
    gst_buffer_unref(out);
    GST_ELEMENT_ERROR(self, STREAM, DECODE, ("vaedecode: %s", problem.c_str()), (nullptr));
    return GST_FLOW_ERROR;
  }
  GST_BUFFER_PTS(out) = f.pts;
  GST_BUFFER_DTS(out) = GST_CLOCK_TIME_NONE;
  GST_BUFFER_DURATION(out) = f.duration;
  GST_BUFFER_OFFSET(out) = f.offset;
  GST_BUFFER_OFFSET_END(out) =
      f.offset != GST_BUFFER_OFFSET_NONE ? f.offset + 1 : GST_BUFFER_OFFSET_NONE;
  if (f.discont)
    GST_BUFFER_FLAG_SET(out, GST_BUFFER_FLAG_DISCONT);
  else
    GST_BUFFER_FLAG_UNSET(out, GST_BUFFER_FLAG_DISCONT);
  *outbuf = out;
  return GST_FLOW_OK;
}

static bool video_mode(GstVaeDecode* self, Negotiated* n) {
  std::lock_guard<std::mutex> lock(self->impl->lock);
  if (n) *n = self->impl->stream;
  return self->impl->negotiated && self->impl->stream.video;
}

static GstFlowReturn gst_vae_decode_submit_input_buffer(GstBaseTransform* trans,
                                                        gboolean is_discont, GstBuffer* input) {
  GstVaeDecode* self = GST_VAE_DECODE(trans);
  Negotiated n;
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(trans));
  // Video mode: no QoS dropping (a latent missing from the clip breaks the causal stream).
  if (model && video_mode(self, &n)) return video_submit(self, n, *model, is_discont, input);
  return GST_BASE_TRANSFORM_CLASS(parent_class)->submit_input_buffer(trans, is_discont, input);
}

// ---- output staging: decoded frames are pushed `prefetch-depth` frames after their decode ----

// Writes the oldest staged frame into its buffer (waiting for its copy) and hands it out.
static GstFlowReturn finish_staged(GstVaeDecode* self, GstBuffer** outbuf) {
  Staging& st = self->impl->staging;
  Pending p = st.pending.front();
  st.pending.pop_front();
  Negotiated n;
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    n = self->impl->stream;
  }
  const gint64 wait_started_us = g_get_monotonic_time();
  GstVideoFrame frame;
  if (p.direct) {
    frame = p.frame;  // mapped since queue(); the fetch only waits for the GPU's copy
  } else if (!gst_video_frame_map(&frame, &n.out_info, p.buffer, GST_MAP_WRITE)) {
    st.downloader->reset();  // the frames behind it are dropped by the error that follows
    gst_buffer_unref(p.buffer);
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE,
                      ("vaedecode: cannot map the output buffer as a %dx%d frame",
                       GST_VIDEO_INFO_WIDTH(&n.out_info), GST_VIDEO_INFO_HEIGHT(&n.out_info)),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  latent::Status s = st.downloader->fetch(p.ticket, output_desc(n, frame));
  gst_video_frame_unmap(&frame);
  if (!s.ok()) {
    gst_buffer_unref(p.buffer);
    GST_ELEMENT_ERROR(self, STREAM, DECODE,
                      ("vaedecode: downloading a decoded frame failed: %s", s.message().c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  // Its processing: the decode's submission plus the wait for its copy.
  gst_latent_base_frame_done(
      GST_LATENT_BASE(self),
      (p.submit_us + g_get_monotonic_time() - wait_started_us) * GST_USECOND);
  *outbuf = p.buffer;
  return GST_FLOW_OK;
}

static GstFlowReturn gst_vae_decode_generate_output(GstBaseTransform* trans, GstBuffer** outbuf) {
  GstVaeDecode* self = GST_VAE_DECODE(trans);
  if (!self->impl->clip.ready.empty()) return video_generate(self, outbuf);
  Staging& st = self->impl->staging;
  GstBuffer* produced = nullptr;
  *outbuf = nullptr;
  if (trans->queued_buf) {
    GstFlowReturn ret = GST_BASE_TRANSFORM_CLASS(parent_class)->generate_output(trans, &produced);
    const bool staged = st.staged_current;
    st.staged_current = false;
    if (ret != GST_FLOW_OK) {
      if (staged && st.current.direct) {  // its copy may still write into `produced`
        st.downloader->reset();
        gst_video_frame_unmap(&st.current.frame);
      }
      if (produced) gst_buffer_unref(produced);
      return ret;
    }
    if (produced && !staged) {
      *outbuf = produced;  // the synchronous path (also on the CPU)
      return GST_FLOW_OK;
    }
    if (produced) {
      // The buffer already carries the input's timestamps, duration, offsets and flags.
      st.current.buffer = produced;
      st.pending.push_back(st.current);
    }
  }
  if (st.pending.empty() || !st.downloader) return GST_FLOW_OK;
  bool due = st.draining || st.pending.size() > static_cast<size_t>(st.downloader->depth());
  if (!due) {
    // Pushed early when its copy is already complete (no added latency in a slow stream).
    auto ready = st.downloader->ready(st.pending.front().ticket);
    due = !ready.ok() || *ready;  // an error is reported by the fetch
  }
  if (!due) return GST_FLOW_OK;
  return finish_staged(self, outbuf);
}

// Pushes out every staged frame, in order (before EOS, a new segment and new caps).
static GstFlowReturn drain_staging(GstLatentBase* base) {
  GstVaeDecode* self = GST_VAE_DECODE(base);
  if (video_mode(self, nullptr)) {
    // EOS, a new segment, new caps: the frames still queued go out and the clip ends.
    VideoDecode& v = self->impl->clip;
    const GstFlowReturn ret = gst_latent_base_drain(
        base, &v.draining, [&] { return !v.ready.empty(); },
        [&](GstBuffer** out) { return video_generate(self, out); });
    video_drop(self);
    return ret;
  }
  Staging& st = self->impl->staging;
  return gst_latent_base_drain(
      base, &st.draining, [&] { return !st.pending.empty(); },
      [&](GstBuffer** out) { return finish_staged(self, out); });
}

static void drop_staging(GstLatentBase* base) {
  GstVaeDecode* self = GST_VAE_DECODE(base);
  Staging& st = self->impl->staging;
  if (st.downloader) st.downloader->reset();  // no copy still writes into a buffer below
  for (Pending& p : st.pending) {
    if (p.direct) gst_video_frame_unmap(&p.frame);
    gst_buffer_unref(p.buffer);
  }
  st.pending.clear();
  st.downloader.reset();  // waits for its copies, then frees its pinned slots
  st.checked = false;
  st.staged_current = false;
  gst_latent_base_set_frames_held(GST_LATENT_BASE(self), 0);
  video_drop(self);
}

static gboolean gst_vae_decode_decide_allocation(GstBaseTransform* trans, GstQuery* query) {
  GstCaps* caps = nullptr;
  gst_query_parse_allocation(query, &caps, nullptr);
  GstLatentCuda* cuda = gst_latent_base_cuda(GST_LATENT_BASE(trans));
  // Frames in system memory from a GPU: page-locked buffers the GPU copies into, where
  // downstream has no pool of its own kind.
  if (caps && !gst_latent_caps_is_cuda(caps) && cuda->active() &&
      gst_latent_cuda_decide_pinned_pool(cuda, query))
    return TRUE;
  if (!caps || !gst_latent_caps_is_cuda(caps) || !cuda->active())
    return GST_BASE_TRANSFORM_CLASS(parent_class)->decide_allocation(trans, query);
  // Frames in CUDA memory: downstream's pool when it is on our context, else our own.
  GstVideoInfo info;
  if (!gst_video_info_from_caps(&info, caps)) return FALSE;
  GstBufferPool* pool = nullptr;
  guint size = 0, min = 0, max = 0;
  if (gst_query_get_n_allocation_pools(query) > 0) {
    gst_query_parse_nth_allocation_pool(query, 0, &pool, &size, &min, &max);
    if (pool && !cuda->owns_pool(pool)) {
      gst_object_unref(pool);
      pool = nullptr;
    }
  }
  if (pool) {
    GstStructure* config = gst_buffer_pool_get_config(pool);
    gst_buffer_pool_config_set_params(config, caps, GST_VIDEO_INFO_SIZE(&info), min, max);
    gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
    if (!gst_buffer_pool_set_config(pool, config)) {
      gst_object_unref(pool);
      pool = nullptr;
    }
  }
  if (!pool) pool = cuda->new_video_pool(caps, min, max);
  if (!pool) {
    GST_ERROR_OBJECT(trans, "no CUDA buffer pool for %" GST_PTR_FORMAT, caps);
    return FALSE;
  }
  size = static_cast<guint>(GST_VIDEO_INFO_SIZE(&info));
  gst_latent_query_set_pool(query, pool, size, min, max);
  gst_object_unref(pool);
  return TRUE;
}

// Held frames were dropped by the base class's stop().
static void gst_vae_decode_close(GstLatentBase* base) {
  GstVaeDecode* self = GST_VAE_DECODE(base);
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    self->impl->negotiated = false;
  }
}

// After the model is loaded: mode=video needs a video VAE.
static gboolean gst_vae_decode_open(GstLatentBase* base, const std::shared_ptr<latent::Backend>&) {
  GstVaeDecode* self = GST_VAE_DECODE(base);
  auto model = gst_latent_base_get_model(base);
  if (!model) return FALSE;
  GstLatentVaeMode mode;
  if (!gst_latent_base_checked_vae_mode(base, *model, &mode)) return FALSE;
  std::lock_guard<std::mutex> lock(self->impl->lock);
  self->impl->mode = mode;
  return TRUE;
}

static void gst_vae_decode_class_init(GstVaeDecodeClass* klass) {
  GstElementClass* element_class = GST_ELEMENT_CLASS(klass);
  GstBaseTransformClass* trans_class = GST_BASE_TRANSFORM_CLASS(klass);

  GST_DEBUG_CATEGORY_INIT(gst_vae_decode_debug, "vaedecode", 0, "VAE decoder");

  gst_element_class_set_static_metadata(
      element_class, "VAE decoder", "Filter/Converter/Video",
      "Decodes a diffusion model's latents into video frames with its VAE decoder. "
      "Example (pipelines/encode_decode.sh): gst-launch-1.0 videotestsrc num-buffers=30 ! "
      "video/x-raw,width=320,height=240 ! vaeencode ! vaedecode ! videoconvert ! vp8enc ! "
      "webmmux ! filesink location=out.webm",
      "gst-latent developers");
  gst_element_class_add_static_pad_template(element_class, &sink_template);
  gst_element_class_add_static_pad_template(element_class, &src_template);

  trans_class->transform_caps = GST_DEBUG_FUNCPTR(gst_vae_decode_transform_caps);
  trans_class->transform_size = GST_DEBUG_FUNCPTR(gst_vae_decode_transform_size);
  trans_class->transform = GST_DEBUG_FUNCPTR(gst_vae_decode_transform);
  trans_class->decide_allocation = GST_DEBUG_FUNCPTR(gst_vae_decode_decide_allocation);
  trans_class->generate_output = GST_DEBUG_FUNCPTR(gst_vae_decode_generate_output);
  trans_class->submit_input_buffer = GST_DEBUG_FUNCPTR(gst_vae_decode_submit_input_buffer);

  GstLatentBaseClass* base_class = GST_LATENT_BASE_CLASS(klass);
  base_class->debug_category = gst_vae_decode_debug;
  gst_latent_base_class_install_plan_properties(base_class);
  base_class->parts = GST_LATENT_PART_DECODER;
  base_class->drain_held = drain_staging;
  base_class->close = gst_vae_decode_close;
  base_class->open = gst_vae_decode_open;
  gst_latent_base_class_install_mode_property(base_class);
  base_class->set_info = gst_vae_decode_set_info;
  base_class->drop_held = drop_staging;
}

static void gst_vae_decode_init(GstVaeDecode* self) {
  self->impl = new Impl();
  gst_latent_base_set_stage(GST_LATENT_BASE(self), self->impl);
}
