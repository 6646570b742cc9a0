// Device memory for the CUDA backend: one stream and one stream-ordered memory pool per backend.
//
// Buffers come from a private cudaMemPool whose release threshold is unlimited, so after the
// first frame every cudaMallocFromPoolAsync is served from memory the pool already holds: no
// cudaMalloc, no device synchronisation. Frees are stream-ordered too (cudaFreeAsync on the
// backend's stream), so a tensor dropped on the host while kernels that read it are still
// queued is recycled only after they ran.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/core/arena_plan.h"
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
  Result<void*> allocate_from_pool(size_t rounded);
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
  // Bytes of the pool in use now / reserved from the driver now (-1 on failure).
  int64_t used_bytes() const;
  int64_t reserved_bytes() const;
  // Waits for the stream, then hands the pool memory no buffer holds back to the driver (the pool
  // otherwise keeps everything it ever reserved).
  Status trim();

  // === Planned allocations for graph captures (plans) ===
  // record_allocations(true) .. (false): the sizes and lifetimes of the buffers the calling
  // thread allocates in between (a plain forward) are recorded. serve_allocations() then lays
  // them out by lifetime in one arena of arena_bytes() (engine/core/arena_plan) and, until
  // end_serving(), hands the calling thread's allocations out of it in the recorded order (the
  // same forward, captured as a graph: its buffers are then not graph memory). end_serving()
  // says whether every allocation and free matched the recording; a graph captured while they
  // did not must be discarded (buffers laid out for other lifetimes may overlap).
  void record_allocations(bool on);
  // Whether the calling thread recorded allocations not yet served.
  bool has_recording() {
    std::lock_guard<std::mutex> lock(plan_mutex_);
    return plan_mode_ == PlanMode::kIdle && !recorded_.empty() &&
           plan_thread_ == std::this_thread::get_id();
  }
  // The arena size the current recording needs (0 without one).
  size_t plan_arena_bytes();
  void serve_allocations(void* arena);
  bool has_serving() {
    std::lock_guard<std::mutex> lock(plan_mutex_);
    return plan_mode_ == PlanMode::kServing;
  }
  bool end_serving();

 private:
  DeviceContext() = default;

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  cudaDeviceProp props_{};
  std::string label_;
  bool poison_ = false;

  // plans: the recording / serving state (one thread at a time; plan_mutex_ guards it).
  enum class PlanMode { kIdle, kRecording, kServing };
  std::atomic<bool> plan_active_{false};
  std::mutex plan_mutex_;
  PlanMode plan_mode_ = PlanMode::kIdle;
  std::thread::id plan_thread_;
  std::vector<ArenaBuffer> recorded_, served_;  // event clock: born / died (-1: alive)
  std::vector<size_t> offsets_;
  std::unordered_map<void*, size_t> plan_live_;
  int64_t plan_clock_ = 0;
  char* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  bool plan_mismatch_ = false;
  void plan_offsets();
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

// Two CUDA events for timing work queued on a stream between them (the engine choices timed on
// a first call: conv_fused.cpp's choose_engine, DitLinear::tune), destroyed with the object.
class TimingEvents {
 public:
  TimingEvents() = default;
  ~TimingEvents() {
    if (start_) (void)cudaEventDestroy(start_);
    if (stop_) (void)cudaEventDestroy(stop_);
  }
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;

  Status create() {
    if (cudaEventCreate(&start_) != cudaSuccess || cudaEventCreate(&stop_) != cudaSuccess)
      return Status::errorf("cudaEventCreate failed: ", cudaGetErrorString(cudaGetLastError()));
    return ok_status();
  }
  cudaError_t start(cudaStream_t stream) { return cudaEventRecord(start_, stream); }
  cudaError_t stop(cudaStream_t stream) { return cudaEventRecord(stop_, stream); }
  // Milliseconds from start to stop once the stop has completed; negative if either failed.
  float elapsed_ms() {
    float ms = -1.f;
    if (cudaEventSynchronize(stop_) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start_, stop_) != cudaSuccess)
      return -1.f;
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// A buffer that only grows (cuBLASLt's workspace outside plans); its old block is released
// stream-ordered.
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
