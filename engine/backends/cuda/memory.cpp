#include "engine/backends/cuda/memory.h"

#include <cstdint>
#include <utility>

#include "engine/backends/cuda/check.h"
#include "engine/core/log.h"

namespace latent::cuda {

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

Status DeviceGuard::set(int device) {
  int current = -1;
  LATENT_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    LATENT_CUDA_CHECK(cudaSetDevice(device));
    if (previous_ < 0) previous_ = current;
  }
  return ok_status();
}

Result<std::shared_ptr<DeviceContext>> DeviceContext::create(int device, bool poison) {
  std::shared_ptr<DeviceContext> ctx(new DeviceContext());
  ctx->device_ = device;
  ctx->poison_ = poison;
  DeviceGuard guard;
  LATENT_TRY(guard.set(device));
  LATENT_CUDA_CHECK(cudaGetDeviceProperties(&ctx->props_, device));
  ctx->label_ = str_cat("cuda:", device, " (", ctx->props_.name, ", sm_", ctx->props_.major,
                        ctx->props_.minor, ")");
  int pools = 0;
  LATENT_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
  if (!pools)
    return Status::errorf(ctx->label_, ": the device or driver has no stream-ordered memory pools");

  LATENT_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream_, cudaStreamNonBlocking));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  LATENT_CUDA_CHECK(cudaMemPoolCreate(&ctx->pool_, &props));
  // Keep freed memory in the pool instead of returning it at every synchronisation.
  uint64_t threshold = UINT64_MAX;
  LATENT_CUDA_CHECK(
      cudaMemPoolSetAttribute(ctx->pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  return ctx;
}

DeviceContext::~DeviceContext() {
  DeviceGuard guard;
  if (!guard.set(device_).ok()) return;
  if (stream_) LATENT_CUDA_WARN(cudaStreamSynchronize(stream_));
  // Every Storage holds this context, so no buffer of the pool is still in use.
  if (pool_) LATENT_CUDA_WARN(cudaMemPoolDestroy(pool_));
  if (stream_) LATENT_CUDA_WARN(cudaStreamDestroy(stream_));
}

Result<void*> DeviceContext::allocate(size_t bytes) {
  const size_t rounded = ((bytes > 0 ? bytes : 1) + 255) / 256 * 256;
  DeviceGuard guard;
  LATENT_TRY(guard.set(device_));
  void* ptr = nullptr;
  cudaError_t rc = cudaMallocFromPoolAsync(&ptr, rounded, pool_, stream_);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    // Queued frees may still hold memory, and the pool keeps what it once had: wait for the
    // queue, hand unused pool memory back to the driver and try once more.
    LATENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    LATENT_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
    rc = cudaMallocFromPoolAsync(&ptr, rounded, pool_, stream_);
  }
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    (void)cudaGetLastError();
    LATENT_ERROR(label_, ": cudaMallocFromPoolAsync(", rounded,
                 ") failed: ", cudaGetErrorString(rc));
    return Status::errorf(label_, ": cannot allocate ", bytes, " bytes of device memory (",
                          free_bytes >> 20, " MiB of ", total_bytes >> 20,
                          " MiB free): ", cudaGetErrorString(rc));
  }
  if (poison_) LATENT_CUDA_CHECK(cudaMemsetAsync(ptr, 0xFF, rounded, stream_));
  return ptr;
}

void DeviceContext::release(void* ptr) {
  if (!ptr) return;
  DeviceGuard guard;
  if (!guard.set(device_).ok()) return;
  const cudaError_t rc = cudaFreeAsync(ptr, stream_);
  if (rc == cudaErrorCudartUnloading) return;  // process exit: the driver reclaims everything
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    LATENT_WARN(label_, ": cudaFreeAsync failed: ", cudaGetErrorString(rc));
  }
}

Result<std::shared_ptr<Storage>> DeviceContext::allocate_storage(size_t bytes) {
  LATENT_ASSIGN_OR_RETURN(void* ptr, allocate(bytes));
  std::shared_ptr<DeviceContext> self = shared_from_this();
  return std::make_shared<Storage>(ptr, bytes, Device{DeviceKind::kCUDA, device_},
                                   [self](void* p) { self->release(p); });
}

Result<Tensor> DeviceContext::empty(const Shape& shape, DType dtype, Layout layout) {
  for (int64_t d : shape)
    if (d < 0) return Status::errorf(label_, ": negative dimension in shape ", shape_str(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  LATENT_ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage, allocate_storage(bytes));
  return Tensor::from_storage(std::move(storage), 0, shape, dtype, layout);
}

int64_t DeviceContext::peak_bytes() const {
  uint64_t high = 0;
  const cudaError_t rc = cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &high);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(high);
}

void DeviceContext::reset_peak() {
  uint64_t zero = 0;  // the only value accepted: resets the mark to the current use
  LATENT_CUDA_WARN(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero));
}

Status TempBuffer::allocate(DeviceContext& ctx, size_t bytes) {
  reset();
  LATENT_ASSIGN_OR_RETURN(ptr_, ctx.allocate(bytes));
  ctx_ = &ctx;
  return ok_status();
}

void TempBuffer::reset() {
  if (ctx_ && ptr_) ctx_->release(ptr_);
  ctx_ = nullptr;
  ptr_ = nullptr;
}

Result<void*> GrowableBuffer::ensure(DeviceContext& ctx, size_t bytes) {
  if (bytes <= size_ && buffer_.get()) return buffer_.get();
  // Grow by at least half again so a sequence of slightly larger requests does not churn.
  const size_t grown = bytes > size_ + size_ / 2 ? bytes : size_ + size_ / 2;
  buffer_.reset();
  size_ = 0;
  LATENT_TRY(buffer_.allocate(ctx, grown));
  size_ = grown;
  return buffer_.get();
}

}  // namespace latent::cuda
