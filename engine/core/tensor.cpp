#include "engine/core/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

namespace latent {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::shared_ptr<Storage> Storage::allocate_host(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  return std::make_shared<Storage>(p, bytes, Device{}, [](void* q) { std::free(q); });
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = Storage::allocate_host(t.nbytes());
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::from_floats(const Shape& shape, const std::vector<float>& values) {
  Tensor t = empty(shape, DType::kF32);
  std::memcpy(t.data(), values.data(), std::min(values.size(), static_cast<size_t>(t.numel())) * 4);
  return t;
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, size_t byte_offset, const Shape& shape,
                            DType dtype, Layout layout) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.offset_ = byte_offset;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.layout_ = layout;
  return t;
}

Result<Tensor> Tensor::reshape(const Shape& shape) const {
  if (shape_numel(shape) != numel())
    return Status::errorf("cannot reshape ", shape_str(shape_), " to ", shape_str(shape));
  if (layout_ != Layout::kContiguous)
    return Status::errorf("cannot reshape a tensor in a backend layout ", describe());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::to_dtype(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  convert_elements(data(), dtype_, t.data(), dtype, static_cast<size_t>(numel()));
  return t;
}

std::vector<float> Tensor::to_floats() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  convert_elements(data(), dtype_, v.data(), DType::kF32, v.size());
  return v;
}

std::string Tensor::describe() const {
  return str_cat(dtype_name(dtype_), shape_str(shape_), " on ", device().to_string());
}

double relative_l2(const Tensor& a, const Tensor& b) {
  std::vector<float> x = a.to_floats(), y = b.to_floats();
  if (x.size() != y.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = static_cast<double>(x[i]) - y[i];
    num += d * d;
    den += static_cast<double>(y[i]) * y[i];
  }
  if (std::isnan(num)) return NAN;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace latent
