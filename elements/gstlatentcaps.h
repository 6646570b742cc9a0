// The latent media type shared by the stages: application/x-latent.
//
//   format        string    element type of the buffer: "fp32", "bf16" or "fp16"
//   channels      int       latent channels C
//   width/height  int       latent size w x h
//   latent-space  string    what the latent means (LatentSpace::name, e.g. "flux1")
//   frame-width   int       the video size vaedecode restores
//   frame-height  int
//   size-policy   string    how the frame was fitted to the model grid: pad, crop or scale
//   framerate     fraction  (optional, 0/1 when absent)
//
// A buffer is one frame's normalised latent [C, h, w], contiguous, in system memory, or with
// the memory:CUDAMemory feature in one GstCudaMemory (elements/gstlatentcuda.h).
#pragma once

#include <gst/gst.h>
#include <gst/video/video.h>

#include <string>

#include "engine/core/dtype.h"
#include "engine/core/pixels.h"
#include "engine/core/status.h"

#define GST_LATENT_MEDIA_TYPE "application/x-latent"

// Limits a caps field must respect; anything outside is refused with a message.
constexpr int kGstLatentMaxChannels = 1024;
// Latent and frame sides: frames are video/x-raw of at most kGstLatentMaxVideoSide (below).
constexpr int kGstLatentMaxSide = 8192;

// Template caps for a pad carrying latents (every field's full range).
#define GST_LATENT_CAPS_FIELDS                    \
  "format = (string) { fp32, bf16, fp16 }, "      \
  "channels = (int) [ 1, 1024 ], "                \
  "width = (int) [ 1, 8192 ], "                   \
  "height = (int) [ 1, 8192 ], "                  \
  "frame-width = (int) [ 1, 8192 ], "             \
  "frame-height = (int) [ 1, 8192 ], "            \
  "size-policy = (string) { pad, crop, scale }, " \
  "framerate = (fraction) [ 0/1, 2147483647/1 ]"
// The latent spaces the engine names itself (latent::known_latent_spaces(), which a test keeps
// equal to this list). A custom VAE's space carries a generated name instead (e.g.
// `autoencoder-kl-4ch-s0.5-t0`, `qwen-image-vae-custom`, or the `latent_space` its config names),
// so each template has a second structure without the field: it takes those names, and the
// elements refuse a space their model does not produce with a message during negotiation.
#define GST_LATENT_KNOWN_SPACES                                                           \
  "{ sd, sdxl, sd3, flux1, flux2, qwen-image, wan2.2, hunyuan-video, hunyuan-video-1.5, " \
  "open-sora-1.3, latent-default }"
#define GST_LATENT_CAPS_TEMPLATE_FOR(media)                                              \
  media ", latent-space = (string) " GST_LATENT_KNOWN_SPACES ", " GST_LATENT_CAPS_FIELDS \
        "; " media ", " GST_LATENT_CAPS_FIELDS
#define GST_LATENT_CAPS_TEMPLATE GST_LATENT_CAPS_TEMPLATE_FOR(GST_LATENT_MEDIA_TYPE)

// The same in CUDA memory (elements/gstlatentcuda.h): one GstCudaMemory holding [C, h, w].
#define GST_LATENT_CUDA_CAPS_TEMPLATE \
  GST_LATENT_CAPS_TEMPLATE_FOR(GST_LATENT_MEDIA_TYPE "(memory:CUDAMemory)")

struct GstLatentInfo {
  latent::DType dtype = latent::DType::kF32;
  int channels = 0;
  int width = 0;
  int height = 0;
  std::string latent_space;
  int frame_width = 0;
  int frame_height = 0;
  latent::SizePolicy size_policy = latent::SizePolicy::kPad;
  int fps_n = 0;
  int fps_d = 1;

  // Bytes of one buffer: C * h * w * sizeof(dtype).
  size_t frame_bytes() const;
  bool operator==(const GstLatentInfo& o) const;
  bool operator!=(const GstLatentInfo& o) const { return !(*this == o); }
};

// Fixed caps describing `info`.
GstCaps* gst_latent_info_to_caps(const GstLatentInfo& info);
// Parses fixed application/x-latent caps; every field but framerate is required. Absurd values
// (zero or huge sizes, unknown format or policy, empty latent space) are errors naming the field.
latent::Result<GstLatentInfo> gst_latent_info_from_caps(const GstCaps* caps);

// GEnum for size-policy properties (nicks "pad", "crop", "scale"; values = latent::SizePolicy).
#define GST_TYPE_LATENT_SIZE_POLICY (gst_latent_size_policy_get_type())
GType gst_latent_size_policy_get_type(void);

// The dtype names offered in caps, `preferred` first (the rest in a fixed order).
void gst_latent_set_format_list(GstStructure* s, latent::DType preferred);

// ---- the video side ----------------------------------------------------------------------

// The packed 8-bit RGB formats the stages read and write, in the order vaedecode offers them.
#define GST_LATENT_VIDEO_FORMATS "{ RGB, RGBA, BGRA, BGR, RGBx, BGRx, xRGB, xBGR, ARGB, ABGR }"
// Any size: frames smaller than the model's downsampling factor are padded (or scaled) up to one
// block; size-policy crop needs a block's worth of pixels per side.
constexpr int kGstLatentMinVideoSide = 1;
constexpr int kGstLatentMaxVideoSide = 8192;
#define GST_LATENT_VIDEO_CAPS_TEMPLATE                       \
  "video/x-raw, format = (string) " GST_LATENT_VIDEO_FORMATS \
  ", "                                                       \
  "width = (int) [ 1, 8192 ], height = (int) [ 1, 8192 ], "  \
  "framerate = (fraction) [ 0/1, 2147483647/1 ]"

#define GST_LATENT_CUDA_VIDEO_CAPS_TEMPLATE                                     \
  "video/x-raw(memory:CUDAMemory), format = (string) " GST_LATENT_VIDEO_FORMATS \
  ", width = (int) [ 1, 8192 ], height = (int) [ 1, 8192 ], "                   \
  "framerate = (fraction) [ 0/1, 2147483647/1 ]"

// GstVideoFormat -> the engine's pixel format (an error for anything but the list above).
latent::Result<latent::PixelFormat> gst_latent_pixel_format(GstVideoFormat format);
// A video/x-raw structure with the format list `formats` and no size fields.
GstStructure* gst_latent_video_structure_new(const char* formats = GST_LATENT_VIDEO_FORMATS);
// Sets the video structure `video`'s width, height and framerate from the latent structure
// `latent`'s frame-width, frame-height and framerate (the full side ranges where absent).
void gst_latent_set_video_size(const GstStructure* latent, GstStructure* video);
// Copies `field` from `from` (any value) to `to` as `as`; false when `from` has no such field.
bool gst_latent_copy_field(const GstStructure* from, const char* field, GstStructure* to,
                           const char* as);

// Refuses a change of a property flagged GST_PARAM_MUTABLE_READY while `element` is (or is going)
// past READY, where the value is in use: a warning from `who` (the element's name in messages)
// naming the value `current` that stays. True when refused (the caller then keeps it).
bool gst_latent_refuse_while_running(GstElement* element, const char* who, GParamSpec* pspec,
                                     const std::string& current);
