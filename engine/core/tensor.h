// Tensor: a logical shape, an element type and shared storage on one device.
// Logical layout is row-major over `shape` (images are [N, C, H, W]); a backend may keep its
// own physical layout for the tensors it makes (see Tensor::layout), which only it reads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace latent {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[1, 3, 64, 64]"
int64_t shape_numel(const Shape& s);

// Owns (or borrows, with a keep-alive) one block of memory on a device.
class Storage {
 public:
  using Release = std::function<void(void*)>;
  Storage(void* data, size_t bytes, Device device, Release release)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}
  ~Storage() {
    if (release_) release_(data_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // 64-byte aligned host memory; nullptr-free: throws std::bad_alloc only on exhaustion.
  static std::shared_ptr<Storage> allocate_host(size_t bytes);

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  Release release_;
};

// Physical arrangement of a 4-D tensor's elements. kContiguous is row-major over the logical
// shape; kNHWC is the channels-last form a backend may choose for [N, C, H, W] tensors.
enum class Layout : uint8_t { kContiguous, kNHWC };

class Tensor {
 public:
  Tensor() = default;

  // Host tensors.
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  static Tensor from_floats(const Shape& shape, const std::vector<float>& values);  // fp32
  // A view over existing storage (a mmapped weight, a device buffer).
  static Tensor from_storage(std::shared_ptr<Storage> storage, size_t byte_offset,
                             const Shape& shape, DType dtype, Layout layout = Layout::kContiguous);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t byte_offset() const { return offset_; }

  void* data() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // Same storage, new shape of equal element count (contiguous layout only).
  Result<Tensor> reshape(const Shape& shape) const;
  // Host only: a new host tensor converted to `dtype` (a copy even when the dtype matches).
  Tensor to_dtype(DType dtype) const;
  // Host only: values as fp32 (copy).
  std::vector<float> to_floats() const;

  std::string describe() const;  // "bf16[1, 16, 64, 64] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Layout layout_ = Layout::kContiguous;
};

// ||a - b|| / ||b|| over host tensors of equal element count (any dtypes).
double relative_l2(const Tensor& a, const Tensor& b);

}  // namespace latent
