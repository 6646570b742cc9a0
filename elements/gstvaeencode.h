// vaeencode: video/x-raw (packed 8-bit RGB) -> application/x-latent.
#pragma once

#include "elements/gstlatentbase.h"

G_BEGIN_DECLS

#define GST_TYPE_VAE_ENCODE (gst_vae_encode_get_type())
G_DECLARE_FINAL_TYPE(GstVaeEncode, gst_vae_encode, GST, VAE_ENCODE, GstLatentBase)

GST_ELEMENT_REGISTER_DECLARE(vaeencode);

G_END_DECLS
