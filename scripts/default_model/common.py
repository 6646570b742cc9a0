"""Shared pieces of the default autoencoder's scripts: the model's configuration, image I/O and
the round-trip metrics (PSNR, and SSIM computed exactly as the C++ quality test does it)."""

import json
import os

import numpy as np

LATENT_SPACE = "latent-default"


def model_config(latent_channels=16, channels=64):
    """diffusers AutoencoderTiny arguments: TAESD's layout (8x down/up, 64-wide blocks)."""
    return dict(
        in_channels=3,
        out_channels=3,
        encoder_block_out_channels=(channels,) * 4,
        decoder_block_out_channels=(channels,) * 4,
        act_fn="relu",
        upsample_fn="nearest",
        latent_channels=latent_channels,
        upsampling_scaling_factor=2,
        num_encoder_blocks=(1, 3, 3, 3),
        num_decoder_blocks=(3, 3, 3, 1),
        latent_magnitude=3,
        latent_shift=0.5,
        force_upcast=False,
        scaling_factor=1.0,
        shift_factor=0.0,
    )


def add_latent_space_key(folder):
    """Adds our engine's latent space name to config.json (diffusers ignores unknown keys)."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["latent_space"] = LATENT_SPACE
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def load_rgb_512(path, size=512):
    """uint8 [size, size, 3] RGB: the largest centred square, resized if it is not `size`.

    Mirrors the C++ test: cv2.imread (BGR) -> centre square crop -> INTER_AREA resize."""
    import cv2

    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise FileNotFoundError(path)
    h, w = bgr.shape[:2]
    s = min(h, w)
    y0, x0 = (h - s) // 2, (w - s) // 2
    bgr = bgr[y0:y0 + s, x0:x0 + s]
    if s != size:
        bgr = cv2.resize(bgr, (size, size), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(bgr[:, :, ::-1])


def psnr(a, b):
    """PSNR in dB of two uint8 images over all pixels and channels (peak 255)."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0 ** 2 / mse)


def ssim(a, b):
    """Mean SSIM (Wang et al. 2004): 11x11 Gaussian window, sigma 1.5, K1 0.01, K2 0.03,
    averaged over the three channels -- OpenCV's reference getMSSIM, as in the C++ test."""
    import cv2

    c1 = (0.01 * 255) ** 2
    c2 = (0.03 * 255) ** 2
    x = a.astype(np.float64)
    y = b.astype(np.float64)

    def blur(img):
        return cv2.GaussianBlur(img, (11, 11), 1.5)

    mu_x, mu_y = blur(x), blur(y)
    mu_x2, mu_y2, mu_xy = mu_x * mu_x, mu_y * mu_y, mu_x * mu_y
    s_x2 = blur(x * x) - mu_x2
    s_y2 = blur(y * y) - mu_y2
    s_xy = blur(x * y) - mu_xy
    m = ((2 * mu_xy + c1) * (2 * s_xy + c2)) / ((mu_x2 + mu_y2 + c1) * (s_x2 + s_y2 + c2))
    return float(np.mean(m.reshape(-1, m.shape[-1]).mean(axis=0)))
