#!/usr/bin/env python3
"""One denoising step (one transformer forward) of the full-size Qwen-Image MMDiT (random
weights, bf16, ~41 GB) at 1024x1024 (4,096 image tokens; edit: 8,192 = target + reference),
gst-latent next to PyTorch eager and torch.compile in the same run, on the GPU machine.

  python3 bench/bench_dit.py --tool /tmp/dev/bin/latent-tool --out bench/results/dit.json

The weights are written once as a sharded diffusers folder (`--workdir`, ~41 GB of disk) that
latent-tool loads; the outputs of both are compared (relative L2).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file


def time_cuda(fn, warmup, repeat):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y = fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2], y


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--out", default="bench/results/dit.json")
    ap.add_argument("--workdir", default="/tmp/latent-dit")
    ap.add_argument("--layers", type=int, default=60, help="60 = full size; fewer for a quick look")
    ap.add_argument("--text-tokens", type=int, default=128)
    ap.add_argument("--cases", default="t2i,edit")
    ap.add_argument("--compile", default="static", choices=["static", "none"])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import diffusers

    torch.backends.cuda.matmul.allow_tf32 = True
    dev, dt = torch.device("cuda"), torch.bfloat16
    cfg = dict(num_layers=args.layers, zero_cond_t=False)
    folder = os.path.join(args.workdir, f"transformer-{args.layers}")
    with torch.device(dev):
        torch.manual_seed(0)
        m = diffusers.QwenImageTransformer2DModel(**cfg).to(dt).eval()
    params = sum(p.numel() for p in m.parameters())
    if not os.path.exists(os.path.join(folder, "config.json")):
        t0 = time.time()
        m.save_pretrained(folder, safe_serialization=True, max_shard_size="10GB")
        print(f"# wrote {params / 1e9:.2f}B parameters to {folder} in {time.time() - t0:.0f} s", flush=True)
    rows = []
    g = torch.Generator(device="cpu").manual_seed(1)
    h = w = 64  # latent 128x128 /2 patches = 64x64 = 4096 tokens (1024x1024 image)
    for case in args.cases.split(","):
        n_img = 1 if case == "t2i" else 2
        tokens = n_img * h * w
        x = torch.randn(1, tokens, 64, generator=g)
        txt = torch.randn(1, args.text_tokens, 3584, generator=g)
        mask = torch.ones(1, args.text_tokens)
        mask[:, args.text_tokens * 3 // 4:] = 0
        t = torch.tensor([0.6])
        shapes = [(1, h, w)] * n_img
        inputs = dict(hidden_states=x.to(dev, dt), encoder_hidden_states=txt.to(dev, dt),
                      encoder_hidden_states_mask=mask.to(dev, dt), timestep=t.to(dev, dt))
        fn = lambda mm=m: mm(**inputs, img_shapes=[shapes], return_dict=False)[0]
        row = {"case": case, "image_tokens": tokens, "text_tokens": args.text_tokens,
               "layers": args.layers, "parameters": params}
        # FLOPs: the image and text streams each hold about half the weights and apply them to
        # their own tokens (2 * params/2 * T), plus joint attention 4 * T^2 * D per layer.
        T = tokens + args.text_tokens
        row["flops"] = params * T + args.layers * 4 * T * T * 3072
        with torch.no_grad():
            row["eager_ms"], ref = time_cuda(fn, 2, args.repeat)
            if args.compile == "static":
                cm = torch.compile(m, dynamic=False)
                cfn = lambda: cm(**inputs, img_shapes=[shapes], return_dict=False)[0]
                t0 = time.time()
                cfn()
                row["compile_s"] = round(time.time() - t0, 1)
                row["compile_ms"], _ = time_cuda(cfn, 2, args.repeat)
                del cm, cfn
                torch._dynamo.reset()
        inp = os.path.join(args.workdir, f"in-{case}.safetensors")
        save_file({"hidden_states": x, "encoder_hidden_states": txt, "encoder_hidden_states_mask": mask,
                   "timestep": t, "img_shapes": torch.tensor(shapes, dtype=torch.float32)}, inp)
        row["_inp"], row["_ref"] = inp, ref.float().cpu()
        del inputs, fn, ref
        rows.append(row)
        torch.cuda.empty_cache()
    # Free PyTorch's copy of the weights before ours loads (41 GB each).
    del m
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    for row in rows:
        case, inp, ref = row["case"], row.pop("_inp"), row.pop("_ref")
        outp = os.path.join(args.workdir, f"out-{case}.safetensors")
        p = subprocess.run([args.tool, "run", "--part", "transformer", "--model", folder, "--inputs", inp,
                            "--outputs", outp, "--device", "cuda", "--dtype", "bf16", "--warmup", "2",
                            "--repeat", str(args.repeat), "--json"], capture_output=True, text=True)
        if p.returncode != 0:
            row["ours_error"] = (p.stderr or p.stdout)[-600:]
        else:
            j = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
            row["ours_ms"], row["ours_peak_bytes"] = j["median_ms"], j.get("peak_bytes")
            out = next(iter(load_file(outp).values())).float()
            row["ours_vs_torch_rel_l2"] = float((out - ref).norm() / ref.norm())
        print(json.dumps(row), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "diffusers": diffusers.__version__, "rows": rows}, open(args.out, "w"), indent=1)
    print(f"\n{'case':5} {'tokens':>7} {'eager ms':>9} {'compile ms':>10} {'ours ms':>8} {'relL2':>8}")
    for r in rows:
        print(f"{r['case']:5} {r['image_tokens']:7} {r['eager_ms']:9.1f} {r.get('compile_ms', float('nan')):10.1f} "
              f"{r.get('ours_ms', float('nan')):8.1f} {r.get('ours_vs_torch_rel_l2', float('nan')):8.1e}")
        if "ours_error" in r:
            print("  ours failed:", r["ours_error"])


if __name__ == "__main__":
    sys.exit(main())
