// Host side of the GPU frame conversions: checks, staging copies, kernel launches.
#include "engine/backends/cuda/pixels.cuh"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/memory.h"

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

Result<std::shared_ptr<DeviceContext>> context_of(Backend& backend) {
  auto ctx = backend_device_context(backend);
  if (!ctx) return Status::errorf("backend ", backend.name(), " is not a CUDA backend");
  return ctx;
}

}  // namespace

Result<Tensor> frame_to_tensor(Backend& backend, const FrameDesc& frame, const FrameGeometry& g) {
  LATENT_ASSIGN_OR_RETURN(std::shared_ptr<DeviceContext> ctx, context_of(backend));
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx->device()));
  const Launch l = backend_launch(backend);
  FrameKernelSource src;
  src.format = frame.format;
  src.width = frame.width;
  src.height = frame.height;
  src.yuv = yuv_coefficients(frame.color);
  const int planes = frame_format_planes(frame.format);
  TempBuffer staging;
  if (frame.device.is_cpu()) {
    // The raw bytes go up, tightly packed; the kernels do all the conversion work.
    size_t total = 0, row[3] = {}, rows[3] = {}, offset[3] = {};
    for (int i = 0; i < planes; ++i) {
      plane_extent(frame, i, &row[i], &rows[i]);
      offset[i] = total;
      total += (row[i] * rows[i] + 255) / 256 * 256;
    }
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
  LATENT_ASSIGN_OR_RETURN(Tensor out, ctx->empty({1, 3, g.model_height(), g.model_width()},
                                                 backend.compute_dtype(), Layout::kNHWC));
  LATENT_TRY(launch_frame_to_nhwc(src, g, out.data(), out.dtype(), l));
  return out;
}

Status tensor_to_frame(Backend& backend, const Tensor& image, const FrameGeometry& g,
                       const FrameDesc& frame) {
  LATENT_ASSIGN_OR_RETURN(std::shared_ptr<DeviceContext> ctx, context_of(backend));
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
  const Launch l = backend_launch(backend);
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

// One frame on its way: pinned host bytes, their device copy, and the events between them.
struct StagingSlot {
  void* host = nullptr;  // pinned
  void* device = nullptr;
  size_t capacity = 0;             // bytes of both
  cudaEvent_t uploaded = nullptr;  // copy stream: the device copy is complete
  cudaEvent_t consumed = nullptr;  // compute stream: the kernel reading it has run
  bool busy = false;               // staged, not yet converted
  uint64_t ticket = 0;
  FrameKernelSource src;  // planes point into `device`
};

class CudaFrameStager final : public FrameStager {
 public:
  CudaFrameStager(Backend& backend, std::shared_ptr<DeviceContext> ctx, int depth)
      : backend_(backend), ctx_(std::move(ctx)), depth_(depth), slots_(depth + 1) {}

  ~CudaFrameStager() override {
    DeviceGuard guard;
    if (!guard.set(ctx_->device()).ok()) return;
    for (StagingSlot& s : slots_) {
      if (s.consumed) LATENT_CUDA_WARN(cudaEventSynchronize(s.consumed));
      if (s.uploaded) LATENT_CUDA_WARN(cudaEventSynchronize(s.uploaded));
      if (s.host) LATENT_CUDA_WARN(cudaFreeHost(s.host));
      if (s.device) LATENT_CUDA_WARN(cudaFree(s.device));
      if (s.uploaded) LATENT_CUDA_WARN(cudaEventDestroy(s.uploaded));
      if (s.consumed) LATENT_CUDA_WARN(cudaEventDestroy(s.consumed));
    }
    if (copy_stream_) LATENT_CUDA_WARN(cudaStreamDestroy(copy_stream_));
  }

  Status init() {
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx_->device()));
    LATENT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (StagingSlot& s : slots_) {
      LATENT_CUDA_CHECK(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming));
      LATENT_CUDA_CHECK(cudaEventCreateWithFlags(&s.consumed, cudaEventDisableTiming));
    }
    return ok_status();
  }

  int depth() const override { return depth_; }

  Result<uint64_t> stage(const FrameDesc& frame) override {
    if (!frame.device.is_cpu())
      return Status::errorf("only host frames are staged (got one on ", frame.device.to_string(),
                            ")");
    if (frame.format > FrameFormat::kI420 || frame.width <= 0 || frame.height <= 0)
      return Status::errorf("cannot stage a ", frame.width, "x", frame.height, " frame");
    const uint64_t ticket = next_ticket_++;
    StagingSlot& s = slots_[ticket % slots_.size()];
    if (s.busy)
      return Status::errorf("frame ", ticket, " staged while ", slots_.size(),
                            " earlier frames wait for conversion (prefetch depth ", depth_, ")");
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx_->device()));
    // The slot's last frame: its upload and the kernel that read it are done.
    LATENT_CUDA_CHECK(cudaEventSynchronize(s.consumed));
    LATENT_CUDA_CHECK(cudaEventSynchronize(s.uploaded));
    const int planes = frame_format_planes(frame.format);
    size_t total = 0, row[3] = {}, rows[3] = {}, offset[3] = {};
    for (int i = 0; i < planes; ++i) {
      plane_extent(frame, i, &row[i], &rows[i]);
      if (!frame.planes[i] || frame.strides[i] < row[i])
        return Status::errorf(frame_format_name(frame.format), " plane ", i,
                              " is missing or its stride ", frame.strides[i], " is below ", row[i]);
      offset[i] = total;
      total += (row[i] * rows[i] + 255) / 256 * 256;
    }
    if (total > s.capacity) {
      // Grows once per larger frame size; steady streams never come here again.
      if (s.host) LATENT_CUDA_CHECK(cudaFreeHost(s.host));
      if (s.device) LATENT_CUDA_CHECK(cudaFree(s.device));
      s.host = s.device = nullptr;
      s.capacity = 0;
      LATENT_CUDA_CHECK(cudaHostAlloc(&s.host, total, cudaHostAllocDefault));
      LATENT_CUDA_CHECK(cudaMalloc(&s.device, total));
      s.capacity = total;
    }
    s.src = FrameKernelSource();
    s.src.format = frame.format;
    s.src.width = frame.width;
    s.src.height = frame.height;
    s.src.yuv = yuv_coefficients(frame.color);
    for (int i = 0; i < planes; ++i) {
      auto* dst = static_cast<uint8_t*>(s.host) + offset[i];
      const auto* src = static_cast<const uint8_t*>(frame.planes[i]);
      for (size_t r = 0; r < rows[i]; ++r)
        std::memcpy(dst + r * row[i], src + r * frame.strides[i], row[i]);
      s.src.planes[i] = static_cast<const uint8_t*>(s.device) + offset[i];
      s.src.strides[i] = row[i];
    }
    LATENT_CUDA_CHECK(
        cudaMemcpyAsync(s.device, s.host, total, cudaMemcpyHostToDevice, copy_stream_));
    LATENT_CUDA_CHECK(cudaEventRecord(s.uploaded, copy_stream_));
    count_host_to_device(total);
    s.busy = true;
    s.ticket = ticket;
    return ticket;
  }

  Result<Tensor> convert(uint64_t ticket, const FrameGeometry& g) override {
    StagingSlot& s = slots_[ticket % slots_.size()];
    if (!s.busy || s.ticket != ticket) return Status::errorf("frame ", ticket, " is not staged");
    s.busy = false;
    if (s.src.width != g.frame_width() || s.src.height != g.frame_height())
      return Status::errorf("staged frame of ", s.src.width, "x", s.src.height,
                            " does not match the planned frame size ", g.frame_width(), "x",
                            g.frame_height());
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx_->device()));
    LATENT_CUDA_CHECK(cudaStreamWaitEvent(ctx_->stream(), s.uploaded, 0));
    LATENT_ASSIGN_OR_RETURN(Tensor out, ctx_->empty({1, 3, g.model_height(), g.model_width()},
                                                    backend_.compute_dtype(), Layout::kNHWC));
    LATENT_TRY(launch_frame_to_nhwc(s.src, g, out.data(), out.dtype(), backend_launch(backend_)));
    LATENT_CUDA_CHECK(cudaEventRecord(s.consumed, ctx_->stream()));
    return out;
  }

 private:
  Backend& backend_;
  std::shared_ptr<DeviceContext> ctx_;
  int depth_;
  std::vector<StagingSlot> slots_;
  cudaStream_t copy_stream_ = nullptr;
  uint64_t next_ticket_ = 0;
};

// One decoded frame on its way back: its packed bytes on the device, their pinned host copy.
struct DownloadSlot {
  void* device = nullptr;
  void* host = nullptr;              // pinned
  size_t capacity = 0;               // bytes of both
  cudaEvent_t converted = nullptr;   // compute stream: the bytes are on the device
  cudaEvent_t downloaded = nullptr;  // copy stream: the bytes are on the host
  bool busy = false;                 // queued, not yet fetched
  uint64_t ticket = 0;
  FrameFormat format = FrameFormat::kRGB;
  int width = 0, height = 0;
  size_t row = 0;  // bytes of one row (tightly packed in both copies)
};

class CudaFrameDownloader final : public FrameDownloader {
 public:
  CudaFrameDownloader(Backend& backend, std::shared_ptr<DeviceContext> ctx, int depth)
      : backend_(backend), ctx_(std::move(ctx)), depth_(depth), slots_(depth + 1) {}

  ~CudaFrameDownloader() override {
    DeviceGuard guard;
    if (!guard.set(ctx_->device()).ok()) return;
    for (DownloadSlot& s : slots_) {
      if (s.downloaded) LATENT_CUDA_WARN(cudaEventSynchronize(s.downloaded));
      if (s.host) LATENT_CUDA_WARN(cudaFreeHost(s.host));
      if (s.device) LATENT_CUDA_WARN(cudaFree(s.device));
      if (s.converted) LATENT_CUDA_WARN(cudaEventDestroy(s.converted));
      if (s.downloaded) LATENT_CUDA_WARN(cudaEventDestroy(s.downloaded));
    }
    if (copy_stream_) LATENT_CUDA_WARN(cudaStreamDestroy(copy_stream_));
  }

  Status init() {
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx_->device()));
    LATENT_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (DownloadSlot& s : slots_) {
      LATENT_CUDA_CHECK(cudaEventCreateWithFlags(&s.converted, cudaEventDisableTiming));
      LATENT_CUDA_CHECK(cudaEventCreateWithFlags(&s.downloaded, cudaEventDisableTiming));
    }
    return ok_status();
  }

  int depth() const override { return depth_; }

  Result<uint64_t> queue(const Tensor& image, const FrameGeometry& g, FrameFormat format) override {
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
    const uint64_t ticket = next_ticket_++;
    DownloadSlot& s = slots_[ticket % slots_.size()];
    if (s.busy)
      return Status::errorf("frame ", ticket, " queued while ", slots_.size(),
                            " earlier frames wait to be fetched (prefetch depth ", depth_, ")");
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx_->device()));
    const PixelFormat pf = frame_pixel_format(format);
    const size_t row = static_cast<size_t>(g.frame_width()) * pixel_layout(pf).bytes_per_pixel;
    const size_t total = row * static_cast<size_t>(g.frame_height());
    // The slot's last copy is done (fetch() waited for it); its buffers are free to reuse.
    if (total > s.capacity) {
      // Grows once per larger frame size; steady streams never come here again.
      if (s.host) LATENT_CUDA_CHECK(cudaFreeHost(s.host));
      if (s.device) LATENT_CUDA_CHECK(cudaFree(s.device));
      s.host = s.device = nullptr;
      s.capacity = 0;
      LATENT_CUDA_CHECK(cudaHostAlloc(&s.host, total, cudaHostAllocDefault));
      LATENT_CUDA_CHECK(cudaMalloc(&s.device, total));
      s.capacity = total;
    }
    LATENT_TRY(launch_nhwc_to_frame(image.data(), image.dtype(), g, pf,
                                    static_cast<uint8_t*>(s.device), row,
                                    backend_launch(backend_)));
    LATENT_CUDA_CHECK(cudaEventRecord(s.converted, ctx_->stream()));
    LATENT_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, s.converted, 0));
    LATENT_CUDA_CHECK(
        cudaMemcpyAsync(s.host, s.device, total, cudaMemcpyDeviceToHost, copy_stream_));
    LATENT_CUDA_CHECK(cudaEventRecord(s.downloaded, copy_stream_));
    count_device_to_host(total);
    s.busy = true;
    s.ticket = ticket;
    s.format = format;
    s.width = g.frame_width();
    s.height = g.frame_height();
    s.row = row;
    return ticket;
  }

  Result<bool> ready(uint64_t ticket) override {
    LATENT_ASSIGN_OR_RETURN(DownloadSlot * s, slot(ticket));
    DeviceGuard guard;
    LATENT_TRY(guard.set(ctx_->device()));
    const cudaError_t rc = cudaEventQuery(s->downloaded);
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
    LATENT_TRY(guard.set(ctx_->device()));
    // The slot is free again only once its copy is done, whatever happens below.
    LATENT_CUDA_CHECK(cudaEventSynchronize(s->downloaded));
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
    // Only each row's pixels are written: bytes past them stay untouched, as on the CPU.
    const auto* src = static_cast<const uint8_t*>(s->host);
    auto* dst = static_cast<uint8_t*>(frame.planes[0]);
    for (int r = 0; r < s->height; ++r)
      std::memcpy(dst + r * frame.strides[0], src + r * s->row, s->row);
    return ok_status();
  }

  void reset() override {
    DeviceGuard guard;
    if (!guard.set(ctx_->device()).ok()) return;
    for (DownloadSlot& s : slots_) {
      if (s.busy) LATENT_CUDA_WARN(cudaEventSynchronize(s.downloaded));
      s.busy = false;
    }
    // Tickets keep counting: slot = ticket % slots, so the next queue() takes any slot.
  }

 private:
  Result<DownloadSlot*> slot(uint64_t ticket) {
    DownloadSlot& s = slots_[ticket % slots_.size()];
    if (!s.busy || s.ticket != ticket) return Status::errorf("frame ", ticket, " is not queued");
    return &s;
  }

  Backend& backend_;
  std::shared_ptr<DeviceContext> ctx_;
  int depth_;
  std::vector<DownloadSlot> slots_;
  cudaStream_t copy_stream_ = nullptr;
  uint64_t next_ticket_ = 0;
};

}  // namespace

Result<std::unique_ptr<FrameDownloader>> create_frame_downloader(Backend& backend, int depth) {
  LATENT_ASSIGN_OR_RETURN(std::shared_ptr<DeviceContext> ctx, context_of(backend));
  auto d = std::make_unique<CudaFrameDownloader>(backend, std::move(ctx), depth);
  LATENT_TRY(d->init());
  return std::unique_ptr<FrameDownloader>(std::move(d));
}

Result<Tensor> zero_tensor(Backend& backend, const Shape& shape) {
  LATENT_ASSIGN_OR_RETURN(std::shared_ptr<DeviceContext> ctx, context_of(backend));
  DeviceGuard guard;
  LATENT_TRY(guard.set(ctx->device()));
  LATENT_ASSIGN_OR_RETURN(Tensor out, ctx->empty(shape, backend.compute_dtype(), Layout::kNHWC));
  if (out.nbytes() > 0)
    LATENT_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.nbytes(), ctx->stream()));
  return out;
}

Result<std::unique_ptr<FrameStager>> create_frame_stager(Backend& backend, int depth) {
  LATENT_ASSIGN_OR_RETURN(std::shared_ptr<DeviceContext> ctx, context_of(backend));
  auto stager = std::make_unique<CudaFrameStager>(backend, std::move(ctx), depth);
  LATENT_TRY(stager->init());
  return std::unique_ptr<FrameStager>(std::move(stager));
}

}  // namespace latent::cuda
