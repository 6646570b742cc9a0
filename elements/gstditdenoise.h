// ditdenoise: application/x-latent -> application/x-latent, restyled or edited by the Qwen-Image
// MMDiT (img2img or edit) under a text prompt given as precomputed embeddings.
#pragma once

#include <gst/gst.h>

#include "elements/gstlatentbase.h"

G_BEGIN_DECLS

#define GST_TYPE_DIT_DENOISE (gst_dit_denoise_get_type())
G_DECLARE_FINAL_TYPE(GstDitDenoise, gst_dit_denoise, GST, DIT_DENOISE, GstLatentBase)

#define GST_TYPE_DIT_DENOISE_MODE (gst_dit_denoise_mode_get_type())
GType gst_dit_denoise_mode_get_type(void);
#define GST_TYPE_DIT_DENOISE_NOISE_MODE (gst_dit_denoise_noise_mode_get_type())
GType gst_dit_denoise_noise_mode_get_type(void);
#define GST_TYPE_DIT_DENOISE_LORA_MODE (gst_dit_denoise_lora_mode_get_type())
GType gst_dit_denoise_lora_mode_get_type(void);

GST_ELEMENT_REGISTER_DECLARE(ditdenoise);

G_END_DECLS
