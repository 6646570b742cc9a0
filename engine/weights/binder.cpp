#include "engine/weights/binder.h"

#include <algorithm>

namespace latent {

namespace {

// errors_ keeps one line per problem; missing tensors are kept as bare names behind this tag
// so that finish() can list them together.
constexpr char kMissingTag[] = "\x01missing:";
constexpr size_t kMaxListed = 20;

bool is_missing_entry(const std::string& e) { return e.rfind(kMissingTag, 0) == 0; }

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

WeightBinder::WeightBinder(const WeightStore& store, Backend& backend,
                           std::function<std::string(const std::string&)> rename)
    : store_(store), backend_(backend), rename_(std::move(rename)) {}

Tensor WeightBinder::take(const std::string& name, const Shape& shape) {
  return take_impl(name, shape, /*optional=*/false, /*upload=*/true);
}

Tensor WeightBinder::take_optional(const std::string& name, const Shape& shape) {
  return take_impl(name, shape, /*optional=*/true, /*upload=*/true);
}

Tensor WeightBinder::take_host(const std::string& name, const Shape& shape) {
  return take_impl(name, shape, /*optional=*/false, /*upload=*/false);
}

bool WeightBinder::has(const std::string& name) const {
  return store_.contains(rename_ ? rename_(name) : name);
}

void WeightBinder::ignore_prefix(const std::string& prefix) { ignored_prefixes_.push_back(prefix); }

Tensor WeightBinder::take_impl(const std::string& name, const Shape& shape, bool optional,
                               bool upload) {
  const std::string stored = rename_ ? rename_(name) : name;
  // "encoder.conv_in.weight" or "encoder.conv_in.weight (stored as 'first_stage_model....')".
  const std::string label =
      stored == name ? str_cat("'", name, "'") : str_cat("'", name, "' (stored as '", stored, "')");
  const bool first_take = used_.insert(stored).second;

  const TensorRecord* rec = store_.find(stored);
  if (!rec) {
    auto probe = store_.get(stored);  // says "unsupported dtype ..." when that is the reason
    const bool unsupported = !probe.ok() && probe.status().message().rfind("unsupported", 0) == 0;
    if (unsupported) {
      errors_.push_back(probe.status().message());
    } else if (!optional) {
      errors_.push_back(kMissingTag +
                        (stored == name ? name : str_cat(name, " (as ", stored, ")")));
    }
    return Tensor();
  }
  // Its FP8 scale is read with it (WeightStore::get), which reports a bad one.
  if (const TensorRecord* scale = store_.fp8_scale_of(stored)) used_.insert(scale->name);
  if (!shape.empty() && rec->shape != shape) {
    errors_.push_back(str_cat("tensor ", label, " in ", store_.path(), " has shape ",
                              shape_str(rec->shape), ", expected ", shape_str(shape)));
    return Tensor();
  }
  auto host = store_.get(stored);
  if (!host.ok()) {
    errors_.push_back(host.status().message());
    return Tensor();
  }
  if (first_take) {
    parameters_ += host->numel();
    // As stored: "fp8_e4m3 scaled" for a ComfyUI scaled-FP8 weight (decoded to fp32 here).
    const std::string stored_as =
        rec->fp8 == Fp8Format::kNone
            ? std::string(dtype_name(host->dtype()))
            : str_cat(fp8_format_name(rec->fp8), store_.fp8_scale_of(stored) ? " scaled" : "");
    dtypes_[stored_as] += host->numel();
  }
  if (!upload) return host->to_dtype(DType::kF32);
  auto dev = backend_.upload(*host);
  if (!dev.ok()) {
    errors_.push_back(str_cat("uploading tensor ", label, " from ", store_.path(), " to ",
                              backend_.name(), ": ", dev.status().message()));
    return Tensor();
  }
  return std::move(dev).value();
}

Status WeightBinder::finish() const {
  std::vector<std::string> missing, other, unexpected;
  for (const auto& e : errors_) {
    if (is_missing_entry(e))
      missing.push_back(e.substr(sizeof(kMissingTag) - 1));
    else
      other.push_back(e);
  }
  for (const auto& n : store_.names()) {
    if (used_.count(n)) continue;
    bool ignored = std::any_of(ignored_prefixes_.begin(), ignored_prefixes_.end(),
                               [&](const std::string& p) { return starts_with(n, p); });
    if (ignored) continue;
    // The scales and marker of ComfyUI's scaled FP8 (Fp8Companion): consumed with their
    // weight or ignored; a scale beside a weight that is not FP8, or misshaped, is an error.
    if (fp8_companion(n).kind != Fp8Companion::kNone) {
      const std::string why = store_.check_fp8_companion(n);
      if (!why.empty()) other.push_back(why);
      continue;
    }
    unexpected.push_back(n);
  }
  if (missing.empty() && other.empty() && unexpected.empty()) return ok_status();

  // One message with at most kMaxListed entries in all, shared fairly between the kinds: when
  // every name is "missing" because of a prefix mismatch, the unexpected names show why.
  const std::vector<std::string>* lists[3] = {&missing, &other, &unexpected};
  size_t quota[3] = {0, 0, 0};
  for (size_t budget = kMaxListed; budget > 0;) {
    size_t wanting = 0;
    for (int k = 0; k < 3; ++k) wanting += quota[k] < lists[k]->size();
    if (wanting == 0) break;
    const size_t share = std::max<size_t>(1, budget / wanting);
    for (int k = 0; k < 3 && budget > 0; ++k) {
      const size_t give = std::min({share, lists[k]->size() - quota[k], budget});
      quota[k] += give;
      budget -= give;
    }
  }
  const char* titles[3][2] = {{"missing tensor", "missing tensors"},
                              {"misshaped or unreadable tensor", "misshaped or unreadable tensors"},
                              {"unexpected tensor", "unexpected tensors"}};
  std::string msg = str_cat(store_.path(), " does not match the model:");
  for (int k = 0; k < 3; ++k) {
    const auto& items = *lists[k];
    if (items.empty()) continue;
    msg += str_cat(" ", items.size(), " ", titles[k][items.size() == 1 ? 0 : 1], ":");
    for (size_t i = 0; i < quota[k]; ++i)
      msg += str_cat(i ? (k == 1 ? "; " : ", ") : " ", items[i]);
    if (quota[k] < items.size()) msg += str_cat(" and ", items.size() - quota[k], " more");
    msg += ".";
  }
  return Status::error(msg);
}

}  // namespace latent
