#!/usr/bin/env python3
"""Golden fixtures for the TAEHV family (TAEW2.1, TAEW2.2), produced by madebyollin's taehv.py.

Each case is a randomly initialised TAEHV whose channel widths are narrowed (taehv.py hard-codes
64 / [256, 128, 64, 64]; the layers are wrapped to build 8 / [32, 16, 8, 8] so the committed
files stay small) but which is otherwise taehv.py's own model: its MemBlock, TPool, TGrow,
Clamp and conv factories, its Sequential indices, its encode_video / decode_video. Weights are
written as the published single files are (taew2_1.safetensors, taew2_2.safetensors:
encoder.N.* / decoder.N.*), and io.safetensors holds inputs and taehv.py's outputs in
diffusers' conventions ([N, C, T, H, W], frames in [-1, 1]).

  /work/venvs/ref/bin/python scripts/make_taehv_fixtures.py --taehv-py /path/to/taehv.py

Writes tests/fixtures/taew2_1_tiny/, tests/fixtures/taew2_2_tiny/ and
tests/fixtures/taehv_published_shapes.json (the tensor names and shapes of full-size
TAEW2.1 / TAEW2.2 as taehv.py builds them, with no weights: the loader test checks that the
published layout loads).

io.safetensors (float32):
  sample          [N, 3, 9, H, W] in [-1, 1]
  latent_mean     taehv.py encode_video((sample + 1) / 2), parallel mode, as [N, C, 3, h, w]
  latent_mean_t6  encode_video of sample's first 6 frames padded to 9 by repeating frame 5
                  (what the engine's stream does at the end of a 6-frame clip)
  latent          [N, C, 3, h, w] ~ N(0, 1)
  decoded         decode_video(latent) * 2 - 1, parallel mode, [N, 3, 9, H, W]
  *_bf16, *_fp16  the same outputs with weights and inputs in that dtype (the GPU tests'
                  measure of the reference's own rounding)
Weights and inputs are drawn on the CPU from fixed seeds; outputs in fp32 on the CPU. The
script also asserts that taehv.py's sequential mode equals its parallel mode.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import save_file  # noqa: E402  (sorted headers: byte-identical reruns)

SEEDS = {"taew2_1_tiny": 2101, "taew2_2_tiny": 2201}
FRAMES = 9  # 1 + 4k with k = 2: 3 latent frames
# taehv.py's widths -> the narrowed ones (all / 8; 512 is a MemBlock's cat[x, past] of 256)
WIDTHS = {64: 8, 128: 16, 256: 32, 512: 64}
CASES = {
    # case: (file name, patch size, latent channels, batch, (H, W)); non-square frames:
    # TAEW2.1 latents 2x4 (/8), TAEW2.2 latents 2x3 (/16, an odd width)
    "taew2_1_tiny": ("taew2_1.safetensors", 1, 16, 2, (16, 32)),
    "taew2_2_tiny": ("taew2_2.safetensors", 2, 48, 1, (32, 48)),
}


def load_taehv_module(path):
    spec = importlib.util.spec_from_file_location("taehv_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("TAEHV", "MemBlock", "TPool", "TGrow", "conv"):
        if not hasattr(mod, name):
            raise SystemExit(f"{path}: no {name}; is this madebyollin/taehv's taehv.py?")
    return mod


def narrowed_taehv(mod, patch_size, latent_channels):
    """taehv.py's TAEHV built with its widths mapped through WIDTHS: the module's conv factory
    (which MemBlock uses too) and the TPool / TGrow classes (subclasses, so taehv.py's
    isinstance checks still hold) are wrapped while TAEHV.__init__ runs; everything else is
    taehv.py's."""
    w = lambda n: WIDTHS.get(n, n)
    orig = {k: getattr(mod, k) for k in ("conv", "TPool", "TGrow")}

    class TPool(orig["TPool"]):
        def __init__(self, n_f, stride):
            super().__init__(w(n_f), stride)

    class TGrow(orig["TGrow"]):
        def __init__(self, n_f, stride):
            super().__init__(w(n_f), stride)

    def conv(n_in, n_out, **kwargs):
        return orig["conv"](w(n_in), w(n_out), **kwargs)

    mod.conv, mod.TPool, mod.TGrow = conv, TPool, TGrow
    try:
        model = mod.TAEHV(checkpoint_path=None, patch_size=patch_size,
                          latent_channels=latent_channels)
    finally:
        for k, v in orig.items():
            setattr(mod, k, v)
    return model.eval()


def full_taehv(mod, patch_size, latent_channels):
    return mod.TAEHV(checkpoint_path=None, patch_size=patch_size,
                     latent_channels=latent_channels).eval()


GAIN = float(os.environ.get("TAEHV_FIXTURE_GAIN", "1.0"))


def randomize(model, seed):
    """Weights from a fixed CPU generator, scaled (GAIN / sqrt(fan_in)) so that activations
    neither blow up through the MemBlocks' residual sums nor leave the decoded frames pinned to
    the output clamp; the last decoder bias centres the frames in taehv.py's [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 4:
                fan_in = p.shape[1] * p.shape[2] * p.shape[3]
                p.copy_(torch.randn(p.shape, generator=g) * GAIN / fan_in ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        last = model.decoder[-1].bias
        last.add_(0.5)




def sha256_file(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def git_commit(path):
    try:
        out = subprocess.run(["git", "-C", str(Path(path).resolve().parent), "rev-parse", "HEAD"],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def to_ntchw(x):  # diffusers [N, C, T, H, W] -> taehv.py [N, T, C, H, W]
    return x.permute(0, 2, 1, 3, 4).contiguous()


def to_ncthw(x):
    return x.permute(0, 2, 1, 3, 4).contiguous()


def encode(model, sample, parallel=True):
    """diffusers' convention: sample [N, 3, T, H, W] in [-1, 1] -> [N, C, t, h, w]."""
    return to_ncthw(model.encode_video(to_ntchw((sample + 1) / 2), parallel=parallel,
                                       show_progress_bar=False))


def decode(model, latent, parallel=True):
    return to_ncthw(model.decode_video(to_ntchw(latent), parallel=parallel,
                                       show_progress_bar=False)) * 2 - 1


def summarize(name, t):
    t = t.float()
    return (f"  {name} {list(t.shape)} mean {t.mean().item():+.4f} std {t.std().item():.4f} "
            f"min {t.min().item():+.4f} max {t.max().item():+.4f}")


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def generate(mod, case, out, meta_common):
    file_name, patch, channels, batch, (h, w) = CASES[case]
    seed = SEEDS[case]
    model = narrowed_taehv(mod, patch, channels)
    randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 500)
    f = 8 * patch
    sample = torch.rand((batch, 3, FRAMES, h, w), generator=g) * 2 - 1
    t_lat = (FRAMES - 1) // 4 + 1
    latent = torch.randn((batch, channels, t_lat, h // f, w // f), generator=g)

    with torch.no_grad():
        latent_mean = encode(model, sample)
        decoded = decode(model, latent)
        # taehv.py's sequential mode is the same computation.
        seq_mean = encode(model, sample, parallel=False)
        seq_dec = decode(model, latent, parallel=False)
        for name, a, b in (("encode", seq_mean, latent_mean), ("decode", seq_dec, decoded)):
            if rel_l2(a, b) > 1e-5:
                raise SystemExit(f"{case}: taehv.py sequential {name} differs from parallel "
                                 f"({rel_l2(a, b):.2e})")
        padded = torch.cat([sample[:, :, :6], sample[:, :, 5:6].expand(-1, -1, 3, -1, -1)], 2)
        latent_mean_t6 = encode(model, padded)
        tensors = {"sample": sample, "latent": latent, "latent_mean": latent_mean,
                   "latent_mean_t6": latent_mean_t6, "decoded": decoded}
        for dt, tag in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            m = narrowed_taehv(mod, patch, channels)
            m.load_state_dict(model.state_dict())
            m = m.to(dt)
            tensors[f"latent_mean_{tag}"] = encode(m, sample.to(dt)).float()
            tensors[f"decoded_{tag}"] = decode(m, latent.to(dt)).float()

    if latent_mean.shape[2] != t_lat or decoded.shape[2] != FRAMES:
        raise SystemExit(f"{case}: unexpected frame counts {list(latent_mean.shape)} "
                         f"{list(decoded.shape)}")
    folder = out / case
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.is_file():
            old.unlink()
    meta = dict(meta_common, case=case, seed=str(seed), patch_size=str(patch),
                latent_channels=str(channels), widths=json.dumps(WIDTHS))
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, folder / file_name, dict(meta, format="pt", layout="taehv.py state_dict"))
    io = {k: v.float().contiguous() for k, v in tensors.items()}
    save_file(io, folder / "io.safetensors",
              dict(meta, image_hw=f"{h}x{w}", frames=str(FRAMES), downsample=str(f),
                   convention="diffusers [N, C, T, H, W], frames in [-1, 1]"))
    print(case)
    for k in ("sample", "latent_mean", "latent_mean_t6", "latent", "decoded"):
        print(summarize(k, tensors[k]))
    for tag in ("bf16", "fp16"):
        print(f"  reference {tag} error: encode {rel_l2(tensors[f'latent_mean_{tag}'], latent_mean):.2e}"
              f" decode {rel_l2(tensors[f'decoded_{tag}'], decoded):.2e}")
    # How much the frames' history matters (a test where it did not would be weak).
    print(f"  latent_mean_t6 vs latent_mean: {rel_l2(latent_mean_t6, latent_mean):.3f}")
    # The fraction of decoded values the clamp pins to +-1 (a test of all-clamped output is weak).
    print(f"  decoded values at +-1: {(decoded.abs() >= 1).float().mean().item():.3f}")


def published_shapes(mod):
    shapes = {}
    for name, patch, channels in (("taew2_1", 1, 16), ("taew2_2", 2, 48)):
        m = full_taehv(mod, patch, channels)
        shapes[name] = {k: list(v.shape) for k, v in sorted(m.state_dict().items())}
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--taehv-py", required=True, help="madebyollin/taehv's taehv.py")
    ap.add_argument("--taehv-commit", default=None,
                    help="the commit taehv.py is from (default: git rev-parse in its folder)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    mod = load_taehv_module(args.taehv_py)
    meta_common = {
        "generator": "scripts/make_taehv_fixtures.py",
        "reference": "madebyollin/taehv taehv.py",
        "taehv_py_commit": args.taehv_commit or git_commit(args.taehv_py),
        "taehv_py_sha256": sha256_file(args.taehv_py),
        "torch_version": torch.__version__,
        "device": "cpu",
        "dtype_compute": "float32",
    }
    out = Path(args.out)
    for case in args.cases.split(","):
        if case not in CASES:
            raise SystemExit(f"unknown case {case!r} (known: {', '.join(CASES)})")
        generate(mod, case, out, meta_common)
    shapes = {"generator": "scripts/make_taehv_fixtures.py",
              "taehv_py_commit": meta_common["taehv_py_commit"],
              "taehv_py_sha256": meta_common["taehv_py_sha256"],
              "models": published_shapes(mod)}
    (out / "taehv_published_shapes.json").write_text(json.dumps(shapes, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
