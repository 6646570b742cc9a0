// latentsink: application/x-latent -> one latent file (safetensors) per stream.
#pragma once

#include <gst/base/gstbasesink.h>
#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_LATENT_SINK (gst_latent_sink_get_type())
G_DECLARE_FINAL_TYPE(GstLatentSink, gst_latent_sink, GST, LATENT_SINK, GstBaseSink)

GST_ELEMENT_REGISTER_DECLARE(latentsink);

G_END_DECLS
