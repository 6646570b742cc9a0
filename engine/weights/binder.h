// WeightBinder: hands a model its parameters by checkpoint name, checking shapes, so that a
// missing, misshaped or unexpected tensor is reported by its full dotted name.
//
// Models ask for every parameter with take(); finish() then reports every tensor in the store
// that no one asked for. Names can be remapped (single-file layouts) before lookup.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/weights/safetensors.h"

namespace latent {

class WeightBinder {
 public:
  // `rename` maps the model's (diffusers) name to the store's name; identity when empty.
  WeightBinder(const WeightStore& store, Backend& backend,
               std::function<std::string(const std::string&)> rename = {});

  // Uploads the tensor `name` to the backend after checking its shape (empty `shape` skips the
  // check). Errors are collected: the returned tensor is undefined on failure, and finish()
  // reports all problems at once.
  Tensor take(const std::string& name, const Shape& shape);
  // Like take() but absent is fine (returns an undefined tensor); present-but-misshaped is not.
  Tensor take_optional(const std::string& name, const Shape& shape);
  // Host copy of a tensor without uploading it (fp32), e.g. a weight to slice on the host.
  Tensor take_host(const std::string& name, const Shape& shape);
  bool has(const std::string& name) const;
  // The backend take() uploads to.
  Backend& backend() const { return backend_; }
  // Records a problem of a taken tensor found by the model (e.g. an upload of a weight it made
  // from one taken with take_host()); finish() reports it with the rest.
  void note(std::string error) { errors_.push_back(std::move(error)); }

  // Marks store tensors matching `prefix` as deliberately unused (e.g. a decoder-only load).
  void ignore_prefix(const std::string& prefix);

  // Errors for missing / misshaped tensors and for tensors in the store that were never taken,
  // except the scales and marker of FP8 weights (safetensors.h, Fp8Companion), which are
  // consumed with their weight or ignored; those are errors only when they scale a weight that
  // is not FP8 or are misshaped.
  Status finish() const;
  int64_t parameters_taken() const { return parameters_; }
  // Storage dtypes seen among the taken tensors, in parameters ("bf16" -> count; FP8 weights as
  // "fp8_e4m3", or "fp8_e4m3 scaled" with a scale).
  const std::map<std::string, int64_t>& storage_dtypes() const { return dtypes_; }

 private:
  Tensor take_impl(const std::string& name, const Shape& shape, bool optional, bool upload);
  const WeightStore& store_;
  Backend& backend_;
  std::function<std::string(const std::string&)> rename_;
  std::set<std::string> used_;
  std::vector<std::string> ignored_prefixes_;
  std::vector<std::string> errors_;
  std::map<std::string, int64_t> dtypes_;
  int64_t parameters_ = 0;
};

}  // namespace latent
