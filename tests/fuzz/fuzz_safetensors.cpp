// libFuzzer target: the safetensors header parser on arbitrary bytes. Beyond not crashing, an
// accepted header must describe records that lie inside the input and do not overlap.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "engine/weights/safetensors.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<latent::TensorRecord> records;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;
  latent::Status s = latent::parse_safetensors_header(data, size, "fuzz.safetensors", &records,
                                                      &metadata, &data_start);
  if (!s.ok()) {
    check(!s.message().empty());
    return 0;
  }
  check(data_start >= 8 && data_start <= size);
  const uint64_t data_bytes = size - data_start;
  for (const auto& r : records) {
    check(r.begin <= r.end && r.end <= data_bytes);
    uint64_t numel = 1;
    for (int64_t d : r.shape) {
      check(d >= 0);
      numel *= static_cast<uint64_t>(d);
    }
    check(numel * latent::dtype_size(r.dtype) == r.end - r.begin);
  }
  std::vector<const latent::TensorRecord*> sorted;
  for (const auto& r : records)
    if (r.end > r.begin) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i) check(sorted[i]->begin >= sorted[i - 1]->end);
  return 0;
}
