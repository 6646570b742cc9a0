"""gst-latent from Python: latent files and the dataset precompute job.

Importable without GStreamer or a GPU; `gst_latent.pipeline` imports PyGObject when used.
"""

from gst_latent.latentfile import LatentFileError, read_header, read_latents, is_complete

__all__ = ["LatentFileError", "read_header", "read_latents", "is_complete"]
