#!/usr/bin/env python3
"""VAE benchmark: gst-latent's engine next to PyTorch eager and torch.compile (diffusers), same
weights, same run, on the GPU machine.

For each model (Qwen-Image VAE full config, FLUX.1 VAE, a TAESD-size tiny VAE; random weights)
and size (512x512, 1024x1024, 1280x720, 1920x1088) it times encode and decode:
  - PyTorch eager and torch.compile: CUDA events around each call, median of --repeat runs after
    warm-up, peak memory from torch.cuda.max_memory_allocated;
  - gst-latent: `latent-tool run --json` on the same weights (saved by diffusers), which reports
    the median and the engine's peak device memory; its output is checked against PyTorch's
    (relative L2) so a fast wrong answer shows;
  - the floor: FLOPs counted by torch.utils.flop_counter over the measured matrix-unit peak.
Writes JSON to --out and prints a table.

  python3 bench/bench_vae.py --tool build/tools/latent-tool --out bench/results/vae.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file

SIZES = ["512x512", "1024x1024", "1280x720", "1920x1088"]


def make_model(name):
    import diffusers

    torch.manual_seed(0)
    if name == "qwen":
        # The Qwen-Image VAE config (diffusers Qwen/Qwen-Image vae/config.json).
        m = diffusers.AutoencoderKLQwenImage(
            base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
            temperal_downsample=[False, True, True], dropout=0.0)
    elif name == "flux":
        m = diffusers.AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=16,
            down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
            block_out_channels=[128, 256, 512, 512], layers_per_block=2, norm_num_groups=32,
            scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
            use_post_quant_conv=False, sample_size=1024)
    elif name == "taesd":
        m = diffusers.AutoencoderTiny(latent_channels=4)
    else:
        raise SystemExit(f"unknown model {name}")
    return m


def encode_fn(name, m):
    if name == "qwen":
        return lambda x: m.encode(x.unsqueeze(2)).latent_dist.mean.squeeze(2)
    if name == "taesd":
        return lambda x: m.encode(x).latents
    return lambda x: m.encode(x).latent_dist.mean


def decode_fn(name, m):
    if name == "qwen":
        return lambda z: m.decode(z.unsqueeze(2)).sample.squeeze(2)
    return lambda z: m.decode(z).sample


def time_cuda(fn, x, warmup, repeat):
    torch.cuda.synchronize()
    for _ in range(warmup):
        fn(x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y = fn(x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    peak = torch.cuda.max_memory_allocated() - base
    times.sort()
    return times[len(times) // 2], peak, y


def count_flops(fn, x, model):
    """FLOPs of one call as torch.utils.flop_counter counts them, less the causal 3-D convs'
    zero-padded temporal taps: for a single frame only the last of kt taps touches data (the
    Qwen-Image / Wan VAE), so (kt - 1)/kt of each such conv is multiplication by zero padding.
    Returns (useful FLOPs, FLOPs PyTorch executes)."""
    from torch.utils.flop_counter import FlopCounterMode

    padded = [0]

    def hook(mod, inp, out):
        kt = mod.kernel_size[0]
        if kt > 1 and inp[0].shape[2] == 1:
            b, co, t, h, w = out.shape
            full = 2 * b * co * t * h * w * mod.in_channels * kt * mod.kernel_size[1] * mod.kernel_size[2]
            padded[0] += full * (kt - 1) // kt

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv3d)]
    try:
        with FlopCounterMode(display=False) as fc:
            fn(x)
    finally:
        for h in handles:
            h.remove()
    total = fc.get_total_flops()
    return total - padded[0], total


def matmul_peak_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms, _, _ = time_cuda(lambda _: a @ b, None, 3, 10)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def run_ours(tool, model_dir, part, inputs, outputs, warmup, repeat, dtype):
    cmd = [tool, "run", "--model", model_dir, "--part", part, "--inputs", inputs, "--outputs",
           outputs, "--device", "cuda", "--dtype", dtype, "--warmup", str(warmup), "--repeat",
           str(repeat), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-500:]}
    line = [l for l in p.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="path to latent-tool (CUDA build)")
    ap.add_argument("--out", default="bench/results/vae.json")
    ap.add_argument("--models", default="qwen,flux,taesd")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--parts", default="encoder,decoder")
    ap.add_argument("--compile", default="static", choices=["static", "none"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dev = torch.device("cuda")
    work = args.workdir or tempfile.mkdtemp(prefix="latent-bench-")
    peak_tflops = matmul_peak_tflops()
    env = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "diffusers": __import__("diffusers").__version__, "dtype": args.dtype,
        "matmul_peak_tflops": round(peak_tflops, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"# {env}", flush=True)
    rows = []
    for name in args.models.split(","):
        m = make_model(name).eval()
        model_dir = os.path.join(work, name)
        m.to(tdtype).save_pretrained(model_dir, safe_serialization=True)
        m = m.to(dev)
        enc, dec = encode_fn(name, m), decode_fn(name, m)
        f = 8
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            g = torch.Generator(device="cpu").manual_seed(1)
            x = (torch.rand(1, 3, h, w, generator=g) * 2 - 1)
            c = m.config.latent_channels if name != "qwen" else m.config.z_dim
            z = torch.randn(1, c, h // f, w // f, generator=g)
            for part in args.parts.split(","):
                inp = x if part == "encoder" else z
                fn = enc if part == "encoder" else dec
                xin = inp.to(dev, tdtype)
                row = {"model": name, "part": part, "size": size}
                with torch.no_grad():
                    row["flops"], row["torch_executed_flops"] = count_flops(fn, xin, m)
                    row["floor_ms"] = row["flops"] / (peak_tflops * 1e12) * 1e3
                    row["eager_ms"], row["eager_peak_bytes"], ref = time_cuda(fn, xin, args.warmup, args.repeat)
                    if args.compile == "static":
                        cfn = torch.compile(fn, dynamic=False)
                        t0 = time.time()
                        cfn(xin)
                        row["compile_s"] = round(time.time() - t0, 1)
                        row["compile_ms"], row["compile_peak_bytes"], _ = time_cuda(cfn, xin, args.warmup, args.repeat)
                        torch._dynamo.reset()
                inputs = os.path.join(work, f"{name}-{part}-{size}-in.safetensors")
                outputs = os.path.join(work, f"{name}-{part}-{size}-out.safetensors")
                save_file({"sample" if part == "encoder" else "latent": inp.contiguous()}, inputs)
                ours = run_ours(args.tool, model_dir, part, inputs, outputs, args.warmup, args.repeat, args.dtype)
                if "error" in ours:
                    row["ours_error"] = ours["error"]
                else:
                    row["ours_ms"] = ours["median_ms"]
                    row["ours_peak_bytes"] = ours["peak_bytes"]
                    out = next(iter(load_file(outputs).values()))
                    row["ours_vs_torch_rel_l2"] = rel_l2(out, ref.float().cpu())
                rows.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
        del m
        torch.cuda.empty_cache()

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fp:
        json.dump({"env": env, "rows": rows}, fp, indent=1)
    hdr = f"{'model':6} {'part':7} {'size':9} {'eager':>8} {'compile':>8} {'ours':>8} {'vs comp':>7} {'floor':>7} {'relL2':>8} {'peak MB t/o':>13}"
    print("\n" + hdr)
    for r in rows:
        ours = r.get("ours_ms")
        comp = r.get("compile_ms")
        ratio = f"{comp / ours:6.2f}x" if ours and comp else "   -   "
        peak = f"{r['eager_peak_bytes'] / 2**20:6.0f}/{(r.get('ours_peak_bytes') or -1) / 2**20:6.0f}"
        print(f"{r['model']:6} {r['part']:7} {r['size']:9} {r['eager_ms']:8.2f} "
              f"{comp if comp else float('nan'):8.2f} {ours if ours else float('nan'):8.2f} {ratio:>7} "
              f"{r['floor_ms']:7.2f} {r.get('ours_vs_torch_rel_l2', float('nan')):8.1e} {peak:>13}")
        if "ours_error" in r:
            print(f"   ours failed: {r['ours_error']}")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
