// latentsrc: a latent file (as latentsink writes it) -> application/x-latent, seekable in time.
#pragma once

#include <gst/base/gstpushsrc.h>
#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_LATENT_SRC (gst_latent_src_get_type())
G_DECLARE_FINAL_TYPE(GstLatentSrc, gst_latent_src, GST, LATENT_SRC, GstPushSrc)

GST_ELEMENT_REGISTER_DECLARE(latentsrc);

G_END_DECLS
