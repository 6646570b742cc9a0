// The `latent` plugin: gathers the element registrations; each element registers itself
// beside its own code.
#include <gst/gst.h>

#include "elements/gstditdenoise.h"
#include "elements/gstlatentsink.h"
#include "elements/gstlatentsrc.h"
#include "elements/gstvaedecode.h"
#include "elements/gstvaeencode.h"

#ifndef PACKAGE
#define PACKAGE "gst-latent"
#endif
#ifndef GST_LATENT_ORIGIN
#define GST_LATENT_ORIGIN "Unknown package origin"
#endif

static gboolean plugin_init(GstPlugin* plugin) {
  gboolean ret = FALSE;
  ret |= GST_ELEMENT_REGISTER(vaeencode, plugin);
  ret |= GST_ELEMENT_REGISTER(vaedecode, plugin);
  ret |= GST_ELEMENT_REGISTER(ditdenoise, plugin);
  ret |= GST_ELEMENT_REGISTER(latentsink, plugin);
  ret |= GST_ELEMENT_REGISTER(latentsrc, plugin);
  return ret;
}

GST_PLUGIN_DEFINE(GST_VERSION_MAJOR, GST_VERSION_MINOR, latent,
                  "Diffusion-model stages: VAE encode/decode of video frames to latents, DiT denoising, latent files",
                  plugin_init, "0.1.0", "LGPL", "gst-latent", GST_LATENT_ORIGIN)
