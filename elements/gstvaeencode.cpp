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
 */
#include "elements/gstvaeencode.h"

#include <cstring>
#include <mutex>

#include "elements/gstlatentcaps.h"

GST_DEBUG_CATEGORY_STATIC(gst_vae_encode_debug);
#define GST_CAT_DEFAULT gst_vae_encode_debug

namespace {

enum { PROP_0, PROP_SIZE_POLICY };
constexpr latent::SizePolicy kDefaultSizePolicy = latent::SizePolicy::kPad;

GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE(
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS(GST_LATENT_VIDEO_CAPS_TEMPLATE));
GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(GST_LATENT_CAPS_TEMPLATE));

// What set_caps() fixed for the stream.
struct Negotiated {
  GstVideoInfo in_info;
  latent::PixelFormat pixel_format = latent::PixelFormat::kRGB;
  GstLatentInfo out_info;
  latent::FrameGeometry geometry;
};

struct Impl {
  std::mutex lock;
  latent::SizePolicy size_policy = kDefaultSizePolicy;  // setting
  bool negotiated = false;
  Negotiated stream;
};

bool is_system_memory(GstCapsFeatures* f) {
  return !f || gst_caps_features_is_any(f) ||
         gst_caps_features_is_equal(f, GST_CAPS_FEATURES_MEMORY_SYSTEM_MEMORY);
}

// video/x-raw structure -> the latent structure this element would output for it.
GstStructure* video_to_latent(const GstStructure* s, const GstLatentModel* model,
                              latent::SizePolicy policy, latent::DType dtype) {
  GstStructure* out = gst_structure_new_empty(GST_LATENT_MEDIA_TYPE);
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
                              latent::SizePolicy policy) {
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
  GstStructure* out = gst_latent_video_structure_new();
  if (!gst_latent_copy_field(s, "frame-width", out, "width"))
    gst_structure_set(out, "width", GST_TYPE_INT_RANGE, kGstLatentMinVideoSide,
                      kGstLatentMaxVideoSide, nullptr);
  if (!gst_latent_copy_field(s, "frame-height", out, "height"))
    gst_structure_set(out, "height", GST_TYPE_INT_RANGE, kGstLatentMinVideoSide,
                      kGstLatentMaxVideoSide, nullptr);
  gst_latent_copy_field(s, "framerate", out, "framerate");
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
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
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
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
      break;
  }
}

static void gst_vae_encode_finalize(GObject* object) {
  GstVaeEncode* self = GST_VAE_ENCODE(object);
  delete self->impl;
  self->impl = nullptr;
  G_OBJECT_CLASS(parent_class)->finalize(object);
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

  GstCaps* out = gst_caps_new_empty();
  if (gst_caps_is_any(caps)) {
    GstPad* other = direction == GST_PAD_SINK ? GST_BASE_TRANSFORM_SRC_PAD(trans)
                                              : GST_BASE_TRANSFORM_SINK_PAD(trans);
    gst_caps_unref(out);
    out = gst_pad_get_pad_template_caps(other);
  } else {
    for (guint i = 0; i < gst_caps_get_size(caps); ++i) {
      if (!is_system_memory(gst_caps_get_features(caps, i))) continue;
      const GstStructure* s = gst_caps_get_structure(caps, i);
      GstStructure* o = nullptr;
      if (direction == GST_PAD_SINK && gst_structure_has_name(s, "video/x-raw"))
        o = video_to_latent(s, model.get(), policy, dtype);
      else if (direction == GST_PAD_SRC && gst_structure_has_name(s, GST_LATENT_MEDIA_TYPE))
        o = latent_to_video(s, model.get(), policy);
      if (o) out = gst_caps_merge_structure(out, o);
    }
  }
  if (filter) {
    GstCaps* tmp = gst_caps_intersect_full(filter, out, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(out);
    out = tmp;
  }
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

static gboolean gst_vae_encode_set_caps(GstBaseTransform* trans, GstCaps* incaps,
                                        GstCaps* outcaps) {
  GstVaeEncode* self = GST_VAE_ENCODE(trans);
  auto model = gst_latent_base_get_model(GST_LATENT_BASE(trans));
  if (!model) {
    GST_ERROR_OBJECT(self, "caps set before a model was loaded");
    return FALSE;
  }
  Negotiated n;
  if (!gst_video_info_from_caps(&n.in_info, incaps)) {
    GST_ERROR_OBJECT(self, "invalid input caps %" GST_PTR_FORMAT, incaps);
    return FALSE;
  }
  auto format = gst_latent_pixel_format(GST_VIDEO_INFO_FORMAT(&n.in_info));
  if (!format.ok()) {
    GST_ERROR_OBJECT(self, "%s", format.status().message().c_str());
    return FALSE;
  }
  n.pixel_format = *format;
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
  if (!problem.empty()) {
    GST_ERROR_OBJECT(self, "%s", problem.c_str());
    return FALSE;
  }
  n.geometry = *geometry;
  GST_INFO_OBJECT(self, "%dx%d %s -> %s latent [%d, %d, %d] (%s, model input %dx%d)", w, h,
                  latent::pixel_format_name(n.pixel_format), latent::dtype_name(info->dtype),
                  info->channels, info->height, info->width,
                  latent::size_policy_name(info->size_policy), geometry->model_width(),
                  geometry->model_height());
  std::lock_guard<std::mutex> lock(self->impl->lock);
  self->impl->stream = n;
  self->impl->negotiated = true;
  return TRUE;
}

static gboolean gst_vae_encode_transform_size(GstBaseTransform* trans, GstPadDirection direction,
                                              GstCaps*, gsize, GstCaps* othercaps,
                                              gsize* othersize) {
  // One frame in, one latent out, whatever the input buffer's size (transform() checks it).
  if (direction == GST_PAD_SINK) {
    auto info = gst_latent_info_from_caps(othercaps);
    if (!info.ok()) {
      GST_WARNING_OBJECT(trans, "%s", info.status().message().c_str());
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

static gboolean gst_vae_encode_propose_allocation(GstBaseTransform* trans, GstQuery* decide_query,
                                                  GstQuery* query) {
  if (!GST_BASE_TRANSFORM_CLASS(parent_class)->propose_allocation(trans, decide_query, query))
    return FALSE;
  // Strided frames are fine: the frame is read through GstVideoFrame.
  gst_query_add_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
  return TRUE;
}

// The CPU path: frame in system memory -> host tensor. (A CUDA-memory path goes beside this.)
static latent::Result<latent::Tensor> read_frame_sysmem(const Negotiated& n, GstBuffer* inbuf) {
  GstVideoFrame frame;
  if (!gst_video_frame_map(&frame, const_cast<GstVideoInfo*>(&n.in_info), inbuf, GST_MAP_READ)) {
    return latent::Status::errorf("input buffer of ", gst_buffer_get_size(inbuf),
                                  " bytes does not hold a ", GST_VIDEO_INFO_WIDTH(&n.in_info), "x",
                                  GST_VIDEO_INFO_HEIGHT(&n.in_info), " ",
                                  latent::pixel_format_name(n.pixel_format), " frame (",
                                  GST_VIDEO_INFO_SIZE(&n.in_info), " bytes)");
  }
  auto t =
      latent::frame_to_tensor(static_cast<const uint8_t*>(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0)),
                              GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0), n.pixel_format, n.geometry);
  gst_video_frame_unmap(&frame);
  return t;
}

// sample [1, 3, H, W] host -> normalised latent [1, C, h, w] fp32 host.
static latent::Result<latent::Tensor> encode_frame(GstLatentModel& model,
                                                   const latent::Tensor& sample) {
  std::lock_guard<std::mutex> lock(*model.run_lock);
  latent::Backend& b = *model.backend;
  LATENT_ASSIGN_OR_RETURN(latent::Tensor x, b.upload(sample));
  LATENT_ASSIGN_OR_RETURN(latent::Tensor raw, model.vae->encode(x));
  LATENT_ASSIGN_OR_RETURN(latent::Tensor normalised, model.latent_space().normalize(b, raw));
  return b.download(normalised);
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

  auto sample = read_frame_sysmem(n, inbuf);
  if (!sample.ok()) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("vaeencode: %s", sample.status().message().c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  auto latents = encode_frame(*model, *sample);
  if (!latents.ok()) {
    GST_ELEMENT_ERROR(
        self, STREAM, FAILED,
        ("vaeencode: encoding a %dx%d frame with %s failed: %s", n.geometry.frame_width(),
         n.geometry.frame_height(), model->describe().c_str(), latents.status().message().c_str()),
        (nullptr));
    return GST_FLOW_ERROR;
  }
  const latent::Shape want{1, n.out_info.channels, n.out_info.height, n.out_info.width};
  if (latents->shape() != want || latents->dtype() != latent::DType::kF32) {
    GST_ELEMENT_ERROR(self, STREAM, FAILED,
                      ("vaeencode: %s returned %s, expected fp32%s", model->describe().c_str(),
                       latents->describe().c_str(), latent::shape_str(want).c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }

  GstMapInfo map;
  if (!gst_buffer_map(outbuf, &map, GST_MAP_WRITE)) {
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("vaeencode: cannot map the output buffer"),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  const size_t bytes = n.out_info.frame_bytes();
  if (map.size < bytes) {
    gst_buffer_unmap(outbuf, &map);
    GST_ELEMENT_ERROR(
        self, RESOURCE, WRITE,
        ("vaeencode: output buffer of %zu bytes is smaller than a latent (%zu)", map.size, bytes),
        (nullptr));
    return GST_FLOW_ERROR;
  }
  latent::convert_elements(latents->data(), latent::DType::kF32, map.data, n.out_info.dtype,
                           static_cast<size_t>(latents->numel()));
  gst_buffer_unmap(outbuf, &map);
  gst_buffer_set_size(outbuf, bytes);
  return GST_FLOW_OK;
}

static gboolean gst_vae_encode_stop(GstBaseTransform* trans) {
  GstVaeEncode* self = GST_VAE_ENCODE(trans);
  {
    std::lock_guard<std::mutex> lock(self->impl->lock);
    self->impl->negotiated = false;
  }
  return GST_BASE_TRANSFORM_CLASS(parent_class)->stop(trans);
}

static void gst_vae_encode_class_init(GstVaeEncodeClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  GstElementClass* element_class = GST_ELEMENT_CLASS(klass);
  GstBaseTransformClass* trans_class = GST_BASE_TRANSFORM_CLASS(klass);

  GST_DEBUG_CATEGORY_INIT(gst_vae_encode_debug, "vaeencode", 0, "VAE encoder");

  gobject_class->set_property = gst_vae_encode_set_property;
  gobject_class->get_property = gst_vae_encode_get_property;
  gobject_class->finalize = gst_vae_encode_finalize;

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
      "Encodes video frames into a diffusion model's latent space with its VAE encoder",
      "gst-latent developers");
  gst_element_class_add_static_pad_template(element_class, &sink_template);
  gst_element_class_add_static_pad_template(element_class, &src_template);

  trans_class->transform_caps = GST_DEBUG_FUNCPTR(gst_vae_encode_transform_caps);
  trans_class->fixate_caps = GST_DEBUG_FUNCPTR(gst_vae_encode_fixate_caps);
  trans_class->set_caps = GST_DEBUG_FUNCPTR(gst_vae_encode_set_caps);
  trans_class->transform_size = GST_DEBUG_FUNCPTR(gst_vae_encode_transform_size);
  trans_class->propose_allocation = GST_DEBUG_FUNCPTR(gst_vae_encode_propose_allocation);
  trans_class->transform = GST_DEBUG_FUNCPTR(gst_vae_encode_transform);
  trans_class->stop = GST_DEBUG_FUNCPTR(gst_vae_encode_stop);

  GST_LATENT_BASE_CLASS(klass)->parts = GST_LATENT_PART_ENCODER;
  gst_type_mark_as_plugin_api(GST_TYPE_LATENT_SIZE_POLICY, static_cast<GstPluginAPIFlags>(0));
}

static void gst_vae_encode_init(GstVaeEncode* self) { self->impl = new Impl(); }
