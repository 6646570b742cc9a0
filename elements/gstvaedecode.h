// vaedecode: application/x-latent -> video/x-raw (packed 8-bit RGB) at the original frame size.
#pragma once

#include "elements/gstlatentbase.h"

G_BEGIN_DECLS

#define GST_TYPE_VAE_DECODE (gst_vae_decode_get_type())
G_DECLARE_FINAL_TYPE(GstVaeDecode, gst_vae_decode, GST, VAE_DECODE, GstLatentBase)

GST_ELEMENT_REGISTER_DECLARE(vaedecode);

G_END_DECLS
