#include "elements/gstlatentcaps.h"

namespace {

latent::Status get_side(const GstStructure* s, const char* field, int max, int* out) {
  int v = 0;
  if (!gst_structure_get_int(s, field, &v))
    return latent::Status::errorf("latent caps have no fixed integer '", field, "'");
  if (v < 1 || v > max)
    return latent::Status::errorf("latent caps field '", field, "' = ", v, " is outside 1..", max);
  *out = v;
  return latent::ok_status();
}

latent::Status get_string(const GstStructure* s, const char* field, std::string* out) {
  const gchar* v = gst_structure_get_string(s, field);
  if (!v) return latent::Status::errorf("latent caps have no fixed string '", field, "'");
  *out = v;
  return latent::ok_status();
}

}  // namespace

size_t GstLatentInfo::frame_bytes() const {
  return static_cast<size_t>(channels) * static_cast<size_t>(width) * static_cast<size_t>(height) *
         latent::dtype_size(dtype);
}

bool GstLatentInfo::operator==(const GstLatentInfo& o) const {
  return dtype == o.dtype && channels == o.channels && width == o.width && height == o.height &&
         latent_space == o.latent_space && frame_width == o.frame_width &&
         frame_height == o.frame_height && size_policy == o.size_policy && fps_n == o.fps_n &&
         fps_d == o.fps_d;
}

GstCaps* gst_latent_info_to_caps(const GstLatentInfo& info) {
  return gst_caps_new_simple(GST_LATENT_MEDIA_TYPE,                                     //
                             "format", G_TYPE_STRING, latent::dtype_name(info.dtype),   //
                             "channels", G_TYPE_INT, info.channels,                     //
                             "width", G_TYPE_INT, info.width,                           //
                             "height", G_TYPE_INT, info.height,                         //
                             "latent-space", G_TYPE_STRING, info.latent_space.c_str(),  //
                             "frame-width", G_TYPE_INT, info.frame_width,               //
                             "frame-height", G_TYPE_INT, info.frame_height,             //
                             "size-policy", G_TYPE_STRING,
                             latent::size_policy_name(info.size_policy),  //
                             "framerate", GST_TYPE_FRACTION, info.fps_n, info.fps_d, nullptr);
}

latent::Result<GstLatentInfo> gst_latent_info_from_caps(const GstCaps* caps) {
  if (!caps || gst_caps_get_size(caps) != 1)
    return latent::Status::error("latent caps must have exactly one structure");
  if (!gst_caps_is_fixed(caps)) return latent::Status::error("latent caps are not fixed");
  const GstStructure* s = gst_caps_get_structure(caps, 0);
  if (!gst_structure_has_name(s, GST_LATENT_MEDIA_TYPE))
    return latent::Status::errorf("caps '", gst_structure_get_name(s), "' are not ",
                                  GST_LATENT_MEDIA_TYPE);
  GstLatentInfo info;
  std::string text;
  LATENT_TRY(get_string(s, "format", &text));
  auto dtype = latent::parse_dtype(text);
  if (!dtype.ok()) return dtype.status().with_context("latent caps field 'format'");
  info.dtype = *dtype;
  LATENT_TRY(get_side(s, "channels", kGstLatentMaxChannels, &info.channels));
  LATENT_TRY(get_side(s, "width", kGstLatentMaxSide, &info.width));
  LATENT_TRY(get_side(s, "height", kGstLatentMaxSide, &info.height));
  LATENT_TRY(get_side(s, "frame-width", kGstLatentMaxSide, &info.frame_width));
  LATENT_TRY(get_side(s, "frame-height", kGstLatentMaxSide, &info.frame_height));
  LATENT_TRY(get_string(s, "latent-space", &info.latent_space));
  if (info.latent_space.empty())
    return latent::Status::error("latent caps field 'latent-space' is empty");
  LATENT_TRY(get_string(s, "size-policy", &text));
  auto policy = latent::parse_size_policy(text);
  if (!policy.ok()) return policy.status().with_context("latent caps field 'size-policy'");
  info.size_policy = *policy;
  if (gst_structure_has_field(s, "framerate")) {
    if (!gst_structure_get_fraction(s, "framerate", &info.fps_n, &info.fps_d) || info.fps_n < 0 ||
        info.fps_d <= 0)
      return latent::Status::error("latent caps field 'framerate' is not a valid fraction");
  }
  // Each side is bounded; bound the whole buffer too (4 GiB is far beyond any real latent).
  if (info.frame_bytes() > (size_t{1} << 32))
    return latent::Status::errorf("latent of ", info.channels, "x", info.height, "x", info.width,
                                  " is too large");
  return info;
}

void gst_latent_set_format_list(GstStructure* s, latent::DType preferred) {
  GValue list = G_VALUE_INIT;
  gst_value_list_init(&list, 3);
  auto append = [&](latent::DType t) {
    GValue v = G_VALUE_INIT;
    g_value_init(&v, G_TYPE_STRING);
    g_value_set_string(&v, latent::dtype_name(t));
    gst_value_list_append_and_take_value(&list, &v);
  };
  append(preferred);
  for (latent::DType t : {latent::DType::kF32, latent::DType::kBF16, latent::DType::kF16})
    if (t != preferred) append(t);
  gst_structure_take_value(s, "format", &list);
}

GType gst_latent_size_policy_get_type(void) {
  static gsize type = 0;
  static const GEnumValue values[] = {
      {static_cast<gint>(latent::SizePolicy::kPad),
       "Pad to the next multiple of the model's factor, replicating edges", "pad"},
      {static_cast<gint>(latent::SizePolicy::kCrop),
       "Centre crop to the previous multiple (decoding replicates the lost border)", "crop"},
      {static_cast<gint>(latent::SizePolicy::kScale),
       "Bilinear resize to the nearest multiple (decoding resizes back)", "scale"},
      {0, nullptr, nullptr},
  };
  if (g_once_init_enter(&type)) {
    GType t = g_enum_register_static("GstLatentSizePolicy", values);
    g_once_init_leave(&type, t);
  }
  return type;
}

latent::Result<latent::PixelFormat> gst_latent_pixel_format(GstVideoFormat format) {
  const gchar* name = gst_video_format_to_string(format);
  return latent::parse_pixel_format(name ? name : "UNKNOWN");
}

GstStructure* gst_latent_video_structure_new(const char* formats) {
  gchar* desc = g_strconcat("video/x-raw, format = (string) ", formats, nullptr);
  GstCaps* caps = gst_caps_from_string(desc);
  g_free(desc);
  GstStructure* s = gst_structure_copy(gst_caps_get_structure(caps, 0));
  gst_caps_unref(caps);
  return s;
}

void gst_latent_set_video_size(const GstStructure* latent, GstStructure* video) {
  if (!gst_latent_copy_field(latent, "frame-width", video, "width"))
    gst_structure_set(video, "width", GST_TYPE_INT_RANGE, kGstLatentMinVideoSide,
                      kGstLatentMaxVideoSide, nullptr);
  if (!gst_latent_copy_field(latent, "frame-height", video, "height"))
    gst_structure_set(video, "height", GST_TYPE_INT_RANGE, kGstLatentMinVideoSide,
                      kGstLatentMaxVideoSide, nullptr);
  gst_latent_copy_field(latent, "framerate", video, "framerate");
}

bool gst_latent_copy_field(const GstStructure* from, const char* field, GstStructure* to,
                           const char* as) {
  const GValue* v = gst_structure_get_value(from, field);
  if (!v) return false;
  gst_structure_set_value(to, as, v);
  return true;
}

bool gst_latent_refuse_while_running(GstElement* element, const char* who, GParamSpec* pspec,
                                     const std::string& current) {
  GST_OBJECT_LOCK(element);
  const bool running =
      GST_STATE(element) > GST_STATE_READY || GST_STATE_NEXT(element) > GST_STATE_READY;
  GST_OBJECT_UNLOCK(element);
  if (!running) return false;
  GST_ELEMENT_WARNING(element, CORE, STATE_CHANGE,
                      ("%s: `%s` cannot change while PAUSED or PLAYING; it stays '%s' (set it in "
                       "the NULL or READY state)",
                       who, g_param_spec_get_name(pspec), current.c_str()),
                      (nullptr));
  return true;
}
