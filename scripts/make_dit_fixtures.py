#!/usr/bin/env python3
"""Golden fixtures for the Qwen-Image diffusion transformer, its scheduler and denoising loop.

The reference is diffusers (QwenImageTransformer2DModel, FlowMatchEulerDiscreteScheduler,
QwenImagePipeline, QwenImageImg2ImgPipeline and the QwenImageEditPlusPipeline loop) on PyTorch in
fp32 with TF32 off, deterministic algorithms and math-only attention. Everything is tiny and
randomly initialised; see tests/fixtures/dit_README.md for the cases and tensor names.

  /opt/refenv/bin/python scripts/make_dit_fixtures.py --out tests/fixtures
  /opt/refenv/bin/python scripts/make_dit_fixtures.py --out tests/fixtures --check

Writes:
  dit_scheduler/schedules.json          FlowMatchEulerDiscreteScheduler timesteps / sigmas
  dit_rng/randn.safetensors             torch.randn on seeded CPU generators
  dit_qwen_image_tiny/                  pipeline root: model_index.json, scheduler/, vae/,
                                        transformer/ (fp32, two shards + index.json),
                                        io_transformer.safetensors, io_denoise.safetensors
  dit_qwen_image_edit_tiny/             pipeline root of an Edit-2511-style model: scheduler/,
                                        transformer/ (zero_cond_t, bf16, one file), no vae/,
                                        io_transformer.safetensors, io_denoise.safetensors

--check loads the committed folders through diffusers' from_pretrained, re-runs every reference
on the committed inputs and compares with the committed outputs. Needs no network.
"""

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import contextlib
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import save_file  # noqa: E402  (sorted headers: byte-identical reruns)

import diffusers
from diffusers import (
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    QwenImageImg2ImgPipeline,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

GENERATOR = "scripts/make_dit_fixtures.py"

# ---------------------------------------------------------------------------------------------
# Configurations

# Qwen-Image's own scheduler/scheduler_config.json (also used by Qwen-Image-Edit-2509/2511).
QWEN_SCHEDULER_CONFIG = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    invert_sigmas=False,
    max_image_seq_len=8192,
    max_shift=0.9,
    num_train_timesteps=1000,
    shift=1.0,
    shift_terminal=0.02,
    stochastic_sampling=False,
    time_shift_type="exponential",
    use_beta_sigmas=False,
    use_dynamic_shifting=True,
    use_exponential_sigmas=False,
    use_karras_sigmas=False,
)

# The text-to-image transformer: Qwen-Image's layout narrowed (inner dim 2 x 16 = 32).
DIT_T2I_CONFIG = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=24,
    guidance_embeds=False,
    axes_dims_rope=[4, 6, 6],
    zero_cond_t=False,
)

# Qwen-Image-Edit-2511: the same network with zero_cond_t (reference tokens modulated at t = 0).
DIT_EDIT_CONFIG = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=20,
    guidance_embeds=False,
    axes_dims_rope=[2, 8, 6],  # unequal height / width axes: a transposed position shows
    zero_cond_t=True,
)

VAE_CONFIG = dict(
    base_dim=2,
    z_dim=16,
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

SEEDS = {"dit_t2i": 2001, "dit_edit": 2002, "vae": 2003, "io": 2004}

# Latent frame of the loop fixtures: 8 x 12 latents = 64 x 96 pixels = 4 x 6 = 24 tokens.
LAT_H, LAT_W = 8, 12


# ---------------------------------------------------------------------------------------------
# Determinism and files

def setup_determinism():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(True)


def reference_context():
    ctx = contextlib.ExitStack()
    ctx.enter_context(torch.no_grad())
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ctx.enter_context(sdpa_kernel(SDPBackend.MATH))
    return ctx


def gen(seed):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g






def metadata(args, case, extra=None):
    meta = {
        "case": case,
        "generator": GENERATOR,
        "diffusers_version": diffusers.__version__,
        "torch_version": torch.__version__,
        "device": "cpu",
        "dtype_compute": "float32",
        "tf32": "off",
    }
    meta.update({k: str(v) for k, v in (extra or {}).items()})
    return meta


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def fresh_dir(path):
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def save_transformer(model, folder, args, case, dtype, shards):
    """config.json and the weights in `dtype`, split into `shards` files with an index.json
    (diffusers' sharded layout) when shards > 1."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_config(str(folder))
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    meta = {"format": "pt"}
    meta.update(metadata(args, case, {"layout": "diffusers"}))
    if shards == 1:
        save_file(sd, str(folder / "diffusion_pytorch_model.safetensors"), meta)
        return
    names = sorted(sd)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        fname = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: sd[k] for k in part}, str(folder / fname), meta)
        for k in part:
            weight_map[k] = fname
            total += sd[k].numel() * sd[k].element_size()
    write_json(folder / "diffusion_pytorch_model.safetensors.index.json",
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


# ---------------------------------------------------------------------------------------------
# Models

def build_transformer(config, seed, bf16_weights):
    torch.manual_seed(seed)
    model = QwenImageTransformer2DModel(**config)
    g = gen(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # RMS norm scales start at 1: move them off so a loader that drops them fails.
            if name.endswith("norm.weight") or ".norm_" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            # Modulation layers: a larger spread so shift/scale/gate clearly matter.
            if "_mod." in name:
                p.mul_(3.0)
    if bf16_weights:
        model = model.to(torch.bfloat16).to(torch.float32)
    return model.eval()


def build_vae(seed):
    torch.manual_seed(seed)
    model = AutoencoderKLQwenImage(**VAE_CONFIG)
    g = gen(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            gamma = getattr(module, "gamma", None)
            if isinstance(gamma, torch.nn.Parameter):
                gamma.copy_(1 + 0.2 * torch.randn(gamma.shape, generator=g))
    return model.eval()


def run_transformer(model, inp):
    img_shapes = [[tuple(int(v) for v in row) for row in inp["img_shapes"].tolist()]]
    batch = inp["hidden_states"].shape[0]
    mask = inp.get("encoder_hidden_states_mask")
    with reference_context():
        out = model(
            hidden_states=inp["hidden_states"],
            encoder_hidden_states=inp["encoder_hidden_states"],
            encoder_hidden_states_mask=mask,
            timestep=inp["timestep"],
            img_shapes=img_shapes * batch,
            return_dict=False,
        )[0]
    return out


# ---------------------------------------------------------------------------------------------
# Transformer-level cases

def transformer_case(g, config, batch, img_shapes, text_len, mask_rows, timesteps):
    tokens = sum(f * h * w for f, h, w in img_shapes)
    inp = {
        "hidden_states": torch.randn((batch, tokens, config["in_channels"]), generator=g),
        "encoder_hidden_states": torch.randn((batch, text_len, config["joint_attention_dim"]),
                                             generator=g),
        "timestep": torch.tensor(timesteps, dtype=torch.float32),
        "img_shapes": torch.tensor(img_shapes, dtype=torch.float32),
    }
    if mask_rows is not None:
        inp["encoder_hidden_states_mask"] = torch.tensor(mask_rows, dtype=torch.float32)
    return inp


def transformer_cases(config, seed, edit):
    g = gen(seed)
    cases = {}
    if not edit:
        # One image, no mask (every text token valid).
        cases["single"] = transformer_case(g, config, 1, [(1, 4, 6)], 7, None, [0.7])
        # Batch of two with padded text (a non-contiguous mask too), odd image sides.
        cases["masked_batch"] = transformer_case(
            g, config, 2, [(1, 3, 5)], 9,
            [[1, 1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 1, 1, 1, 0, 0]], [0.3, 0.95])
        # Several images in one sequence without zero_cond_t (Qwen-Image-Edit-2509 style).
        cases["multi_image"] = transformer_case(
            g, config, 1, [(1, 4, 4), (1, 2, 3)], 5, [[1, 1, 1, 1, 0]], [0.5])
    else:
        # Target then two references of other sizes; padded text.
        cases["edit"] = transformer_case(
            g, config, 1, [(1, 4, 6), (1, 4, 6), (1, 2, 4)], 8, [[1, 1, 1, 1, 1, 1, 0, 0]], [0.6])
        # zero_cond_t with a batch of two: the t / 0 halves of the modulation must pair up.
        cases["edit_batch"] = transformer_case(
            g, config, 2, [(1, 2, 4), (1, 3, 3)], 6,
            [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], [0.25, 0.8])
        # A single image through the zero_cond_t model (all tokens use t).
        cases["edit_single"] = transformer_case(g, config, 1, [(1, 3, 4)], 4, None, [0.9])
    return cases


def flatten_io(cases, outputs):
    flat = {}
    for name, inp in cases.items():
        for k, v in inp.items():
            flat[f"{name}.{k}"] = v
        flat[f"{name}.sample"] = outputs[name]
    return flat


# ---------------------------------------------------------------------------------------------
# Denoising loops

def pack(latents):
    """[1, 16, 1, h, w] -> [1, (h/2)(w/2), 64], QwenImagePipeline._pack_latents."""
    b, c, _, h, w = latents.shape
    return QwenImagePipeline._pack_latents(latents, b, c, h, w)


def unpack(packed, lat_h, lat_w):
    return QwenImagePipeline._unpack_latents(packed, lat_h * 8, lat_w * 8, 8)


def edit_loop(transformer, scheduler, noise, refs, embeds, steps, true_cfg_scale):
    """QwenImageEditPlusPipeline.__call__ steps 4-6 (diffusers 0.42.1) for latent inputs: the
    pipeline itself cannot take reference latents (its image preprocessing needs PIL images),
    so this is its loop, line for line, with the references already VAE-encoded and normalised."""
    latents = pack(noise)
    image_latents = torch.cat([pack(r) for r in refs], dim=1)
    img_shapes = [[(1, LAT_H // 2, LAT_W // 2),
                   *[(1, r.shape[3] // 2, r.shape[4] // 2) for r in refs]]]
    sigmas = np.linspace(1.0, 1 / steps, steps)
    mu = calculate_shift(
        latents.shape[1],
        scheduler.config.get("base_image_seq_len", 256),
        scheduler.config.get("max_image_seq_len", 4096),
        scheduler.config.get("base_shift", 0.5),
        scheduler.config.get("max_shift", 1.15),
    )
    timesteps, _ = retrieve_timesteps(scheduler, steps, "cpu", sigmas=sigmas, mu=mu)
    do_true_cfg = true_cfg_scale > 1 and "negative_prompt_embeds" in embeds
    scheduler.set_begin_index(0)
    with reference_context():
        for t in timesteps:
            latent_model_input = torch.cat([latents, image_latents], dim=1)
            timestep = t.expand(latents.shape[0]).to(latents.dtype)
            noise_pred = transformer(
                hidden_states=latent_model_input,
                timestep=timestep / 1000,
                encoder_hidden_states_mask=embeds["prompt_embeds_mask"],
                encoder_hidden_states=embeds["prompt_embeds"],
                img_shapes=img_shapes,
                return_dict=False,
            )[0]
            noise_pred = noise_pred[:, : latents.size(1)]
            if do_true_cfg:
                neg_noise_pred = transformer(
                    hidden_states=latent_model_input,
                    timestep=timestep / 1000,
                    encoder_hidden_states_mask=embeds["negative_prompt_embeds_mask"],
                    encoder_hidden_states=embeds["negative_prompt_embeds"],
                    img_shapes=img_shapes,
                    return_dict=False,
                )[0]
                neg_noise_pred = neg_noise_pred[:, : latents.size(1)]
                comb_pred = neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)
                cond_norm = torch.norm(noise_pred, dim=-1, keepdim=True)
                noise_norm = torch.norm(comb_pred, dim=-1, keepdim=True)
                noise_pred = comb_pred * (cond_norm / noise_norm)
            latents = scheduler.step(noise_pred, t, latents, return_dict=False)[0]
    return unpack(latents, LAT_H, LAT_W)


def embeds_for(g, config, text_len, neg_len, mask_valid, neg_mask_valid):
    dj = config["joint_attention_dim"]
    e = {
        "prompt_embeds": torch.randn((1, text_len, dj), generator=g),
        "prompt_embeds_mask": torch.tensor([[1] * mask_valid + [0] * (text_len - mask_valid)],
                                           dtype=torch.int64),
    }
    if neg_len:
        e["negative_prompt_embeds"] = torch.randn((1, neg_len, dj), generator=g)
        e["negative_prompt_embeds_mask"] = torch.tensor(
            [[1] * neg_mask_valid + [0] * (neg_len - neg_mask_valid)], dtype=torch.int64)
    return e


def vae_decode(vae, latents):
    """What QwenImagePipeline does after the loop: denormalise, decode, first frame."""
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1)
    with reference_context():
        return vae.decode(latents / std + mean, return_dict=False)[0][:, :, 0]


def t2i_pipeline(transformer, vae, scheduler):
    return QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None,
                             transformer=transformer)


def run_pipeline(pipe, embeds, **kwargs):
    with reference_context():
        out = pipe(prompt_embeds=embeds["prompt_embeds"],
                   prompt_embeds_mask=embeds["prompt_embeds_mask"],
                   negative_prompt_embeds=embeds.get("negative_prompt_embeds"),
                   negative_prompt_embeds_mask=embeds.get("negative_prompt_embeds_mask"),
                   height=LAT_H * 8, width=LAT_W * 8, output_type="latent", return_dict=False,
                   **kwargs)[0]
    return unpack(out, LAT_H, LAT_W)


def denoise_t2i_inputs():
    """Inputs of the text-to-image root's loop cases: {case: {tensor: value}}, {case: meta}."""
    g = gen(SEEDS["io"] + 10)
    cfg = DIT_T2I_CONFIG
    inputs = {
        # Text-to-image with true CFG and explicit initial noise.
        "t2i_cfg": dict(embeds_for(g, cfg, 7, 5, 5, 5),
                        noise=torch.randn((1, 16, 1, LAT_H, LAT_W), generator=g)),
        # Text-to-image from a seed (torch.Generator("cpu")), no CFG.
        "t2i_seed": embeds_for(g, cfg, 6, 0, 6, 0),
        # img2img: normalised image latents, strength 0.6 of 5 steps (3 run), CFG 2.5.
        "img2img": dict(embeds_for(g, cfg, 7, 4, 6, 3),
                        image_latents=torch.randn((1, 16, 1, LAT_H, LAT_W), generator=g)),
    }
    meta = {
        "t2i_cfg": dict(steps=3, true_cfg_scale=4.0, strength=1.0),
        "t2i_seed": dict(steps=2, true_cfg_scale=4.0, strength=1.0, seed=1234),
        "img2img": dict(steps=5, true_cfg_scale=2.5, strength=0.6, seed=77),
    }
    return inputs, meta


def run_denoise_t2i(name, inp, meta, transformer, vae, scheduler_config):
    """Runs one loop case through diffusers' own pipelines; returns the outputs to store."""
    def scheduler():
        return FlowMatchEulerDiscreteScheduler.from_config(scheduler_config)

    e = {k: v for k, v in inp.items() if "prompt_embeds" in k}
    if name == "t2i_cfg":
        lat = run_pipeline(t2i_pipeline(transformer, vae, scheduler()), e,
                           num_inference_steps=meta["steps"], true_cfg_scale=meta["true_cfg_scale"],
                           latents=pack(inp["noise"]))
        # The edit loop replica must reproduce the pipeline on a case both can run.
        replica = edit_loop_t2i(transformer, scheduler(), inp["noise"], e, meta["steps"],
                                meta["true_cfg_scale"])
        if not torch.allclose(lat, replica, atol=1e-5, rtol=1e-5):
            raise SystemExit("the loop replica does not reproduce QwenImagePipeline")
        return dict(latents=lat, decoded=vae_decode(vae, lat))
    seed = meta["seed"]
    # What the pipelines draw from the generator first: randn((1, 1, 16, h, w)).
    noise = torch.randn((1, 1, 16, LAT_H, LAT_W), generator=gen(seed)).transpose(1, 2).contiguous()
    if name == "t2i_seed":
        lat = run_pipeline(t2i_pipeline(transformer, vae, scheduler()), e,
                           num_inference_steps=meta["steps"], generator=gen(seed))
        return dict(noise=noise, latents=lat)
    pipe = QwenImageImg2ImgPipeline(scheduler=scheduler(), vae=vae, text_encoder=None,
                                    tokenizer=None, transformer=transformer)
    lat = run_pipeline(pipe, e, image=inp["image_latents"][:, :, 0], strength=meta["strength"],
                       num_inference_steps=meta["steps"], true_cfg_scale=meta["true_cfg_scale"],
                       generator=gen(seed))
    return dict(noise=noise, latents=lat)


def edit_loop_t2i(transformer, scheduler, noise, embeds, steps, true_cfg_scale):
    """The replica without references (checked against QwenImagePipeline)."""
    latents = pack(noise)
    sigmas = np.linspace(1.0, 1 / steps, steps)
    mu = calculate_shift(latents.shape[1], scheduler.config.get("base_image_seq_len", 256),
                         scheduler.config.get("max_image_seq_len", 4096),
                         scheduler.config.get("base_shift", 0.5),
                         scheduler.config.get("max_shift", 1.15))
    timesteps, _ = retrieve_timesteps(scheduler, steps, "cpu", sigmas=sigmas, mu=mu)
    scheduler.set_begin_index(0)
    img_shapes = [[(1, LAT_H // 2, LAT_W // 2)]]
    mask = embeds["prompt_embeds_mask"]
    neg_mask = embeds["negative_prompt_embeds_mask"]
    # QwenImagePipeline.encode_prompt drops an all-ones mask (equivalent to none).
    mask = None if mask.all() else mask
    neg_mask = None if neg_mask.all() else neg_mask
    with reference_context():
        for t in timesteps:
            timestep = t.expand(latents.shape[0]).to(latents.dtype)
            cond = transformer(hidden_states=latents, timestep=timestep / 1000,
                               encoder_hidden_states_mask=mask,
                               encoder_hidden_states=embeds["prompt_embeds"],
                               img_shapes=img_shapes, return_dict=False)[0]
            uncond = transformer(hidden_states=latents, timestep=timestep / 1000,
                                 encoder_hidden_states_mask=neg_mask,
                                 encoder_hidden_states=embeds["negative_prompt_embeds"],
                                 img_shapes=img_shapes, return_dict=False)[0]
            comb = uncond + true_cfg_scale * (cond - uncond)
            pred = comb * (torch.norm(cond, dim=-1, keepdim=True) /
                           torch.norm(comb, dim=-1, keepdim=True))
            latents = scheduler.step(pred, t, latents, return_dict=False)[0]
    return unpack(latents, LAT_H, LAT_W)


def denoise_edit_inputs():
    g = gen(SEEDS["io"] + 20)
    inp = dict(embeds_for(g, DIT_EDIT_CONFIG, 8, 6, 7, 6),
               noise=torch.randn((1, 16, 1, LAT_H, LAT_W), generator=g),
               reference_latents_0=torch.randn((1, 16, 1, LAT_H, LAT_W), generator=g),
               reference_latents_1=torch.randn((1, 16, 1, 6, 4), generator=g))
    return {"edit_cfg": inp}, {"edit_cfg": dict(steps=3, true_cfg_scale=4.0, strength=1.0,
                                                references=2)}


def run_denoise_edit(inp, meta, transformer, scheduler_config):
    e = {k: v for k, v in inp.items() if "prompt_embeds" in k}
    refs = [inp["reference_latents_0"], inp["reference_latents_1"]]
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config)
    return dict(latents=edit_loop(transformer, scheduler, inp["noise"], refs, e, meta["steps"],
                                  meta["true_cfg_scale"]))


def flatten_denoise(cases):
    flat = {}
    for name, tensors in cases.items():
        for k, v in tensors.items():
            flat[f"{name}.{k}"] = v.to(torch.float32)
    return flat


# ---------------------------------------------------------------------------------------------
# Scheduler schedules

SCHEDULER_CONFIGS = {
    "qwen_image": QWEN_SCHEDULER_CONFIG,
    "static_shift3": dict(num_train_timesteps=1000, shift=3.0),  # SD3-style, no dynamic shift
    "flux_linear": dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
                        base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                        max_image_seq_len=4096, time_shift_type="linear"),
    "karras": dict(QWEN_SCHEDULER_CONFIG, use_karras_sigmas=True),
    "exponential": dict(QWEN_SCHEDULER_CONFIG, use_exponential_sigmas=True),
    "inverted": dict(QWEN_SCHEDULER_CONFIG, invert_sigmas=True, shift_terminal=None),
}


def scheduler_cases():
    """Every config x steps x image sequence length, with diffusers' custom Qwen sigmas
    (np.linspace(1, 1/N, N)) and, once per config and N, plain set_timesteps(N). Strength only
    moves the first step (QwenImageImg2ImgPipeline.get_timesteps): `begin_index` per strength.
    With shift_terminal and one step diffusers divides 0 by 0 (NaN sigmas): such cases are
    stored with "nan": true and no schedule, and the engine must refuse them."""
    out = []
    for cname, config in SCHEDULER_CONFIGS.items():
        for steps in (1, 2, 4, 7, 30):
            for seq in (16, 256, 4096, 16384):
                for qwen_sigmas in (True, False):
                    if not qwen_sigmas and seq != 4096:
                        continue
                    s = FlowMatchEulerDiscreteScheduler(**config)
                    mu = calculate_shift(seq, s.config.get("base_image_seq_len", 256),
                                         s.config.get("max_image_seq_len", 4096),
                                         s.config.get("base_shift", 0.5),
                                         s.config.get("max_shift", 1.15))
                    with np.errstate(invalid="ignore", divide="ignore"):
                        if qwen_sigmas:
                            s.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
                        else:
                            s.set_timesteps(steps, mu=mu if s.config.use_dynamic_shifting else None)
                    case = dict(config=cname, steps=steps, image_seq_len=seq,
                                qwen_sigmas=qwen_sigmas, mu=mu)
                    if torch.isnan(s.sigmas).any():
                        case["nan"] = True
                        out.append(case)
                        continue
                    begin = {}
                    for strength in (1.0, 0.6, 0.25, 0.01):
                        init_timestep = min(steps * strength, steps)  # get_timesteps
                        begin[repr(strength)] = int(max(steps - init_timestep, 0))
                    case.update(timesteps=[float(v) for v in s.timesteps.tolist()],
                                sigmas=[float(v) for v in s.sigmas.tolist()],
                                begin_index=begin)
                    out.append(case)
    def public(config):  # without diffusers' bookkeeping (_use_default_values: random order)
        return {k: v for k, v in config.items() if not k.startswith("_") or k == "_class_name"}

    return {"configs": {k: public(FlowMatchEulerDiscreteScheduler(**v).config)
                        for k, v in SCHEDULER_CONFIGS.items()},
            "cases": out}


# ---------------------------------------------------------------------------------------------
# torch.randn on the CPU generator

RNG_CASES = [("s1234_1536", 1234, (1, 1, 16, 8, 12)), ("s0_35", 0, (1, 5, 7)),
             ("s42_4096", 42, (1, 1, 16, 16, 16)), ("s2p40_64", 2 ** 40 + 5, (64,))]


def rng_tensors():
    return {name: torch.randn(shape, generator=gen(seed)).reshape(-1) for name, seed, shape in RNG_CASES}


# ---------------------------------------------------------------------------------------------
# Main

def write_root_common(root, scheduler_config, with_vae, transformer_name):
    (root / "scheduler").mkdir(parents=True, exist_ok=True)
    s = FlowMatchEulerDiscreteScheduler(**scheduler_config)
    s.save_config(str(root / "scheduler"))
    index = {
        "_class_name": "QwenImagePipeline" if with_vae else "QwenImageEditPlusPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": [None, None],
        "tokenizer": [None, None],
        "transformer": ["diffusers", transformer_name],
        "vae": ["diffusers", "AutoencoderKLQwenImage"] if with_vae else [None, None],
    }
    if not with_vae:
        index["processor"] = [None, None]
    write_json(root / "model_index.json", index)


def generate(args):
    out = Path(args.out)
    # Scheduler and RNG.
    fresh_dir(out / "dit_scheduler")
    (out / "dit_scheduler" / "schedules.json").write_text(
        json.dumps(scheduler_cases(), sort_keys=True, separators=(",", ":")) + "\n")
    fresh_dir(out / "dit_rng")
    save_file(rng_tensors(), str(out / "dit_rng" / "randn.safetensors"),
              metadata(args, "dit_rng", {"cases": ";".join(f"{n}:{s}:{list(sh)}"
                                                           for n, s, sh in RNG_CASES)}))

    # Text-to-image root.
    root = fresh_dir(out / "dit_qwen_image_tiny")
    t2i = build_transformer(DIT_T2I_CONFIG, SEEDS["dit_t2i"], bf16_weights=False)
    save_transformer(t2i, root / "transformer", args, "dit_qwen_image_tiny", torch.float32, 2)
    vae = build_vae(SEEDS["vae"])
    (root / "vae").mkdir()
    vae.save_config(str(root / "vae"))
    vsd = {k: v.detach().contiguous() for k, v in vae.state_dict().items()}
    vmeta = {"format": "pt"}
    vmeta.update(metadata(args, "dit_qwen_image_tiny", {"layout": "diffusers"}))
    save_file(vsd, str(root / "vae" / "diffusion_pytorch_model.safetensors"), vmeta)
    write_root_common(root, QWEN_SCHEDULER_CONFIG, True, "QwenImageTransformer2DModel")
    cases = transformer_cases(DIT_T2I_CONFIG, SEEDS["io"], edit=False)
    outs = {n: run_transformer(t2i, c) for n, c in cases.items()}
    save_file(flatten_io(cases, outs), str(root / "io_transformer.safetensors"),
              metadata(args, "dit_qwen_image_tiny", {"cases": ",".join(cases)}))
    sched = dict(FlowMatchEulerDiscreteScheduler(**QWEN_SCHEDULER_CONFIG).config)
    dcases, dmeta = denoise_t2i_inputs()
    for name, inp in dcases.items():
        inp.update(run_denoise_t2i(name, inp, dmeta[name], t2i, vae, sched))
    save_file(flatten_denoise(dcases), str(root / "io_denoise.safetensors"),
              metadata(args, "dit_qwen_image_tiny", {"cases": json.dumps(dmeta, sort_keys=True)}))

    # Edit root (zero_cond_t, bf16 weights, no VAE).
    root = fresh_dir(out / "dit_qwen_image_edit_tiny")
    edit = build_transformer(DIT_EDIT_CONFIG, SEEDS["dit_edit"], bf16_weights=True)
    save_transformer(edit, root / "transformer", args, "dit_qwen_image_edit_tiny",
                     torch.bfloat16, 1)
    write_root_common(root, QWEN_SCHEDULER_CONFIG, False, "QwenImageTransformer2DModel")
    cases = transformer_cases(DIT_EDIT_CONFIG, SEEDS["io"] + 1, edit=True)
    outs = {n: run_transformer(edit, c) for n, c in cases.items()}
    save_file(flatten_io(cases, outs), str(root / "io_transformer.safetensors"),
              metadata(args, "dit_qwen_image_edit_tiny", {"cases": ",".join(cases)}))
    dcases, dmeta = denoise_edit_inputs()
    for name, inp in dcases.items():
        inp.update(run_denoise_edit(inp, dmeta[name], edit, sched))
    save_file(flatten_denoise(dcases), str(root / "io_denoise.safetensors"),
              metadata(args, "dit_qwen_image_edit_tiny",
                       {"cases": json.dumps(dmeta, sort_keys=True)}))
    for name, o in outs.items():
        print(f"edit {name}: sample std {o.std().item():.4f}")
    print("done")


def compare(what, got, ref, tol):
    err = (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())
    status = "ok" if err <= tol else "MISMATCH"
    print(f"{what}: max err {err:.2e} {status}")
    return err <= tol


def check(args):
    out = Path(args.out)
    ok = True
    sched = json.loads((out / "dit_scheduler" / "schedules.json").read_text())
    fresh = scheduler_cases()
    fresh = json.loads(json.dumps(fresh))
    ok &= sched == fresh
    print(f"schedules.json: {'ok' if sched == fresh else 'MISMATCH'}")
    rng = load_file(str(out / "dit_rng" / "randn.safetensors"))
    for name, t in rng_tensors().items():
        ok &= compare(f"randn {name}", t, rng[name], 0)
    for root_name in ("dit_qwen_image_tiny", "dit_qwen_image_edit_tiny"):
        root = out / root_name
        model = QwenImageTransformer2DModel.from_pretrained(str(root / "transformer"),
                                                            torch_dtype=torch.float32).eval()
        io = load_file(str(root / "io_transformer.safetensors"))
        names = sorted({k.split(".")[0] for k in io})
        for n in names:
            inp = {k.split(".", 1)[1]: v for k, v in io.items() if k.startswith(n + ".")}
            ok &= compare(f"{root_name} {n}", run_transformer(model, inp), inp["sample"], 1e-4)
        # The loops, on the committed inputs through the committed folders.
        sched = dict(FlowMatchEulerDiscreteScheduler.from_pretrained(str(root / "scheduler")).config)
        dio = load_file(str(root / "io_denoise.safetensors"))
        with safe_open(str(root / "io_denoise.safetensors"), framework="pt") as f:
            dmeta = json.loads(f.metadata()["cases"])
        vae = None
        if (root / "vae").exists():
            vae = AutoencoderKLQwenImage.from_pretrained(str(root / "vae")).eval()
        for name, meta in dmeta.items():
            stored = {k.split(".", 1)[1]: v for k, v in dio.items() if k.startswith(name + ".")}
            outputs = ("latents", "decoded") if name != "img2img" and name != "t2i_seed" else (
                "latents", "noise")
            inp = {k: v for k, v in stored.items() if k not in outputs}
            if name == "edit_cfg":
                got = run_denoise_edit(inp, meta, model, sched)
            else:
                got = run_denoise_t2i(name, inp, meta, model, vae, sched)
            if "decoded" in got:  # the decoder alone, from the committed latents
                got["decoded"] = vae_decode(vae, stored["latents"])
            for k, v in got.items():
                ok &= compare(f"{root_name} {name}.{k}", v, stored[k], 1e-4)
    if not ok:
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="tests/fixtures")
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    setup_determinism()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.check:
        check(args)
    else:
        generate(args)


if __name__ == "__main__":
    main()
