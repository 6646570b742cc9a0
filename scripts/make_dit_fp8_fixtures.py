#!/usr/bin/env python3
"""FP8 checkpoints of the tiny Qwen-Image transformer (tests/fixtures/dit_fp8/).

The transformer of tests/fixtures/dit_qwen_image_tiny quantised to FP8 the way users download
such files, the exact values PyTorch decodes FP8 bytes to, and diffusers' outputs with the
dequantised weights (what a loader that dequantises at load must reproduce):

  PYTHONPATH=/work/venvs/dit/site /work/venvs/ref/bin/python scripts/make_dit_fp8_fixtures.py \
      --out tests/fixtures
  ... --check   # recompute everything and compare with the committed files (exit 1 on mismatch)

Writes tests/fixtures/dit_fp8/:
  decode.safetensors           every byte 0..255 as F8_E4M3 (`e4m3_bytes`) and F8_E5M2
                               (`e5m2_bytes`), and torch's float32 value of each (`e4m3`, `e5m2`:
                               `torch.arange(256, dtype=torch.uint8).view(float8).float()`)
  comfyui_scaled.safetensors   ComfyUI's scaled FP8 layout: keys `model.diffusion_model.<m>`, the
                               linear weights in F8_E4M3 with `<m>.scale_weight` (F32, shape [],
                               amax / 448; one per row for transformer_blocks.1.img_mlp.net.2),
                               `<m>.scale_input` (F32 1.0), the `scaled_fp8` marker (F8_E4M3 [0]);
                               img_in and proj_out, biases and norms in BF16
  comfyui_scaled.json          its config.json (heads of 16 dims: not inferable from the shapes)
  e5m2.safetensors / .json     keys `diffusion_model.<m>`, linear weights cast to F8_E5M2 without
                               scales, everything else F32
  io_fp8.safetensors           `<file>.sample`: diffusers' QwenImageTransformer2DModel (fp32, CPU)
                               with the dequantised weights (fp8 -> float32, x scale in float32)
                               on the "masked_batch" case of
                               dit_qwen_image_tiny/io_transformer.safetensors;
                               `<file>.dequant.<m>.weight` for a few weights
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_dit_fixtures as base  # noqa: E402  (determinism, save_file, run_transformer, metadata)
from make_fixtures import add_fixture_args, check_file, parse_fixture_args, same_bits  # noqa: E402

import diffusers  # noqa: E402
from diffusers import QwenImageTransformer2DModel  # noqa: E402

GENERATOR = "scripts/make_dit_fp8_fixtures.py"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HIGH_PRECISION = {"img_in", "proj_out"}  # kept in BF16 in the scaled file, as real files do
PER_ROW = "transformer_blocks.1.img_mlp.net.2"
DEQUANT_SAVED = ["transformer_blocks.0.attn.to_q.weight", PER_ROW + ".weight",
                 "transformer_blocks.0.img_mod.1.weight"]


def linear_modules(tr):
    return sorted(name for name, mod in tr.named_modules() if isinstance(mod, torch.nn.Linear))


def decode_tables():
    b = torch.arange(256, dtype=torch.uint8)
    return {"e4m3_bytes": b.view(E4M3).clone(), "e5m2_bytes": b.view(E5M2).clone(),
            "e4m3": b.view(E4M3).float(), "e5m2": b.view(E5M2).float()}


def comfyui_scaled(sd, linears):
    """-> (file tensors, dequantised state dict)."""
    out, deq = {}, {}
    fmax = torch.finfo(E4M3).max
    for k, v in sd.items():
        m = k[: -len(".weight")] if k.endswith(".weight") else None
        if m in linears and m not in HIGH_PRECISION:
            if m == PER_ROW:
                scale = (v.abs().amax(dim=1) / fmax).float()
                q = (v / scale[:, None]).to(E4M3)
                deq[k] = q.float() * scale[:, None]
            else:
                scale = (v.abs().amax() / fmax).float()
                q = (v / scale).to(E4M3)
                deq[k] = q.float() * scale
            out[k] = q
            out[m + ".scale_weight"] = scale.contiguous()
            out[m + ".scale_input"] = torch.tensor(1.0)
        else:
            out[k] = v.to(torch.bfloat16)
            deq[k] = out[k].float()
    out["scaled_fp8"] = torch.empty(0, dtype=E4M3)
    return {"model.diffusion_model." + k: t for k, t in out.items()}, deq


def e5m2(sd, linears):
    out, deq = {}, {}
    for k, v in sd.items():
        m = k[: -len(".weight")] if k.endswith(".weight") else None
        out[k] = v.to(E5M2) if m in linears else v
        deq[k] = out[k].float()
    return {"diffusion_model." + k: t for k, t in out.items()}, deq


def generate(out_root, check, tolerance):
    base.setup_determinism()
    root = out_root
    folder = root / "dit_fp8"
    target = Path(tempfile.mkdtemp()) if check else folder
    target.mkdir(parents=True, exist_ok=True)
    tdir = root / "dit_qwen_image_tiny" / "transformer"
    tr = QwenImageTransformer2DModel.from_pretrained(str(tdir), torch_dtype=torch.float32)
    sd = {k: v.detach().contiguous() for k, v in tr.state_dict().items()}
    linears = set(linear_modules(tr))
    config = json.loads((tdir / "config.json").read_text())

    io = load_file(str(root / "dit_qwen_image_tiny" / "io_transformer.safetensors"))
    inp = {k.split(".", 1)[1]: v for k, v in io.items() if k.startswith("masked_batch.")}
    meta = base.metadata(argparse.Namespace(), "dit_fp8")
    meta["generator"] = GENERATOR
    outputs = {}
    for name, make in [("comfyui_scaled", comfyui_scaled), ("e5m2", e5m2)]:
        tensors, deq = make(sd, linears)
        base.save_file(tensors, target / f"{name}.safetensors", dict(meta, layout=name))
        (target / f"{name}.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        m = QwenImageTransformer2DModel.from_pretrained(str(tdir), torch_dtype=torch.float32)
        m.load_state_dict(deq, strict=True)
        outputs[f"{name}.sample"] = base.run_transformer(m.eval(), inp).contiguous()
        for k in DEQUANT_SAVED:
            outputs[f"{name}.dequant.{k}"] = deq[k].contiguous()
    base.save_file(outputs, target / "io_fp8.safetensors", meta)
    base.save_file(decode_tables(), target / "decode.safetensors", meta)
    if not check:
        print(f"wrote {folder}")
        return 0
    bad = 0
    for name in ["decode", "comfyui_scaled", "e5m2"]:  # bit for bit
        a, b = load_file(str(target / f"{name}.safetensors")), \
            load_file(str(folder / f"{name}.safetensors"))
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b or not same_bits(a[k], b[k]):
                print(f"MISMATCH {name} {k}")
                bad += 1
    bad += check_file(target / "io_fp8.safetensors", folder / "io_fp8.safetensors", tolerance,
                      "io_fp8")
    print("check:", "ok" if not bad else f"{bad} mismatches")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_fixture_args(ap, device=False)
    args = parse_fixture_args(ap)
    sys.exit(generate(Path(args.out), args.check, args.tolerance))


if __name__ == "__main__":
    main()
