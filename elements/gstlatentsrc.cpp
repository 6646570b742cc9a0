/**
 * SECTION:element-latentsrc
 * @title: latentsrc
 * @short_description: Plays a latent file (as latentsink writes it) as a stream of latents
 *
 * ```sh
 * gst-launch-1.0 latentsrc location=clip.safetensors ! vaedecode ! videoconvert \
 *     ! vp8enc ! webmmux ! filesink location=clip.webm
 * ```
 * (pipelines/decode_latents.sh)
 *
 * Read-only properties `model` and `source` give what the open file records.
 * Pushes one application/x-latent buffer per latent frame with the caps the file describes
 * (temporal-factor too for a video-mode file) and each frame's PTS, DURATION, OFFSET and
 * OFFSET_END as they were recorded. Seekable in TIME (flushing, segment start and stop): playback
 * resumes at the latent frame covering the position. Its header is read when it starts; each
 * latent frame is read (pread) into a buffer of its own as it is pushed, so a file truncated while
 * it plays is an error naming the file and the frame, never a crash in an element downstream. A
 * truncated file or a safetensors file that is not a latent file is an error naming the file and
 * what is wrong.
 */
#include "elements/gstlatentsrc.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <mutex>
#include <string>

#include "elements/gstlatentcaps.h"
#include "engine/weights/latent_file.h"

GST_DEBUG_CATEGORY_STATIC(gst_latent_src_debug);
#define GST_CAT_DEFAULT gst_latent_src_debug

namespace {

enum { PROP_0, PROP_LOCATION, PROP_MODEL, PROP_SOURCE };

struct State {
  std::shared_ptr<latent::LatentFile> file;
  // The file, open for pread: each latent frame is read into a buffer of its own rather than
  // handed out as a view of the mapping, so a file truncated while it plays is an error when the
  // read comes up short (as filesrc does), never a SIGBUS in whichever element touches the data.
  int fd = -1;
  GstCaps* caps = nullptr;
  int64_t next = 0;  // index of the next latent frame to push
  bool discont = true;
  GstClockTime frame_duration = GST_CLOCK_TIME_NONE;  // from the frame rate, for missing times

  ~State() {
    if (caps) gst_caps_unref(caps);
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

struct _GstLatentSrc {
  GstPushSrc parent;
  std::mutex* lock;  // guards location and state against queries from other threads
  std::string* location;
  State* state;
};

G_DEFINE_TYPE(GstLatentSrc, gst_latent_src, GST_TYPE_PUSH_SRC);
GST_ELEMENT_REGISTER_DEFINE(latentsrc, "latentsrc", GST_RANK_NONE, GST_TYPE_LATENT_SRC);

static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE(
    "src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS(GST_LATENT_CAPS_TEMPLATE));

namespace {

// Frame `i`'s pts, or one computed from the frame rate when the file has none.
GstClockTime frame_pts(const State& st, int64_t i) {
  const int64_t p = st.file->info.pts[i];
  if (p >= 0) return static_cast<GstClockTime>(p);
  if (!GST_CLOCK_TIME_IS_VALID(st.frame_duration)) return GST_CLOCK_TIME_NONE;
  const int64_t per = st.file->info.video_mode() ? st.file->info.temporal_factor : 1;
  return st.frame_duration * static_cast<GstClockTime>(i * per);
}

GstClockTime frame_duration(const State& st, int64_t i) {
  const int64_t d = st.file->info.durations[i];
  if (d >= 0) return static_cast<GstClockTime>(d);
  if (!GST_CLOCK_TIME_IS_VALID(st.frame_duration)) return GST_CLOCK_TIME_NONE;
  return st.frame_duration * (st.file->info.video_mode() ? st.file->info.temporal_factor : 1);
}

GstClockTime total_duration(const State& st) {
  if (!st.file) return GST_CLOCK_TIME_NONE;
  const int64_t last = st.file->frames() - 1;
  const GstClockTime p = frame_pts(st, last), d = frame_duration(st, last);
  if (!GST_CLOCK_TIME_IS_VALID(p) || !GST_CLOCK_TIME_IS_VALID(d)) return GST_CLOCK_TIME_NONE;
  return p + d;
}

}  // namespace

static void gst_latent_src_set_property(GObject* object, guint prop_id, const GValue* value,
                                        GParamSpec* pspec) {
  GstLatentSrc* self = GST_LATENT_SRC(object);
  if (prop_id == PROP_LOCATION) {
    // The file is open (read at start): a new name would be shown but not played.
    std::string current;
    {
      std::lock_guard<std::mutex> g(*self->lock);
      current = *self->location;
    }
    if (gst_latent_refuse_while_running(GST_ELEMENT(self), "latentsrc", pspec, current)) return;
  }
  std::lock_guard<std::mutex> g(*self->lock);
  switch (prop_id) {
    case PROP_LOCATION: {
      const gchar* v = g_value_get_string(value);
      *self->location = v ? v : "";
      break;
    }
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
  }
}

static void gst_latent_src_get_property(GObject* object, guint prop_id, GValue* value,
                                        GParamSpec* pspec) {
  GstLatentSrc* self = GST_LATENT_SRC(object);
  std::lock_guard<std::mutex> g(*self->lock);
  switch (prop_id) {
    case PROP_LOCATION:
      g_value_set_string(value, self->location->c_str());
      break;
    case PROP_MODEL:
      g_value_set_string(value,
                         self->state->file ? self->state->file->info.model.c_str() : nullptr);
      break;
    case PROP_SOURCE:
      g_value_set_string(value,
                         self->state->file ? self->state->file->info.source.c_str() : nullptr);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
  }
}

static gboolean gst_latent_src_start(GstBaseSrc* src) {
  GstLatentSrc* self = GST_LATENT_SRC(src);
  std::string location;
  {
    std::lock_guard<std::mutex> g(*self->lock);
    location = *self->location;
  }
  if (location.empty()) {
    GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND,
                      ("latentsrc: no file name given; set location=FILE.safetensors"), (nullptr));
    return FALSE;
  }
  auto file = latent::open_latent_file(location);
  if (!file.ok()) {
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("latentsrc: %s", file.status().message().c_str()),
                      (nullptr));
    return FALSE;
  }
  const latent::LatentFileInfo& i = file->info;
  GstLatentInfo info;
  info.dtype = i.dtype;
  info.channels = i.channels;
  info.width = i.width;
  info.height = i.height;
  info.latent_space = i.latent_space;
  info.frame_width = i.frame_width;
  info.frame_height = i.frame_height;
  info.size_policy = *latent::parse_size_policy(i.size_policy);  // checked by the parser
  info.fps_n = i.fps_n;
  info.fps_d = i.fps_d;
  GstCaps* caps = gst_latent_info_to_caps(info);
  if (i.video_mode())
    gst_caps_set_simple(caps, "temporal-factor", G_TYPE_INT, i.temporal_factor, nullptr);

  auto* st = new State();
  st->fd = ::open(location.c_str(), O_RDONLY | O_CLOEXEC);
  if (st->fd < 0) {
    const int err = errno;
    delete st;
    gst_caps_unref(caps);
    GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ,
                      ("latentsrc: cannot open %s: %s", location.c_str(), g_strerror(err)),
                      (nullptr));
    return FALSE;
  }
  st->file = std::make_shared<latent::LatentFile>(std::move(*file));
  st->caps = caps;
  if (i.fps_n > 0) st->frame_duration = gst_util_uint64_scale_int(GST_SECOND, i.fps_d, i.fps_n);
  GST_INFO_OBJECT(self, "%s: %" G_GINT64_FORMAT " latent frames, %" GST_PTR_FORMAT,
                  location.c_str(), st->file->frames(), caps);
  std::lock_guard<std::mutex> g(*self->lock);
  delete self->state;
  self->state = st;
  return TRUE;
}

static gboolean gst_latent_src_stop(GstBaseSrc* src) {
  GstLatentSrc* self = GST_LATENT_SRC(src);
  std::lock_guard<std::mutex> g(*self->lock);
  delete self->state;
  self->state = new State();
  return TRUE;
}

static GstCaps* gst_latent_src_get_caps(GstBaseSrc* src, GstCaps* filter) {
  GstLatentSrc* self = GST_LATENT_SRC(src);
  GstCaps* caps = nullptr;
  {
    std::lock_guard<std::mutex> g(*self->lock);
    if (self->state->caps) caps = gst_caps_ref(self->state->caps);
  }
  if (!caps) caps = gst_pad_get_pad_template_caps(GST_BASE_SRC_PAD(src));
  if (filter) {
    GstCaps* both = gst_caps_intersect_full(filter, caps, GST_CAPS_INTERSECT_FIRST);
    gst_caps_unref(caps);
    caps = both;
  }
  return caps;
}

// The file's caps are fixed: when downstream takes none of them (vaedecode told a frame size
// the file does not have, an element that takes no latents), say which caps met which, instead of
// GstBaseSrc's bare "Internal data stream error" (not-negotiated).
static gboolean gst_latent_src_negotiate(GstBaseSrc* src) {
  GstLatentSrc* self = GST_LATENT_SRC(src);
  GstCaps* caps = nullptr;
  std::string location;
  {
    std::lock_guard<std::mutex> g(*self->lock);
    if (self->state->caps) caps = gst_caps_ref(self->state->caps);
    location = *self->location;
  }
  if (caps) {
    GstPad* pad = GST_BASE_SRC_PAD(src);
    GstCaps* taken = gst_pad_peer_query_caps(pad, caps);
    const bool refused = taken && gst_caps_is_empty(taken);
    if (taken) gst_caps_unref(taken);
    if (refused) {
      GstCaps* downstream = gst_pad_peer_query_caps(pad, nullptr);
      gchar* ours = gst_caps_to_string(caps);
      gchar* theirs = downstream ? gst_caps_to_string(downstream) : g_strdup("nothing");
      GST_ELEMENT_ERROR(self, CORE, NEGOTIATION,
                        ("latentsrc: downstream takes none of the caps of %s (%s); it takes %s",
                         location.c_str(), ours, theirs),
                        (nullptr));
      g_free(ours);
      g_free(theirs);
      if (downstream) gst_caps_unref(downstream);
      gst_caps_unref(caps);
      return FALSE;
    }
    gst_caps_unref(caps);
  }
  return GST_BASE_SRC_CLASS(gst_latent_src_parent_class)->negotiate(src);
}

static gboolean gst_latent_src_is_seekable(GstBaseSrc*) { return TRUE; }

static gboolean gst_latent_src_do_seek(GstBaseSrc* src, GstSegment* segment) {
  GstLatentSrc* self = GST_LATENT_SRC(src);
  std::lock_guard<std::mutex> g(*self->lock);
  State& st = *self->state;
  if (!st.file) return TRUE;  // the initial seek before start
  if (segment->rate < 0) {
    GST_WARNING_OBJECT(self, "reverse playback is not supported");
    return FALSE;
  }
  // The first latent frame that ends after the start: the one covering the position.
  const GstClockTime start = segment->start;
  int64_t i = 0;
  const int64_t n = st.file->frames();
  for (; i < n; ++i) {
    const GstClockTime p = frame_pts(st, i), d = frame_duration(st, i);
    if (!GST_CLOCK_TIME_IS_VALID(p)) break;  // no times at all: start from the beginning
    if ((GST_CLOCK_TIME_IS_VALID(d) ? p + d : p + 1) > start) break;
  }
  st.next = GST_CLOCK_TIME_IS_VALID(frame_pts(st, 0)) ? i : 0;
  st.discont = true;
  GST_DEBUG_OBJECT(self, "seek to %" GST_TIME_FORMAT ": latent frame %" G_GINT64_FORMAT,
                   GST_TIME_ARGS(start), st.next);
  return TRUE;
}

static gboolean gst_latent_src_query(GstBaseSrc* src, GstQuery* query) {
  GstLatentSrc* self = GST_LATENT_SRC(src);
  if (GST_QUERY_TYPE(query) == GST_QUERY_DURATION) {
    GstFormat format;
    gst_query_parse_duration(query, &format, nullptr);
    if (format == GST_FORMAT_TIME) {
      GstClockTime d;
      {
        std::lock_guard<std::mutex> g(*self->lock);
        d = total_duration(*self->state);
      }
      if (GST_CLOCK_TIME_IS_VALID(d)) {
        gst_query_set_duration(query, GST_FORMAT_TIME, static_cast<gint64>(d));
        return TRUE;
      }
    }
  }
  return GST_BASE_SRC_CLASS(gst_latent_src_parent_class)->query(src, query);
}

static GstFlowReturn gst_latent_src_create(GstPushSrc* push, GstBuffer** out) {
  GstLatentSrc* self = GST_LATENT_SRC(push);
  GstBaseSrc* src = GST_BASE_SRC(push);
  std::lock_guard<std::mutex> g(*self->lock);
  State& st = *self->state;
  if (!st.file) return GST_FLOW_FLUSHING;
  if (st.next >= st.file->frames()) return GST_FLOW_EOS;
  const int64_t i = st.next;
  const GstClockTime pts = frame_pts(st, i);
  GST_OBJECT_LOCK(src);
  const GstClockTime stop = src->segment.stop;
  GST_OBJECT_UNLOCK(src);
  if (GST_CLOCK_TIME_IS_VALID(stop) && GST_CLOCK_TIME_IS_VALID(pts) && pts >= stop)
    return GST_FLOW_EOS;

  const size_t bytes = st.file->frame_bytes();
  GstBuffer* buf = gst_buffer_new_allocate(nullptr, bytes, nullptr);
  GstMapInfo map;
  if (!buf || !gst_buffer_map(buf, &map, GST_MAP_WRITE)) {
    if (buf) gst_buffer_unref(buf);
    GST_ELEMENT_ERROR(self, RESOURCE, NO_SPACE_LEFT,
                      ("latentsrc: cannot allocate a buffer of %zu bytes", bytes), (nullptr));
    return GST_FLOW_ERROR;
  }
  const off_t at = static_cast<off_t>(st.file->frame_offset(i));
  size_t got = 0;
  int err = 0;
  while (got < bytes) {
    const ssize_t n = ::pread(st.fd, map.data + got, bytes - got, at + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : 0;
      break;
    }
    got += static_cast<size_t>(n);
  }
  gst_buffer_unmap(buf, &map);
  if (got < bytes) {
    gst_buffer_unref(buf);
    GST_ELEMENT_ERROR(
        self, RESOURCE, READ,
        ("latentsrc: %s: cannot read latent frame %" G_GINT64_FORMAT " of %" G_GINT64_FORMAT
         " (%zu of its %zu bytes at offset %" G_GINT64_FORMAT "): %s",
         self->location->c_str(), i, st.file->frames(), got, bytes, static_cast<gint64>(at),
         err ? g_strerror(err) : "the file ends there (truncated while playing?)"),
        (nullptr));
    return GST_FLOW_ERROR;
  }
  GST_BUFFER_PTS(buf) = pts;
  GST_BUFFER_DURATION(buf) = frame_duration(st, i);
  const latent::LatentFileInfo& info = st.file->info;
  GST_BUFFER_OFFSET(buf) = info.offsets[i] >= 0 ? guint64(info.offsets[i]) : GST_BUFFER_OFFSET_NONE;
  GST_BUFFER_OFFSET_END(buf) =
      info.offset_ends[i] >= 0 ? guint64(info.offset_ends[i]) : GST_BUFFER_OFFSET_NONE;
  if (st.discont) {
    GST_BUFFER_FLAG_SET(buf, GST_BUFFER_FLAG_DISCONT);
    st.discont = false;
  }
  ++st.next;
  *out = buf;
  return GST_FLOW_OK;
}

static void gst_latent_src_finalize(GObject* object) {
  GstLatentSrc* self = GST_LATENT_SRC(object);
  delete self->state;
  delete self->location;
  delete self->lock;
  G_OBJECT_CLASS(gst_latent_src_parent_class)->finalize(object);
}

static void gst_latent_src_class_init(GstLatentSrcClass* klass) {
  GObjectClass* gobject_class = G_OBJECT_CLASS(klass);
  GstElementClass* element_class = GST_ELEMENT_CLASS(klass);
  GstBaseSrcClass* base_class = GST_BASE_SRC_CLASS(klass);
  GstPushSrcClass* push_class = GST_PUSH_SRC_CLASS(klass);
  gobject_class->set_property = gst_latent_src_set_property;
  gobject_class->get_property = gst_latent_src_get_property;
  gobject_class->finalize = gst_latent_src_finalize;
  g_object_class_install_property(
      gobject_class, PROP_LOCATION,
      g_param_spec_string("location", "Location", "The latent file to play (.safetensors)", "",
                          static_cast<GParamFlags>(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS |
                                                   GST_PARAM_MUTABLE_READY)));
  // Read-only: what the file records (a latentsink downstream records them again).
  const GParamFlags ro = static_cast<GParamFlags>(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS);
  g_object_class_install_property(
      gobject_class, PROP_MODEL,
      g_param_spec_string("model", "Model", "The model the open file records (null while stopped)",
                          nullptr, ro));
  g_object_class_install_property(
      gobject_class, PROP_SOURCE,
      g_param_spec_string("source", "Source",
                          "The source the open file records (null while stopped)", nullptr, ro));
  gst_element_class_add_static_pad_template(element_class, &src_template);
  gst_element_class_set_static_metadata(
      element_class, "Latent file source", "Source/File",
      "Plays a safetensors latent file (as latentsink writes it) as application/x-latent",
      "gst-latent");
  base_class->start = GST_DEBUG_FUNCPTR(gst_latent_src_start);
  base_class->stop = GST_DEBUG_FUNCPTR(gst_latent_src_stop);
  base_class->get_caps = GST_DEBUG_FUNCPTR(gst_latent_src_get_caps);
  base_class->negotiate = GST_DEBUG_FUNCPTR(gst_latent_src_negotiate);
  base_class->is_seekable = GST_DEBUG_FUNCPTR(gst_latent_src_is_seekable);
  base_class->do_seek = GST_DEBUG_FUNCPTR(gst_latent_src_do_seek);
  base_class->query = GST_DEBUG_FUNCPTR(gst_latent_src_query);
  push_class->create = GST_DEBUG_FUNCPTR(gst_latent_src_create);
  GST_DEBUG_CATEGORY_INIT(gst_latent_src_debug, "latentsrc", 0, "latent file source");
}

static void gst_latent_src_init(GstLatentSrc* self) {
  self->lock = new std::mutex();
  self->location = new std::string();
  self->state = new State();
  gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_TIME);
}
