#!/usr/bin/env python3
"""LoRA and few-step fixtures for the Qwen-Image transformer (tests/fixtures/dit_lora/).

Small random LoRAs for the tiny transformer of tests/fixtures/dit_qwen_image_tiny, one file per
layout users download, and diffusers' own outputs with them loaded through its LoRA loader
(QwenImagePipeline.lora_state_dict + load_lora_into_transformer, PEFT adapters, set_adapters for
strengths and stacking). Then 4- and 8-step text-to-image loops with few-step scheduler configs
(Qwen-Image-Lightning's and a fixed-shift one) and guidance off (true_cfg_scale 1: one pass per
step), through QwenImagePipeline, one of them with the Lightning-layout LoRA loaded.

Needs peft next to diffusers (diffusers' LoRA loader requires it):
  PYTHONPATH=/work/venvs/dit/site /work/venvs/ref/bin/python scripts/make_dit_lora_fixtures.py \\
      --out tests/fixtures
  ... --check   # recompute everything and compare with the committed files (exit 1 on mismatch)

Writes tests/fixtures/dit_lora/:
  lora_diffusers.safetensors   transformer.<m>.lora_A/B.weight, alpha in the adapter metadata
                               (lora_alpha 8, alpha_pattern for one module), rank 4, made by PEFT
                               and saved by QwenImagePipeline.save_lora_weights
  lora_comfyui.safetensors     diffusion_model.<m>.lora_down/up.weight + .alpha, rank 8, with the
                               modulation and top-level layers
  lora_kohya.safetensors       lora_unet_<m with _>.lora_down/up.weight + .alpha, rank 2, bf16
  lora_lightning.safetensors   <m>.lora_down/up.weight + .alpha (Qwen-Image-Lightning V1), rank 4,
                               every linear layer of the blocks
  io_lora.safetensors          <case>.sample for the transformer cases below, inputs copied from
                               dit_qwen_image_tiny/io_transformer.safetensors ("masked_batch")
  io_fewstep.safetensors       loops: prompt_embeds, noise, latents per case
  cases.json                   every case's LoRAs, strengths, scheduler config and steps
"""

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_dit_fixtures as base  # noqa: E402  (determinism, save_file, run_transformer, metadata)
from make_fixtures import add_fixture_args, check_file, parse_fixture_args  # noqa: E402

import diffusers  # noqa: E402
from diffusers import (  # noqa: E402
    FlowMatchEulerDiscreteScheduler,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
)

GENERATOR = "scripts/make_dit_lora_fixtures.py"
SEED = 3001

BLOCK_LINEARS = ["img_mod.1", "txt_mod.1", "attn.to_q", "attn.to_k", "attn.to_v",
                 "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                 "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2",
                 "txt_mlp.net.0.proj", "txt_mlp.net.2"]

# Modules of each file (partial LoRAs: only some layers).
DIFFUSERS_MODULES = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k",
                     "transformer_blocks.0.attn.to_v", "transformer_blocks.0.attn.to_out.0",
                     "transformer_blocks.1.attn.add_q_proj", "transformer_blocks.1.img_mlp.net.0.proj",
                     "transformer_blocks.1.img_mlp.net.2", "proj_out", "img_in"]
COMFY_MODULES = ["transformer_blocks.0.img_mod.1", "transformer_blocks.1.txt_mod.1",
                 "transformer_blocks.0.txt_mlp.net.0.proj", "transformer_blocks.1.attn.to_add_out",
                 "transformer_blocks.1.attn.to_q", "time_text_embed.timestep_embedder.linear_1",
                 "time_text_embed.timestep_embedder.linear_2", "norm_out.linear", "txt_in"]
KOHYA_MODULES = ["transformer_blocks.0.attn.add_k_proj", "transformer_blocks.0.attn.add_v_proj",
                 "transformer_blocks.0.img_mlp.net.0.proj", "transformer_blocks.1.txt_mlp.net.2",
                 "transformer_blocks.1.attn.to_out.0", "transformer_blocks.1.img_mod.1",
                 "norm_out.linear", "proj_out"]
LIGHTNING_MODULES = [f"transformer_blocks.{i}.{m}" for i in range(2) for m in BLOCK_LINEARS]

# Transformer cases: (name, [(lora file, strength), ...]).
TRANSFORMER_CASES = [
    ("diffusers", [("lora_diffusers", 1.0)]),
    ("comfyui", [("lora_comfyui", 0.7)]),
    ("comfyui_s1_5", [("lora_comfyui", 1.5)]),
    ("kohya", [("lora_kohya", 1.0)]),
    ("lightning", [("lora_lightning", 1.0)]),
    ("stack", [("lora_comfyui", 0.7), ("lora_kohya", -0.5)]),
]

# Few-step scheduler configs that distilled Qwen-Image models ship.
LIGHTNING_SCHEDULER = dict(  # Qwen-Image-Lightning (ModelTC): exponential shift fixed at log(3)
    base_image_seq_len=256, base_shift=math.log(3), invert_sigmas=False, max_image_seq_len=8192,
    max_shift=math.log(3), num_train_timesteps=1000, shift=1.0, shift_terminal=None,
    stochastic_sampling=False, time_shift_type="exponential", use_beta_sigmas=False,
    use_dynamic_shifting=True, use_exponential_sigmas=False, use_karras_sigmas=False)
FIXED_SHIFT_SCHEDULER = dict(  # a fixed shift, no dynamic shifting
    base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9,
    num_train_timesteps=1000, shift=3.0, shift_terminal=None, time_shift_type="exponential",
    use_dynamic_shifting=False)
BASE_MAX_SCHEDULER = dict(  # base/max shift variant with a terminal sigma
    base_image_seq_len=256, base_shift=1.0, max_image_seq_len=4096, max_shift=1.5,
    num_train_timesteps=1000, shift=1.0, shift_terminal=0.05, time_shift_type="exponential",
    use_dynamic_shifting=True)
SCHEDULERS = {"lightning": LIGHTNING_SCHEDULER, "fixed_shift3": FIXED_SHIFT_SCHEDULER,
              "base_max": BASE_MAX_SCHEDULER}

# Loops: (name, scheduler, steps, loras, true_cfg_scale). cfg 1 with a negative prompt given:
# diffusers runs one pass per step (true CFG needs scale > 1).
LOOP_CASES = [
    ("lightning_4", "lightning", 4, [], 1.0),
    ("lightning_8", "lightning", 8, [], 1.0),
    ("lightning_4_lora", "lightning", 4, [("lora_lightning", 1.0)], 1.0),
    ("fixed_shift3_4", "fixed_shift3", 4, [], 1.0),
    ("base_max_8", "base_max", 8, [], 1.0),
]
LAT_H, LAT_W = 8, 12


def rand(g, shape, scale):
    return torch.randn(shape, generator=g, dtype=torch.float32) * scale


def target_shapes(tr):
    return {name: tuple(mod.weight.shape) for name, mod in tr.named_modules()
            if isinstance(mod, torch.nn.Linear)}


def make_files(tr, g, out):
    """The four LoRA files; returns {file: path}."""
    shapes = target_shapes(tr)
    paths = {}

    # diffusers / PEFT: an adapter made by PEFT, saved by the pipeline's save_lora_weights.
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=DIFFUSERS_MODULES, init_lora_weights=True,
                     alpha_pattern={"transformer_blocks.1.img_mlp.net.2": 2})
    tr.add_adapter(cfg, adapter_name="make")
    sd = get_peft_model_state_dict(tr, adapter_name="make")
    with torch.no_grad():
        for k in sorted(sd):
            sd[k] = rand(g, sd[k].shape, 0.2)
    meta = tr.peft_config["make"].to_dict()
    meta["target_modules"] = sorted(meta["target_modules"])  # a set: fixed order
    tr.delete_adapters("make")
    with tempfile.TemporaryDirectory() as d:
        QwenImagePipeline.save_lora_weights(d, transformer_lora_layers=sd,
                                            transformer_lora_adapter_metadata=meta)
        written = load_file(f"{d}/pytorch_lora_weights.safetensors")
        with safe_open(f"{d}/pytorch_lora_weights.safetensors", "pt") as f:
            file_meta = dict(f.metadata())
    file_meta["generator"] = GENERATOR
    paths["lora_diffusers"] = out / "lora_diffusers.safetensors"
    base.save_file(written, paths["lora_diffusers"], file_meta)

    def kohya_like(modules, rank, key_of, dtype, alpha_of):
        t = {}
        for m in modules:
            o, i = shapes[m]
            down = rand(g, (rank, i), 0.3)
            up = rand(g, (o, rank), 0.3)
            k = key_of(m)
            t[k + ".lora_down.weight"] = down.to(dtype)
            t[k + ".lora_up.weight"] = up.to(dtype)
            a = alpha_of(m, rank)
            if a is not None:
                t[k + ".alpha"] = torch.tensor(a, dtype=dtype)
        return t

    meta = {"generator": GENERATOR, "diffusers_version": diffusers.__version__}
    t = kohya_like(COMFY_MODULES, 8, lambda m: "diffusion_model." + m, torch.float32,
                   lambda m, r: 4.0)
    paths["lora_comfyui"] = out / "lora_comfyui.safetensors"
    base.save_file(t, paths["lora_comfyui"], meta)
    # kohya: one module without .alpha (alpha = rank).
    t = kohya_like(KOHYA_MODULES, 2, lambda m: "lora_unet_" + m.replace(".", "_"), torch.bfloat16,
                   lambda m, r: None if m == "proj_out" else 1.0)
    paths["lora_kohya"] = out / "lora_kohya.safetensors"
    base.save_file(t, paths["lora_kohya"], meta)
    t = kohya_like(LIGHTNING_MODULES, 4, lambda m: m, torch.float32, lambda m, r: 4.0)
    paths["lora_lightning"] = out / "lora_lightning.safetensors"
    base.save_file(t, paths["lora_lightning"], meta)
    return paths


def load_loras(tr, loras, paths):
    """Loads each file through diffusers' Qwen-Image LoRA loader; sets the strengths."""
    names, weights = [], []
    for i, (f, strength) in enumerate(loras):
        sd, md = QwenImagePipeline.lora_state_dict(str(paths[f]), return_lora_metadata=True)
        name = f"a{i}_{f}"
        QwenImagePipeline.load_lora_into_transformer(sd, transformer=tr, adapter_name=name,
                                                     metadata=md)
        names.append(name)
        weights.append(strength)
    if names:
        tr.set_adapters(names, weights)
    return names


def unload(tr, names):
    if names:
        tr.delete_adapters(names)


def transformer_outputs(root, paths):
    io = load_file(str(root / "dit_qwen_image_tiny" / "io_transformer.safetensors"))
    inp = {k.split(".", 1)[1]: v for k, v in io.items() if k.startswith("masked_batch.")}
    out = {}
    for cname, loras in TRANSFORMER_CASES:
        tr = QwenImageTransformer2DModel.from_pretrained(
            str(root / "dit_qwen_image_tiny" / "transformer"), torch_dtype=torch.float32)
        names = load_loras(tr, loras, paths)
        out[f"{cname}.sample"] = base.run_transformer(tr, inp).contiguous()
        unload(tr, names)
    # The base model on the same inputs: each LoRA must move the output away from it.
    return out


def loop_outputs(root, paths, g):
    tensors, cases = {}, {}
    pe = torch.randn((1, 7, 24), generator=g)
    mask = torch.ones((1, 7), dtype=torch.int64)
    mask[0, 5:] = 0
    ne = torch.randn((1, 5, 24), generator=g)
    nmask = torch.ones((1, 5), dtype=torch.int64)
    noise = torch.randn((1, 16, 1, LAT_H, LAT_W), generator=g)
    tensors.update({"prompt_embeds": pe, "prompt_embeds_mask": mask.float(),
                    "negative_prompt_embeds": ne, "negative_prompt_embeds_mask": nmask.float(),
                    "noise": noise})
    for cname, sname, steps, loras, cfg in LOOP_CASES:
        tr = QwenImageTransformer2DModel.from_pretrained(
            str(root / "dit_qwen_image_tiny" / "transformer"), torch_dtype=torch.float32)
        names = load_loras(tr, loras, paths)
        sched = FlowMatchEulerDiscreteScheduler(**SCHEDULERS[sname])
        pipe = QwenImagePipeline(scheduler=sched, vae=None, text_encoder=None, tokenizer=None,
                                 transformer=tr)
        pipe.vae_scale_factor = 8
        pipe.latent_channels = 16
        calls = []
        orig = tr.forward

        def counting(*a, **k):
            calls.append(1)
            return orig(*a, **k)

        tr.forward = counting
        with base.reference_context():
            latents = pipe(prompt_embeds=pe, prompt_embeds_mask=mask, negative_prompt_embeds=ne,
                           negative_prompt_embeds_mask=nmask, true_cfg_scale=cfg,
                           num_inference_steps=steps, height=LAT_H * 8, width=LAT_W * 8,
                           latents=base.pack(noise), output_type="latent", return_dict=False)[0]
        tr.forward = orig
        if len(calls) != steps:
            raise SystemExit(f"{cname}: {len(calls)} transformer passes for {steps} steps")
        # output_type="latent": packed; unpacked to [1, 16, 1, h, w] (normalised).
        tensors[f"{cname}.latents"] = base.unpack(latents, LAT_H, LAT_W).contiguous()
        cases[cname] = dict(scheduler=sname, steps=steps, true_cfg_scale=cfg,
                            loras=[[f, s] for f, s in loras], passes=len(calls))
        unload(tr, names)
    return tensors, cases


def scheduler_tables():
    """Few-step schedules as the Qwen pipelines set them (sigmas linspace(1, 1/N, N), mu from
    the image tokens)."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    out = []
    for sname, cfg in SCHEDULERS.items():
        for steps in (4, 8):
            for seq in (24, 4096, 16384):
                s = FlowMatchEulerDiscreteScheduler(**cfg)
                mu = calculate_shift(seq, s.config.base_image_seq_len, s.config.max_image_seq_len,
                                     s.config.base_shift, s.config.max_shift)
                s.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
                out.append(dict(config=sname, steps=steps, image_seq_len=seq,
                                timesteps=[float(v) for v in s.timesteps.tolist()],
                                sigmas=[float(v) for v in s.sigmas.tolist()]))
    return {"configs": SCHEDULERS, "cases": out}


def generate(out_root, check, tolerance):
    base.setup_determinism()
    g = torch.Generator("cpu").manual_seed(SEED)
    root = out_root
    folder = root / "dit_lora"
    target = Path(tempfile.mkdtemp()) if check else folder
    target.mkdir(parents=True, exist_ok=True)
    tr = QwenImageTransformer2DModel.from_pretrained(
        str(root / "dit_qwen_image_tiny" / "transformer"), torch_dtype=torch.float32)
    paths = make_files(tr, g, target)
    io = transformer_outputs(root, paths)
    loop_tensors, loop_cases = loop_outputs(root, paths, g)
    meta = base.metadata(argparse.Namespace(), "dit_lora")
    meta["generator"] = GENERATOR
    base.save_file(io, target / "io_lora.safetensors", meta)
    base.save_file(loop_tensors, target / "io_fewstep.safetensors", meta)
    cases = {"transformer": {c: [[f, s] for f, s in l] for c, l in TRANSFORMER_CASES},
             "transformer_input": "dit_qwen_image_tiny/io_transformer.safetensors: masked_batch",
             "loops": loop_cases, "schedules": scheduler_tables(),
             "diffusers_version": diffusers.__version__, "torch_version": torch.__version__}
    (target / "cases.json").write_text(json.dumps(cases, indent=2, sort_keys=True) + "\n")
    if not check:
        print(f"wrote {folder}")
        return 0
    bad = 0
    for name in ["io_lora.safetensors", "io_fewstep.safetensors"] + \
            [p.name for p in paths.values()]:
        bad += check_file(target / name, folder / name, tolerance, name)
    if json.loads((target / "cases.json").read_text())["schedules"] != \
            json.loads((folder / "cases.json").read_text())["schedules"]:
        print("MISMATCH cases.json schedules")
        bad += 1
    print("check:", "ok" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_fixture_args(ap, device=False)
    args = parse_fixture_args(ap)
    sys.exit(generate(Path(args.out), args.check, args.tolerance))


if __name__ == "__main__":
    main()
