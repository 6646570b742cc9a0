#include "engine/backends/cuda/memory.h"

#include <algorithm>
#include <cstdint>
#include <string>
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
  bool record = false;
  if (plan_active_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(plan_mutex_);
    if (plan_thread_ == std::this_thread::get_id()) {
      if (plan_mode_ == PlanMode::kServing) {
        const size_t i = served_.size();
        if (!plan_mismatch_ && i < recorded_.size() && recorded_[i].bytes == rounded) {
          served_.push_back({rounded, plan_clock_++, -1});
          void* p = arena_ + offsets_[i];
          plan_live_[p] = i;
          if (poison_) LATENT_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, rounded, stream_));
          return p;
        }
        plan_mismatch_ = true;  // from here on the pool's own buffers (graph memory)
      } else if (plan_mode_ == PlanMode::kRecording) {
        record = true;
      }
    }
  }
  Result<void*> r = allocate_from_pool(rounded);
  if (record && r.ok()) {
    std::lock_guard<std::mutex> lock(plan_mutex_);
    plan_live_[r.value()] = recorded_.size();
    recorded_.push_back({rounded, plan_clock_++, -1});
  }
  return r;
}

Result<void*> DeviceContext::allocate_from_pool(size_t rounded) {
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
    return Status::errorf(label_, ": cannot allocate ", rounded, " bytes of device memory (",
                          free_bytes >> 20, " MiB of ", total_bytes >> 20,
                          " MiB free): ", cudaGetErrorString(rc));
  }
  if (poison_) LATENT_CUDA_CHECK(cudaMemsetAsync(ptr, 0xFF, rounded, stream_));
  return ptr;
}

void DeviceContext::release(void* ptr) {
  if (!ptr) return;
  if (plan_active_.load(std::memory_order_acquire)) {  // recording or serving (arena_ set)
    std::lock_guard<std::mutex> lock(plan_mutex_);
    auto it = plan_live_.find(ptr);
    if (it != plan_live_.end()) {
      auto& events = plan_mode_ == PlanMode::kServing ? served_ : recorded_;
      if (it->second < events.size()) events[it->second].died = plan_clock_++;
      plan_live_.erase(it);
    }
    // A buffer of the arena is not the pool's: the arena goes with the graph.
    if (arena_ && static_cast<char*>(ptr) >= arena_ &&
        static_cast<char*>(ptr) < arena_ + arena_bytes_)
      return;
  }
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

namespace {
int64_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t v = 0;
  if (cudaMemPoolGetAttribute(pool, attr, &v) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return static_cast<int64_t>(v);
}
}  // namespace

int64_t DeviceContext::peak_bytes() const {
  return pool_attribute(pool_, cudaMemPoolAttrUsedMemHigh);
}

int64_t DeviceContext::used_bytes() const {
  return pool_attribute(pool_, cudaMemPoolAttrUsedMemCurrent);
}

int64_t DeviceContext::reserved_bytes() const {
  return pool_attribute(pool_, cudaMemPoolAttrReservedMemCurrent);
}

Status DeviceContext::trim() {
  DeviceGuard guard;
  LATENT_TRY(guard.set(device_));
  LATENT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  LATENT_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
  return ok_status();
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

// === Planned allocations for graph captures (plans) ===

void DeviceContext::record_allocations(bool on) {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  // One thread at a time: while another thread records or is served, this one records nothing
  // (its capture then uses graph memory).
  if (plan_mode_ != PlanMode::kIdle && plan_thread_ != std::this_thread::get_id()) return;
  if (on) {
    recorded_.clear();
    served_.clear();
    plan_live_.clear();
    plan_clock_ = 0;
    plan_thread_ = std::this_thread::get_id();
    plan_mode_ = PlanMode::kRecording;
    plan_active_.store(true, std::memory_order_release);
  } else if (plan_mode_ == PlanMode::kRecording) {
    plan_mode_ = PlanMode::kIdle;
    plan_live_.clear();  // buffers still alive count as never freed
    plan_active_.store(false, std::memory_order_release);
  }
}

// The recorded buffers laid out by engine/core/arena_plan (several greedy placements, the
// smallest arena kept).
void DeviceContext::plan_offsets() {
  const std::vector<ArenaBuffer>& buffers = recorded_;
  ArenaPlan plan = plan_arena(buffers);
  LATENT_INFO(label_, ": plan arena of ", buffers.size(), " buffers: ", plan.bytes >> 10, " KiB (",
              plan.placement, "; largest first alone ", plan.largest_first_bytes >> 10,
              " KiB; the most alive at once ", plan.live_peak >> 10, " KiB)");
  if (log_enabled(LogLevel::kDebug)) {
    // What the peak is made of: each buffer alive then, largest first (MiB, born / freed on
    // the recording's event clock).
    std::vector<size_t> alive = arena_alive_at_peak(buffers);
    std::sort(alive.begin(), alive.end(),
              [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
    std::string list;
    for (size_t i : alive)
      list += str_cat(list.empty() ? "" : ", ", buffers[i].bytes / 1048576.0, " (", buffers[i].born,
                      "-", buffers[i].died, ")");
    LATENT_DEBUG(label_, ": plan arena: the ", alive.size(),
                 " buffers alive at the peak, MiB (born-freed): ", list);
  }
  offsets_ = std::move(plan.offsets);
  arena_bytes_ = plan.bytes;
}

size_t DeviceContext::plan_arena_bytes() {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  if (recorded_.empty()) return 0;
  plan_offsets();
  return arena_bytes_;
}

void DeviceContext::serve_allocations(void* arena) {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  arena_ = static_cast<char*>(arena);
  served_.clear();
  plan_live_.clear();
  plan_clock_ = 0;
  plan_mismatch_ = false;
  plan_thread_ = std::this_thread::get_id();
  plan_mode_ = PlanMode::kServing;
  plan_active_.store(true, std::memory_order_release);
}

bool DeviceContext::end_serving() {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  bool same = !plan_mismatch_ && served_.size() == recorded_.size();
  for (size_t i = 0; same && i < served_.size(); ++i)
    same = served_[i].bytes == recorded_[i].bytes && served_[i].born == recorded_[i].born &&
           served_[i].died == recorded_[i].died;
  plan_mode_ = PlanMode::kIdle;
  plan_active_.store(false, std::memory_order_release);
  plan_live_.clear();
  recorded_.clear();
  served_.clear();
  arena_ = nullptr;
  arena_bytes_ = 0;
  return same;
}

}  // namespace latent::cuda
