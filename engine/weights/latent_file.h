// The latent file: one safetensors file per clip (or image) holding a stream's latents, as
// latentsink writes it and latentsrc / latent-tool / Python read it.
//
//   tensor "latents"  [T, C, h, w] in the stream's dtype (F32, BF16, F16): T latent frames of
//                     the normalised latent (T = 1 for an image)
//   __metadata__      every value a string (safetensors requires it); see README "The latent
//                     file". Lists are JSON arrays of integers (null for an unknown time).
//
// Nothing in it depends on when, where or by which process it was written, so the same clip
// through the same model gives the same bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/weights/safetensors.h"

namespace latent {

constexpr const char* kLatentFileTensor = "latents";
constexpr const char* kLatentFileVersion = "1";
constexpr int64_t kLatentFileNoTime = -1;  // an unknown pts / duration / offset

struct LatentFileInfo {
  std::string latent_space;
  std::string model;                // as given to the encoder ("default": the built-in model)
  std::string model_config_sha256;  // of its config.json (or of a single file's header)
  std::string source;               // the clip it was made from, as given to the job
  DType dtype = DType::kF32;
  int channels = 0, width = 0, height = 0;  // latent [C, h, w]
  int frame_width = 0, frame_height = 0;    // the video size a decoder restores
  std::string size_policy = "pad";
  int fps_n = 0, fps_d = 1;  // 0/1: unknown
  int temporal_factor = 1;   // > 1: video mode (each latent frame covers up to this many frames)
  int64_t frame_count = 0;   // video frames covered (video mode: the last offset_end)
  // Per latent frame (T entries each): pts and duration in nanoseconds, and the index of the
  // first source frame covered and one past the last real one (kLatentFileNoTime: unknown).
  std::vector<int64_t> pts, durations, offsets, offset_ends;

  bool video_mode() const { return temporal_factor > 1; }
  int64_t latent_frames() const { return static_cast<int64_t>(pts.size()); }
};

// The `__metadata__` describing `info`.
std::map<std::string, std::string> latent_file_metadata(const LatentFileInfo& info);
// Parses and checks `__metadata__` (`what` names the file in messages): a file without our
// version key is named as not a latent file.
Result<LatentFileInfo> parse_latent_file_metadata(const std::map<std::string, std::string>& meta,
                                                  const std::string& what);

// An opened latent file: the mapping, its description, and the latents checked against it.
struct LatentFile {
  std::shared_ptr<SafetensorsFile> file;
  LatentFileInfo info;
  Tensor latents;  // host view [T, C, h, w] into the mapping
  uint64_t data_offset = 0;  // the file offset of latent frame 0's bytes

  int64_t frames() const { return latents.dim(0); }
  size_t frame_bytes() const;
  const uint8_t* frame_data(int64_t index) const;
  // The file offset of latent frame `index`'s bytes (latentsrc reads them with pread rather than
  // through the mapping: a file truncated while it plays is then an error, not a SIGBUS).
  uint64_t frame_offset(int64_t index) const {
    return data_offset + static_cast<uint64_t>(index) * frame_bytes();
  }
};

Result<LatentFile> open_latent_file(const std::string& path);

}  // namespace latent
