#!/usr/bin/env python3
"""Golden fixtures for gst-latent's model tests, produced by the reference implementations.

Every case is a tiny, randomly initialised autoencoder of an architecture the engine supports,
written in the layout a user would download (diffusers folder or original single file), plus an
io.safetensors holding inputs and the reference outputs. The reference is diffusers (and, for
taef2, madebyollin's taesd.py, which diffusers does not implement) on PyTorch in fp32 with TF32
off and deterministic algorithms. See tests/fixtures/README.md for the cases and conventions.

  python3 scripts/make_fixtures.py --out tests/fixtures --taesd-py /path/to/taesd.py
  python3 scripts/make_fixtures.py --out tests/fixtures --taesd-py /path/to/taesd.py --check --device cuda

Weights and inputs are always drawn on the CPU from fixed seeds, so they do not depend on
--device; only the reference outputs are computed on it. --check loads the committed files
through the reference loaders (from_pretrained, diffusers' own single-file converters,
taesd.py's modules), re-runs them on the committed inputs and compares with the committed
outputs. Needs no network.
"""

import os

# Must be set before CUDA initialises for torch.use_deterministic_algorithms on cuBLAS.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import contextlib
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

import diffusers
from diffusers import AutoencoderKL, AutoencoderKLQwenImage, AutoencoderTiny
from diffusers.loaders.single_file_utils import (
    convert_ldm_vae_checkpoint,
    convert_wan_vae_to_diffusers,
)

# Input image size (H, W): non-square and small (the fixtures are committed); the latent is
# 3x5 at /8, odd-sized and non-square, so a transposed or cropped layout shows.
IMAGE_HW = (24, 40)

CASES = [
    "kl_tiny",
    "kl_tiny_single",
    "kl_tiny_bf16",
    "kl_flux_tiny",
    "kl_flux_tiny_single",
    "tiny_taesd",
    "tiny_taesd_single",
    "tiny_taef2",
    "qwen_image_vae_tiny",
    "qwen_image_vae_tiny_single",
]

# ---------------------------------------------------------------------------------------------
# Configurations (diffusers config.json keys)

KL_TINY_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    block_out_channels=[8, 8, 16, 16],  # SD's 4 levels (/8), narrowed
    layers_per_block=1,
    act_fn="silu",
    latent_channels=4,
    norm_num_groups=4,
    sample_size=64,
    scaling_factor=0.18215,
    force_upcast=True,
    use_quant_conv=True,
    use_post_quant_conv=True,
    mid_block_add_attention=True,
)

KL_FLUX_TINY_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=["DownEncoderBlock2D"] * 3,
    up_block_types=["UpDecoderBlock2D"] * 3,
    block_out_channels=[8, 8, 16],  # 3 levels: /4, so the loader must read it from the config
    layers_per_block=1,
    act_fn="silu",
    latent_channels=16,
    norm_num_groups=4,
    sample_size=64,
    scaling_factor=0.3611,
    shift_factor=0.1159,
    force_upcast=True,
    use_quant_conv=False,
    use_post_quant_conv=False,
    mid_block_add_attention=True,
)

TINY_TAESD_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    encoder_block_out_channels=[8, 8, 8, 8],  # TAESD's 64 channels, /8
    decoder_block_out_channels=[8, 8, 8, 8],
    act_fn="relu",
    upsample_fn="nearest",
    latent_channels=4,
    upsampling_scaling_factor=2,
    num_encoder_blocks=[1, 3, 3, 3],  # the published TAESD block counts, so the single-file
    num_decoder_blocks=[3, 3, 3, 1],  # layout has the real nn.Sequential indices
    latent_magnitude=3,
    latent_shift=0.5,
    force_upcast=False,
    scaling_factor=1.0,
    shift_factor=0.0,
)

# taef2 through taesd.py: its 64-channel width is narrowed to this.
TAEF2_WIDTH = 8
TAEF2_LATENT_CHANNELS = 32  # as the published taef2 (FLUX.2's 32 unpacked latent channels)

QWEN_TINY_CONFIG = dict(
    base_dim=2,  # Qwen-Image's 96, /48 (channels 2..8); dim_mult, num_res_blocks and
    z_dim=16,  # temperal_downsample are the real ones, so the Wan key layout is the real one
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    dropout=0.0,
    input_channels=3,
    latents_mean=[-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                  0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
    latents_std=[2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                 3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160],
)

SEEDS = {"kl_tiny": 1001, "kl_flux_tiny": 1002, "tiny_taesd": 1003, "tiny_taef2": 1004,
         "qwen_image_vae_tiny": 1005}


# ---------------------------------------------------------------------------------------------
# Determinism and small helpers

def setup_determinism():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True)


def reference_context():
    """fp32 math-only attention: the plainest, most exact reference."""
    ctx = contextlib.ExitStack()
    ctx.enter_context(torch.no_grad())
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx.enter_context(sdpa_kernel(SDPBackend.MATH))
    except ImportError:  # older torch
        pass
    return ctx


def cpu_generator(seed):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def randomize_norms(model, gen, spread=0.2):
    """Moves norm scales/offsets off 1/0 so a loader that drops them fails the comparison."""
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.GroupNorm, torch.nn.LayerNorm)) and module.weight is not None:
            with torch.no_grad():
                module.weight.copy_(1 + spread * torch.randn(module.weight.shape, generator=gen))
                module.bias.copy_(spread * torch.randn(module.bias.shape, generator=gen))
        gamma = getattr(module, "gamma", None)  # Qwen / Wan RMS_norm
        if isinstance(gamma, torch.nn.Parameter):
            with torch.no_grad():
                gamma.copy_(1 + spread * torch.randn(gamma.shape, generator=gen))


def scale_module(module, factor):
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(factor)


def state_dict_fp32(model):
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}


def round_to(sd, dtype):
    return {k: v.to(dtype).to(torch.float32) for k, v in sd.items()}


def cast(sd, dtype):
    return {k: v.to(dtype).contiguous() for k, v in sd.items()}


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                      torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def same_bits(a, b):
    """Equal values bit for bit (torch.equal has no float8 kernels; NaN bytes compare too)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def save_file(tensors, path, metadata):
    """safetensors.torch.save_file with a sorted header, so that regenerating unchanged
    fixtures gives byte-identical files (the Rust writer orders __metadata__ at random)."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned, as the Rust writer does
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)  # a new inode: tensors still mapped from the old file stay valid
    back = load_file(str(path))  # the reference reader must agree with what was meant
    for name, t in tensors.items():
        if not same_bits(back[name], t.detach().to("cpu")):
            raise SystemExit(f"{path}: {name} does not read back")


def sha256_file(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def base_metadata(args, case, extra=None):
    meta = {
        "case": case,
        "generator": "scripts/make_fixtures.py",
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
        "device": str(args.device),
        "dtype_compute": "float32",
        "tf32": "off",
    }
    if extra:
        meta.update({k: str(v) for k, v in extra.items()})
    return meta


def save_weights(path, sd, case, args, layout):
    meta = {"format": "pt"}
    meta.update(base_metadata(args, case, {"layout": layout}))
    save_file(sd, str(path), metadata=meta)


def save_config(model, folder):
    model.save_config(str(folder))


def save_io(folder, case, args, tensors, extra):
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(folder / "io.safetensors"), metadata=base_metadata(args, case, extra))


def load_io(folder):
    return load_file(str(folder / "io.safetensors"))


def io_metadata(folder):
    with safe_open(str(folder / "io.safetensors"), framework="pt") as f:
        return f.metadata() or {}


def make_inputs(seed, latent_shape, latent_std=1.0):
    g = cpu_generator(seed + 500)
    h, w = IMAGE_HW
    sample = torch.rand((1, 3, h, w), generator=g) * 2 - 1
    latent = torch.randn(latent_shape, generator=g) * latent_std
    return sample, latent


def fresh_dir(path):
    path.mkdir(parents=True, exist_ok=True)
    for f in path.iterdir():
        if f.is_file():
            f.unlink()
    return path


def summarize(name, t):
    t = t.float()
    return f"{name} {list(t.shape)} mean {t.mean().item():+.4f} std {t.std().item():.4f} " \
           f"min {t.min().item():+.4f} max {t.max().item():+.4f}"


# ---------------------------------------------------------------------------------------------
# AutoencoderKL

def kl_build(config, seed):
    torch.manual_seed(seed)
    model = AutoencoderKL(**config)
    randomize_norms(model, cpu_generator(seed + 1))
    model.eval()
    return model


def kl_run(model, sample, latent, device):
    model = model.to(device)
    with reference_context():
        mean = model.encode(sample.to(device)).latent_dist.mean
        decoded = model.decode(latent.to(device)).sample
    return mean.cpu(), decoded.cpu()


def kl_to_ldm(sd, config):
    """diffusers AutoencoderKL names -> original LDM / SGM first-stage names (no prefix), the
    inverse of diffusers' convert_ldm_vae_checkpoint."""
    n_up = len(config["up_block_types"])
    out = {}
    attn_names = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    for key, value in sd.items():
        k = key
        m = re.match(r"(encoder|decoder)\.conv_norm_out\.(.*)", k)
        if m:
            k = f"{m[1]}.norm_out.{m[2]}"
        m = re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k)
        if m:
            k = f"encoder.down.{m[1]}.block.{m[2]}.{m[3]}"
        m = re.match(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", k)
        if m:
            k = f"encoder.down.{m[1]}.downsample.conv.{m[2]}"
        m = re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", k)
        if m:
            k = f"decoder.up.{n_up - 1 - int(m[1])}.block.{m[2]}.{m[3]}"
        m = re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.*)", k)
        if m:
            k = f"decoder.up.{n_up - 1 - int(m[1])}.upsample.conv.{m[2]}"
        m = re.match(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.*)", k)
        if m:
            k = f"{m[1]}.mid.block_{int(m[2]) + 1}.{m[3]}"
        m = re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(group_norm|to_q|to_k|to_v|to_out\.0)\.(.*)", k)
        if m:
            k = f"{m[1]}.mid.attn_1.{attn_names[m[2]]}.{m[3]}"
            if m[3] == "weight" and m[2] != "group_norm":
                value = value[:, :, None, None]  # LDM attention projections are 1x1 convs
        k = k.replace("conv_shortcut", "nin_shortcut")
        out[k] = value.contiguous()
    return out


def kl_from_ldm(ldm_sd, config):
    """What diffusers' own single-file path does: convert_ldm_vae_checkpoint into the model."""
    conv_config = dict(config)
    sd = convert_ldm_vae_checkpoint(dict(ldm_sd), conv_config)
    model = AutoencoderKL(**config)
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return model.eval(), sd


# ---------------------------------------------------------------------------------------------
# AutoencoderKLQwenImage

def qwen_build(config, seed):
    torch.manual_seed(seed)
    model = AutoencoderKLQwenImage(**config)
    randomize_norms(model, cpu_generator(seed + 1))
    model.eval()
    return model


def qwen_run(model, sample, latent, device):
    model = model.to(device)
    with reference_context():
        mean = model.encode(sample.to(device).unsqueeze(2)).latent_dist.mean  # [1, C, 1, h, w]
        decoded = model.decode(latent.to(device).unsqueeze(2)).sample  # [1, 3, 1, H, W]
    return mean.squeeze(2).cpu(), decoded.squeeze(2).cpu()


def qwen_to_wan(sd, config):
    """diffusers AutoencoderKLQwenImage names -> original Wan 2.1 VAE names, the inverse of
    diffusers' convert_wan_vae_to_diffusers (which assumes num_res_blocks == 2)."""
    per_up = config["num_res_blocks"] + 2  # resnets + one resample slot in Wan's flat list
    resnet_names = {"norm1.gamma": "residual.0.gamma", "conv1.weight": "residual.2.weight",
                    "conv1.bias": "residual.2.bias", "norm2.gamma": "residual.3.gamma",
                    "conv2.weight": "residual.6.weight", "conv2.bias": "residual.6.bias",
                    "conv_shortcut.weight": "shortcut.weight", "conv_shortcut.bias": "shortcut.bias"}
    mid_index = {"resnets.0": "0", "attentions.0": "1", "resnets.1": "2"}
    out = {}
    for key, value in sd.items():
        k = None
        if key == "quant_conv.weight" or key == "quant_conv.bias":
            k = key.replace("quant_conv", "conv1")
        elif key.startswith("post_quant_conv."):
            k = key.replace("post_quant_conv", "conv2")
        elif re.match(r"(encoder|decoder)\.conv_in\.", key):
            k = key.replace("conv_in", "conv1")
        elif re.match(r"(encoder|decoder)\.norm_out\.gamma", key):
            k = key.replace("norm_out.gamma", "head.0.gamma")
        elif re.match(r"(encoder|decoder)\.conv_out\.", key):
            k = key.replace("conv_out", "head.2")
        elif m := re.match(r"(encoder|decoder)\.mid_block\.(resnets\.\d|attentions\.0)\.(.*)", key):
            rest = resnet_names.get(m[3], m[3]) if m[2].startswith("resnets") else m[3]
            k = f"{m[1]}.middle.{mid_index[m[2]]}.{rest}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.(.*)", key):
            k = f"encoder.downsamples.{m[1]}.{resnet_names.get(m[2], m[2])}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
            k = f"decoder.upsamples.{int(m[1]) * per_up + int(m[2])}.{resnet_names[m[3]]}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", key):
            k = f"decoder.upsamples.{int(m[1]) * per_up + per_up - 1}.{m[2]}"
        if k is None:
            raise SystemExit(f"qwen_to_wan: no Wan name for {key}")
        out[k] = value.contiguous()
    return out


def qwen_from_wan(wan_sd, config):
    sd = convert_wan_vae_to_diffusers(dict(wan_sd))
    model = AutoencoderKLQwenImage(**config)
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return model.eval(), sd


# ---------------------------------------------------------------------------------------------
# AutoencoderTiny (TAESD) and taesd.py (taef2)

def tiny_build(config, seed):
    torch.manual_seed(seed)
    model = AutoencoderTiny(**config)
    model.eval()
    return model


def tiny_run(model, sample, latent, device):
    model = model.to(device)
    with reference_context():
        latents = model.encode(sample.to(device)).latents
        decoded = model.decode(latent.to(device)).sample
    return latents.cpu(), decoded.cpu()


def tiny_to_published(sd):
    """diffusers AutoencoderTiny names -> the published taesd_encoder / taesd_decoder files:
    bare nn.Sequential indices; the decoder's are shifted by one for taesd.py's leading Clamp.
    (madebyollin's convert_diffusers_sd_to_taesd does the same.)"""
    enc, dec = {}, {}
    for key, value in sd.items():
        m = re.match(r"(encoder|decoder)\.layers\.(\d+)\.(.*)", key)
        if not m:
            raise SystemExit(f"tiny_to_published: unexpected key {key}")
        if m[1] == "encoder":
            enc[f"{m[2]}.{m[3]}"] = value.contiguous()
        else:
            dec[f"{int(m[2]) + 1}.{m[3]}"] = value.contiguous()
    return enc, dec


def published_to_tiny(enc, dec):
    sd = {}
    for key, value in enc.items():
        sd[f"encoder.layers.{key}"] = value
    for key, value in dec.items():
        idx, rest = key.split(".", 1)
        sd[f"decoder.layers.{int(idx) - 1}.{rest}"] = value
    return sd


def load_taesd_module(path):
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("taesd_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if "use_midblock_gn" not in Path(path).read_text():
        raise SystemExit(f"{path}: this taesd.py predates taef2 (no use_midblock_gn); "
                         "use madebyollin/taesd at or after commit 5cccb12")
    return mod


@contextlib.contextmanager
def narrowed(mod, width):
    """Builds taesd.py's own Encoder/Decoder with its 64-channel width narrowed to `width`
    by wrapping the module's conv() and Block factories; everything else is taesd.py's."""
    orig_conv, orig_block = mod.conv, mod.Block

    def w(n):
        return width if n == 64 else n

    def conv(n_in, n_out, **kwargs):
        return orig_conv(w(n_in), w(n_out), **kwargs)

    def block(n_in, n_out, **kwargs):
        return orig_block(w(n_in), w(n_out), **kwargs)

    mod.conv, mod.Block = conv, block
    try:
        yield
    finally:
        mod.conv, mod.Block = orig_conv, orig_block


def taesd_py_modules(mod, latent_channels, midblock_gn, width):
    with narrowed(mod, width):
        enc = mod.Encoder(latent_channels, use_midblock_gn=midblock_gn)
        dec = mod.Decoder(latent_channels, use_midblock_gn=midblock_gn)
    return enc.eval(), dec.eval()


def taesd_py_run(enc, dec, sample, latent, device):
    enc, dec = enc.to(device), dec.to(device)
    with reference_context():
        # diffusers' AutoencoderTiny conventions: images in [-1, 1] on both sides.
        latents = enc(sample.to(device).add(1).div(2))
        decoded = dec(latent.to(device)).mul(2).sub(1)
    return latents.cpu(), decoded.cpu()


def published_to_hf_combined(enc, dec):
    """taef2 published files -> the combined taef2.safetensors of the Hugging Face repo
    (encoder.layers.N / decoder.layers.N-1: AutoencoderTiny-style names, no config.json)."""
    return published_to_tiny(enc, dec)


# ---------------------------------------------------------------------------------------------
# Generation

def write_case_io(folder, case, args, sample, latent, latent_mean, decoded, extra):
    save_io(folder, case, args,
            {"sample": sample, "latent_mean": latent_mean, "latent": latent, "decoded": decoded},
            extra)
    print(f"  {case}: " + "; ".join(summarize(n, t) for n, t in
                                     [("latent_mean", latent_mean), ("decoded", decoded)]))


def assert_same_sd(a, b, what):
    if set(a) != set(b):
        raise SystemExit(f"{what}: key sets differ: only in ours {sorted(set(a) - set(b))[:5]}, "
                         f"only in reference {sorted(set(b) - set(a))[:5]}")
    for k in a:
        if a[k].shape != b[k].shape or not torch.equal(a[k].float(), b[k].float()):
            raise SystemExit(f"{what}: tensor {k} differs after the reference conversion")


def generate_kl(args, out):
    # kl_tiny and its single-file / reduced-precision variants share weights and inputs.
    seed = SEEDS["kl_tiny"]
    cfg = KL_TINY_CONFIG
    model = kl_build(cfg, seed)
    f = 2 ** (len(cfg["block_out_channels"]) - 1)
    h, w = IMAGE_HW
    sample, latent = make_inputs(seed, (1, cfg["latent_channels"], h // f, w // f))
    sd = state_dict_fp32(model)
    mean, decoded = kl_run(model, sample, latent, args.device)
    common = {"architecture": "AutoencoderKL", "image_hw": f"{h}x{w}", "downsample": f}

    if "kl_tiny" in args.cases:
        d = fresh_dir(out / "kl_tiny")
        save_config(model, d)
        save_weights(d / "diffusion_pytorch_model.safetensors", sd, "kl_tiny", args, "diffusers")
        write_case_io(d, "kl_tiny", args, sample, latent, mean, decoded, common)

    if "kl_tiny_single" in args.cases:
        d = fresh_dir(out / "kl_tiny_single")
        ldm = kl_to_ldm(sd, cfg)
        _, back = kl_from_ldm(ldm, cfg)  # the inversion must round-trip through diffusers
        assert_same_sd(back, sd, "kl_tiny_single")
        save_weights(d / "vae_single.safetensors", ldm, "kl_tiny_single", args, "ldm single file")
        write_case_io(d, "kl_tiny_single", args, sample, latent, mean, decoded,
                      dict(common, weights="same as kl_tiny"))

    if "kl_tiny_bf16" in args.cases:
        # Stored as bf16; the reference runs in fp32 on the bf16-rounded weights, as a loader
        # that upcasts at load time would.
        d = fresh_dir(out / "kl_tiny_bf16")
        rounded = AutoencoderKL(**cfg).eval()
        rounded.load_state_dict(round_to(sd, torch.bfloat16), strict=True)
        m2, dec2 = kl_run(rounded, sample, latent, args.device)
        save_config(rounded, d)
        save_weights(d / "diffusion_pytorch_model.safetensors", cast(sd, torch.bfloat16),
                     "kl_tiny_bf16", args, "diffusers, weights stored as bfloat16")
        write_case_io(d, "kl_tiny_bf16", args, sample, latent, m2, dec2,
                      dict(common, weights="kl_tiny rounded to bfloat16, computed in float32"))

    seed = SEEDS["kl_flux_tiny"]
    cfg = KL_FLUX_TINY_CONFIG
    model = kl_build(cfg, seed)
    f = 2 ** (len(cfg["block_out_channels"]) - 1)
    sample, latent = make_inputs(seed, (1, cfg["latent_channels"], h // f, w // f))
    sd = state_dict_fp32(model)
    mean, decoded = kl_run(model, sample, latent, args.device)
    common = {"architecture": "AutoencoderKL", "image_hw": f"{h}x{w}", "downsample": f}
    if "kl_flux_tiny" in args.cases:
        d = fresh_dir(out / "kl_flux_tiny")
        save_config(model, d)
        save_weights(d / "diffusion_pytorch_model.safetensors", sd, "kl_flux_tiny", args, "diffusers")
        write_case_io(d, "kl_flux_tiny", args, sample, latent, mean, decoded, common)
    if "kl_flux_tiny_single" in args.cases:
        d = fresh_dir(out / "kl_flux_tiny_single")
        ldm = kl_to_ldm(sd, cfg)
        _, back = kl_from_ldm(ldm, cfg)
        assert_same_sd(back, sd, "kl_flux_tiny_single")
        save_weights(d / "vae_single.safetensors", ldm, "kl_flux_tiny_single", args,
                     "ldm single file (FLUX ae.safetensors style, no quant convs)")
        write_case_io(d, "kl_flux_tiny_single", args, sample, latent, mean, decoded,
                      dict(common, weights="same as kl_flux_tiny"))


def generate_tiny(args, out, taesd_mod):
    seed = SEEDS["tiny_taesd"]
    cfg = TINY_TAESD_CONFIG
    model = tiny_build(cfg, seed)
    # Default init shrinks activations through 20+ ReLU convs; a gain keeps outputs O(1).
    scale_module(model.encoder.layers[-1], 4.0)
    scale_module(model.decoder.layers[-1], 4.0)
    h, w = IMAGE_HW
    # Latents with std 2 reach the curved part of the decoder's tanh(x/3)*3 clamp.
    sample, latent = make_inputs(seed, (1, cfg["latent_channels"], h // 8, w // 8), latent_std=2.0)
    sd = state_dict_fp32(model)
    latents, decoded = tiny_run(model, sample, latent, args.device)
    common = {"architecture": "AutoencoderTiny", "image_hw": f"{h}x{w}", "downsample": 8}

    if "tiny_taesd" in args.cases:
        d = fresh_dir(out / "tiny_taesd")
        save_config(model, d)
        save_weights(d / "diffusion_pytorch_model.safetensors", sd, "tiny_taesd", args, "diffusers")
        write_case_io(d, "tiny_taesd", args, sample, latent, latents, decoded, common)

    if "tiny_taesd_single" in args.cases:
        d = fresh_dir(out / "tiny_taesd_single")
        enc, dec = tiny_to_published(sd)
        assert_same_sd(published_to_tiny(enc, dec), sd, "tiny_taesd_single")
        extra = dict(common, weights="same as tiny_taesd")
        if taesd_mod is not None:
            # Cross-check with madebyollin's own modules: the published files must load
            # strictly into taesd.py's Encoder/Decoder and give diffusers' outputs.
            te, td = taesd_py_modules(taesd_mod, cfg["latent_channels"], False, cfg["encoder_block_out_channels"][0])
            te.load_state_dict(enc, strict=True)
            td.load_state_dict(dec, strict=True)
            l2, d2 = taesd_py_run(te, td, sample, latent, args.device)
            err = max((l2 - latents).abs().max().item(), (d2 - decoded).abs().max().item())
            if err > 1e-5:
                raise SystemExit(f"tiny_taesd_single: taesd.py and diffusers disagree by {err}")
            extra["taesd_py_crosscheck_max_abs"] = f"{err:.3g}"
        save_weights(d / "taesd_encoder.safetensors", enc, "tiny_taesd_single", args, "taesd published encoder")
        save_weights(d / "taesd_decoder.safetensors", dec, "tiny_taesd_single", args, "taesd published decoder")
        write_case_io(d, "tiny_taesd_single", args, sample, latent, latents, decoded, extra)

    if "tiny_taef2" in args.cases:
        if taesd_mod is None:
            print("  tiny_taef2: SKIPPED (needs --taesd-py: diffusers has no taef2 architecture)")
            return
        seed = SEEDS["tiny_taef2"]
        torch.manual_seed(seed)
        enc_m, dec_m = taesd_py_modules(taesd_mod, TAEF2_LATENT_CHANNELS, True, TAEF2_WIDTH)
        randomize_norms(enc_m, cpu_generator(seed + 1))
        randomize_norms(dec_m, cpu_generator(seed + 2))
        scale_module(enc_m[-1], 4.0)
        scale_module(dec_m[-1], 4.0)
        sample, latent = make_inputs(seed, (1, TAEF2_LATENT_CHANNELS, h // 8, w // 8), latent_std=2.0)
        latents, decoded = taesd_py_run(enc_m, dec_m, sample, latent, args.device)
        enc, dec = state_dict_fp32(enc_m), state_dict_fp32(dec_m)
        d = fresh_dir(out / "tiny_taef2")
        save_weights(d / "taef2_encoder.safetensors", enc, "tiny_taef2", args, "taef2 published encoder")
        save_weights(d / "taef2_decoder.safetensors", dec, "tiny_taef2", args, "taef2 published decoder")
        save_weights(d / "taef2.safetensors", published_to_hf_combined(enc, dec), "tiny_taef2", args,
                     "taef2 combined (encoder.layers.N / decoder.layers.N-1)")
        write_case_io(d, "tiny_taef2", args, sample, latent, latents, decoded,
                      {"architecture": "taesd.py Encoder/Decoder, use_midblock_gn=True (taef2)",
                       "image_hw": f"{h}x{w}", "downsample": 8, "width": TAEF2_WIDTH,
                       "taesd_py_sha256": sha256_file(args.taesd_py)})


def generate_qwen(args, out):
    seed = SEEDS["qwen_image_vae_tiny"]
    cfg = QWEN_TINY_CONFIG
    model = qwen_build(cfg, seed)
    f = 2 ** len(cfg["temperal_downsample"])
    h, w = IMAGE_HW
    sample, latent = make_inputs(seed, (1, cfg["z_dim"], h // f, w // f))
    sd = state_dict_fp32(model)
    mean, decoded = qwen_run(model, sample, latent, args.device)
    common = {"architecture": "AutoencoderKLQwenImage", "image_hw": f"{h}x{w}", "downsample": f,
              "frames": 1, "squeezed": "5-D [N,C,1,H,W] stored as 4-D [N,C,H,W]"}
    if "qwen_image_vae_tiny" in args.cases:
        d = fresh_dir(out / "qwen_image_vae_tiny")
        save_config(model, d)
        save_weights(d / "diffusion_pytorch_model.safetensors", sd, "qwen_image_vae_tiny", args, "diffusers")
        write_case_io(d, "qwen_image_vae_tiny", args, sample, latent, mean, decoded, common)
    if "qwen_image_vae_tiny_single" in args.cases:
        d = fresh_dir(out / "qwen_image_vae_tiny_single")
        wan = qwen_to_wan(sd, cfg)
        _, back = qwen_from_wan(wan, cfg)
        assert_same_sd(back, sd, "qwen_image_vae_tiny_single")
        save_weights(d / "vae_single.safetensors", wan, "qwen_image_vae_tiny_single", args,
                     "Wan 2.1 VAE single file")
        write_case_io(d, "qwen_image_vae_tiny_single", args, sample, latent, mean, decoded,
                      dict(common, weights="same as qwen_image_vae_tiny"))


# ---------------------------------------------------------------------------------------------
# --check: reload the committed files through the reference loaders and compare

def load_reference(case, folder, taesd_mod, dtype=torch.float32):
    """Returns run(sample, latent, device) -> (latent_mean, decoded), or None to skip.
    With dtype=torch.bfloat16 the reference runs in bf16 (weights and inputs cast), outputs fp32."""
    def bound(models, runner):
        for mm in models:
            mm.to(dtype)
        return lambda s, l, dev: tuple(t.float() for t in runner(s.to(dtype), l.to(dtype), dev))

    if case in ("kl_tiny", "kl_tiny_bf16", "kl_flux_tiny"):
        m = AutoencoderKL.from_pretrained(str(folder), torch_dtype=torch.float32, low_cpu_mem_usage=False).eval()
        return bound([m], lambda s, l, dev: kl_run(m, s, l, dev))
    if case in ("kl_tiny_single", "kl_flux_tiny_single"):
        cfg = KL_TINY_CONFIG if case == "kl_tiny_single" else KL_FLUX_TINY_CONFIG
        m, _ = kl_from_ldm(load_file(str(folder / "vae_single.safetensors")), cfg)
        return bound([m], lambda s, l, dev: kl_run(m, s, l, dev))
    if case == "qwen_image_vae_tiny":
        m = AutoencoderKLQwenImage.from_pretrained(str(folder), torch_dtype=torch.float32, low_cpu_mem_usage=False).eval()
        return bound([m], lambda s, l, dev: qwen_run(m, s, l, dev))
    if case == "qwen_image_vae_tiny_single":
        m, _ = qwen_from_wan(load_file(str(folder / "vae_single.safetensors")), QWEN_TINY_CONFIG)
        return bound([m], lambda s, l, dev: qwen_run(m, s, l, dev))
    if case == "tiny_taesd":
        m = AutoencoderTiny.from_pretrained(str(folder), torch_dtype=torch.float32, low_cpu_mem_usage=False).eval()
        return bound([m], lambda s, l, dev: tiny_run(m, s, l, dev))
    if case == "tiny_taesd_single":
        enc = load_file(str(folder / "taesd_encoder.safetensors"))
        dec = load_file(str(folder / "taesd_decoder.safetensors"))
        if taesd_mod is not None:
            te, td = taesd_py_modules(taesd_mod, TINY_TAESD_CONFIG["latent_channels"], False,
                                      TINY_TAESD_CONFIG["encoder_block_out_channels"][0])
            te.load_state_dict(enc, strict=True)
            td.load_state_dict(dec, strict=True)
            return bound([te, td], lambda s, l, dev: taesd_py_run(te, td, s, l, dev))
        m = AutoencoderTiny(**TINY_TAESD_CONFIG).eval()
        m.load_state_dict(published_to_tiny(enc, dec), strict=True)
        return bound([m], lambda s, l, dev: tiny_run(m, s, l, dev))
    if case == "tiny_taef2":
        if taesd_mod is None:
            return None
        te, td = taesd_py_modules(taesd_mod, TAEF2_LATENT_CHANNELS, True, TAEF2_WIDTH)
        te.load_state_dict(load_file(str(folder / "taef2_encoder.safetensors")), strict=True)
        td.load_state_dict(load_file(str(folder / "taef2_decoder.safetensors")), strict=True)
        combined = load_file(str(folder / "taef2.safetensors"))
        assert_same_sd(combined, published_to_hf_combined(te.state_dict(), td.state_dict()),
                       "tiny_taef2 taef2.safetensors")
        return bound([te, td], lambda s, l, dev: taesd_py_run(te, td, s, l, dev))
    raise SystemExit(f"unknown case {case}")


def add_bf16_references(args, out, taesd_mod):
    """Adds `latent_mean_bf16` / `decoded_bf16` to each io.safetensors: the same reference run in
    bf16. Tests of reduced-precision backends compare their error with the reference's own."""
    for case in args.cases:
        folder = out / case
        run = load_reference(case, folder, taesd_mod, torch.bfloat16)
        if run is None:
            continue
        io = load_io(folder)
        mean, decoded = run(io["sample"], io["latent"], args.device)
        io["latent_mean_bf16"], io["decoded_bf16"] = mean.cpu().contiguous(), decoded.cpu().contiguous()
        meta = io_metadata(folder)
        save_file(io, str(folder / "io.safetensors"), meta)
        rel = lambda a, b: float((a - b).norm() / b.norm())
        print(f"  {case}: reference bf16 rel L2 latent_mean {rel(mean.cpu(), io['latent_mean']):.2e}, "
              f"decoded {rel(decoded.cpu(), io['decoded']):.2e}")


def check(args, out, taesd_mod):
    failures = 0
    for case in args.cases:
        folder = out / case
        if not (folder / "io.safetensors").exists():
            print(f"  {case}: MISSING {folder / 'io.safetensors'}")
            failures += 1
            continue
        run = load_reference(case, folder, taesd_mod)
        if run is None:
            print(f"  {case}: SKIPPED (needs --taesd-py)")
            continue
        io = load_io(folder)
        mean, decoded = run(io["sample"], io["latent"], args.device)
        worst = []
        for name, got in (("latent_mean", mean), ("decoded", decoded)):
            ref = io[name]
            if got.shape != ref.shape:
                print(f"  {case}: {name} shape {list(got.shape)} != stored {list(ref.shape)}")
                failures += 1
                continue
            err = (got - ref).abs().max().item()
            tol = args.tolerance * max(1.0, ref.abs().max().item())
            worst.append(f"{name} max|diff| {err:.3g} (tol {tol:.3g})")
            if not err <= tol:
                failures += 1
                worst[-1] += " FAIL"
        meta = io_metadata(folder)
        print(f"  {case}: " + "; ".join(worst) +
              f"  [stored by diffusers {meta.get('diffusers_version')}, torch {meta.get('torch_version')}, "
              f"{meta.get('device')}]")
    print(f"{len(args.cases) - failures} passed, {failures} failed")
    return failures


# ---------------------------------------------------------------------------------------------

def add_fixture_args(ap, cases=None, device=True):
    """The options every fixture script takes (--out, --check, --tolerance), with --device where
    the references run on a chosen torch device and --cases where the script has `cases`."""
    ap.add_argument("--out", default="tests/fixtures", help="fixtures folder (default: tests/fixtures)")
    if device:
        ap.add_argument("--device", default="cpu", help="torch device for the reference outputs (cpu, cuda)")
    if cases is not None:
        ap.add_argument("--cases", default=",".join(cases), help="comma-separated subset of: " + ", ".join(cases))
    ap.add_argument("--check", action="store_true", help="compare the existing fixtures instead of writing")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="--check: max |diff| allowed, relative to max(1, max|reference|)")


def parse_fixture_args(ap, cases=None):
    """ap.parse_args() with --cases split and checked and --device a torch.device."""
    args = ap.parse_args()
    if cases is not None:
        args.cases = [c for c in args.cases.split(",") if c]
        for c in args.cases:
            if c not in cases:
                ap.error(f"unknown case {c}")
    if "device" in args:
        args.device = torch.device(args.device)
        if args.device.type == "cuda" and not torch.cuda.is_available():
            ap.error("--device cuda but torch sees no CUDA device")
    return args


def check_file(fresh, committed, tolerance, label):
    """--check of a script that writes its fixtures anew into a temporary folder: every tensor of
    the committed safetensors file against the fresh one's, max |diff| within `tolerance` x
    max(1, max|reference|). Prints each mismatch as `MISMATCH <label> <tensor>`; returns their
    count."""
    a, b = load_file(str(fresh)), load_file(str(committed))
    bad = 0
    for k in b:
        ref = b[k].float()
        d = (a[k].float() - ref).abs().max().item()
        if d > tolerance * max(1.0, ref.abs().max().item()):
            print(f"MISMATCH {label} {k}: max|diff| {d}")
            bad += 1
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_fixture_args(ap, CASES)
    ap.add_argument("--taesd-py", default=None,
                    help="path to madebyollin/taesd's taesd.py (commit 5cccb12 or later); needed for "
                         "tiny_taef2 and for the taesd.py cross-check of tiny_taesd_single")
    args = parse_fixture_args(ap, CASES)

    setup_determinism()
    taesd_mod = load_taesd_module(args.taesd_py)
    out = Path(args.out)
    print(f"diffusers {diffusers.__version__}, torch {torch.__version__}, device {args.device}")
    if args.check:
        sys.exit(1 if check(args, out, taesd_mod) else 0)
    out.mkdir(parents=True, exist_ok=True)
    if any(c.startswith("kl_") for c in args.cases):
        generate_kl(args, out)
    if any(c.startswith("tiny_") for c in args.cases):
        generate_tiny(args, out, taesd_mod)
    if any(c.startswith("qwen_") for c in args.cases):
        generate_qwen(args, out)
    add_bf16_references(args, out, taesd_mod)
    total = sum(p.stat().st_size for c in args.cases if (out / c).is_dir()
                for p in (out / c).iterdir() if p.is_file())
    print(f"wrote {len(args.cases)} cases to {out} ({total / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
