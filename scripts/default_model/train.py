#!/usr/bin/env python3
"""Trains gst-latent's built-in default autoencoder: a diffusers AutoencoderTiny (TAESD layout,
8x spatial down-sampling, 16 latent channels) trained from scratch for round-trip fidelity on the
openly licensed photographs that prepare_data.py collects.

Everything runs on one device: the training images are decoded once and kept on the GPU as
uint8; every batch is cut from them there (random image, random scale with antialiased
resampling, random crop, the 8 flips/transposes, light brightness/contrast/saturation jitter).
Loss: L1 for the first 75% of the schedule, then MSE (what PSNR measures). AdamW, linear warm-up,
cosine decay over a fixed time budget (--minutes) or step count (--steps), bf16 autocast on CUDA.
The held-out photos in <data>/eval are only reported on (PSNR at 512x512), never trained on and
never used to pick a checkpoint: the weights written are those of the last step.

Writes <out>/config.json and <out>/diffusion_pytorch_model.safetensors (fp16) in the diffusers
layout, with "latent_space": "latent-default" and scaling_factor/shift_factor measured on training
crops (normalised = (raw - shift) * scale has zero mean, unit variance), plus <out>/train_log.json.

  python3 scripts/default_model/train.py --data .carry/default_data --out /tmp/model --minutes 7
"""

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_latent_space_key, model_config  # noqa: E402

from diffusers import AutoencoderTiny  # noqa: E402


def log(msg):
    print(f"[train {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class CropSampler:
    """Random augmented crops from uint8 images held on `device`."""

    def __init__(self, images, weights, crop, device, seed):
        self.images = images  # list of uint8 [3, H, W]
        p = np.asarray(weights, dtype=np.float64)
        self.p = p / p.sum()
        self.crop = crop
        self.device = device
        self.rng = np.random.default_rng(seed)

    def sample(self, batch):
        c = self.crop
        out = torch.empty(batch, 3, c, c, device=self.device)
        idx = self.rng.choice(len(self.images), size=batch, p=self.p)
        for i, k in enumerate(idx):
            img = self.images[k]
            h, w = img.shape[1:]
            # Scale s = output pixels per source pixel, log-uniform in [s_min, 1]: s < 1 shows
            # the content at a coarser scale (a down-sampled photo), as a 512x512 frame of a
            # larger photo would.
            s_min = max(c / min(h, w), 0.25)
            s = math.exp(self.rng.uniform(math.log(s_min), 0.0)) if s_min < 1 else 1.0
            src = min(min(h, w), max(c, round(c / s)))
            y = int(self.rng.integers(0, h - src + 1))
            x = int(self.rng.integers(0, w - src + 1))
            patch = img[:, y:y + src, x:x + src].float().div_(255.0).unsqueeze(0)
            if src != c:
                patch = F.interpolate(patch, size=(c, c), mode="bilinear", antialias=True,
                                      align_corners=False)
            out[i] = patch[0]
        # The 8 symmetries of the square.
        flips = self.rng.integers(0, 2, size=(3, batch))
        for i in range(batch):
            if flips[0, i]:
                out[i] = out[i].flip(-1)
            if flips[1, i]:
                out[i] = out[i].flip(-2)
            if flips[2, i]:
                out[i] = out[i].transpose(-1, -2).clone()
        # Colour jitter: brightness, contrast (around the crop mean), saturation (around grey).
        j = torch.from_numpy(self.rng.uniform(-1, 1, size=(batch, 3)).astype(np.float32)).to(self.device)
        bright = (1 + 0.10 * j[:, 0]).view(-1, 1, 1, 1)
        contrast = (1 + 0.10 * j[:, 1]).view(-1, 1, 1, 1)
        sat = (1 + 0.15 * j[:, 2]).view(-1, 1, 1, 1)
        out = out * bright
        mean = out.mean(dim=(1, 2, 3), keepdim=True)
        out = (out - mean) * contrast + mean
        grey = (0.299 * out[:, 0:1] + 0.587 * out[:, 1:2] + 0.114 * out[:, 2:3])
        out = (out - grey) * sat + grey
        # Quantise to 8 bits like real frames, then map to the model's [-1, 1].
        out = out.clamp_(0, 1).mul_(255).round_().div_(255)
        return out.mul_(2).sub_(1).contiguous(memory_format=torch.channels_last)


def load_data(data_dir, device, render_share):
    with open(os.path.join(data_dir, "manifest.json")) as f:
        manifest = json.load(f)
    images, weights, names = [], [], []
    train = [m for m in manifest if m["role"] == "train"]
    render = [m for m in manifest if m["role"] == "render"]
    for group, share in ((train, 1.0 - render_share), (render, render_share)):
        if not group or share <= 0:
            continue
        # Within a group, weight by sqrt(area): big photos give more distinct crops.
        areas = [math.sqrt(m["stored_size"][0] * m["stored_size"][1]) for m in group]
        total = sum(areas)
        for m, a in zip(group, areas):
            arr = np.asarray(Image.open(os.path.join(data_dir, m["stored"])).convert("RGB"))
            images.append(torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous().to(device))
            weights.append(share * a / total)
            names.append(m["id"])
    evals = []
    for m in manifest:
        if m["role"] == "test":
            arr = np.array(Image.open(os.path.join(data_dir, m["stored"])).convert("RGB"))
            evals.append((m["id"], arr))
    held_out = {m["id"] for m in manifest if m["role"] == "test"}
    if held_out & set(names):
        sys.exit(f"train: held-out photos in the training set: {sorted(held_out & set(names))}")
    return images, weights, names, evals, manifest


@torch.no_grad()
def evaluate(model, evals, device):
    """Round-trip PSNR (uint8, peak 255) of each held-out photo at 512x512, in fp32."""
    model.eval()
    res = {}
    for name, arr in evals:
        x = torch.from_numpy(arr).permute(2, 0, 1)[None].float().div(127.5).sub(1).to(device)
        y = model.decoder(model.encoder(x.contiguous(memory_format=torch.channels_last)))
        y8 = y.clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)[0].permute(1, 2, 0).cpu().numpy()
        mse = np.mean((y8.astype(np.float64) - arr.astype(np.float64)) ** 2)
        res[name] = 10 * math.log10(255.0 ** 2 / max(mse, 1e-12))
    model.train()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=".carry/default_data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=7.0, help="training time budget")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count instead of --minutes")
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--crop", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--mse-from", type=float, default=0.75, help="schedule fraction where L1 turns MSE")
    ap.add_argument("--latent-channels", type=int, default=16)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--render-share", type=float, default=0.2)
    ap.add_argument("--eval-every", type=float, default=45.0, help="seconds between held-out reports")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--save-fp32", action="store_true", help="also write <out>-fp32/")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log(f"device {torch.cuda.get_device_name(device)}, torch {torch.__version__}")

    t0 = time.time()
    images, weights, names, evals, manifest = load_data(args.data, device, args.render_share)
    mpix = sum(i.shape[1] * i.shape[2] for i in images) / 1e6
    log(f"{len(images)} training images ({mpix:.1f} Mpixel), {len(evals)} held-out, "
        f"loaded in {time.time() - t0:.1f}s")
    sampler = CropSampler(images, weights, args.crop, device, args.seed)

    model = AutoencoderTiny(**model_config(args.latent_channels, args.channels)).to(device)
    model = model.to(memory_format=torch.channels_last).train()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"AutoencoderTiny: {n_params / 1e6:.3f}M parameters, {args.latent_channels} latent channels")

    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim == 1 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 1e-4},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.99), eps=1e-8)

    budget = args.minutes * 60.0
    history = []
    step = 0
    seen = 0
    loss_avg = None
    t_start = time.time()
    t_eval = t_start
    while True:
        elapsed = time.time() - t_start
        frac = step / args.steps if args.steps else elapsed / budget
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x = sampler.sample(args.batch)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cuda):
            z = model.encoder(x)
            y = model.decoder(z)
        d = y.float() - x
        loss = d.abs().mean() if frac < args.mse_from else d.square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += args.batch
        if step % 50 == 0:
            lv = loss.item()
            loss_avg = lv if loss_avg is None else 0.9 * loss_avg + 0.1 * lv
            if not math.isfinite(lv):
                sys.exit(f"train: loss is {lv} at step {step}")
        now = time.time()
        if now - t_eval >= args.eval_every or step == 20:
            t_eval = now
            res = evaluate(model, evals, device)
            mean = sum(res.values()) / len(res)
            rate = seen / (now - t_start)
            history.append(dict(step=step, seconds=round(now - t_start, 1), lr=lr, loss=loss_avg,
                                heldout_psnr=res, heldout_psnr_mean=mean))
            log(f"step {step} t={now - t_start:.0f}s lr={lr:.2e} loss={loss_avg} {rate:.0f} img/s | "
                f"held-out PSNR mean {mean:.2f} dB: " + " ".join(f"{k}={v:.2f}" for k, v in res.items()))

    train_s = time.time() - t_start
    log(f"done: {step} steps, {seen} crops of {args.crop}px in {train_s:.0f}s")

    # Latent statistics on training crops -> scaling_factor / shift_factor.
    model.eval()
    with torch.no_grad():
        zs = torch.cat([model.encoder(sampler.sample(32)).float() for _ in range(8)])
    mean = zs.mean().item()
    std = zs.std().item()
    per_channel = dict(mean=zs.mean(dim=(0, 2, 3)).tolist(), std=zs.std(dim=(0, 2, 3)).tolist())
    log(f"latents: mean {mean:.4f} std {std:.4f} min {zs.min().item():.3f} max {zs.max().item():.3f}")
    model.register_to_config(scaling_factor=round(1.0 / std, 6), shift_factor=round(mean, 6))

    final_fp32 = evaluate(model, evals, device)
    if args.save_fp32:
        model.save_pretrained(args.out + "-fp32", safe_serialization=True)
        add_latent_space_key(args.out + "-fp32")
    model = model.to(torch.float16)
    model.save_pretrained(args.out, safe_serialization=True)
    add_latent_space_key(args.out)
    # Check what was written: reload the fp16 file and evaluate it in fp32.
    reloaded = AutoencoderTiny.from_pretrained(args.out).float().to(device)
    reloaded = reloaded.to(memory_format=torch.channels_last)
    final_fp16 = evaluate(reloaded, evals, device)
    for tag, res in (("fp32 weights", final_fp32), ("fp16 file", final_fp16)):
        log(f"final held-out PSNR ({tag}): mean {sum(res.values()) / len(res):.2f} dB: "
            + " ".join(f"{k}={v:.2f}" for k, v in res.items()))

    info = dict(
        args=vars(args), parameters=n_params, steps=step, crops_seen=seen, train_seconds=round(train_s, 1),
        device=torch.cuda.get_device_name(device) if cuda else "cpu", torch=torch.__version__,
        training_images=names, latent_mean=mean, latent_std=std, latent_per_channel=per_channel,
        history=history, final_heldout_psnr_fp32=final_fp32, final_heldout_psnr_fp16=final_fp16)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(info, f, indent=1)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
