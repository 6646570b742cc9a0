// libFuzzer target: the latent file's __metadata__ checks (parse_latent_file_metadata, what
// latentsrc and latent-tool run on a file's header) on arbitrary JSON objects of strings. Beyond
// not crashing: a rejection says why, an accepted description is consistent (its four lists as
// long as 'latent_frames', sizes and rates in range), and what latentsink would write for it
// reads back to the same metadata.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/weights/latent_file.h"

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j =
      nlohmann::json::parse(data, data + size, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return 0;
  std::map<std::string, std::string> meta;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) return 0;  // safetensors' __metadata__ holds strings only
    meta[key] = value.get<std::string>();
  }
  auto info = latent::parse_latent_file_metadata(meta, "fuzz.safetensors");
  if (!info.ok()) {
    check(!info.status().message().empty());
    return 0;
  }
  const latent::LatentFileInfo& i = *info;
  const size_t t = i.pts.size();
  check(i.durations.size() == t && i.offsets.size() == t && i.offset_ends.size() == t);
  check(i.latent_frames() == static_cast<int64_t>(t));
  check(!i.latent_space.empty());
  check(i.channels >= 1 && i.channels <= 1024 && i.width >= 1 && i.height >= 1);
  check(i.frame_width >= 1 && i.frame_height >= 1 && i.fps_n >= 0 && i.fps_d >= 1);
  check(i.temporal_factor >= 1 && i.frame_count >= 0);
  for (size_t k = 0; k < t; ++k)
    check(i.pts[k] >= latent::kLatentFileNoTime && i.durations[k] >= latent::kLatentFileNoTime &&
          i.offsets[k] >= latent::kLatentFileNoTime &&
          i.offset_ends[k] >= latent::kLatentFileNoTime);
  // What latentsink writes for this description parses back to the same description.
  const std::map<std::string, std::string> written = latent::latent_file_metadata(i);
  auto again = latent::parse_latent_file_metadata(written, "fuzz.safetensors");
  check(again.ok());
  check(latent::latent_file_metadata(*again) == written);
  return 0;
}
