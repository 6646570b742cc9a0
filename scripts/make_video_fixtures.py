#!/usr/bin/env python3
"""Golden fixtures for the video mode of the causal video VAEs (Wan 2.1 / Qwen-Image).

Same conventions as scripts/make_fixtures.py (whose helpers this script reuses): tiny random
configurations written in the layout a user downloads, an io.safetensors with inputs and
diffusers' outputs, fp32 with TF32 off, weights and inputs drawn on the CPU from fixed seeds.
See tests/fixtures/README.md ("Video cases").

  python3 scripts/make_video_fixtures.py --out tests/fixtures
  python3 scripts/make_video_fixtures.py --out tests/fixtures --check [--device cuda]

Each case stores (all [N, C, T, H, W], diffusers' order):
  sample        [1, 3, 9, 24, 40]   a clip in [-1, 1], T = 1 + 4*2
  latent_mean   [1, C, 3, 3, 5]     encode(sample).latent_dist.mean (raw)
  latent        [1, C, 3, 3, 5]     a random raw latent, N(0, 1)
  decoded       [1, 3, 9, 24, 40]   decode(latent).sample (clamped to [-1, 1] by diffusers)
  sample_odd    [1, 3, 7, 24, 40]   a clip whose T is not 1 + 4k
  latent_mean_odd [1, C, 3, 3, 5]   encode of sample_odd padded to 9 frames by repeating its
                                    last frame (what VaeStream::finish() promises)
  *_bf16                            the same reference runs in bf16 (weights and inputs cast)
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_fixtures as mf  # noqa: E402  (sets CUBLAS_WORKSPACE_CONFIG before torch is used)

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from diffusers import AutoencoderKLQwenImage, AutoencoderKLWan  # noqa: E402
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers  # noqa: E402

CLIP_FRAMES = 9  # 1 + 4 * 2: three latent frames
ODD_FRAMES = 7  # padded to 9 by repeating the last frame

CASES = [
    "wan_vae_video_tiny",
    "wan_vae_video_tiny_single",
    "qwen_image_vae_video_tiny",
    "wan22_vae_video_tiny",
    "wan22_vae_video_tiny_single",
]

# The Wan 2.2 cases: 16x spatial compression needs frames that are multiples of 16.
WAN22_HW = (32, 32)

# AutoencoderKLWan (Wan 2.1 layout): the real dim_mult / num_res_blocks / temperal_downsample,
# narrowed channels, and a decoder width differing from the encoder's (decoder_base_dim).
WAN_VIDEO_TINY_CONFIG = dict(
    base_dim=2,
    decoder_base_dim=3,
    z_dim=16,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    dropout=0.0,
    latents_mean=mf.QWEN_TINY_CONFIG["latents_mean"],
    latents_std=mf.QWEN_TINY_CONFIG["latents_std"],
    is_residual=False,
    in_channels=3,
    out_channels=3,
    patch_size=None,
    scale_factor_temporal=4,
    scale_factor_spatial=8,
)

# AutoencoderKLQwenImage: the Qwen-Image layout, temporal downsampling in the first levels
# ([true, true, false], the WanEncoder3d default order) so the resamplers sit elsewhere.
QWEN_VIDEO_TINY_CONFIG = dict(mf.QWEN_TINY_CONFIG, base_dim=3,
                              temperal_downsample=[True, True, False])

# AutoencoderKLWan (Wan 2.2 layout): is_residual, patch_size 2 (12 channels after the patchify),
# dim_mult / num_res_blocks / temperal_downsample as published, narrowed widths (decoder_base_dim
# differs, as 160 / 256 do) and z_dim 16 instead of 48 to keep the files small.
WAN22_VIDEO_TINY_CONFIG = dict(WAN_VIDEO_TINY_CONFIG, base_dim=3, decoder_base_dim=2, is_residual=True,
                               in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16)

SEEDS = {"wan_vae_video_tiny": 2001, "qwen_image_vae_video_tiny": 2002,
         "wan22_vae_video_tiny": 2003}


def build(cls, config, seed):
    torch.manual_seed(seed)
    model = cls(**config)
    mf.randomize_norms(model, mf.cpu_generator(seed + 1))
    return model.eval()


def pad_clip(x, frames):
    """Repeats the last frame of x [N, C, T, H, W] until T == frames."""
    if x.shape[2] >= frames:
        return x
    tail = x[:, :, -1:].expand(-1, -1, frames - x.shape[2], -1, -1)
    return torch.cat([x, tail], dim=2)


def run(model, sample, latent, sample_odd, device):
    model = model.to(device)
    with mf.reference_context():
        mean = model.encode(sample.to(device)).latent_dist.mean
        decoded = model.decode(latent.to(device)).sample
        mean_odd = model.encode(pad_clip(sample_odd, CLIP_FRAMES).to(device)).latent_dist.mean
    return mean.cpu(), decoded.cpu(), mean_odd.cpu()


def make_inputs(seed, z_dim, hw=mf.IMAGE_HW, down=8):
    g = mf.cpu_generator(seed + 500)
    h, w = hw
    sample = torch.rand((1, 3, CLIP_FRAMES, h, w), generator=g) * 2 - 1
    latent = torch.randn((1, z_dim, 1 + (CLIP_FRAMES - 1) // 4, h // down, w // down), generator=g)
    sample_odd = torch.rand((1, 3, ODD_FRAMES, h, w), generator=g) * 2 - 1
    return sample, latent, sample_odd


def wan_from_original(wan_sd, config):
    sd = convert_wan_vae_to_diffusers(dict(wan_sd))
    model = AutoencoderKLWan(**config)
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return model.eval(), sd


# The original Wan 2.2 key names (Wan-Video's vae2_2.py, Wan2.2_VAE.pth / ComfyUI's
# Wan2.2_VAE.safetensors). diffusers 0.42.1's convert_wan_vae_to_diffusers only knows the Wan 2.1
# names; the Wan 2.2 mapping is diffusers' scripts/convert_wan_to_diffusers.py convert_vae_22,
# whose rules wan22_to_diffusers() below restates to check the round trip.
RESNET_LEAVES = [("norm1.gamma", "residual.0.gamma"), ("conv1.", "residual.2."),
                 ("norm2.gamma", "residual.3.gamma"), ("conv2.", "residual.6."),
                 ("conv_shortcut.", "shortcut.")]
TOP_NAMES = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2.",
             "encoder.conv_in.": "encoder.conv1.", "decoder.conv_in.": "decoder.conv1.",
             "encoder.norm_out.": "encoder.head.0.", "decoder.norm_out.": "decoder.head.0.",
             "encoder.conv_out.": "encoder.head.2.", "decoder.conv_out.": "decoder.head.2."}


def _leaf(rest):
    for a, b in RESNET_LEAVES:
        if rest.startswith(a):
            return b + rest[len(a):]
    raise SystemExit(f"unexpected resnet leaf {rest}")


def diffusers_to_wan22(sd, nrb):
    out = {}
    for k, v in sd.items():
        p = k.split(".")
        new = None
        for a, b in TOP_NAMES.items():
            if k.startswith(a):
                new = b + k[len(a):]
        if new is None and p[1] == "mid_block":
            i = int(p[3])
            new = f"{p[0]}.middle.{2 * i + (1 if p[2] == 'attentions' else 0)}." + (
                ".".join(p[4:]) if p[2] == "attentions" else _leaf(".".join(p[4:])))
        if new is None and p[1] in ("down_blocks", "up_blocks"):
            seq = "downsamples" if p[1] == "down_blocks" else "upsamples"
            if p[3] == "resnets":
                new = f"{p[0]}.{seq}.{p[2]}.{seq}.{p[4]}." + _leaf(".".join(p[5:]))
            elif p[3] in ("downsampler", "upsampler"):
                j = nrb if p[3] == "downsampler" else nrb + 1
                new = f"{p[0]}.{seq}.{p[2]}.{seq}.{j}." + ".".join(p[4:])
        if new is None:
            raise SystemExit(f"no Wan 2.2 name for {k}")
        out[new] = v
    return out


def wan22_to_diffusers(sd):
    """convert_vae_22's rules (diffusers scripts/convert_wan_to_diffusers.py)."""
    out = {}
    inv_top = {b: a for a, b in TOP_NAMES.items()}
    for k, v in sd.items():
        new = None
        for a, b in inv_top.items():
            if k.startswith(a):
                new = b + k[len(a):]
        if new is None and ".middle." in k:
            p = k.split(".")
            i = int(p[2])
            if i % 2 == 1:
                new = f"{p[0]}.mid_block.attentions.{i // 2}." + ".".join(p[3:])
            else:
                rest = ".".join(p[3:])
                for a, b in RESNET_LEAVES:
                    if rest.startswith(b):
                        rest = a + rest[len(b):]
                new = f"{p[0]}.mid_block.resnets.{i // 2}.{rest}"
        if new is None:
            for part, blocks, seq, res in (("encoder", "down_blocks", "downsamples", "downsampler"),
                                           ("decoder", "up_blocks", "upsamples", "upsampler")):
                if not k.startswith(f"{part}.{seq}."):
                    continue
                n = k.replace(f"{part}.{seq}.", f"{part}.{blocks}.")
                if "residual" in n or "shortcut" in n:
                    n = n.replace(f".{seq}.", ".resnets.")
                    for a, b in RESNET_LEAVES:
                        n = n.replace("." + b, "." + a)
                else:
                    q = n.split(".")
                    n = ".".join(q[:3] + [res] + q[5:])
                new = n
        out[new] = v
    return out


def write_io(folder, case, args, tensors, extra):
    mf.save_io(folder, case, args, tensors, extra)
    print(f"  {case}: " + "; ".join(mf.summarize(n, tensors[n])
                                     for n in ("latent_mean", "decoded", "latent_mean_odd")))


def generate_wan22(args, out):
    case, single = "wan22_vae_video_tiny", "wan22_vae_video_tiny_single"
    if case not in args.cases and single not in args.cases:
        return
    cfg = WAN22_VIDEO_TINY_CONFIG
    h, w = WAN22_HW
    model = build(AutoencoderKLWan, cfg, SEEDS[case])
    sample, latent, sample_odd = make_inputs(SEEDS[case], cfg["z_dim"], WAN22_HW, 16)
    mean, decoded, mean_odd = run(model, sample, latent, sample_odd, args.device)
    tensors = {"sample": sample, "latent": latent, "sample_odd": sample_odd,
               "latent_mean": mean, "decoded": decoded, "latent_mean_odd": mean_odd}
    sd = mf.state_dict_fp32(model)
    meta = {"generator": "scripts/make_video_fixtures.py", "image_hw": f"{h}x{w}",
            "downsample": 16, "temporal_factor": 4, "frames": CLIP_FRAMES,
            "odd_frames": f"{ODD_FRAMES} (padded to {CLIP_FRAMES})",
            "architecture": "AutoencoderKLWan (Wan 2.2: is_residual, patch_size 2)"}
    if case in args.cases:
        d = mf.fresh_dir(out / case)
        mf.save_config(model, d)
        mf.save_weights(d / "diffusion_pytorch_model.safetensors", sd, case, args, "diffusers")
        write_io(d, case, args, tensors, meta)
    if single in args.cases:
        d = mf.fresh_dir(out / single)
        wan = diffusers_to_wan22(sd, cfg["num_res_blocks"])
        back = wan22_to_diffusers(wan)
        mf.assert_same_sd(back, sd, single)
        mf.save_weights(d / "vae_single.safetensors", wan, single, args,
                        "Wan 2.2 VAE single file")
        # Same weights and inputs as the folder case: its io.safetensors serves both (size).


def generate(args, out):
    generate_wan22(args, out)
    h, w = mf.IMAGE_HW
    common = {"generator": "scripts/make_video_fixtures.py", "image_hw": f"{h}x{w}", "downsample": 8, "temporal_factor": 4,
              "frames": CLIP_FRAMES, "odd_frames": f"{ODD_FRAMES} (padded to {CLIP_FRAMES})"}
    for case, cls, cfg in (("wan_vae_video_tiny", AutoencoderKLWan, WAN_VIDEO_TINY_CONFIG),
                           ("qwen_image_vae_video_tiny", AutoencoderKLQwenImage,
                            QWEN_VIDEO_TINY_CONFIG)):
        single = case + "_single"
        if case not in args.cases and single not in args.cases:
            continue
        seed = SEEDS[case]
        model = build(cls, cfg, seed)
        sample, latent, sample_odd = make_inputs(seed, cfg["z_dim"])
        mean, decoded, mean_odd = run(model, sample, latent, sample_odd, args.device)
        tensors = {"sample": sample, "latent": latent, "sample_odd": sample_odd,
                   "latent_mean": mean, "decoded": decoded, "latent_mean_odd": mean_odd}
        sd = mf.state_dict_fp32(model)
        meta = dict(common, architecture=cls.__name__)
        if case in args.cases:
            d = mf.fresh_dir(out / case)
            mf.save_config(model, d)
            mf.save_weights(d / "diffusion_pytorch_model.safetensors", sd, case, args, "diffusers")
            write_io(d, case, args, tensors, meta)
        if single in CASES and single in args.cases:
            d = mf.fresh_dir(out / single)
            wan = mf.qwen_to_wan(sd, cfg)
            _, back = wan_from_original(wan, cfg)
            mf.assert_same_sd(back, sd, single)
            mf.save_weights(d / "vae_single.safetensors", wan, single, args,
                            "Wan 2.1 VAE single file")
            write_io(d, single, args, tensors, dict(meta, weights=f"same as {case}"))


def load_reference(case, folder):
    if case == "wan_vae_video_tiny":
        return AutoencoderKLWan.from_pretrained(str(folder), torch_dtype=torch.float32,
                                                low_cpu_mem_usage=False).eval()
    if case == "qwen_image_vae_video_tiny":
        return AutoencoderKLQwenImage.from_pretrained(str(folder), torch_dtype=torch.float32,
                                                      low_cpu_mem_usage=False).eval()
    if case == "wan22_vae_video_tiny":
        return AutoencoderKLWan.from_pretrained(str(folder), torch_dtype=torch.float32,
                                                low_cpu_mem_usage=False).eval()
    if case == "wan22_vae_video_tiny_single":
        m = AutoencoderKLWan(**WAN22_VIDEO_TINY_CONFIG)
        sd = wan22_to_diffusers(load_file(str(folder / "vae_single.safetensors")))
        m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
        return m.eval()
    if case == "wan_vae_video_tiny_single":
        m, _ = wan_from_original(load_file(str(folder / "vae_single.safetensors")),
                                 WAN_VIDEO_TINY_CONFIG)
        return m
    raise SystemExit(f"unknown case {case}")


OUTPUTS = ("latent_mean", "decoded", "latent_mean_odd")
IO_OF = {"wan22_vae_video_tiny_single": "wan22_vae_video_tiny"}  # cases sharing an io file


def add_bf16_references(args, out):
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    for case in args.cases:
        if case == "wan22_vae_video_tiny_single":
            continue  # no io.safetensors of its own
        folder = out / case
        m = load_reference(case, folder).to(torch.bfloat16)
        io = mf.load_io(folder)
        got = run(m, io["sample"].bfloat16(), io["latent"].bfloat16(),
                  io["sample_odd"].bfloat16(), args.device)
        for name, t in zip(OUTPUTS, got):
            io[name + "_bf16"] = t.float().contiguous()
        mf.save_file(io, str(folder / "io.safetensors"), mf.io_metadata(folder))
        print(f"  {case}: reference bf16 rel L2 " +
              ", ".join(f"{n} {rel(io[n + '_bf16'], io[n]):.2e}" for n in OUTPUTS))


def check(args, out):
    failures = 0
    for case in args.cases:
        folder = out / case
        io = mf.load_io(out / IO_OF.get(case, case))
        got = run(load_reference(case, folder), io["sample"], io["latent"], io["sample_odd"],
                  args.device)
        notes = []
        for name, t in zip(OUTPUTS, got):
            ref = io[name]
            err = (t - ref).abs().max().item() if t.shape == ref.shape else float("inf")
            tol = args.tolerance * max(1.0, ref.abs().max().item())
            notes.append(f"{name} max|diff| {err:.3g} (tol {tol:.3g})" + ("" if err <= tol else " FAIL"))
            failures += 0 if err <= tol else 1
        print(f"  {case}: " + "; ".join(notes))
    print(f"{'all passed' if not failures else f'{failures} failed'}")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mf.add_fixture_args(ap, CASES)
    args = mf.parse_fixture_args(ap, CASES)
    mf.setup_determinism()
    out = Path(args.out)
    print(f"diffusers {mf.diffusers.__version__}, torch {torch.__version__}, device {args.device}")
    if args.check:
        sys.exit(1 if check(args, out) else 0)
    out.mkdir(parents=True, exist_ok=True)
    generate(args, out)
    add_bf16_references(args, out)


if __name__ == "__main__":
    main()
