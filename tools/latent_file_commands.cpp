#include "tools/latent_file_commands.h"

#include <cstdio>

#include "engine/weights/latent_file.h"

namespace {

std::string time_text(int64_t ns) {
  if (ns < 0) return "none";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f s", double(ns) / 1e9);
  return buf;
}

}  // namespace

bool is_latent_file(const std::string& path) {
  const std::string ext = ".safetensors";
  if (path.size() < ext.size() || path.compare(path.size() - ext.size(), ext.size(), ext) != 0)
    return false;
  auto file = latent::SafetensorsFile::open(path);
  return file.ok() && (*file)->metadata().count("gst_latent_version") != 0;
}

int inspect_latent_file(const std::string& path) {
  auto file = latent::open_latent_file(path);
  if (!file.ok()) {
    std::fprintf(stderr, "latent-tool: error: %s\n", file.status().message().c_str());
    return 1;
  }
  const latent::LatentFileInfo& i = file->info;
  std::printf("latent file:   %s\n", path.c_str());
  std::printf("latents:       %s %s\n", latent::shape_str(file->latents.shape()).c_str(),
              latent::dtype_name(i.dtype));
  std::printf("latent space:  %s\n", i.latent_space.c_str());
  std::printf("model:         %s (config sha256 %s)\n", i.model.c_str(),
              i.model_config_sha256.empty() ? "unknown" : i.model_config_sha256.c_str());
  std::printf("frame size:    %dx%d (size policy %s)\n", i.frame_width, i.frame_height,
              i.size_policy.c_str());
  std::printf("frame rate:    %d/%d\n", i.fps_n, i.fps_d);
  if (i.video_mode())
    std::printf("mode:          video, %d frames per latent frame, %lld frames\n",
                i.temporal_factor, static_cast<long long>(i.frame_count));
  else
    std::printf("mode:          image, %lld frames\n", static_cast<long long>(i.frame_count));
  std::printf("source:        %s\n", i.source.empty() ? "unknown" : i.source.c_str());
  const int64_t t = i.latent_frames();
  auto frames = [&](int64_t k) -> std::string {
    if (i.offsets[k] < 0 || i.offset_ends[k] < 0) return "unknown";
    return "[" + std::to_string(i.offsets[k]) + ", " + std::to_string(i.offset_ends[k]) + ")";
  };
  if (t > 0) {
    std::printf("first latent:  pts %s, duration %s, frames %s\n", time_text(i.pts[0]).c_str(),
                time_text(i.durations[0]).c_str(), frames(0).c_str());
    std::printf("last latent:   pts %s, duration %s, frames %s\n", time_text(i.pts[t - 1]).c_str(),
                time_text(i.durations[t - 1]).c_str(), frames(t - 1).c_str());
  }
  return 0;
}

latent::Result<latent::Tensor> latent_file_images(const latent::SafetensorsFile& file) {
  auto info = latent::parse_latent_file_metadata(file.metadata(), file.path());
  if (!info.ok()) return info.status();
  if (info->video_mode())
    return latent::Status::errorf(
        file.path(), " holds video-mode latents (", info->temporal_factor,
        " frames per latent frame): decode them with "
        "`latentsrc location=FILE ! vaedecode` (pipelines/decode_latents.sh)");
  return file.tensor(latent::kLatentFileTensor);
}
