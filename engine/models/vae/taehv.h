// The TAEHV family of tiny video autoencoders (madebyollin/taehv, `taehv.py` class TAEHV):
// TAEW2.1 (taew2_1.safetensors: Wan 2.1 / Qwen-Image latents, 16 channels, /8), TAEW2.2
// (taew2_2.safetensors: Wan 2.2 5B latents, 48 channels, 2x2 pixel patches, /16), and the other
// published files of the same plain (non-"super") structure: taehv (HunyuanVideo, 16 channels)
// and taehv1_5 (HunyuanVideo 1.5, 32 channels, 2x2 patches).
//
// Stored layout: the published single files hold taehv.py's two nn.Sequential layer lists under
// their own indices, encoder.N.* and decoder.N.*:
//   encoder  0 conv(3p^2 -> 64) 1 ReLU
//            2 TPool  3 conv stride 2 (no bias)  4-6 MemBlock     (the same at 7-11 and 12-16)
//            17 conv(64 -> latent)
//   decoder  0 Clamp 1 conv(latent -> 256) 2 ReLU
//            3-5 MemBlock 6 Upsample 7 TGrow 8 conv(256 -> 128, no bias)   (the same at 9-14
//            and 15-20, widths 128 -> 64 and 64 -> 64)  21 ReLU 22 conv(64 -> 3p^2)
// MemBlock(c): conv.0 (2c -> c, input cat[x, past]), conv.2, conv.4 (3x3, bias); out =
// ReLU(conv(x, past) + x). TPool(c, s): 1x1 conv (s*c -> c, no bias) over s consecutive frames
// stacked along channels; TGrow(c, s): 1x1 conv (c -> s*c, no bias) whose output channels are s
// consecutive frames. Channel widths are read from the weights (so narrowed test models load);
// the temporal strides are taehv.py's defaults for these files: encoder pools (2, 2, 1) (read
// from the weights), decoder grows (1, 2, 2), and like taehv.py's patch_tgrow_layers a stored
// TGrow weight with more output channels than its stride needs keeps its last ones.
//
// Not supported (refused with a message naming the file): the "super" decoders (taew2_2_super,
// taehv1_5_super: depthwise SuperMemBlocks), taecvx (CogVideoX: another frame trim), taeh3
// (17-frame chunks) and taeltx (three temporal pools, 4x4 patches).
//
// ---- Frame conventions (what differs from the VaeStream comments in vae.h) -------------------
// Temporal factor F = 4 (the product of the encoder's pool strides).
// * Encoder: taehv.py pools every 4 consecutive frames into one latent frame, the first latent
//   frame included (Wan's causal VAE encodes frame 0 alone). So a stream returns latent frame k
//   once frames 4k .. 4k+3 have been pushed: latent 0 after 4 frames, not after 1, and
//   frames_buffered() is frames_seen() % 4.
// * Clip lengths: taehv.py's encode_video pads a clip at the end by repeating its last frame to
//   a multiple of 4; for T = 1 + 4k (diffusers' convention) that is 3 frames and gives 1 + k
//   latent frames, like Wan. finish() pads a clip of any other length first to the next 1 + 4k
//   frames (those repeated frames are what *padded_frames reports and what a decoder's output
//   drops again), then as taehv.py does: the result is taehv.py's encode_video of the clip
//   padded to 1 + 4k frames, and a round trip keeps the clip's length. (taehv.py's own
//   encode_video on, say, 6 frames gives 2 latent frames, which decode to 5 frames; here 6
//   frames give 3, which decode to 9, of which the last 3 are the padding.) finish() returns
//   1 latent frame, or 2 when the clip's length T has T % 4 == 2 or 3 (vae.h: always 1).
// * Decoder: every latent frame becomes 4 frames; taehv.py drops the first 3 frames of the
//   clip (frames_to_trim), so latent 0 yields 1 frame and each later one 4, as in vae.h.
// * Values: frames in [-1, 1] on our side ([0, 1] in taehv.py; decoded frames are clamped to
//   [0, 1] there, so to [-1, 1] here); latents are taehv.py's, which are already the diffusion
//   model's normalised latents (the latent space's shift is 0 and scale 1, like the TAESD
//   family's).
// * Image mode: encode() of [N, 3, H, W] is a one-frame clip (taehv.py's encode_video of one
//   frame, i.e. that frame repeated 4 times) -> [N, C, h, w]; decode() of [N, C, h, w] is a
//   one-latent clip -> its one frame after the trim (the last of the 4 the decoder makes).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/weights/safetensors.h"

namespace latent {

struct TaehvConfig {
  int64_t image_channels = 3;
  int patch_size = 1;  // 1 (TAEW2.1), 2 (TAEW2.2: pixel (un)shuffle of 2x2 patches)
  int64_t latent_channels = 16;
  int64_t encoder_width = 64;                               // every encoder layer's channels
  std::array<int64_t, 4> decoder_widths{256, 128, 64, 64};  // the 3 stages, then the last conv
  std::array<int, 3> encoder_pool{2, 2, 1};                 // TPool strides
  std::array<int, 3> decoder_grow{1, 2, 2};                 // TGrow strides
  bool has_encoder = false, has_decoder = false;

  int temporal_factor() const { return encoder_pool[0] * encoder_pool[1] * encoder_pool[2]; }
  int temporal_upscale() const { return decoder_grow[0] * decoder_grow[1] * decoder_grow[2]; }
  int downsample() const { return 8 * patch_size; }
};

// Whether the store holds a TAEHV-family layer list (encoder.N / decoder.N with MemBlocks and
// TPool / TGrow layers). Checked before the TAESD family, which shares the encoder.N names.
bool is_taehv_checkpoint(const WeightStore& weights);

// Reads the configuration from the weight shapes; errors name the file and tensor.
Result<TaehvConfig> infer_taehv_config(const WeightStore& weights);

}  // namespace latent
