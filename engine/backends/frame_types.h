// The types of frame I/O (what engine/backends/frames.h converts and what each Backend
// implements: Backend::frame_to_tensor() and friends). GStreamer-free; no backend needed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/core/pixels.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace latent {

// Packed formats are PixelFormat's values; NV12 and I420 follow them.
enum class FrameFormat : uint8_t {
  kRGB,
  kBGR,
  kRGBA,
  kBGRA,
  kRGBx,
  kBGRx,
  kxRGB,
  kxBGR,
  kARGB,
  kABGR,
  kNV12,  // Y plane, then interleaved U/V at half width and height
  kI420,  // Y plane, U plane, V plane (U and V at half width and height)
};
constexpr FrameFormat frame_format(PixelFormat f) { return static_cast<FrameFormat>(f); }
inline bool frame_format_is_packed(FrameFormat f) { return f < FrameFormat::kNV12; }
inline PixelFormat frame_pixel_format(FrameFormat f) { return static_cast<PixelFormat>(f); }
int frame_format_planes(FrameFormat f);        // 1, 2 or 3
const char* frame_format_name(FrameFormat f);  // "RGBx", "NV12", ...

// The YUV -> RGB matrix and range of NV12/I420 frames.
enum class YuvMatrix : uint8_t { kBT601, kBT709, kBT2020 };
struct YuvColor {
  YuvMatrix matrix = YuvMatrix::kBT601;
  bool full_range = false;  // false: Y in 16..235, U/V in 16..240
};

// YUV -> RGB as floats: r = y' + cr_r * v', g = y' - cb_g * u' - cr_g * v', b = y' + cb_b * u'
// with y' = (Y - y_off) * y_scale and u', v' = (U/V - 128) * c_scale (all in 0..255 units).
struct YuvCoefficients {
  float y_off, y_scale, c_scale;
  float cr_r, cb_g, cr_g, cb_b;
};
YuvCoefficients yuv_coefficients(const YuvColor& c);

struct FrameDesc {
  FrameFormat format = FrameFormat::kRGB;
  int width = 0, height = 0;
  // planes[i] with strides[i] bytes a row; unused planes stay null. Host pointers when
  // `device` is the CPU, device pointers of that CUDA device otherwise.
  void* planes[3] = {nullptr, nullptr, nullptr};
  size_t strides[3] = {0, 0, 0};
  Device device;
  YuvColor color;  // NV12/I420 only
  // Host planes in page-locked memory (alloc_pinned_host(), registry.h, or any other
  // cudaHostAlloc'd memory of the backend's device): a FrameStager uploads them in place,
  // with no copy on the caller's thread, and the frame must then stay valid until the stager's
  // convert() of its ticket has returned (see FrameStager::stage). Ignored elsewhere.
  bool pinned = false;
};

// Uploads host frames ahead of their conversion on GPU backends: stage() copies a frame into a
// pinned host slot (or takes a `pinned` frame's own page-locked planes) and queues its upload on
// a separate copy stream, so the upload overlaps the work queued for earlier frames; convert()
// makes the model tensor from a staged frame, the compute stream waiting on the upload's event
// (the host does not wait, but for a `pinned` frame's own upload, long done by then). depth + 1
// slots are reused round-robin and only grow, so frames of a steady size allocate nothing. At
// most `depth` + 1 frames may be staged and not yet converted; convert() takes them in stage
// order.
// A frame already in the backend's device memory is copied device to device on the copy
// stream, and stage() waits for that copy only: the frame's buffer can go back to its producer
// (a decoder's pool) at once, without waiting behind the work queued on the compute stream.
// stage() waits on the compute stream only when it reuses a slot whose conversion has not run.
class FrameStager {
 public:
  virtual ~FrameStager() = default;
  // The frame may be freed or reused once this returns, but for a `pinned` host frame, which
  // the copy engine reads after this returns: that one must stay valid until convert() of its
  // ticket has returned (convert() waits for the copy first; the stager's destruction waits
  // for every copy). Returns the frame's ticket.
  virtual Result<uint64_t> stage(const FrameDesc& frame) = 0;
  // The staged frame `ticket` -> backend tensor, as frame_to_tensor() would make it (written
  // into `into` where given: an image tensor of the backend as frame_to_tensor() makes, e.g. a
  // plan's input buffer; anything else is refused).
  virtual Result<Tensor> convert(uint64_t ticket, const FrameGeometry& g,
                                 const Tensor* into = nullptr) = 0;
  virtual int depth() const = 0;
};
// Downloads decoded frames while later ones compute (the way back of FrameStager): queue()
// converts an image tensor into the packed frame's bytes on the compute stream (like
// tensor_to_frame()), records an event there and queues the copy of those bytes into a pinned
// host slot on a separate copy stream, without waiting; fetch() waits for that copy and writes
// the frame. depth + 1 slots are reused round-robin and only grow, so frames of a steady size
// allocate nothing. At most `depth` + 1 frames may be queued and not yet fetched; fetch() takes
// them in queue order. queue() uses the backend's stream (hold whatever serialises the
// backend's callers); ready() and fetch() only wait on the copy stream.
class FrameDownloader {
 public:
  virtual ~FrameDownloader() = default;
  // image [1, 3, g.model_height(), g.model_width()] (as the decoder returns it) -> a packed
  // `format` frame of g.frame_width() x g.frame_height(), on its way to the host. The image may
  // be dropped or overwritten (a plan's next run) once this returns. Returns the frame's ticket.
  // `direct`: a host frame (that format and size) in page-locked memory (alloc_pinned_host(),
  // registry.h) that the copy writes straight into, row by row, instead of the pinned slot;
  // fetch() then only waits, and must be given that frame. It must stay valid until fetch() or
  // reset() has returned.
  virtual Result<uint64_t> queue(const Tensor& image, const FrameGeometry& g, FrameFormat format,
                                 const FrameDesc* direct = nullptr) = 0;
  // Whether the copy of frame `ticket` has completed (fetch() would not wait).
  virtual Result<bool> ready(uint64_t ticket) = 0;
  // Waits for frame `ticket` and writes it into `host_frame` (packed, its format and size as
  // queued; only each row's pixels are written). Frees its slot.
  virtual Status fetch(uint64_t ticket, const FrameDesc& host_frame) = 0;
  // Forgets every queued frame (a flush): waits for their copies, frees nothing.
  virtual void reset() = 0;
  virtual int depth() const = 0;
};
}  // namespace latent
