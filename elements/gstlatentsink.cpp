/**
 * SECTION:element-latentsink
 * @title: latentsink
 * @short_description: Writes a stream of latents to one latent file (safetensors)
 *
 * ```sh
 * gst-launch-1.0 filesrc location=clip.mp4 ! decodebin ! videoconvert ! vaeencode \
 *     ! latentsink location=clip.safetensors
 * ```
 * (pipelines/precompute_latents.sh)
 *
 * Writes the tensor `latents` [T, C, h, w] in the stream's dtype and a `__metadata__` describing
 * it (latent space, model and a hash of its config, frame size, size policy, frame rate, video
 * mode, and each latent frame's pts, duration and covered source frames: README "The latent
 * file"). The data streams to `LOCATION.partial` as buffers arrive; at EOS the header is written,
 * the file synced and renamed to `location`, so an interrupted or failed run never leaves a file
 * that looks complete. Latents in CUDA memory are downloaded through GStreamer's mapping.
 */
#include "elements/gstlatentsink.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "elements/gstlatentcaps.h"
#include "elements/gstlatentcuda.h"
#include "engine/weights/latent_file.h"
#include "engine/weights/model_source.h"
#include "engine/weights/safetensors.h"

GST_DEBUG_CATEGORY_STATIC(gst_latent_sink_debug);
#define GST_CAT_DEFAULT gst_latent_sink_debug

namespace {

enum { PROP_0, PROP_LOCATION, PROP_MODEL, PROP_SOURCE, PROP_FSYNC };

struct Settings {
  std::string location;
  std::string model;   // empty: the `model` of the first upstream element that has one
  std::string source;  // empty: the `location` of the first upstream element that has one
  bool fsync = true;
};

struct State {
  bool have_caps = false;
  GstLatentInfo info;
  int temporal_factor = 1;
  std::unique_ptr<latent::SafetensorsStreamWriter> writer;
  latent::LatentFileInfo file;  // metadata being collected (the per-frame lists grow)
  bool finished = false;
};

}  // namespace

struct _GstLatentSink {
  GstBaseSink parent;
  std::mutex* lock;  // guards settings
  Settings* settings;
  State* state;  // streaming thread only (and start/stop)
};

G_DEFINE_TYPE(GstLatentSink, gst_latent_sink, GST_TYPE_BASE_SINK);
GST_ELEMENT_REGISTER_DEFINE(latentsink, "latentsink", GST_RANK_NONE, GST_TYPE_LATENT_SINK);

namespace {

Settings settings_copy(GstLatentSink* self) {
  std::lock_guard<std::mutex> g(*self->lock);
  return *self->settings;
}

// The value of the first of the string properties `names` that the first element upstream of
// `pad` having any of them has (through bins such as decodebin: a ghost pad's parent is the bin).
std::string upstream_string_property(GstPad* pad, std::initializer_list<const char*> names) {
  GstPad* peer = gst_pad_get_peer(pad);
  for (int depth = 0; peer && depth < 64; ++depth) {
    GstObject* parent = gst_pad_get_parent(peer);
    gst_object_unref(peer);
    peer = nullptr;
    if (!parent || !GST_IS_ELEMENT(parent)) {
      if (parent) gst_object_unref(parent);
      break;
    }
    GstElement* el = GST_ELEMENT(parent);
    for (const char* name : names) {
      GParamSpec* spec = g_object_class_find_property(G_OBJECT_GET_CLASS(el), name);
      if (spec && spec->value_type == G_TYPE_STRING && (spec->flags & G_PARAM_READABLE)) {
        gchar* value = nullptr;
        g_object_get(el, name, &value, nullptr);
        std::string out = value ? value : "";
        g_free(value);
        gst_object_unref(el);
        return out;
      }
    }
    // Walk on through this element's first sink pad.
    GstPad* sink = nullptr;
    GstIterator* it = gst_element_iterate_sink_pads(el);
    GValue item = G_VALUE_INIT;
    if (gst_iterator_next(it, &item) == GST_ITERATOR_OK) {
      sink = GST_PAD(g_value_dup_object(&item));
      g_value_unset(&item);
    }
    gst_iterator_free(it);
    gst_object_unref(el);
    if (!sink) break;
    peer = gst_pad_get_peer(sink);
    gst_object_unref(sink);
  }
  if (peer) gst_object_unref(peer);
  return "";
}

// SHA-256 of a model's config.json; for a single file without one, of the safetensors header
// (tensor names, shapes, dtypes, metadata), which pins the checkpoint's layout.
std::string config_sha256(const std::string& model, std::string* error) {
  auto src = latent::resolve_model_source(model);
  if (!src.ok()) {
    *error = src.status().message();
    return "";
  }
  std::string bytes;
  if (!src->config_path.empty()) {
    std::ifstream in(src->config_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  } else {
    std::ifstream in(src->weights_path, std::ios::binary);
    unsigned char len[8] = {};
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(len[i]) << (8 * i);
    if (in && n < (100u << 20)) {
      bytes.resize(n);
      in.read(bytes.data(), static_cast<std::streamsize>(n));
      if (!in) bytes.clear();
    }
  }
  if (bytes.empty()) {
    *error = "cannot read the config of model '" + model + "'";
    return "";
  }
  gchar* hex = g_compute_checksum_for_data(
      G_CHECKSUM_SHA256, reinterpret_cast<const guchar*>(bytes.data()), bytes.size());
  std::string out = hex;
  g_free(hex);
  return out;
}

void reset_state(GstLatentSink* self) {
  delete self->state;  // an unfinished writer removes its partial file
  self->state = new State();
}

}  // namespace

static void gst_latent_sink_set_property(GObject* object, guint prop_id, const GValue* value,
                                         GParamSpec* pspec) {
  GstLatentSink* self = GST_LATENT_SINK(object);
  // Read when the file opens (the first latent): a change while running would be shown but not
  // used.
  std::string current;
  {
    std::lock_guard<std::mutex> g(*self->lock);
    const Settings& st = *self->settings;
    current = prop_id == PROP_LOCATION ? st.location
              : prop_id == PROP_MODEL  ? st.model
              : prop_id == PROP_SOURCE ? st.source
                                       : (st.fsync ? "true" : "false");
  }
  if (gst_latent_refuse_while_running(GST_ELEMENT(self), "latentsink", pspec, current)) return;
  std::lock_guard<std::mutex> g(*self->lock);
  Settings& s = *self->settings;
  switch (prop_id) {
    case PROP_LOCATION: {
      const gchar* v = g_value_get_string(value);
      s.location = v ? v : "";
      break;
    }
    case PROP_MODEL: {
      const gchar* v = g_value_get_string(value);
      s.model = v ? v : "";
      break;
    }
    case PROP_SOURCE: {
      const gchar* v = g_value_get_string(value);
      s.source = v ? v : "";
      break;
    }
    case PROP_FSYNC:
      s.fsync = g_value_get_boolean(value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
  }
}

static void gst_latent_sink_get_property(GObject* object, guint prop_id, GValue* value,
                                         GParamSpec* pspec) {
  GstLatentSink* self = GST_LATENT_SINK(object);
  std::lock_guard<std::mutex> g(*self->lock);
  const Settings& s = *self->settings;
  switch (prop_id) {
    case PROP_LOCATION:
      g_value_set_string(value, s.location.c_str());
      break;
    case PROP_MODEL:
      g_value_set_string(value, s.model.c_str());
      break;
    case PROP_SOURCE:
      g_value_set_string(value, s.source.c_str());
      break;
    case PROP_FSYNC:
      g_value_set_boolean(value, s.fsync);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
  }
}

static gboolean gst_latent_sink_start(GstBaseSink* sink) {
  GstLatentSink* self = GST_LATENT_SINK(sink);
  reset_state(self);
  const Settings s = settings_copy(self);
  if (s.location.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND,
                      ("latentsink: no file name given; set location=FILE.safetensors"), (nullptr));
    return FALSE;
  }
  // An unusable folder is reported now, before any data is decoded and encoded.
  std::error_code ec;
  if (std::filesystem::is_directory(s.location, ec)) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_WRITE,
                      ("latentsink: cannot write %s: it is a folder; set location to a file in it",
                       s.location.c_str()),
                      (nullptr));
    return FALSE;
  }
  std::string dir = std::filesystem::path(s.location).parent_path().string();
  if (dir.empty()) dir = ".";
  if (!std::filesystem::is_directory(dir, ec)) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_WRITE,
                      ("latentsink: cannot write %s: folder '%s' does not exist or is not a folder",
                       s.location.c_str(), dir.c_str()),
                      (nullptr));
    return FALSE;
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_WRITE,
                      ("latentsink: cannot write %s: folder '%s' is not writable (%s)",
                       s.location.c_str(), dir.c_str(), g_strerror(errno)),
                      (nullptr));
    return FALSE;
  }
  return TRUE;
}

static gboolean gst_latent_sink_stop(GstBaseSink* sink) {
  GstLatentSink* self = GST_LATENT_SINK(sink);
  State* st = self->state;
  if (st->writer)
    GST_WARNING_OBJECT(self, "stopped before EOS: %s not written (partial file removed)",
                       st->writer->path().c_str());
  reset_state(self);
  return TRUE;
}

static gboolean gst_latent_sink_set_caps(GstBaseSink* sink, GstCaps* caps) {
  GstLatentSink* self = GST_LATENT_SINK(sink);
  State* st = self->state;
  auto info = gst_latent_info_from_caps(caps);
  if (!info.ok()) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("latentsink: %s", info.status().message().c_str()),
                      ("caps: %" GST_PTR_FORMAT, caps));
    return FALSE;
  }
  int temporal = 1;
  const GstStructure* s = gst_caps_get_structure(caps, 0);
  if (gst_structure_has_field(s, "temporal-factor") &&
      (!gst_structure_get_int(s, "temporal-factor", &temporal) || temporal < 1 ||
       temporal > 1024)) {
    GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                      ("latentsink: caps field 'temporal-factor' must be an integer in [1, 1024]"),
                      ("caps: %" GST_PTR_FORMAT, caps));
    return FALSE;
  }
  if (st->have_caps) {
    if (*info == st->info && temporal == st->temporal_factor) return TRUE;
    if (st->writer) {
      GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                        ("latentsink: the latent format changed mid-stream (%" GST_PTR_FORMAT
                         "); one latent file holds one format",
                         caps),
                        (nullptr));
      return FALSE;
    }
  }
  st->info = *info;
  st->temporal_factor = temporal;
  st->have_caps = true;
  GST_INFO_OBJECT(self, "caps %" GST_PTR_FORMAT, caps);
  return TRUE;
}

// The first buffer opens the file; the metadata that does not change is filled in here.
static gboolean open_file(GstLatentSink* self) {
  State* st = self->state;
  const Settings s = settings_copy(self);
  const GstLatentInfo& i = st->info;
  latent::LatentFileInfo& f = st->file;
  f = latent::LatentFileInfo();
  f.latent_space = i.latent_space;
  f.dtype = i.dtype;
  f.channels = i.channels;
  f.width = i.width;
  f.height = i.height;
  f.frame_width = i.frame_width;
  f.frame_height = i.frame_height;
  f.size_policy = latent::size_policy_name(i.size_policy);
  f.fps_n = i.fps_n;
  f.fps_d = i.fps_d;
  f.temporal_factor = st->temporal_factor;
  f.model =
      s.model.empty() ? upstream_string_property(GST_BASE_SINK_PAD(self), {"model"}) : s.model;
  if (f.model.empty()) f.model = "default";
  std::string error;
  f.model_config_sha256 = config_sha256(f.model, &error);
  if (!error.empty())
    GST_WARNING_OBJECT(self, "model '%s': %s; the file records no config hash", f.model.c_str(),
                       error.c_str());
  f.source = s.source.empty()
                 ? upstream_string_property(GST_BASE_SINK_PAD(self), {"source", "location"})
                 : s.source;

  latent::SafetensorsStreamWriter::Options opt;
  opt.sync = s.fsync;
  auto w = latent::SafetensorsStreamWriter::create(s.location, latent::kLatentFileTensor, i.dtype,
                                                   {i.channels, i.height, i.width}, opt);
  if (!w.ok()) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_WRITE, ("latentsink: %s", w.status().message().c_str()),
                      (nullptr));
    return FALSE;
  }
  st->writer = std::move(*w);
  return TRUE;
}

static GstFlowReturn gst_latent_sink_render(GstBaseSink* sink, GstBuffer* buffer) {
  GstLatentSink* self = GST_LATENT_SINK(sink);
  State* st = self->state;
  if (!st->have_caps) {
    GST_ELEMENT_ERROR(self, CORE, NEGOTIATION, ("latentsink: a buffer arrived before caps"),
                      (nullptr));
    return GST_FLOW_NOT_NEGOTIATED;
  }
  if (st->finished) {
    GST_ELEMENT_ERROR(self, STREAM, FAILED,
                      ("latentsink: data after EOS; %s is already complete",
                       settings_copy(self).location.c_str()),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  if (!st->writer && !open_file(self)) return GST_FLOW_ERROR;
  const size_t bytes = st->info.frame_bytes();
  GstMapInfo map;
  // System memory maps directly; a GstCudaMemory maps by downloading (the buffer may be pitched,
  // so longer than the latent).
  if (!gst_buffer_map(buffer, &map, GST_MAP_READ)) {
    GST_ELEMENT_ERROR(self, STREAM, FAILED, ("latentsink: cannot map a latent buffer for reading"),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  if (map.size < bytes) {
    gst_buffer_unmap(buffer, &map);
    GST_ELEMENT_ERROR(self, STREAM, FORMAT,
                      ("latentsink: a latent buffer of %" G_GSIZE_FORMAT
                       " bytes, the caps describe %" G_GSIZE_FORMAT,
                       map.size, bytes),
                      (nullptr));
    return GST_FLOW_ERROR;
  }
  latent::Status s = st->writer->append(map.data, bytes);
  gst_buffer_unmap(buffer, &map);
  if (!s.ok()) {
    st->writer.reset();
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("latentsink: %s", s.message().c_str()), (nullptr));
    return GST_FLOW_ERROR;
  }
  auto t = [](guint64 v) {
    return v == GST_CLOCK_TIME_NONE ? latent::kLatentFileNoTime : int64_t(v);
  };
  auto o = [](guint64 v) {
    return v == GST_BUFFER_OFFSET_NONE ? latent::kLatentFileNoTime : int64_t(v);
  };
  latent::LatentFileInfo& f = st->file;
  f.pts.push_back(t(GST_BUFFER_PTS(buffer)));
  f.durations.push_back(t(GST_BUFFER_DURATION(buffer)));
  f.offsets.push_back(o(GST_BUFFER_OFFSET(buffer)));
  f.offset_ends.push_back(o(GST_BUFFER_OFFSET_END(buffer)));
  return GST_FLOW_OK;
}

static gboolean finish_file(GstLatentSink* self) {
  State* st = self->state;
  latent::LatentFileInfo& f = st->file;
  if (f.video_mode()) {
    // The frames covered: the last latent frame's OFFSET_END (padding at EOS excluded); without
    // offsets, every latent frame counts temporal_factor frames.
    const int64_t last = f.offset_ends.back();
    f.frame_count = last >= 0 ? last : f.latent_frames() * f.temporal_factor;
  } else {
    f.frame_count = f.latent_frames();
  }
  latent::Status s = st->writer->finish(latent::latent_file_metadata(f));
  const std::string path = st->writer->path();
  st->writer.reset();
  if (!s.ok()) {
    GST_ELEMENT_ERROR(self, RESOURCE, WRITE, ("latentsink: %s", s.message().c_str()), (nullptr));
    return FALSE;
  }
  st->finished = true;
  GST_INFO_OBJECT(self, "wrote %s: %" G_GINT64_FORMAT " latent frames, %" G_GINT64_FORMAT " frames",
                  path.c_str(), f.latent_frames(), f.frame_count);
  return TRUE;
}

static gboolean gst_latent_sink_event(GstBaseSink* sink, GstEvent* event) {
  GstLatentSink* self = GST_LATENT_SINK(sink);
  if (GST_EVENT_TYPE(event) == GST_EVENT_EOS) {
    State* st = self->state;
    if (!st->writer && !st->finished) {
      GST_ELEMENT_ERROR(self, STREAM, FAILED,
                        ("latentsink: the stream ended without any latent frame; %s not written",
                         settings_copy(self).location.c_str()),
                        (nullptr));
      gst_event_unref(event);
      return FALSE;
    }
    if (st->writer && !finish_file(self)) {
      gst_event_unref(event);
      return FALSE;
    }
  }
  return GST_BASE_SINK_CLASS(gst_latent_sink_parent_class)->event(sink, event);
}

static void gst_latent_sink_finalize(GObject* object) {
  GstLatentSink* self = GST_LATENT_SINK(object);
  delete self->state;
  delete self->settings;
  delete self->lock;
  G_OBJECT_CLASS(gst_latent_sink_parent_class)->finalize(object);
}

static void gst_latent_sink_class_init(GstLatentSinkClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  GstElementClass* element_class = GST_ELEMENT_CLASS(klass);
  GstBaseSinkClass* sink_class = GST_BASE_SINK_CLASS(klass);
  gobject_class->set_property = gst_latent_sink_set_property;
  gobject_class->get_property = gst_latent_sink_get_property;
  gobject_class->finalize = gst_latent_sink_finalize;

  const GParamFlags rw = static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                                  GST_PARAM_MUTABLE_READY);
  g_object_class_install_property(
      gobject_class, PROP_LOCATION,
      g_param_spec_string("location", "Location",
                          "The latent file to write (.safetensors); written as LOCATION.partial "
                          "and renamed at EOS",
                          "", rw));
  g_object_class_install_property(
      gobject_class, PROP_MODEL,
      g_param_spec_string("model", "Model",
                          "The model recorded in the file (its config is hashed); empty: the "
                          "`model` of the encoder upstream",
                          "", rw));
  g_object_class_install_property(
      gobject_class, PROP_SOURCE,
      g_param_spec_string("source", "Source",
                          "The source recorded in the file; empty: the `source` (latentsrc) or "
                          "`location` (filesrc) of the first upstream element that has one",
                          "", rw));
  g_object_class_install_property(
      gobject_class, PROP_FSYNC,
      g_param_spec_boolean("fsync", "fsync",
                           "Sync the file and its folder to disk before reporting EOS", TRUE, rw));

  GstCaps* caps = gst_caps_from_string(GST_LATENT_CAPS_TEMPLATE);
  if (gst_latent_cuda_built())
    gst_caps_append(caps, gst_caps_from_string(GST_LATENT_CUDA_CAPS_TEMPLATE));
  gst_element_class_add_pad_template(
      element_class, gst_pad_template_new("sink", GST_PAD_SINK, GST_PAD_ALWAYS, caps));
  gst_caps_unref(caps);
  gst_element_class_set_static_metadata(
      element_class, "Latent file sink", "Sink/File",
      "Writes latents (application/x-latent) to a safetensors latent file, one per stream",
      "gst-latent");

  sink_class->start = GST_DEBUG_FUNCPTR(gst_latent_sink_start);
  sink_class->stop = GST_DEBUG_FUNCPTR(gst_latent_sink_stop);
  sink_class->set_caps = GST_DEBUG_FUNCPTR(gst_latent_sink_set_caps);
  sink_class->render = GST_DEBUG_FUNCPTR(gst_latent_sink_render);
  sink_class->event = GST_DEBUG_FUNCPTR(gst_latent_sink_event);
  GST_DEBUG_CATEGORY_INIT(gst_latent_sink_debug, "latentsink", 0, "latent file sink");
}

static void gst_latent_sink_init(GstLatentSink* self) {
  self->lock = new std::mutex();
  self->settings = new Settings();
  self->state = new State();
  gst_base_sink_set_sync(GST_BASE_SINK(self), FALSE);
  gst_base_sink_set_async_enabled(GST_BASE_SINK(self), TRUE);
}
