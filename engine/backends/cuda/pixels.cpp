// Host side of the GPU frame conversions: checks, staging copies, kernel launches.
#include "engine/backends/cuda/pixels.cuh"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/memory.h"
#include "engine/backends/frames.h"
#include "engine/core/env.h"

namespace latent::cuda {
namespace {

// Bytes of one row and number of rows of plane `i` that the kernels read or write.
void plane_extent(const FrameDesc& f, int i, size_t* row, size_t* rows) {
  if (frame_format_is_packed(f.format)) {
    *row =
        static_cast<size_t>(f.width) * pixel_layout(frame_pixel_format(f.format)).bytes_per_pixel;
    *rows = static_cast<size_t>(f.height);
  } else if (i == 0) {
    *row = static_cast<size_t>(f.width);
    *rows = static_cast<size_t>(f.height);
  } else {
    *row = static_cast<size_t>((f.width + 1) / 2) * (f.format == FrameFormat::kNV12 ? 2 : 1);
    *rows = static_cast<size_t>((f.height + 1) / 2);
  }
}

// The planes of `f` tightly packed one after another, each from a 256-byte boundary: bytes of
// a row, rows and offset of each plane; returns the bytes of all.
size_t packed_planes(const FrameDesc& f, size_t (&row)[3], size_t (&rows)[3], size_t (&offset)[3]) {
  size_t total = 0;
  for (int i = 0; i < frame_format_planes(f.format); ++i) {
    plane_extent(f, i, &row[i], &rows[i]);
    offset[i] = total;
    total += (row[i] * rows[i] + 255) / 256 * 256;
  }
  return total;
}

// What the conversion kernels read of `f`, its planes left unset.
FrameKernelSource kernel_source(const FrameDesc& f) {
  FrameKernelSource src;
  src.format = f.format;
  src.width = f.width;
  src.height = f.height;
  src.yuv = yuv_coefficients(f.color);
  return src;
}

}  // namespace

namespace {

// The image tensor a conversion writes: `into` where given (an NHWC image tensor as made below,
// checked: a plan's input buffer), else a new one.
Result<Tensor> image_target(DeviceContext& ctx, Backend& backend, const FrameGeometry& g,
                            const Tensor* into) {
  if (!into)
    return ctx.empty({1, 3, g.model_height(), g.model_width()}, backend.compute_dtype(),
                     Layout::kNHWC);
  LATENT_TRY(check_image_target(backend, *into, g));
  if (into->layout() != Layout::kNHWC)
    return Status::errorf("image target ", into->describe(), " is not in the NHWC layout of ",
                          backend.name());
  return *into;
}

}  // namespace

Result<Tensor> frame_to_tensor(const BackendIo& io, const FrameDesc& frame, const FrameGeometry& g,
                               const Tensor* into) {
  Backend& backend = io.backend;
  const std::shared_ptr<DeviceContext>& ctx = io.ctx;
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx->device()));
  const Launch l = io.launch;
  FrameKernelSource src = kernel_source(frame);
  const int planes = frame_format_planes(frame.format);
  TempBuffer staging;
  if (frame.device.is_cpu()) {
    // The raw bytes go up, tightly packed; the kernels do all the conversion work.
    size_t row[3] = {}, rows[3] = {}, offset[3] = {};
    const size_t total = packed_planes(frame, row, rows, offset);
    LATENT_TRY(staging.allocate(*ctx, total));
    for (int i = 0; i < planes; ++i) {
      uint8_t* dst = staging.as<uint8_t>() + offset[i];
      LATENT_CUDA_CHECK(cudaMemcpy2DAsync(dst, row[i], frame.planes[i], frame.strides[i], row[i],
                                          rows[i], cudaMemcpyHostToDevice, ctx->stream()));
      count_host_to_device(row[i] * rows[i]);
      src.planes[i] = dst;
      src.strides[i] = row[i];
    }
  } else {
    for (int i = 0; i < planes; ++i) {
      src.planes[i] = static_cast<const uint8_t*>(frame.planes[i]);
      src.strides[i] = frame.strides[i];
    }
  }
  LATENT_ASSIGN_OR_RETURN(Tensor out, image_target(*ctx, backend, g, into));
  LATENT_TRY(launch_frame_to_nhwc(src, g, out.data(), out.dtype(), l));
  return out;
}

Status tensor_to_frame(const BackendIo& io, const Tensor& image, const FrameGeometry& g,
                       const FrameDesc& frame) {
  Backend& backend = io.backend;
  const std::shared_ptr<DeviceContext>& ctx = io.ctx;
  if (image.device() != backend.device())
    return Status::errorf("image ", image.describe(), " is not on ", backend.name());
  if (image.byte_offset() + image.nbytes() > image.storage()->bytes())
    return Status::errorf("image ", image.describe(), " is larger than its storage");
  // NHWC, or a contiguous tensor whose NCHW and NHWC readings agree (one pixel).
  if (image.layout() != Layout::kNHWC && g.model_width() * g.model_height() != 1)
    return Status::errorf("image ", image.describe(), " is not in the NHWC layout of ",
                          backend.name());
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx->device()));
  const Launch l = io.launch;
  const PixelFormat format = frame_pixel_format(frame.format);
  size_t row = 0, rows = 0;
  plane_extent(frame, 0, &row, &rows);
  if (!frame.device.is_cpu()) {
    LATENT_TRY(launch_nhwc_to_frame(image.data(), image.dtype(), g, format,
                                    static_cast<uint8_t*>(frame.planes[0]), frame.strides[0], l));
  } else {
    TempBuffer staging;
    LATENT_TRY(staging.allocate(*ctx, row * rows));
    LATENT_TRY(launch_nhwc_to_frame(image.data(), image.dtype(), g, format, staging.as<uint8_t>(),
                                    row, l));
    // Only each row's pixels come back: bytes past them stay untouched, as on the CPU.
    LATENT_CUDA_CHECK(cudaMemcpy2DAsync(frame.planes[0], frame.strides[0], staging.get(), row, row,
                                        rows, cudaMemcpyDeviceToHost, ctx->stream()));
    count_device_to_host(row * rows);
  }
  // The frame is complete when this returns (its consumer may be on another stream).
  LATENT_CUDA_CHECK(cudaStreamSynchronize(ctx->stream()));
  return ok_status();
}

namespace {

// One frame's bytes on their way between host and device: pinned host memory, a device buffer
// of the same size, and the events that order the copy between them against the kernel that
// fills or reads the device side.
struct PinnedSlot {
  void* host = nullptr;  // pinned
  void* device = nullptr;
  size_t capacity = 0;             // bytes of both
  cudaEvent_t copied = nullptr;    // copy stream: the copy (either way) is complete
  cudaEvent_t computed = nullptr;  // compute stream: the kernel on the device bytes has run
  bool busy = false;               // taken by a frame not yet handed on
  uint64_t ticket = 0;

  // Room for `bytes` in both buffers (contents lost; `with_host` false: the device buffer
  // only, for frames copied device to device); grows once per larger frame size, steady
  // streams never reallocate. The slot's last copy and kernel must be done.
  bool fits(size_t bytes, bool with_host) const {
    return device && bytes <= capacity && (host || !with_host);
  }
  Status reserve(size_t bytes, bool with_host = true) {
    if (fits(bytes, with_host)) return ok_status();
    if (host) LATENT_CUDA_CHECK(cudaFreeHost(host));
    if (device) LATENT_CUDA_CHECK(cudaFree(device));
    host = device = nullptr;
    capacity = 0;
    if (with_host) LATENT_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
    LATENT_CUDA_CHECK(cudaMalloc(&device, bytes));
    capacity = bytes;
    return ok_status();
  }
};

// depth + 1 slots that frames take in ticket order (ticket % slots), and the copy stream they
// share with the context's compute stream. Slot: a PinnedSlot with what its frames add.
template <class Slot>
class PinnedRing {
 public:
  PinnedRing(std::shared_ptr<DeviceContext> ctx, int depth)
      : ctx_(std::move(ctx)), slots_(depth + 1) {}
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;

  ~PinnedRing() {
    DeviceGuard guard;
    if (!guard.set(ctx_->device()).ok()) return;
    for (Slot& s : slots_) {
      if (s.computed) LATENT_CUDA_WARN(cudaEventSynchronize(s.computed));
      if (s.copied) LATENT_CUDA_WARN(cudaEventSynchronize(s.copied));
      if (s.host) LATENT_CUDA_WARN(cudaFreeHost(s.host));
      if (s.device) LATENT_CUDA_WARN(cudaFree(s.device));
      if (s.copied) LATENT_CUDA_WARN(cudaEventDestroy(s.copied));
      if (s.computed) LATENT_CUDA_WARN(cudaEventDestroy(s.computed));
    }
    if (copy_stream_) LATENT_CUDA_WARN(cudaStreamDestroy(copy_stream_));
  }

  Status init() {
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx_->device()));
    LATENT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (Slot& s : slots_) {
      LATENT_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
      LATENT_CUDA_CHECK(cudaEventCreateWithFlags(&s.computed, cudaEventDisableTiming));
    }
    return ok_status();
  }

  // Slot `s` takes frame `ticket`: its first `bytes` go across on the copy stream (host to
  // device for an upload, back otherwise), then `copied` is recorded.
  Status copy(Slot& s, size_t bytes, bool upload, uint64_t ticket) {
    LATENT_CUDA_CHECK(cudaMemcpyAsync(upload ? s.device : s.host, upload ? s.host : s.device, bytes,
                                      upload ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                      copy_stream_));
    return copied(s, bytes, upload, ticket);
  }
  // The copy of frame `ticket` (`bytes`, queued on the copy stream by the caller: copy() or the
  // downloader's copy straight into a host frame) is the slot's: its event, its count, the slot
  // taken.
  Status copied(Slot& s, size_t bytes, bool upload, uint64_t ticket) {
    LATENT_CUDA_CHECK(cudaEventRecord(s.copied, copy_stream_));
    if (upload)
      count_host_to_device(bytes);
    else
      count_device_to_host(bytes);
    s.busy = true;
    s.ticket = ticket;
    return ok_status();
  }

  DeviceContext& ctx() { return *ctx_; }
  cudaStream_t copy_stream() const { return copy_stream_; }
  size_t size() const { return slots_.size(); }
  std::vector<Slot>& slots() { return slots_; }
  Slot& operator[](uint64_t ticket) { return slots_[ticket % slots_.size()]; }
  uint64_t next_ticket() { return next_ticket_++; }

 private:
  std::shared_ptr<DeviceContext> ctx_;
  std::vector<Slot> slots_;
  cudaStream_t copy_stream_ = nullptr;
  uint64_t next_ticket_ = 0;
};

// What the stager and the downloader share: their backend, prefetch depth and slot ring.
template <class Interface, class Slot>
class PinnedFrameQueue : public Interface {
 public:
  PinnedFrameQueue(const BackendIo& io, int depth)
      : backend_(io.backend), launch_(io.launch), depth_(depth), ring_(io.ctx, depth) {}

  Status init() { return ring_.init(); }

  int depth() const override { return depth_; }

 protected:
  Backend& backend_;
  Launch launch_;
  int depth_;
  PinnedRing<Slot> ring_;
};

// A host frame on its way up: copied = uploaded, computed = converted (the device bytes read).
struct StagingSlot : PinnedSlot {
  FrameKernelSource src;  // planes point into `device`
  bool in_place = false;  // uploaded from the frame's own page-locked planes (FrameDesc::pinned)
};

class CudaFrameStager final : public PinnedFrameQueue<FrameStager, StagingSlot> {
 public:
  using PinnedFrameQueue::PinnedFrameQueue;

 private:
  // How stage() makes sure the conversion that read a slot has run before refilling it:
  // LATENT_STAGE_ORDER=host (the default) waits on the host; `device` makes the copy stream
  // wait for it (written in session 35, not yet run on a GPU: off until measured).
  const bool host_order_ = env_choice("LATENT_STAGE_ORDER", {{"device"}, {"host"}}, 1) == 1;

 public:
  Result<uint64_t> stage(const FrameDesc& frame) override {
    const bool on_device = !frame.device.is_cpu();
    if (on_device && frame.device != backend_.device())
      return Status::errorf("a frame on ", frame.device.to_string(), " cannot be staged for ",
                            backend_.name());
    if (frame.format > FrameFormat::kI420 || frame.width <= 0 || frame.height <= 0)
      return Status::errorf("cannot stage a ", frame.width, "x", frame.height, " frame");
    const uint64_t ticket = ring_.next_ticket();
    StagingSlot& s = ring_[ticket];
    if (s.busy)
      return Status::errorf("frame ", ticket, " staged while ", ring_.size(),
                            " earlier frames wait for conversion (prefetch depth ", depth_, ")");
    DeviceGuard guard;
    LATENT_TRY(guard.set(ring_.ctx().device()));
    const int planes = frame_format_planes(frame.format);
    size_t row[3] = {}, rows[3] = {}, offset[3] = {};
    const size_t total = packed_planes(frame, row, rows, offset);
    for (int i = 0; i < planes; ++i)
      if (!frame.planes[i] || frame.strides[i] < row[i])
        return Status::errorf(frame_format_name(frame.format), " plane ", i,
                              " is missing or its stride ", frame.strides[i], " is below ", row[i]);
    const bool in_place = !on_device && frame.pinned;
    const bool with_host = !on_device && !in_place;
    // The slot's last frame: its upload is done (this thread may refill the slot's page-locked
    // copy, and the event is recorded again below).
    LATENT_CUDA_CHECK(cudaEventSynchronize(s.copied));
    if (s.fits(total, with_host) && !host_order_) {
      // The kernel that read the slot's device bytes (the conversion of the frame `depth` + 1
      // back, queued with the previous frame) runs before this copy overwrites them: ordered on
      // the device, so the thread does not wait here for the compute stream to get that far.
      LATENT_CUDA_CHECK(cudaStreamWaitEvent(ring_.copy_stream(), s.computed, 0));
    } else {
      // On the host (and always for new buffers, a larger frame: the old ones are freed only
      // once that kernel has run).
      LATENT_CUDA_CHECK(cudaEventSynchronize(s.computed));
    }
    LATENT_TRY(s.reserve(total, with_host));
    s.src = kernel_source(frame);
    s.in_place = in_place;
    for (int i = 0; i < planes; ++i) {
      auto* dst = static_cast<uint8_t*>(s.device) + offset[i];
      if (on_device || in_place) {
        // Straight from the frame's planes on the copy stream: device to device, or host to
        // device from page-locked planes, which the copy engine reads where they are.
        LATENT_CUDA_CHECK(cudaMemcpy2DAsync(
            dst, row[i], frame.planes[i], frame.strides[i], row[i], rows[i],
            on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, ring_.copy_stream()));
      } else {
        // Pageable host planes: packed into the slot's page-locked copy on this thread first.
        auto* host = static_cast<uint8_t*>(s.host) + offset[i];
        const auto* src = static_cast<const uint8_t*>(frame.planes[i]);
        for (size_t r = 0; r < rows[i]; ++r)
          std::memcpy(host + r * row[i], src + r * frame.strides[i], row[i]);
      }
      s.src.planes[i] = dst;
      s.src.strides[i] = row[i];
    }
    if (on_device) {
      // Waited for here: the frame's buffer may go back to its pool on return, while the
      // compute stream may still be busy with earlier work.
      LATENT_CUDA_CHECK(cudaEventRecord(s.copied, ring_.copy_stream()));
      LATENT_CUDA_CHECK(cudaEventSynchronize(s.copied));
      s.busy = true;
      s.ticket = ticket;
      return ticket;
    }
    // A page-locked frame's copy is queued already (convert() waits for it before the caller
    // may let the frame go); the slot's page-locked copy goes up now.
    LATENT_TRY(in_place ? ring_.copied(s, total, /*upload=*/true, ticket)
                        : ring_.copy(s, total, /*upload=*/true, ticket));
    return ticket;
  }

  Result<Tensor> convert(uint64_t ticket, const FrameGeometry& g,
                         const Tensor* into = nullptr) override {
    StagingSlot& s = ring_[ticket];
    if (!s.busy || s.ticket != ticket) return Status::errorf("frame ", ticket, " is not staged");
    s.busy = false;
    DeviceContext& ctx = ring_.ctx();
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx.device()));
    // A frame uploaded in place is free again once this returns, whatever happens below. Its
    // copy was queued `depth` frames ago on a stream of uploads only: long done, as a rule.
    if (s.in_place) LATENT_CUDA_CHECK(cudaEventSynchronize(s.copied));
    if (s.src.width != g.frame_width() || s.src.height != g.frame_height())
      return Status::errorf("staged frame of ", s.src.width, "x", s.src.height,
                            " does not match the planned frame size ", g.frame_width(), "x",
                            g.frame_height());
    LATENT_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), s.copied, 0));
    LATENT_ASSIGN_OR_RETURN(Tensor out, image_target(ctx, backend_, g, into));
    LATENT_TRY(launch_frame_to_nhwc(s.src, g, out.data(), out.dtype(), launch_));
    LATENT_CUDA_CHECK(cudaEventRecord(s.computed, ctx.stream()));
    return out;
  }
};

// A decoded frame on its way back, packed rows in both copies: computed = converted (the bytes
// are on the device), copied = downloaded (the bytes are on the host).
struct DownloadSlot : PinnedSlot {
  FrameFormat format = FrameFormat::kRGB;
  int width = 0, height = 0;
  size_t row = 0;                // bytes of one row (tightly packed in both copies)
  const void* direct = nullptr;  // the host frame the copy writes straight into (queue's direct)
};

class CudaFrameDownloader final : public PinnedFrameQueue<FrameDownloader, DownloadSlot> {
 public:
  using PinnedFrameQueue::PinnedFrameQueue;

  Result<uint64_t> queue(const Tensor& image, const FrameGeometry& g, FrameFormat format,
                         const FrameDesc* direct) override {
    if (!frame_format_is_packed(format))
      return Status::errorf("cannot write ", frame_format_name(format),
                            " frames (packed RGB formats only)");
    const Shape want{1, 3, g.model_height(), g.model_width()};
    if (!image.defined() || image.shape() != want)
      return Status::errorf("expected an image of shape ", shape_str(want), ", got ",
                            image.defined() ? image.describe() : std::string("no tensor"));
    if (image.device() != backend_.device())
      return Status::errorf("image ", image.describe(), " is not on ", backend_.name());
    if (image.layout() != Layout::kNHWC && g.model_width() * g.model_height() != 1)
      return Status::errorf("image ", image.describe(), " is not in the NHWC layout of ",
                            backend_.name());
    const uint64_t ticket = ring_.next_ticket();
    DownloadSlot& s = ring_[ticket];
    if (s.busy)
      return Status::errorf("frame ", ticket, " queued while ", ring_.size(),
                            " earlier frames wait to be fetched (prefetch depth ", depth_, ")");
    DeviceContext& ctx = ring_.ctx();
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx.device()));
    const PixelFormat pf = frame_pixel_format(format);
    const size_t row = static_cast<size_t>(g.frame_width()) * pixel_layout(pf).bytes_per_pixel;
    const size_t total = row * static_cast<size_t>(g.frame_height());
    if (direct &&
        (!direct->device.is_cpu() || direct->format != format || direct->width != g.frame_width() ||
         direct->height != g.frame_height() || !direct->planes[0] || direct->strides[0] < row))
      return Status::errorf("the host frame to download into (", frame_format_name(direct->format),
                            " ", direct->width, "x", direct->height, " on ",
                            direct->device.to_string(), ", stride ", direct->strides[0],
                            ") does not match the ", frame_format_name(format), " ",
                            g.frame_width(), "x", g.frame_height(), " frame");
    // The slot's last copy is done (fetch() waited for it); its buffers are free to reuse.
    LATENT_TRY(s.reserve(total, /*with_host=*/direct == nullptr));
    LATENT_TRY(launch_nhwc_to_frame(image.data(), image.dtype(), g, pf,
                                    static_cast<uint8_t*>(s.device), row, launch_));
    LATENT_CUDA_CHECK(cudaEventRecord(s.computed, ctx.stream()));
    LATENT_CUDA_CHECK(cudaStreamWaitEvent(ring_.copy_stream(), s.computed, 0));
    if (direct) {
      LATENT_CUDA_CHECK(cudaMemcpy2DAsync(direct->planes[0], direct->strides[0], s.device, row, row,
                                          static_cast<size_t>(g.frame_height()),
                                          cudaMemcpyDeviceToHost, ring_.copy_stream()));
      LATENT_TRY(ring_.copied(s, total, /*upload=*/false, ticket));
    } else {
      LATENT_TRY(ring_.copy(s, total, /*upload=*/false, ticket));
    }
    s.direct = direct ? direct->planes[0] : nullptr;
    s.format = format;
    s.width = g.frame_width();
    s.height = g.frame_height();
    s.row = row;
    return ticket;
  }

  Result<bool> ready(uint64_t ticket) override {
    LATENT_ASSIGN_OR_RETURN(DownloadSlot * s, slot(ticket));
    DeviceGuard guard;
    LATENT_TRY(guard.set(ring_.ctx().device()));
    const cudaError_t rc = cudaEventQuery(s->copied);
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    LATENT_CUDA_CHECK(rc);
    return true;
  }

  Status fetch(uint64_t ticket, const FrameDesc& frame) override {
    LATENT_ASSIGN_OR_RETURN(DownloadSlot * s, slot(ticket));
    DeviceGuard guard;
    LATENT_TRY(guard.set(ring_.ctx().device()));
    // The slot is free again only once its copy is done, whatever happens below.
    LATENT_CUDA_CHECK(cudaEventSynchronize(s->copied));
    s->busy = false;
    if (!frame.device.is_cpu())
      return Status::errorf("only host frames are fetched (got one on ", frame.device.to_string(),
                            ")");
    if (frame.format != s->format || frame.width != s->width || frame.height != s->height)
      return Status::errorf(frame_format_name(frame.format), " frame of ", frame.width, "x",
                            frame.height, " does not match the queued ",
                            frame_format_name(s->format), " frame of ", s->width, "x", s->height);
    if (!frame.planes[0] || frame.strides[0] < s->row)
      return Status::errorf("frame has no data or its stride ", frame.strides[0], " is below ",
                            s->row);
    if (s->direct) {  // already written straight into the frame queue() was given
      if (frame.planes[0] != s->direct)
        return Status::errorf("frame ", ticket,
                              " was downloaded straight into another host frame than this one");
      return ok_status();
    }
    // Only each row's pixels are written: bytes past them stay untouched, as on the CPU.
    const auto* src = static_cast<const uint8_t*>(s->host);
    auto* dst = static_cast<uint8_t*>(frame.planes[0]);
    for (int r = 0; r < s->height; ++r)
      std::memcpy(dst + r * frame.strides[0], src + r * s->row, s->row);
    return ok_status();
  }

  void reset() override {
    DeviceGuard guard;
    if (!guard.set(ring_.ctx().device()).ok()) return;
    for (DownloadSlot& s : ring_.slots()) {
      if (s.busy) LATENT_CUDA_WARN(cudaEventSynchronize(s.copied));
      s.busy = false;
    }
    // Tickets keep counting: slot = ticket % slots, so the next queue() takes any slot.
  }

 private:
  Result<DownloadSlot*> slot(uint64_t ticket) {
    DownloadSlot& s = ring_[ticket];
    if (!s.busy || s.ticket != ticket) return Status::errorf("frame ", ticket, " is not queued");
    return &s;
  }
};

template <class Queue, class Interface>
Result<std::unique_ptr<Interface>> create_queue(const BackendIo& io, int depth) {
  auto q = std::make_unique<Queue>(io, depth);
  LATENT_TRY(q->init());
  return std::unique_ptr<Interface>(std::move(q));
}

}  // namespace

Result<std::unique_ptr<FrameDownloader>> create_frame_downloader(const BackendIo& io, int depth) {
  return create_queue<CudaFrameDownloader, FrameDownloader>(io, depth);
}

Result<Tensor> zero_tensor(const BackendIo& io, const Shape& shape) {
  const std::shared_ptr<DeviceContext>& ctx = io.ctx;
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx->device()));
  LATENT_ASSIGN_OR_RETURN(Tensor out, ctx->empty(shape, io.backend.compute_dtype(), Layout::kNHWC));
  if (out.nbytes() > 0)
    LATENT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.nbytes(), ctx->stream()));
  return out;
}

Result<std::unique_ptr<FrameStager>> create_frame_stager(const BackendIo& io, int depth) {
  return create_queue<CudaFrameStager, FrameStager>(io, depth);
}

}  // namespace latent::cuda
