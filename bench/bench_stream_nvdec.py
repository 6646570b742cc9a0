#!/usr/bin/env python3
"""The streaming pipeline from a real video file, on the GPU machine (issue 13):

  filesrc ! qtdemux ! h264parse ! nvh264dec ! video/x-raw(memory:CUDAMemory)
      ! vaeencode ! vaedecode ! video/x-raw(memory:CUDAMemory) ! fakesink

H.264 clips are generated first (videotestsrc ! openh264enc ! mp4mux, two lengths, so start-up
is removed: frames/s = extra frames / extra seconds). Each model is timed with the decoder
alone, the whole pipeline with CUDA-memory output, and with system-memory output (vaedecode
downloads). The kernel-time bound is 1000 / (encode + decode ms a frame) from `latent-tool
stream` (its "compute only" figure, the planned graphs without copies); the pipeline should reach
>= 0.95 of it.

  python3 bench/bench_stream_nvdec.py --models models/default,qwen --tool /tmp/dev/bin/latent-tool \\
      --out bench/results/stream-nvdec.json

`--models wan` runs the Wan 2.1 VAE (full config, random weights, bf16, written with diffusers) in
video mode (`vaeencode mode=video`: causal chunks of 4 frames, caches carried along the clip) at
--video-size (720p); its bound is the engine's streamed rates from `latent-bench-video` (encoder
and decoder pushed frame by frame as the elements push them): 1 / (1/encode + 1/decode) frames/s.

Needs gst-launch-1.0 with nvcodec and openh264 (the carried .gstrt) and the latent plugin.
Writes JSON after every row and prints a table last.
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def gst(desc, timeout):
    cmd = ["gst-launch-1.0", "-q"] + desc.split()
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {desc[:300]}")
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}")
    return time.perf_counter() - t0


def make_clip(path, frames, w, h, timeout):
    if os.path.exists(path):
        return
    # A moving pattern so the encoder produces real P-frames (ball + snow-like noise is costly to
    # encode; the SMPTE bars with a moving ball decode like ordinary content).
    gst(f"videotestsrc num-buffers={frames} pattern=ball ! video/x-raw,format=I420,width={w},height={h},framerate=60/1 "
        f"! openh264enc bitrate=8000000 ! h264parse ! mp4mux ! filesink location={path}.part", timeout)
    os.replace(path + ".part", path)


def stream_compute_ms(tool, model, size, timeout):
    """Encode + decode compute ms a frame from latent-tool stream (None when unavailable)."""
    if not tool or not os.path.exists(tool):
        return None, f"no latent-tool at {tool}"
    cmd = [tool, "stream", "--model", model, "--device", "cuda", "--dtype", "bf16", "--size", size,
           "--format", "RGBx", "--frames", "60", "--prefetch-depth", "2", "--json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "latent-tool stream timed out"
    lines = [l for l in p.stdout.splitlines() if l.strip().startswith("{")]
    if p.returncode != 0 or not lines:
        return None, (p.stderr or p.stdout).strip()[-300:]
    from bench_pipelines import pick
    return pick(json.loads(lines[-1]), "compute"), ""


def ensure_wan(workdir):
    """The Wan 2.1 VAE (diffusers' AutoencoderKLWan default config), random weights, bf16."""
    d = os.path.join(workdir, "wan21-vae")
    if not os.path.exists(os.path.join(d, "config.json")):
        import torch
        from bench_video_vae import make_model
        make_model(False, "wan2.1").to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    return d


def video_bound_fps(bench, model, size, frames, timeout):
    """Encoder and decoder streamed rates (frames/s) from latent-bench-video; (None, why) if absent."""
    if not bench or not os.path.exists(bench):
        return None, f"no latent-bench-video at {bench}"
    rates = {}
    for part in ("encoder", "decoder"):
        cmd = [bench, "--model", model, "--device", "cuda", "--dtype", "bf16", "--size", size,
               "--frames", str(frames), "--warmup", "41", "--part", part, "--json"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"latent-bench-video --part {part} timed out"
        lines = [l for l in p.stdout.splitlines() if l.strip().startswith("{")]
        if p.returncode != 0 or not lines:
            return None, (p.stderr or p.stdout).strip()[-300:]
        rates[part] = json.loads(lines[-1])["fps"]
    return rates, ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="models/default", help="comma-separated model paths, or 'qwen'")
    ap.add_argument("--qwen-dir", default="/tmp/latent-bench/qwen")
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--frames", type=int, default=600, help="frames of the long clip (the short one has a fifth)")
    ap.add_argument("--qwen-frames", type=int, default=120)
    ap.add_argument("--workdir", default="/tmp/latent-nvdec")
    ap.add_argument("--tool", default="/tmp/dev/bin/latent-tool")
    ap.add_argument("--repeat", type=int, default=2, help="pairs of runs per row; the median frames/s")
    ap.add_argument("--timeout", type=int, default=200)
    ap.add_argument("--out", default="bench/results/stream-nvdec.json")
    ap.add_argument("--video-size", default="1280x720", help="clip size for --models wan")
    ap.add_argument("--video-frames", type=int, default=241, help="frames of wan's long clip (1 + 4k)")
    ap.add_argument("--bench", default="/tmp/dev/bin/latent-bench-video")
    args = ap.parse_args()
    w, h = args.size.split("x")
    os.makedirs(args.workdir, exist_ok=True)
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "size": args.size}
    rows = []

    def dump():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    clips = {}

    def clip(n, size=args.size):
        if (n, size) not in clips:
            p = os.path.join(args.workdir, f"clip-{size}-{n}.mp4")
            t0 = time.time()
            cw, ch = size.split("x")
            make_clip(p, n, cw, ch, max(args.timeout, n))
            print(f"# clip {p}: {n} frames ({time.time() - t0:.1f} s to make)", flush=True)
            clips[(n, size)] = p
        return clips[(n, size)]

    def timed(kind, model, desc_for, n2, size=args.size):
        n1 = max(10, n2 // 5)
        if kind.startswith("video"):
            n1 = 1 + 4 * ((n1 - 1) // 4)  # whole chunks
            n2 = 1 + 4 * ((n2 - 1) // 4)
        row = {"kind": kind, "model": os.path.basename(model.rstrip("/")) if model else "-", "frames": [n1, n2],
               "size": size, "pipeline": desc_for("CLIP")}
        try:
            c1, c2 = clip(n1, size), clip(n2, size)
            fps = []
            for _ in range(args.repeat):
                t1 = gst(desc_for(c1), args.timeout)
                t2 = gst(desc_for(c2), args.timeout)
                fps.append((n2 - n1) / (t2 - t1))
            row["fps_runs"] = [round(f, 1) for f in fps]
            row["fps"] = sorted(fps)[len(fps) // 2]
        except RuntimeError as e:
            row["error"] = str(e)
        rows.append(row)
        dump()
        print(json.dumps(row), flush=True)
        return row

    src = "filesrc location={} ! qtdemux ! h264parse ! nvh264dec ! video/x-raw(memory:CUDAMemory)"
    timed("decoder only", None, lambda c: f"{src.format(c)} ! fakesink sync=false", args.frames)
    for m in args.models.split(","):
        if m == "wan":
            m = ensure_wan(args.workdir)
            vs = args.video_size
            rates, why = video_bound_fps(args.bench, m, vs, args.video_frames, args.timeout)
            bound = 1.0 / (1.0 / rates["encoder"] + 1.0 / rates["decoder"]) if rates else None
            stages = f"vaeencode model={m} device=cuda mode=video ! vaedecode model={m} device=cuda"
            for out, caps in (("cuda", "video/x-raw(memory:CUDAMemory)"), ("system", "video/x-raw")):
                r = timed(f"video nvdec ! vae ! {out}", m,
                          lambda c: f"{src.format(c)} ! {stages} ! {caps} ! fakesink sync=false",
                          args.video_frames, vs)
                r["engine_fps"] = rates
                r["kernel_bound_fps"] = bound
                r["compute_ms"] = 1000.0 / bound if bound else None
                if bound and "fps" in r:
                    r["of_bound"] = r["fps"] / bound
                if why:
                    r["bound_note"] = why
                dump()
            continue
        if m == "qwen":
            from bench_pipelines import ensure_qwen
            m = ensure_qwen(args.qwen_dir)
        n2 = args.qwen_frames if m == args.qwen_dir else args.frames
        stages = f"vaeencode model={m} device=cuda ! vaedecode model={m} device=cuda"
        comp, why = stream_compute_ms(args.tool, m, args.size, args.timeout)
        bound = 1000.0 / comp if comp else None
        for out, caps in (("cuda", "video/x-raw(memory:CUDAMemory)"), ("system", "video/x-raw")):
            r = timed(f"nvdec ! vae ! {out}", m, lambda c: f"{src.format(c)} ! {stages} ! {caps} ! fakesink sync=false", n2)
            r["compute_ms"] = comp
            r["kernel_bound_fps"] = bound
            if bound and "fps" in r:
                r["of_bound"] = r["fps"] / bound
            if why:
                r["bound_note"] = why
            dump()
    nan = float("nan")
    print(f"\n{'pipeline':26} {'model':16} {'frames/s':>9} {'compute ms':>10} {'bound fps':>9} {'of bound':>8}")
    for r in rows:
        f = lambda k: r.get(k) if r.get(k) is not None else nan
        print(f"{r['kind'][:26]:26} {r['model'][:16]:16} {f('fps'):9.1f} {f('compute_ms'):10.2f} "
              f"{f('kernel_bound_fps'):9.1f} {f('of_bound'):8.2f}" + (f"  ERROR {r['error'][:160]}" if "error" in r else ""))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
