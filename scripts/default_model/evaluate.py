#!/usr/bin/env python3
"""Round-trip quality of an AutoencoderTiny folder on held-out photographs, with diffusers on the
CPU: each photo is read with OpenCV, cut to its centred square and brought to 512x512 (INTER_AREA),
encoded, decoded, rounded to 8 bits; PSNR and SSIM (11x11 Gaussian, sigma 1.5) are computed as in
tests/model/test_default_model_quality.cpp.

  python3 scripts/default_model/evaluate.py [--model models/default]
      [--photos tests/fixtures/photos] [--markdown] [--json out.json]
"""

import argparse
import glob
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import load_rgb_512, psnr, ssim  # noqa: E402

from diffusers import AutoencoderTiny  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--photos", default="tests/fixtures/photos")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--save-decoded", help="folder for the decoded PNGs")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    model = AutoencoderTiny.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    files = sorted(f for ext in ("png", "jpg", "jpeg") for f in glob.glob(os.path.join(args.photos, "*." + ext)))
    if not files:
        sys.exit(f"evaluate: no photos in {args.photos}")
    rows = []
    for path in files:
        rgb = load_rgb_512(path, args.size)
        x = torch.from_numpy(rgb).permute(2, 0, 1)[None].float().div(127.5).sub(1)
        latents = model.encode(x).latents
        y = model.decode(latents).sample
        out = y.clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)[0].permute(1, 2, 0).numpy()
        name = os.path.basename(path)
        rows.append(dict(photo=name, psnr=psnr(rgb, out), ssim=ssim(rgb, out),
                         latent_shape=list(latents.shape)))
        if args.save_decoded:
            import cv2
            os.makedirs(args.save_decoded, exist_ok=True)
            cv2.imwrite(os.path.join(args.save_decoded, name.rsplit(".", 1)[0] + ".png"),
                        np.ascontiguousarray(out[:, :, ::-1]))
    mean_psnr = float(np.mean([r["psnr"] for r in rows]))
    mean_ssim = float(np.mean([r["ssim"] for r in rows]))
    if args.markdown:
        print("| photo | PSNR (dB) | SSIM |")
        print("| --- | ---: | ---: |")
        for r in rows:
            print(f"| {r['photo']} | {r['psnr']:.2f} | {r['ssim']:.4f} |")
        print(f"| **mean** | **{mean_psnr:.2f}** | **{mean_ssim:.4f}** |")
    else:
        for r in rows:
            print(f"{r['photo']:24s} PSNR {r['psnr']:6.2f} dB  SSIM {r['ssim']:.4f}  latents {r['latent_shape']}")
        print(f"{'mean':24s} PSNR {mean_psnr:6.2f} dB  SSIM {mean_ssim:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, size=args.size, photos=rows, mean_psnr=mean_psnr,
                           mean_ssim=mean_ssim), f, indent=1)


if __name__ == "__main__":
    main()
