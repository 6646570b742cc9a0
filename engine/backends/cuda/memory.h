// Device memory for the CUDA backend: one stream and one stream-ordered memory pool per backend.
//
// Buffers come from a private cudaMemPool whose release threshold is unlimited, so after the
// first frame every cudaMallocFromPoolAsync is served from memory the pool already holds: no
// cudaMalloc, no device synchronisation. Frees are stream-ordered too (cudaFreeAsync on the
// backend's stream), so a tensor dropped on the host while kernels that read it are still
// queued is recycled only after they ran.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace latent::cuda {

// Makes `device` the calling thread's current device for a scope, restoring the previous one.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  Status set(int device);

 private:
  int previous_ = -1;
};

// The state every device tensor keeps alive through its Storage: device, stream, memory pool.
class DeviceContext : public std::enable_shared_from_this<DeviceContext> {
 public:
  // `poison`: fill every new buffer with 0xFF bytes (NaN in fp32/bf16/fp16), so that an op
  // leaving part of its output unwritten shows up as NaN in tests.
  static Result<std::shared_ptr<DeviceContext>> create(int device, bool poison);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const cudaDeviceProp& properties() const { return props_; }
  // "cuda:0 (NVIDIA H100 80GB HBM3)"
  const std::string& label() const { return label_; }

  // A buffer usable by work queued on stream() from now on (256-byte aligned). Retries once
  // after trimming the pool when the device is out of memory.
  Result<void*> allocate(size_t bytes);
  // Returns a buffer to the pool once the work queued on stream() so far has run.
  void release(void* ptr);
  // A Storage on this device that releases its buffer through the pool when dropped.
  Result<std::shared_ptr<Storage>> allocate_storage(size_t bytes);
  // A device tensor of `shape` in `dtype` and `layout` (contents undefined, or poison).
  Result<Tensor> empty(const Shape& shape, DType dtype, Layout layout);

  // Most bytes of the pool in use at once since creation or reset_peak() (-1 on failure).
  int64_t peak_bytes() const;
  // Restarts the peak from what is in use now.
  void reset_peak();

 private:
  DeviceContext() = default;

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  cudaDeviceProp props_{};
  std::string label_;
  bool poison_ = false;
};

// A scratch buffer released (stream-ordered) when the scope ends.
class TempBuffer {
 public:
  TempBuffer() = default;
  ~TempBuffer() { reset(); }
  TempBuffer(const TempBuffer&) = delete;
  TempBuffer& operator=(const TempBuffer&) = delete;

  Status allocate(DeviceContext& ctx, size_t bytes);
  void reset();
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  DeviceContext* ctx_ = nullptr;
  void* ptr_ = nullptr;
};

// A buffer that only grows (the cuDNN workspace); its old block is released stream-ordered.
class GrowableBuffer {
 public:
  ~GrowableBuffer() { buffer_.reset(); }
  Result<void*> ensure(DeviceContext& ctx, size_t bytes);
  size_t size() const { return size_; }

 private:
  TempBuffer buffer_;
  size_t size_ = 0;
};

}  // namespace latent::cuda
