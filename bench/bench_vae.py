#!/usr/bin/env python3
"""VAE benchmark: gst-latent's engine next to PyTorch eager and torch.compile (diffusers), same
weights, same run, on the GPU machine.

For each model (Qwen-Image VAE full config, FLUX.1 VAE, a TAESD-size tiny VAE, random weights;
`default`: the built-in default model of models/default, its own weights, loaded from that folder
by both sides) and size (512x512, 1024x1024, 1280x720, 1920x1088) it times encode and decode:
  - PyTorch eager and torch.compile: CUDA events around each call, median of --repeat runs after
    warm-up, peak memory from torch.cuda.max_memory_allocated;
  - gst-latent: `latent-tool run --json` on the same weights (saved by diffusers), which reports
    the median and the engine's peak device memory; its output is checked against PyTorch's
    (relative L2) so a fast wrong answer shows. Memory: `ours_peak_bytes` is the most in use
    from before planning on, weights and input included (an upper bound: the pool's mark plus
    the graph's own); `ours_steady_extra_bytes` is counted as PyTorch's peak is (the most in use
    during the timed runs beyond what was resident before them); `ours_held_bytes` is what the
    engine holds from the driver after the runs;
  - the floor: FLOPs counted by torch.utils.flop_counter over the measured matrix-unit peak, less
    the work no output needs: the zero-padded temporal taps of the causal 3-D convolutions on one
    frame, and 5/9 of each 3x3 convolution of a nearest-2x upsampled input (its four output
    phases read 2x2 distinct input pixels each: engine/models/vae/upsample_conv.h).
Writes JSON to --out after every row (a timeout still leaves the rows done) and prints a table.

  python3 bench/bench_vae.py --tool build/tools/latent-tool --out bench/results/vae.json
  # one model, two sizes, decode only, compile capped at 120 s, whole run capped at 300 s:
  python3 bench/bench_vae.py --tool ... --models flux --sizes 512x512,1024x1024 --parts decoder \
      --compile-budget-s 120 --budget-s 300
  # CPU dry run of the script's logic (tiny configs, no latent-tool):
  python3 bench/bench_vae.py --smoke --device cpu --tool none --out /tmp/vae-smoke.json

torch.compile runs per (model, part, size) with static shapes (`torch._dynamo.reset()` between
them, so no size is compiled with dynamic shapes); its wall time is printed and stored as
`compile_s`. Earlier runs had only eager columns for FLUX and TAESD because gpu-checks.sh passed
`--compile none` for them (time), not because compile failed; Qwen took 14-22 s per compile.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if "--warm-cache" not in sys.argv:  # cold compile times: fresh Inductor/Triton caches for this run
    _c = tempfile.mkdtemp(prefix="bench-vae-compile-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_c, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_c, "triton")

import torch
from safetensors.torch import load_file, save_file

SIZES = ["512x512", "1024x1024", "1280x720", "1920x1088"]
# The built-in default model (an AutoencoderTiny with 64 channels and 32 latent channels).
DEFAULT_MODEL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "models", "default")


def make_model(name, smoke=False):
    import diffusers

    torch.manual_seed(0)
    if name == "default":  # its own (small) weights, also in a dry run
        return diffusers.AutoencoderTiny.from_pretrained(DEFAULT_MODEL_DIR)
    if smoke:  # tiny configs of the same classes, for a CPU dry run of this script's logic
        if name == "qwen":
            return diffusers.AutoencoderKLQwenImage(
                base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[False, True, True], dropout=0.0)
        if name == "flux":
            return diffusers.AutoencoderKL(
                in_channels=3, out_channels=3, latent_channels=4,
                down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                block_out_channels=[8, 8, 16, 16], layers_per_block=1, norm_num_groups=4)
        if name == "taesd":
            return diffusers.AutoencoderTiny(latent_channels=4, encoder_block_out_channels=(8, 8, 8, 8),
                                             decoder_block_out_channels=(8, 8, 8, 8))
        raise SystemExit(f"unknown model {name}")
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
    if name in ("taesd", "default"):
        return lambda x: m.encode(x).latents
    return lambda x: m.encode(x).latent_dist.mean


def decode_fn(name, m):
    if name == "qwen":
        return lambda z: m.decode(z.unsqueeze(2)).sample.squeeze(2)
    return lambda z: m.decode(z).sample


def time_fn(fn, x, warmup, repeat):
    """Median ms of `repeat` calls after `warmup`, peak extra device memory (bytes; None on the
    CPU) and the last output. CUDA events on the GPU, the host clock (after the call) on the CPU."""
    cuda = torch.cuda.is_available() and (x is None or x.is_cuda)
    if cuda:
        torch.cuda.synchronize()
    for _ in range(warmup):
        fn(x)
    peak = None
    times = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    for _ in range(repeat):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            y = fn(x)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            y = fn(x)
            times.append((time.perf_counter() - t0) * 1e3)
    if cuda:
        peak = torch.cuda.max_memory_allocated() - base
    times.sort()
    return times[len(times) // 2], peak, y


time_cuda = time_fn  # the old name


def ensure_model_dir(name, model_dir, dtype=torch.bfloat16, smoke=False):
    """The model `name` with this script's random weights, saved by diffusers into model_dir
    (what latent-tool and the gst elements load); returns the model (on the CPU, fp32).
    bench_pipelines.py calls this to make the Qwen-Image VAE folder when it is missing."""
    m = make_model(name, smoke).eval()
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        t0 = time.time()
        import copy
        copy.deepcopy(m).to(dtype).save_pretrained(model_dir, safe_serialization=True)
        print(f"# wrote {name} to {model_dir} in {time.time() - t0:.1f} s", flush=True)
    return m


def is_upsampled2x(x):
    """Whether x's last two dims are a nearest 2x upsampling (every 2x2 block one value)."""
    if x.dim() < 2 or x.shape[-1] < 2 or x.shape[-2] < 2 or x.shape[-1] % 2 or x.shape[-2] % 2:
        return False
    a = x[..., 0::2, 0::2]
    return all(torch.equal(a, x[..., i::2, j::2]) for i, j in ((0, 1), (1, 0), (1, 1)))


def upsampled_conv_repeats(mod, inp, out):
    """A forward hook's count for an nn.Conv2d: 5/9 of its FLOPs where it is a 3x3 convolution
    (stride 1, padding 1) of a nearest-2x upsampled input (each output pixel's 9 taps read 4
    distinct input pixels), else 0."""
    if tuple(mod.kernel_size) == (3, 3) and tuple(mod.stride) == (1, 1) and \
            tuple(mod.padding) == (1, 1) and mod.groups == 1 and is_upsampled2x(inp[0]):
        return 2 * out.numel() * mod.in_channels * 9 * 5 // 9
    return 0


def count_flops(fn, x, model):
    """FLOPs of one call as torch.utils.flop_counter counts them, less the work no output needs:
    - the causal 3-D convs' zero-padded temporal taps: for a single frame only the last of kt
      taps touches data (the Qwen-Image / Wan VAE), so (kt - 1)/kt of each such conv is
      multiplication by zero padding;
    - 5/9 of each 3x3 convolution (stride 1, padding 1) of a nearest-2x upsampled input (the
      upsamplers of every VAE here): each output pixel's 9 taps read 4 distinct input pixels, so
      the same outputs take 4 multiply-adds per input channel (upsample_conv.h's phases).
    Returns (useful FLOPs, FLOPs PyTorch executes)."""
    from torch.utils.flop_counter import FlopCounterMode

    padded = [0]

    def hook(mod, inp, out):
        kt = mod.kernel_size[0]
        if kt > 1 and inp[0].shape[2] == 1:
            b, co, t, h, w = out.shape
            full = 2 * b * co * t * h * w * mod.in_channels * kt * mod.kernel_size[1] * mod.kernel_size[2]
            padded[0] += full * (kt - 1) // kt

    def up_hook(mod, inp, out):
        padded[0] += upsampled_conv_repeats(mod, inp, out)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv3d)]
    handles += [m.register_forward_hook(up_hook) for m in model.modules()
                if isinstance(m, torch.nn.Conv2d)]
    try:
        with FlopCounterMode(display=False) as fc:
            fn(x)
    finally:
        for h in handles:
            h.remove()
    total = fc.get_total_flops()
    return total - padded[0], total


def matmul_peak_tflops(device="cuda", n=8192):
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms, _, _ = time_fn(lambda _: a @ b, a, 3, 10)
    return 2 * n**3 / (ms * 1e-3) / 1e12


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


def mb(b):
    return f"{b / 2**20:6.0f}" if b is not None else "     -"


def print_table(rows):
    hdr = (f"{'model':6} {'part':7} {'size':9} {'eager':>8} {'compile':>8} {'ours':>8} {'vs comp':>7} "
           f"{'floor':>7} {'relL2':>8} {'comp s':>6} {'peak MB eager/comp/ours':>23} "
           f"{'ours steady/held MB':>19}")
    print("\n" + hdr)
    nan = float("nan")
    for r in rows:
        ours, comp = r.get("ours_ms"), r.get("compile_ms")
        ratio = f"{comp / ours:6.2f}x" if ours and comp else "   -   "
        peak = f"{mb(r.get('eager_peak_bytes'))}/{mb(r.get('compile_peak_bytes'))}/{mb(r.get('ours_peak_bytes'))}"
        print(f"{r['model']:6} {r['part']:7} {r['size']:9} {r.get('eager_ms', nan):8.2f} "
              f"{comp if comp else nan:8.2f} {ours if ours else nan:8.2f} {ratio:>7} "
              f"{r.get('floor_ms', nan):7.2f} {r.get('ours_vs_torch_rel_l2', nan):8.1e} "
              f"{r.get('compile_s', nan):6.1f} {peak:>23} "
              f"{mb(r.get('ours_steady_extra_bytes'))}/{mb(r.get('ours_held_bytes'))}")
        for k in ("ours_error", "compile_error", "compile_skipped"):
            if k in r:
                print(f"   {k}: {str(r[k])[:300]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="path to latent-tool (CUDA build); 'none' skips ours")
    ap.add_argument("--out", default="bench/results/vae.json")
    ap.add_argument("--models", default="qwen,flux,taesd")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--parts", default="encoder,decoder")
    ap.add_argument("--compile", default="static", choices=["static", "none"])
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: its default)")
    ap.add_argument("--compile-budget-s", type=float, default=0,
                    help="stop compiling (eager and ours go on) once compiles took this long in all; 0: no cap")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no new row after this many seconds; 0: no cap")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--warm-cache", action="store_true",
                    help="keep the default Inductor/Triton caches (else fresh ones: cold compile times)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run")
    ap.add_argument("--smoke", action="store_true", help="tiny model configs and 64x64 (dry run)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    t_start = time.time()
    if args.smoke and args.sizes == ",".join(SIZES):
        args.sizes = "64x64,64x48"

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    work = args.workdir or tempfile.mkdtemp(prefix="latent-bench-")
    os.makedirs(work, exist_ok=True)  # --models default writes no model folder there first
    peak_tflops = matmul_peak_tflops(args.device, 8192 if cuda else 256)
    env = {
        "gpu": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
        "diffusers": __import__("diffusers").__version__, "dtype": args.dtype,
        "matmul_peak_tflops": round(peak_tflops, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "compile": args.compile, "compile_mode": args.compile_mode, "smoke": args.smoke,
        "compile_cache": "default (warm)" if args.warm_cache else "fresh (cold compile)",
    }
    print(f"# {env}", flush=True)
    rows = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def dump():  # after every row: a timeout keeps what was measured
        with open(args.out + ".tmp", "w") as fp:
            json.dump({"env": env, "rows": rows}, fp, indent=1)
        os.replace(args.out + ".tmp", args.out)

    compile_total = 0.0
    stop = False
    for name in args.models.split(","):
        if stop:
            break
        model_dir = DEFAULT_MODEL_DIR if name == "default" else os.path.join(work, name)
        t0 = time.time()
        m = ensure_model_dir(name, model_dir, tdtype, args.smoke)
        m = m.to(dev, tdtype)
        print(f"# {name}: model ready in {time.time() - t0:.1f} s", flush=True)
        enc, dec = encode_fn(name, m), decode_fn(name, m)
        f = 8
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            g = torch.Generator(device="cpu").manual_seed(1)
            x = (torch.rand(1, 3, h, w, generator=g) * 2 - 1)
            c = m.config.latent_channels if name != "qwen" else m.config.z_dim
            z = torch.randn(1, c, h // f, w // f, generator=g)
            for part in args.parts.split(","):
                if args.budget_s and time.time() - t_start > args.budget_s:
                    print(f"# budget of {args.budget_s:.0f} s spent: stopping before {name} {part} {size}", flush=True)
                    env["stopped_at"] = f"{name} {part} {size} (budget)"
                    stop = True
                    break
                inp = x if part == "encoder" else z
                fn = enc if part == "encoder" else dec
                xin = inp.to(dev, tdtype)
                row = {"model": name, "part": part, "size": size}
                t_row = time.time()
                with torch.no_grad():
                    row["flops"], row["torch_executed_flops"] = count_flops(fn, xin, m)
                    row["floor_ms"] = row["flops"] / (peak_tflops * 1e12) * 1e3
                    row["eager_ms"], row["eager_peak_bytes"], ref = time_fn(fn, xin, args.warmup, args.repeat)
                    if args.compile == "static" and args.compile_budget_s and compile_total > args.compile_budget_s:
                        row["compile_skipped"] = f"compile budget {args.compile_budget_s:.0f} s spent"
                    elif args.compile == "static":
                        torch._dynamo.reset()
                        try:
                            cfn = torch.compile(fn, dynamic=False, mode=args.compile_mode)
                            t0 = time.time()
                            cfn(xin)
                            if cuda:
                                torch.cuda.synchronize()
                            row["compile_s"] = round(time.time() - t0, 1)
                            compile_total += row["compile_s"]
                            row["compile_ms"], row["compile_peak_bytes"], cy = time_fn(cfn, xin, args.warmup, args.repeat)
                            row["compile_vs_eager_rel_l2"] = rel_l2(cy, ref)
                            del cfn, cy
                        except Exception as e:  # keep the row: eager and ours still count
                            row["compile_error"] = f"{type(e).__name__}: {str(e)[:400]}"
                        torch._dynamo.reset()
                if args.tool != "none":
                    inputs = os.path.join(work, f"{name}-{part}-{size}-in.safetensors")
                    outputs = os.path.join(work, f"{name}-{part}-{size}-out.safetensors")
                    save_file({"sample" if part == "encoder" else "latent": inp.contiguous()}, inputs)
                    ours = run_ours(args.tool, model_dir, part, inputs, outputs, args.warmup, args.repeat, args.dtype)
                    if "error" in ours:
                        row["ours_error"] = ours["error"]
                    else:
                        row["ours_ms"] = ours["median_ms"]
                        row["ours_peak_bytes"] = ours["peak_bytes"]
                        # counted as PyTorch's peak is: the most in use during the timed runs
                        # beyond what was resident before (weights, input)
                        if ours.get("steady_peak_bytes", -1) >= 0 and ours.get("base_bytes", -1) >= 0:
                            row["ours_steady_extra_bytes"] = ours["steady_peak_bytes"] - ours["base_bytes"]
                            row["ours_base_bytes"] = ours["base_bytes"]
                            row["ours_held_bytes"] = ours.get("held_bytes")
                        row["ours_graph"] = ours.get("graph")
                        out = next(iter(load_file(outputs).values()))
                        row["ours_vs_torch_rel_l2"] = rel_l2(out, ref.float().cpu())
                row["row_s"] = round(time.time() - t_row, 1)
                rows.append(row)
                dump()
                print(f"# {name} {part} {size}: eager {row['eager_ms']:.2f} ms, compile "
                      f"{row.get('compile_ms', float('nan')):.2f} ms ({row.get('compile_s', '-')} s to compile), "
                      f"ours {row.get('ours_ms', float('nan')):.2f} ms; row {row['row_s']} s, "
                      f"total {time.time() - t_start:.0f} s", flush=True)
                print(json.dumps(row), flush=True)
                del ref
                if cuda:
                    torch.cuda.empty_cache()
            if stop:
                break
        del m, enc, dec
        if cuda:
            torch.cuda.empty_cache()

    env["total_s"] = round(time.time() - t_start, 1)
    env["compile_total_s"] = round(compile_total, 1)
    dump()
    print_table(rows)
    print(f"\nwrote {args.out} ({env['total_s']} s, {env['compile_total_s']} s compiling)")


if __name__ == "__main__":
    sys.exit(main())
