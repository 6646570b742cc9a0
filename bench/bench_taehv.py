#!/usr/bin/env python3
"""TAEW2.1 benchmark: gst-latent's streams next to madebyollin's taehv.py, same weights, same run.

TAEW2.1 at its published shapes with random weights (taehv.py's TAEHV(checkpoint_path=None),
saved as taew2_1.safetensors in fp16), clips of --frames frames (81: 21 latent frames) at
--size (1280x720):
  - taehv.py in fp16: encode_video / decode_video with parallel=True (all frames at once) and
    parallel=False (frame by frame, what its StreamingTAEHV does); median of --repeat timed runs
    after one warm-up run, peak memory from torch.cuda.max_memory_allocated (above the weights);
  - ours: `latent-bench-video` (tools/bench_video_vae.cpp), the VaeStream the elements drive, one
    frame or latent frame a push, outputs dropped as they come; its peak device memory (the
    backend's pool, weights included). It also runs --long-frames (1000) to show that the peak
    does not grow with the clip;
  - a check: a 9-frame clip at --size through ours (`latent-bench-video --clip-in/--clip-out`)
    and taehv.py in --dtype, both against taehv.py in fp32 (relative L2), so a fast wrong answer
    shows;
  - the floor: our streams' convolution FLOPs per frame (counted from the layer shapes; taehv.py
    runs each TGrow after its upsample, 4x the work of ours) over the measured fp16 matmul peak.
Writes JSON to --out and prints a table. Targets (issue 10): decode >= 1,000 frames/s with
<= 0.5 GiB at 1280x720 on an H100.

  python3 bench/bench_taehv.py --taehv-py /path/to/taehv.py \
      --bench build/tools/latent-bench-video --out bench/results/taehv-h100.json
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file, save_file


def load_taehv(path):
    spec = importlib.util.spec_from_file_location("taehv_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_call(fn, repeat):
    """Median seconds of `repeat` calls after one warm-up call; peak extra memory (bytes)."""
    fn()
    sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
        del out
    peak = torch.cuda.max_memory_allocated() - base
    times.sort()
    return times[len(times) // 2], peak


def matmul_peak_tflops(n=8192):
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync()
    return 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12


def conv_flops_per_frame(sd, width, height):
    """FLOPs (2 x MACs) of our streams per video frame, from the weight shapes (each upsample and
    3x3 conv as its four output phases' 2x2 convolutions: 4 multiply-adds a pixel and channel
    pair, not 9; engine/models/vae/upsample_conv.h)."""
    w = lambda k: sd[k].shape
    p = int(round((w("encoder.0.weight")[1] // 3) ** 0.5))
    # Encoder, per input frame: rate = frames at a layer per input frame, r = pixels.
    ew = w("encoder.0.weight")[0]
    r = width * height / (p * p)
    enc = 2 * 9 * 3 * p * p * ew * r
    rate = 1.0
    for j, base in enumerate((2, 7, 12)):
        s = w(f"encoder.{base}.conv.weight")[1] // ew
        enc += 2 * ew * ew * r * rate  # each frame's slice of the TPool conv
        rate /= s
        r /= 4
        enc += 2 * 9 * ew * ew * r * rate  # stride-2 conv
        enc += 3 * 2 * 9 * 4 * ew * ew * r * rate  # MemBlocks: x, past, conv.2, conv.4
    enc += 2 * 9 * ew * w("encoder.17.weight")[0] * r * rate
    # Decoder, per latent frame (TGrow before the upsample), then per output frame.
    n = [w("decoder.1.weight")[0], w("decoder.8.weight")[0], w("decoder.14.weight")[0],
         w("decoder.20.weight")[0]]
    c_lat = w("decoder.1.weight")[1]
    r = width * height / (64 * p * p)
    dec = 2 * 9 * c_lat * n[0] * r
    f = 1
    for j, (grow, s) in enumerate(((7, 1), (13, 2), (19, 2))):
        c = n[j]
        dec += 3 * 2 * 9 * 4 * c * c * r * f
        dec += 2 * c * s * c * r * f
        f *= s
        r *= 4
        dec += 2 * 4 * c * n[j + 1] * r * f  # upsample + 3x3 conv as 4 phases of 2x2 taps
    dec += 2 * 9 * n[3] * 3 * p * p * r * f
    return enc, dec / f


def run_ours(tool, model, part, size, frames, dtype, warmup):
    cmd = [tool, "--model", model, "--device", "cuda", "--dtype", dtype, "--size", size,
           "--frames", str(frames), "--part", part, "--warmup", str(warmup), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-500:]}
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def check_outputs(tool, weights, model32, model_lp, size, dtype, tmp):
    """Ours and taehv.py in `dtype` against taehv.py in fp32 on a 9-frame clip."""
    width, height = size
    g = torch.Generator(device="cuda").manual_seed(1)
    frames = torch.rand((1, 9, 3, height, width), device="cuda", generator=g)  # NTCHW, [0, 1]
    latents = torch.randn((1, 3, 16, height // 8, width // 8), device="cuda", generator=g)
    out = {}
    with torch.no_grad():
        for part, x in (("encoder", frames), ("decoder", latents)):
            run = (lambda m, v: m.encode_video(v, parallel=False, show_progress_bar=False)) \
                if part == "encoder" else \
                (lambda m, v: m.decode_video(v, parallel=False, show_progress_bar=False))
            ref = run(model32, x).float()
            lp = run(model_lp, x.to(next(model_lp.parameters()).dtype)).float()
            ours_in = x.permute(0, 2, 1, 3, 4).contiguous().cpu()  # diffusers' NCTHW
            if part == "encoder":
                ours_in = ours_in * 2 - 1
            else:
                ref, lp = ref * 2 - 1, lp * 2 - 1
            fin, fout = os.path.join(tmp, f"{part}_in.safetensors"), os.path.join(tmp, f"{part}_out.safetensors")
            save_file({"input": ours_in}, fin)
            cmd = [tool, "--model", weights, "--device", "cuda", "--dtype", dtype, "--part", part,
                   "--clip-in", fin, "--clip-out", fout]
            p = subprocess.run(cmd, capture_output=True, text=True)
            ref_ncthw = ref.permute(0, 2, 1, 3, 4).contiguous().cpu()
            row = {"part": part, f"taehv_py_{dtype}_vs_fp32": rel_l2(lp.permute(0, 2, 1, 3, 4).cpu(), ref_ncthw)}
            if p.returncode != 0:
                row["ours_error"] = (p.stderr or p.stdout).strip()[-300:]
            else:
                ours = load_file(fout)["output"]
                row[f"ours_{dtype}_vs_fp32"] = rel_l2(ours, ref_ncthw) if ours.shape == ref_ncthw.shape \
                    else f"shape {list(ours.shape)} != {list(ref_ncthw.shape)}"
            out[part] = row
            print(json.dumps(row), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--taehv-py", required=True, help="madebyollin/taehv's taehv.py")
    ap.add_argument("--bench", default="build/tools/latent-bench-video")
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--long-frames", type=int, default=1000, help="0: skip the long-clip run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--modes", default="parallel,streaming", help="taehv.py modes to time")
    ap.add_argument("--out", default="bench/results/taehv.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_taehv.py needs a CUDA GPU")
    width, height = (int(v) for v in args.size.split("x"))
    tdtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    torch.backends.cudnn.benchmark = True

    mod = load_taehv(args.taehv_py)
    torch.manual_seed(0)
    model = mod.TAEHV(checkpoint_path=None).eval()  # TAEW2.1's shapes (16 channels, patch 1)
    sd = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    tmp = tempfile.mkdtemp(prefix="bench-taehv-")
    weights = os.path.join(tmp, "taew2_1.safetensors")
    save_file(sd, weights)
    model32 = mod.TAEHV(checkpoint_path=None).eval()
    model32.load_state_dict({k: v.float() for k, v in sd.items()})  # the fp16-stored weights
    model32 = model32.to("cuda")
    model = model.to("cuda", tdtype)

    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "taehv_py": os.path.abspath(args.taehv_py), "dtype": args.dtype,
           "size": args.size, "frames": args.frames,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    peak_tflops = matmul_peak_tflops()
    env["matmul_peak_tflops_fp16"] = round(peak_tflops, 1)
    enc_flops, dec_flops = conv_flops_per_frame(sd, width, height)
    env["flops_per_frame"] = {"encoder": enc_flops, "decoder": dec_flops}
    env["check"] = check_outputs(args.bench, weights, model32, model, (width, height), args.dtype, tmp)
    del model32
    floor_fps = {"encoder": peak_tflops * 1e12 / enc_flops, "decoder": peak_tflops * 1e12 / dec_flops}
    rows = []

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fp:
            json.dump({"env": env, "rows": rows}, fp, indent=1)

    t_lat = 1 + (args.frames - 1) // 4
    g = torch.Generator(device="cuda").manual_seed(0)
    frames = torch.rand((1, args.frames, 3, height, width), device="cuda", generator=g, dtype=tdtype)
    latents = torch.randn((1, t_lat, 16, height // 8, width // 8), device="cuda", generator=g,
                          dtype=tdtype)
    with torch.no_grad():
        for mode in args.modes.split(","):
            parallel = mode == "parallel"
            for part in ("encoder", "decoder"):
                if part == "encoder":
                    fn = lambda: model.encode_video(frames, parallel=parallel, show_progress_bar=False)
                else:
                    fn = lambda: model.decode_video(latents, parallel=parallel, show_progress_bar=False)
                try:
                    sec, peak = time_call(fn, args.repeat)
                    row = {"impl": f"taehv.py {mode}", "part": part, "fps": args.frames / sec,
                           "peak_bytes": peak, "seconds": sec}
                except torch.cuda.OutOfMemoryError as e:
                    row = {"impl": f"taehv.py {mode}", "part": part, "error": f"OOM: {e}"[:300]}
                    torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row), flush=True)
                save()
    del model, frames, latents
    torch.cuda.empty_cache()

    for part in ("encoder", "decoder"):
        for n in [args.frames] + ([args.long_frames] if args.long_frames else []):
            r = run_ours(args.bench, weights, part, args.size, n, args.dtype, warmup=9)
            row = {"impl": "ours (stream)", "part": part, "frames": n}
            if "error" in r:
                row["error"] = r["error"]
            else:
                row.update(fps=r["fps"], peak_bytes=r["peak_bytes"], seconds=r["seconds"])
            rows.append(row)
            print(json.dumps(row), flush=True)
            save()

    print(f"\nTAEW2.1 {args.size}, {args.frames} frames, {args.dtype}, {env['gpu']} "
          f"(fp16 matmul peak {peak_tflops:.0f} TFLOP/s)")
    print(f"{'impl':22} {'part':8} {'frames':>6} {'frames/s':>9} {'peak GiB':>9} "
          f"{'x taehv.py best':>15} {'% of floor':>10}")
    for part in ("encoder", "decoder"):
        ref = [r["fps"] for r in rows if r["part"] == part and r["impl"].startswith("taehv") and "fps" in r]
        best = max(ref) if ref else None
        for r in rows:
            if r["part"] != part:
                continue
            if "fps" not in r:
                print(f"{r['impl']:22} {part:8} {r.get('frames', args.frames):>6} {'error':>9} "
                      f"{r['error'][:60]}")
                continue
            ratio = f"{r['fps'] / best:15.2f}" if best else f"{'-':>15}"
            print(f"{r['impl']:22} {part:8} {r.get('frames', args.frames):>6} {r['fps']:9.1f} "
                  f"{r['peak_bytes'] / 2**30:9.3f} {ratio} {100 * r['fps'] / floor_fps[part]:9.1f}%")
        print(f"{'floor (FLOPs/peak)':22} {part:8} {'':>6} {floor_fps[part]:9.1f} "
              f"({env['flops_per_frame'][part] / 1e9:.0f} GFLOP/frame)")
    for part, c in env["check"].items():
        print(f"check {part}: " + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                                            for k, v in c.items() if k != "part"))
    print("targets: decode >= 1000 frames/s at <= 0.5 GiB (1280x720, H100)")
    save()


if __name__ == "__main__":
    sys.exit(main())
