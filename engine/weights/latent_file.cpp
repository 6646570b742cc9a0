#include "engine/weights/latent_file.h"

#include <nlohmann/json.hpp>

namespace latent {

namespace {

using json = nlohmann::json;

std::string int_list(const std::vector<int64_t>& v) {
  json a = json::array();
  for (int64_t x : v) {
    if (x < 0)
      a.push_back(nullptr);
    else
      a.push_back(x);
  }
  return a.dump();
}

Status parse_int(const std::map<std::string, std::string>& meta, const std::string& key,
                 const std::string& what, int64_t lo, int64_t hi, int64_t* out) {
  auto it = meta.find(key);
  if (it == meta.end()) return Status::errorf(what, ": __metadata__ has no '", key, "'");
  const std::string& s = it->second;
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || v < lo || v > hi)
    return Status::errorf(what, ": __metadata__ '", key, "' is '", s, "', expected an integer in [",
                          lo, ", ", hi, "]");
  *out = v;
  return ok_status();
}

Status parse_string(const std::map<std::string, std::string>& meta, const std::string& key,
                    const std::string& what, bool required, std::string* out) {
  auto it = meta.find(key);
  if (it == meta.end()) {
    if (required) return Status::errorf(what, ": __metadata__ has no '", key, "'");
    return ok_status();
  }
  *out = it->second;
  return ok_status();
}

Status parse_list(const std::map<std::string, std::string>& meta, const std::string& key,
                  const std::string& what, std::vector<int64_t>* out) {
  auto it = meta.find(key);
  if (it == meta.end()) return Status::errorf(what, ": __metadata__ has no '", key, "'");
  json a = json::parse(it->second, nullptr, false);
  if (!a.is_array())
    return Status::errorf(what, ": __metadata__ '", key, "' is not a JSON list of integers");
  out->clear();
  out->reserve(a.size());
  for (const json& x : a) {
    if (x.is_null())
      out->push_back(kLatentFileNoTime);
    else if (x.is_number_unsigned())
      out->push_back(static_cast<int64_t>(std::min<uint64_t>(x.get<uint64_t>(), INT64_MAX)));
    else
      return Status::errorf(what, ": __metadata__ '", key,
                            "' holds something other than non-negative integers and null");
  }
  return ok_status();
}

}  // namespace

std::map<std::string, std::string> latent_file_metadata(const LatentFileInfo& info) {
  return {
      {"gst_latent_version", kLatentFileVersion},
      {"latent_space", info.latent_space},
      {"model", info.model},
      {"model_config_sha256", info.model_config_sha256},
      {"source", info.source},
      {"dtype", dtype_name(info.dtype)},
      {"channels", std::to_string(info.channels)},
      {"latent_width", std::to_string(info.width)},
      {"latent_height", std::to_string(info.height)},
      {"frame_width", std::to_string(info.frame_width)},
      {"frame_height", std::to_string(info.frame_height)},
      {"size_policy", info.size_policy},
      {"framerate", str_cat(info.fps_n, "/", info.fps_d)},
      {"video_mode", info.video_mode() ? "true" : "false"},
      {"temporal_factor", std::to_string(info.temporal_factor)},
      {"frame_count", std::to_string(info.frame_count)},
      {"latent_frames", std::to_string(info.latent_frames())},
      {"pts", int_list(info.pts)},
      {"durations", int_list(info.durations)},
      {"offsets", int_list(info.offsets)},
      {"offset_ends", int_list(info.offset_ends)},
  };
}

Result<LatentFileInfo> parse_latent_file_metadata(const std::map<std::string, std::string>& meta,
                                                  const std::string& what) {
  auto version = meta.find("gst_latent_version");
  if (version == meta.end())
    return Status::errorf(what,
                          " is not a latent file written by latentsink (no 'gst_latent_version' in "
                          "its __metadata__)");
  if (version->second != kLatentFileVersion)
    return Status::errorf(what, " is a latent file of version ", version->second,
                          "; this build reads version ", kLatentFileVersion);
  LatentFileInfo info;
  int64_t v = 0;
  LATENT_TRY(parse_string(meta, "latent_space", what, true, &info.latent_space));
  if (info.latent_space.empty())
    return Status::errorf(what, ": __metadata__ 'latent_space' is empty");
  LATENT_TRY(parse_string(meta, "model", what, false, &info.model));
  LATENT_TRY(parse_string(meta, "model_config_sha256", what, false, &info.model_config_sha256));
  LATENT_TRY(parse_string(meta, "source", what, false, &info.source));
  std::string dtype;
  LATENT_TRY(parse_string(meta, "dtype", what, true, &dtype));
  auto dt = parse_dtype(dtype);
  if (!dt.ok())
    return Status::errorf(what, ": __metadata__ 'dtype' is '", dtype, "' (fp32, bf16 or fp16)");
  info.dtype = *dt;
  constexpr int64_t kSide = 16384;
  LATENT_TRY(parse_int(meta, "channels", what, 1, 1024, &v));
  info.channels = int(v);
  LATENT_TRY(parse_int(meta, "latent_width", what, 1, kSide, &v));
  info.width = int(v);
  LATENT_TRY(parse_int(meta, "latent_height", what, 1, kSide, &v));
  info.height = int(v);
  LATENT_TRY(parse_int(meta, "frame_width", what, 1, kSide, &v));
  info.frame_width = int(v);
  LATENT_TRY(parse_int(meta, "frame_height", what, 1, kSide, &v));
  info.frame_height = int(v);
  LATENT_TRY(parse_string(meta, "size_policy", what, true, &info.size_policy));
  if (info.size_policy != "pad" && info.size_policy != "crop" && info.size_policy != "scale")
    return Status::errorf(what, ": __metadata__ 'size_policy' is '", info.size_policy,
                          "' (pad, crop or scale)");
  std::string rate;
  LATENT_TRY(parse_string(meta, "framerate", what, true, &rate));
  {
    long long n = -1, d = -1;
    char extra = 0;
    if (std::sscanf(rate.c_str(), "%lld/%lld%c", &n, &d, &extra) != 2 || n < 0 || d <= 0 ||
        n > INT32_MAX || d > INT32_MAX)
      return Status::errorf(what, ": __metadata__ 'framerate' is '", rate, "', expected N/D");
    info.fps_n = int(n);
    info.fps_d = int(d);
  }
  LATENT_TRY(parse_int(meta, "temporal_factor", what, 1, 1024, &v));
  info.temporal_factor = int(v);
  std::string video_mode;
  LATENT_TRY(parse_string(meta, "video_mode", what, true, &video_mode));
  if (video_mode != (info.video_mode() ? "true" : "false"))
    return Status::errorf(what, ": __metadata__ 'video_mode' is '", video_mode,
                          "' but 'temporal_factor' is ", info.temporal_factor, " (video mode ",
                          info.video_mode() ? "true" : "false", ")");
  LATENT_TRY(parse_int(meta, "frame_count", what, 0, INT64_MAX, &info.frame_count));
  LATENT_TRY(parse_list(meta, "pts", what, &info.pts));
  LATENT_TRY(parse_list(meta, "durations", what, &info.durations));
  LATENT_TRY(parse_list(meta, "offsets", what, &info.offsets));
  LATENT_TRY(parse_list(meta, "offset_ends", what, &info.offset_ends));
  const size_t t = info.pts.size();
  if (info.durations.size() != t || info.offsets.size() != t || info.offset_ends.size() != t)
    return Status::errorf(what, ": __metadata__ lists 'pts' (", t, "), 'durations' (",
                          info.durations.size(), "), 'offsets' (", info.offsets.size(),
                          ") and 'offset_ends' (", info.offset_ends.size(), ") differ in length");
  LATENT_TRY(parse_int(meta, "latent_frames", what, 0, INT64_MAX, &v));
  if (static_cast<size_t>(v) != t)
    return Status::errorf(what, ": __metadata__ 'latent_frames' is ", v, " but its lists have ", t,
                          " entries");
  return info;
}

size_t LatentFile::frame_bytes() const {
  return static_cast<size_t>(info.channels) * info.width * info.height * dtype_size(info.dtype);
}

const uint8_t* LatentFile::frame_data(int64_t index) const {
  return static_cast<const uint8_t*>(latents.data()) + static_cast<size_t>(index) * frame_bytes();
}

Result<LatentFile> open_latent_file(const std::string& path) {
  auto file = SafetensorsFile::open(path);
  if (!file.ok()) return file.status();
  LatentFile out;
  out.file = *file;
  auto info = parse_latent_file_metadata(out.file->metadata(), path);
  if (!info.ok()) return info.status();
  out.info = std::move(*info);
  const TensorRecord* rec = out.file->find(kLatentFileTensor);
  if (!rec) {
    // There in a dtype the reader skips (I32, F64, ...): say so rather than "no tensor".
    auto skipped = out.file->tensor(kLatentFileTensor);
    if (!skipped.ok() && skipped.status().message().rfind("unsupported dtype", 0) == 0)
      return skipped.status();
    std::string names;
    for (const auto& r : out.file->records()) names += (names.empty() ? "" : ", ") + r.name;
    return Status::errorf(path, " has no tensor '", kLatentFileTensor,
                          "' (it holds: ", names.empty() ? "nothing" : names, ")");
  }
  auto t = out.file->tensor(kLatentFileTensor);
  if (!t.ok()) return t.status();
  out.latents = *t;
  out.data_offset = out.file->data_start() + rec->begin;
  const LatentFileInfo& i = out.info;
  const Shape want = {static_cast<int64_t>(i.pts.size()), i.channels, i.height, i.width};
  if (out.latents.shape() != want)
    return Status::errorf(path, ": tensor '", kLatentFileTensor, "' has shape ",
                          shape_str(out.latents.shape()), " but its __metadata__ describes ",
                          shape_str(want));
  if (out.latents.dtype() != i.dtype)
    return Status::errorf(path, ": tensor '", kLatentFileTensor, "' is ",
                          dtype_name(out.latents.dtype()), " but its __metadata__ says ",
                          dtype_name(i.dtype));
  if (want[0] == 0) return Status::errorf(path, " holds no latent frames");
  return out;
}

}  // namespace latent
