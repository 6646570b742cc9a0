#!/usr/bin/env python3
"""Video VAE benchmark: the Wan 2.1 VAE (diffusers AutoencoderKLWan, full config, random
weights, bf16) in video mode, gst-latent's engine next to diffusers eager and torch.compile in
the same run, on the GPU machine.

For each size (832x480, 1280x720) it times encode of an 81-frame clip [1, 3, 81, H, W] and decode
of its 21 latent frames [1, 16, 21, H/8, W/8]:
  - diffusers eager: CUDA events around `vae.encode(x).latent_dist.mean` / `vae.decode(z).sample`
    (diffusers' own chunking: frame 0, then 4 frames a chunk; one latent frame a decode chunk),
    median of --repeat runs after warm-up; peak memory = torch.cuda.max_memory_allocated less
    what was allocated before (weights and input);
  - torch.compile: the same calls with vae.encoder / vae.decoder compiled (static shapes: one
    graph for the first chunk, one for the others), where it compiles within --compile-budget-s;
  - gst-latent: `latent-tool run --json` on the same weights with the 5-D tensor (the engine's
    VaeStream), frames/s and the engine's peak device memory less its weights and input
    (`base_bytes`); its output is compared with eager's (relative L2);
  - streaming: the same clip pushed --stream-repeat times into one engine stream, 4 frames a push
    (--chunk 4; the decoder one latent frame a push): ~1,000 frames, peak device memory (does it
    stay at the 81-frame figure?);
  - the floor: FLOPs counted by torch.utils.flop_counter on the eager call, less the causal
    convolutions' products with zero padding and 5/9 of the upsamplers' 3x3 convolutions (their
    input is nearest-2x upsampled: bench_vae.count_flops), over the measured bf16 matmul peak.
Writes JSON to --out after every row and prints a table with ratios.

  python3 bench/bench_video_vae.py --tool /tmp/dev/bin/latent-tool --out bench/results/video_vae.json
  # the Wan 2.2 VAE (48 channels, 16x; latents [1, 48, 21, H/16, W/16]):
  python3 bench/bench_video_vae.py --model wan2.2 --tool ... --out bench/results/video_vae_wan22.json
  # the diffusers wheel carried to the GPU machine (no diffusers there):
  python3 bench/bench_video_vae.py --tool ... --diffusers-wheel-dir .carry/ref
  # CPU dry run of the script's logic (tiny config, 9 frames of 64x48):
  python3 bench/bench_video_vae.py --smoke --device cpu --tool build/tools/latent-tool --out /tmp/v.json
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time


def add_diffusers_wheel(argv):
    """--diffusers-wheel-dir DIR: import diffusers from the wheel in DIR (a wheel is a zip that
    Python can import from directly), for a machine without diffusers installed."""
    if "--diffusers-wheel-dir" not in argv:
        return
    d = argv[argv.index("--diffusers-wheel-dir") + 1]
    wheels = sorted(glob.glob(os.path.join(d, "diffusers-*.whl")))
    if not wheels:
        raise SystemExit(f"--diffusers-wheel-dir {d}: no diffusers-*.whl there")
    sys.path.insert(0, wheels[-1])


add_diffusers_wheel(sys.argv)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vae as bv  # noqa: E402  (fresh Inductor/Triton caches unless --warm-cache)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

SIZES = ["832x480", "1280x720"]


# The Wan 2.2 VAE (Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json; the statistics do not change
# the timings).
WAN22_CONFIG = dict(base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, in_channels=12,
                    out_channels=12, patch_size=2, scale_factor_spatial=16,
                    latents_mean=[0.0] * 48, latents_std=[1.0] * 48)


def make_model(smoke, variant="wan2.1"):
    import diffusers

    torch.manual_seed(0)
    if variant == "wan2.2":
        if smoke:
            return diffusers.AutoencoderKLWan(**dict(WAN22_CONFIG, base_dim=8, decoder_base_dim=8,
                                                     z_dim=4, dim_mult=[1, 2, 2, 2],
                                                     num_res_blocks=1, latents_mean=[0.0] * 4,
                                                     latents_std=[1.0] * 4))
        return diffusers.AutoencoderKLWan(**WAN22_CONFIG)
    if smoke:
        return diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2],
                                          num_res_blocks=1, temperal_downsample=[False, True, True],
                                          latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    return diffusers.AutoencoderKLWan()  # the Wan 2.1 VAE config (Wan-AI/Wan2.1-T2V-14B-Diffusers)


def count_flops(fn, x, model):
    """(useful FLOPs, FLOPs PyTorch executes): flop_counter's count less the products of the
    causal 3-D convolutions with their zero padding (no cache, or a cache shorter than 2 frames:
    output frame t's tap k reads padding when t + k < pad) and 5/9 of each 3x3 convolution of a
    nearest-2x upsampled input (the resamplers' spatial convs; see bench_vae.count_flops)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
    from torch.utils.flop_counter import FlopCounterMode

    padded = [0]

    def hook(mod, inp, out):
        kt = mod.kernel_size[0]
        if kt == 1:
            return
        cache = inp[1] if len(inp) > 1 else None
        pad = mod._padding[4] - (cache.shape[2] if cache is not None else 0)
        if pad <= 0:
            return
        b, co, t, h, w = out.shape
        pairs = sum(1 for o in range(t) for k in range(kt) if o * mod.stride[0] + k < pad)
        padded[0] += 2 * b * co * h * w * mod.in_channels * mod.kernel_size[1] * mod.kernel_size[2] * pairs

    def up_hook(mod, inp, out):
        padded[0] += bv.upsampled_conv_repeats(mod, inp, out)

    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, WanCausalConv3d)]
    hs += [m.register_forward_hook(up_hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    try:
        with FlopCounterMode(display=False) as fc:
            fn(x)
    finally:
        for h in hs:
            h.remove()
    total = fc.get_total_flops()
    return total - padded[0], total


def run_ours(args, model_dir, part, inputs, outputs, warmup, repeat, extra=()):
    cmd = [args.tool, "run", "--model", model_dir, "--part", part, "--inputs", inputs, "--outputs",
           outputs, "--device", args.tool_device, "--dtype", args.dtype, "--warmup", str(warmup),
           "--repeat", str(repeat), "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-500:]}
    return json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][-1])


def gib(b):
    return f"{b / 2**30:5.2f}" if b is not None else "    -"


def print_table(rows):
    hdr = (f"{'part':7} {'size':8} {'frames':>6} {'eager f/s':>9} {'comp f/s':>8} {'ours f/s':>8} "
           f"{'vs eager':>8} {'vs comp':>7} {'floor f/s':>9} {'of floor':>8} {'relL2':>8} "
           f"{'peak GiB eager/comp/ours':>24} {'stream GiB':>10}")
    print("\n" + hdr)
    nan = float("nan")
    for r in rows:
        e, c, o, fl = (r.get(k) for k in ("eager_fps", "compile_fps", "ours_fps", "floor_fps"))
        vs_e = f"{o / e:7.2f}x" if o and e else "    -   "
        vs_c = f"{o / c:6.2f}x" if o and c else "   -   "
        of_floor = f"{o / fl:7.0%}" if o and fl else "     -  "
        peak = f"{gib(r.get('eager_peak_bytes'))}/{gib(r.get('compile_peak_bytes'))}/{gib(r.get('ours_peak_bytes'))}"
        print(f"{r['part']:7} {r['size']:8} {r['frames']:6d} {e or nan:9.1f} {c or nan:8.1f} {o or nan:8.1f} "
              f"{vs_e:>8} {vs_c:>7} {fl or nan:9.1f} {of_floor:>8} {r.get('ours_vs_eager_rel_l2', nan):8.1e} "
              f"{peak:>24} {gib(r.get('stream_peak_bytes')):>10}")
        for k in ("ours_error", "compile_error", "compile_skipped", "stream_error"):
            if k in r:
                print(f"   {k}: {str(r[k])[:300]}")
        if "stream_frames" in r:
            print(f"   streaming {r['stream_frames']} frames: {r.get('stream_fps', nan):.1f} frames/s, "
                  f"peak {gib(r.get('stream_peak_bytes'))} GiB above weights and input "
                  f"(81-frame clip: {gib(r.get('ours_peak_bytes'))} GiB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="latent-tool (CUDA build); 'none' skips ours")
    ap.add_argument("--tool-device", default="cuda", help="--device for latent-tool (cpu for --smoke)")
    ap.add_argument("--out", default="bench/results/video_vae.json")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--frames", type=int, default=81, help="clip length (1 + 4k)")
    ap.add_argument("--parts", default="encoder,decoder")
    ap.add_argument("--stream-repeat", type=int, default=12,
                    help="streaming row: the clip pushed this many times into one stream (12 x 81 = 972 frames)")
    ap.add_argument("--compile", default="static", choices=["static", "none"])
    ap.add_argument("--compile-budget-s", type=float, default=600)
    ap.add_argument("--budget-s", type=float, default=0, help="start no new row after this many seconds")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny config, 9 frames of 64x48 (dry run)")
    ap.add_argument("--model", default="wan2.1", choices=["wan2.1", "wan2.2"],
                    help="wan2.2: the Wan 2.2 VAE (is_residual, 2x2 patches, 48 channels, 16x)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--warm-cache", action="store_true", help="(read by bench_vae.py at import)")
    ap.add_argument("--profile", action="store_true",
                    help="also one streamed clip of ours with LATENT_CUDA_PROFILE=1: the per-op table")
    ap.add_argument("--skip-torch", action="store_true",
                    help="no eager/compile/FLOP count (ours and --profile only)")
    ap.add_argument("--diffusers-wheel-dir", default=None, help="import diffusers from the wheel in this folder")
    args = ap.parse_args()
    t_start = time.time()
    if args.smoke:
        if args.sizes == ",".join(SIZES):
            args.sizes = "64x48"
        if args.frames == 81:
            args.frames = 9
        args.stream_repeat = min(args.stream_repeat, 3)
    if (args.frames - 1) % 4:
        ap.error("--frames must be 1 + 4k")

    import diffusers

    torch.backends.cudnn.benchmark = True
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    work = args.workdir or tempfile.mkdtemp(prefix="latent-video-bench-")
    peak_tflops = bv.matmul_peak_tflops(args.device, 8192 if cuda else 256)
    env = {"gpu": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
           "diffusers": diffusers.__version__, "dtype": args.dtype, "frames": args.frames,
           "matmul_peak_tflops": round(peak_tflops, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "model": f"AutoencoderKLWan ({'Wan 2.2' if args.model == 'wan2.2' else 'Wan 2.1'} config), "
                    "random weights", "smoke": args.smoke}
    print(f"# {env}", flush=True)
    rows = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def dump():
        with open(args.out + ".tmp", "w") as fp:
            json.dump({"env": env, "rows": rows}, fp, indent=1)
        os.replace(args.out + ".tmp", args.out)

    model_dir = os.path.join(work, "wan22-vae" if args.model == "wan2.2" else "wan21-vae")
    m = make_model(args.smoke, args.model).eval()
    down = m.config.scale_factor_spatial if args.model == "wan2.2" else 8
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        import copy
        copy.deepcopy(m).to(tdtype).save_pretrained(model_dir, safe_serialization=True)
    m = m.to(dev, tdtype)
    enc = lambda x: m.encode(x).latent_dist.mean  # noqa: E731
    dec = lambda z: m.decode(z).sample  # noqa: E731
    compiled = None
    compile_total = 0.0
    t_lat = 1 + (args.frames - 1) // 4
    for size in args.sizes.split(","):
        w, h = (int(v) for v in size.split("x"))
        g = torch.Generator(device="cpu").manual_seed(1)
        x = torch.rand(1, 3, args.frames, h, w, generator=g) * 2 - 1
        z = torch.randn(1, m.config.z_dim, t_lat, h // down, w // down, generator=g)
        for part in args.parts.split(","):
            if args.budget_s and time.time() - t_start > args.budget_s:
                env["stopped_at"] = f"{part} {size} (budget)"
                print(f"# budget spent: stopping before {part} {size}", flush=True)
                break
            encoder = part == "encoder"
            inp, fn = (x, enc) if encoder else (z, dec)
            xin = inp.to(dev, tdtype)
            row = {"part": part, "size": size, "frames": args.frames}
            ref = None
            with torch.no_grad():
                if not args.skip_torch:
                    row["flops"], row["torch_executed_flops"] = count_flops(fn, xin, m)
                    floor_s = row["flops"] / (peak_tflops * 1e12)
                    row["floor_ms"] = floor_s * 1e3
                    row["floor_fps"] = args.frames / floor_s
                    row["eager_ms"], row["eager_peak_bytes"], ref = bv.time_fn(fn, xin, args.warmup, args.repeat)
                    row["eager_fps"] = args.frames / (row["eager_ms"] / 1e3)
                    if args.compile == "static" and compile_total > args.compile_budget_s:
                        row["compile_skipped"] = f"compile budget {args.compile_budget_s:.0f} s spent"
                    elif args.compile == "static":
                        try:
                            if compiled is None:
                                compiled = make_model(args.smoke, args.model).eval()
                                compiled.load_state_dict(m.state_dict())
                                compiled = compiled.to(dev, tdtype)
                                compiled.encoder = torch.compile(compiled.encoder, dynamic=False)
                                compiled.decoder = torch.compile(compiled.decoder, dynamic=False)
                            cfn = ((lambda v: compiled.encode(v).latent_dist.mean) if encoder
                                   else (lambda v: compiled.decode(v).sample))
                            t0 = time.time()
                            cfn(xin)
                            if cuda:
                                torch.cuda.synchronize()
                            row["compile_s"] = round(time.time() - t0, 1)
                            compile_total += row["compile_s"]
                            row["compile_ms"], row["compile_peak_bytes"], cy = bv.time_fn(cfn, xin, args.warmup, args.repeat)
                            row["compile_fps"] = args.frames / (row["compile_ms"] / 1e3)
                            row["compile_vs_eager_rel_l2"] = bv.rel_l2(cy, ref)
                            del cy
                        except Exception as e:  # eager and ours still count
                            row["compile_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            if args.tool != "none":
                inputs = os.path.join(work, f"{part}-{size}-in.safetensors")
                outputs = os.path.join(work, f"{part}-{size}-out.safetensors")
                save_file({"sample" if encoder else "latent": inp.to(tdtype).contiguous()}, inputs)
                ours = run_ours(args, model_dir, part, inputs, outputs, args.warmup, args.repeat)
                if "error" in ours:
                    row["ours_error"] = ours["error"]
                else:
                    row["ours_ms"] = ours["median_ms"]
                    row["ours_fps"] = ours["frames_per_s"]
                    row["ours_peak_bytes"] = (ours["peak_bytes"] - ours["base_bytes"]
                                              if ours["peak_bytes"] >= 0 else None)  # -1: not tracked (CPU)
                    row["ours_peak_total_bytes"] = ours["peak_bytes"]
                    out = next(iter(load_file(outputs).values()))
                    if ref is not None:
                        row["ours_vs_eager_rel_l2"] = bv.rel_l2(out, ref.float().cpu())
                # ~1,000 frames through one stream, 4 frames (or one latent frame) a push
                st = run_ours(args, model_dir, part, inputs, outputs, 0, 1,
                              ["--chunk", "4" if encoder else "1", "--stream-repeat", str(args.stream_repeat)])
                if "error" in st:
                    row["stream_error"] = st["error"]
                else:
                    row["stream_frames"] = st["frames"]
                    row["stream_fps"] = st["frames_per_s"]
                    row["stream_peak_bytes"] = (st["peak_bytes"] - st["base_bytes"]
                                                if st["peak_bytes"] >= 0 else None)
                if args.profile:
                    cmd = [args.tool, "run", "--model", model_dir, "--part", part, "--inputs", inputs,
                           "--outputs", outputs, "--device", args.tool_device, "--dtype", args.dtype,
                           "--warmup", "0", "--repeat", "1", "--chunk", "4" if encoder else "1",
                           "--stream-repeat", str(args.stream_repeat)]  # start-up costs amortised
                    p = subprocess.run(cmd, capture_output=True, text=True,
                                       env=dict(os.environ, LATENT_CUDA_PROFILE="1"))
                    row["profile"] = [l[2:] for l in p.stderr.splitlines() if l.startswith("# ")][:45]
                    print(f"# profile {part} {size} (one streamed clip, each op synchronised):", flush=True)
                    for l in row["profile"]:
                        print(f"#   {l}", flush=True)
                os.remove(inputs)
            del xin
            ref = None
            if cuda:
                torch.cuda.empty_cache()
            rows.append(row)
            dump()
            print(f"# {part} {size}: {json.dumps({k: v for k, v in row.items() if not k.endswith('flops')})}",
                  flush=True)
    print_table(rows)
    print(f"# wrote {args.out} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
