#!/usr/bin/env python3
"""A/B of one engine setting on the video VAE streams or the image VAEs, same binary, same call
(GPU machine).

Runs `latent-bench-video` (one frame a push, as the elements drive a stream) for each part and
size, alternating variant A (the environment as it is) and variant B (A plus --b-env NAME=VALUE)
--reps times, so drift of the card between runs falls on both. Prints frames/s and peak device
memory per run, the medians and B / A, then one JSON object (--out also writes it).

    python3 bench/bench_video_ab.py --bench /tmp/dev/bin/latent-bench-video --model DIR \\
        --b-env LATENT_VIDEO_CACHE=copy [--sizes 1280x720,832x480] [--parts encoder,decoder] \\
        [--frames 161] [--reps 2] [--out ab.json]

--model defaults to the Wan 2.1 VAE made by bench_stream_nvdec.ensure_wan (diffusers'
AutoencoderKLWan default config, random weights, bf16) under --workdir.

With --image-models NAME[,NAME] (and --tool latent-tool) the image VAEs that bench_vae.py saved
under --workdir run instead: `latent-tool run --json` on bench_vae.py's input of each part and
size (its `<name>-<part>-<size>-in.safetensors`), frames/s being 1000 / its median ms and the
peak its `peak_bytes` (the plan included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_once(bench: str, model: str, part: str, size: str, frames: int, env: dict, timeout: int) -> dict:
    cmd = [bench, "--model", model, "--device", "cuda", "--dtype", "bf16", "--size", size,
           "--frames", str(frames), "--part", part, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {(p.stderr or p.stdout)[-400:]}")
    return json.loads(lines[-1])


def run_image_once(tool: str, workdir: str, name: str, part: str, size: str, env: dict,
                   timeout: int) -> dict:
    inputs = os.path.join(workdir, f"{name}-{part}-{size}-in.safetensors")
    if not os.path.exists(inputs):
        raise RuntimeError(f"{inputs}: no input (run bench_vae.py --models {name} --sizes {size} first)")
    # bench_vae.py's "default" is the built-in model's own folder (models/default), the rest under
    # its workdir.
    model = os.path.join(os.path.dirname(HERE), "models", "default") if name == "default" else \
        os.path.join(workdir, name)
    cmd = [tool, "run", "--model", model, "--part", part, "--inputs", inputs,
           "--outputs", os.path.join(workdir, f"{name}-{part}-{size}-ab.safetensors"), "--device",
           "cuda", "--dtype", "bf16", "--warmup", "3", "--repeat", "20", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {(p.stderr or p.stdout)[-400:]}")
    r = json.loads(lines[-1])
    ms = r.get("median_ms", r.get("ms"))
    return {"fps": 1000.0 / ms, "ms": ms, "peak_bytes": r.get("peak_bytes", 0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="", help="latent-bench-video (the video streams)")
    ap.add_argument("--model", default="", help="default: the Wan 2.1 VAE under --workdir")
    ap.add_argument("--workdir", default="/tmp/latent-bench")
    ap.add_argument("--b-env", action="append", required=True, help="NAME=VALUE of variant B")
    ap.add_argument("--sizes", default="1280x720")
    ap.add_argument("--parts", default="encoder,decoder")
    ap.add_argument("--frames", type=int, default=161)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out", default="")
    ap.add_argument("--image-models", default="", help="bench_vae.py models under --workdir (e.g. taesd)")
    ap.add_argument("--tool", default="", help="latent-tool, for --image-models")
    args = ap.parse_args(argv)

    targets = []  # (label, run(part, size, env))
    if args.image_models:
        if not args.tool:
            ap.error("--image-models needs --tool latent-tool")
        for name in args.image_models.split(","):
            targets.append((name, lambda part, size, env, name=name: run_image_once(
                args.tool, args.workdir, name, part, size, env, args.timeout)))
    model = args.model
    if not model and not targets:
        sys.path.insert(0, HERE)
        from bench_stream_nvdec import ensure_wan

        model = ensure_wan(args.workdir)
    if not targets:
        if not args.bench:
            ap.error("--bench latent-bench-video is needed for the video streams")
        targets.append((os.path.basename(model.rstrip("/")), lambda part, size, env: run_once(
            args.bench, model, part, size, args.frames, env, args.timeout)))
    env_a = dict(os.environ)
    env_b = dict(os.environ)
    for kv in args.b_env:
        if "=" not in kv:
            ap.error(f"--b-env {kv!r}: expected NAME=VALUE")
        k, v = kv.split("=", 1)
        env_b[k] = v
    rows = []
    for label, run in targets:
        for size in args.sizes.split(","):
            for part in args.parts.split(","):
                runs = {"A": [], "B": []}
                for rep in range(args.reps):
                    for name, env in (("A", env_a), ("B", env_b)) if rep % 2 == 0 else (("B", env_b), ("A", env_a)):
                        r = run(part, size, env)
                        runs[name].append(r)
                        print(f"{label:8} {part:8} {size:9} {name}: {r['fps']:7.2f} frames/s, peak "
                              f"{r['peak_bytes'] / 2**30:.2f} GiB", flush=True)
                a = statistics.median(r["fps"] for r in runs["A"])
                b = statistics.median(r["fps"] for r in runs["B"])
                rows.append({"model": label, "part": part, "size": size, "frames": args.frames,
                             "a_fps": [r["fps"] for r in runs["A"]], "b_fps": [r["fps"] for r in runs["B"]],
                             "a_peak_gib": max(r["peak_bytes"] for r in runs["A"]) / 2**30,
                             "b_peak_gib": max(r["peak_bytes"] for r in runs["B"]) / 2**30,
                             "a_median_fps": a, "b_median_fps": b, "b_over_a": b / a if a else None})
    print()
    print(f"A: as is; B: {' '.join(args.b_env)}; median of {args.reps} runs each, {args.frames} frames")
    print(f"{'model':8} {'part':8} {'size':9} {'A f/s':>8} {'B f/s':>8} {'B/A':>6} {'A GiB':>6} {'B GiB':>6}")
    for r in rows:
        print(f"{r['model']:8} {r['part']:8} {r['size']:9} {r['a_median_fps']:8.2f} {r['b_median_fps']:8.2f} "
              f"{r['b_over_a']:6.3f} {r['a_peak_gib']:6.2f} {r['b_peak_gib']:6.2f}")
    result = {"model": model, "b_env": args.b_env, "rows": rows}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
