#!/usr/bin/env python3
"""The per-frame time of a whole few-step img2img frame at 1024x1024 through the elements (issue:
ditdenoise for real use, bench item "4-step img2img frame"), on the GPU machine:

  videotestsrc pattern=ball num-buffers=NUM ! video/x-raw,format=RGBA,width=1024,height=1024
    ! vaeencode model=VAE ! ditdenoise model=DIT steps=8 strength=0.5 guidance-scale=1
        prompt-embeds=P [dtype=fp8] ! vaedecode model=VAE ! fakesink

- VAE: the Qwen-Image VAE, full config with random weights (bench_vae.py's), written to --vae-dir
  when missing.
- DIT: the full-size Qwen-Image transformer with random weights (bench_dit.py's, ~41 GB), made by
  `bench_dit.py --skip-torch` (which also times one of our steps) in its work folder when
  missing.
- steps=8 at strength=0.5 runs the schedule's last 4 steps. guidance-scale=1 means one
  transformer pass a step (no CFG): 4 passes of 4,096 image tokens a frame.
- P: random prompt embeddings, 64 tokens of 3,584.

Each variant (ditdenoise dtype bf16 and fp8) runs once with --frames frames and the stages'
per-frame debug lines (GST_DEBUG=<stage>:6: when each frame left each stage, and how long the
stage took on it). The per-frame time is the median period between frames leaving vaedecode,
the first frame (plans, first cuBLASLt calls) left out. Start-up (loading 41 GB) is not in it,
and neither is the variance of start-up that timing two runs of different lengths would add.
Frames go one after another through one streaming thread (no queues), so that period is a frame's
latency through the elements plus the source's time on the next frame; the latency itself
(vaeencode taking the frame to vaedecode pushing it) is reported next to it. Targets: <= 0.45 s
(bf16), <= 0.35 s (fp8).

  python3 bench/bench_img2img.py --tool /tmp/dev/bin/latent-tool --out bench/results/img2img.json
  python3 bench/bench_img2img.py --dry-run      # the launch lines only
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# The base class's per-frame line at GST_DEBUG level 6 (LOG): "<time> ... <stage0> frame N took X ms".
FRAME_LINE = re.compile(r"^(\d+):(\d\d):(\d\d\.\d+).*<(vaeencode|ditdenoise|vaedecode)\d+>\s*frame \d+ took "
                        r"([\d.]+) ms")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def seconds(h, m, s):
    return int(h) * 3600 + int(m) * 60 + float(s)


def run(desc, frames, timeout, extra_env=None):
    """gst-launch with the stages' per-frame debug lines: when each frame left each stage, and how
    long the stage took on it."""
    cmd = ["gst-launch-1.0", "-q"] + desc.replace("NUM", str(frames)).split()
    env = dict(os.environ, GST_DEBUG="vaeencode:6,ditdenoise:6,vaedecode:6", GST_DEBUG_NO_COLOR="1",
               **(extra_env or {}))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {' '.join(cmd)[:300]}")
    if p.returncode != 0:
        raise RuntimeError((p.stderr or p.stdout).strip()[-600:])
    done = {"vaeencode": [], "ditdenoise": [], "vaedecode": []}
    took = {"vaeencode": [], "ditdenoise": [], "vaedecode": []}
    for line in (p.stderr + p.stdout).splitlines():
        m = FRAME_LINE.match(ANSI.sub("", line))
        if m:
            done[m.group(4)].append(seconds(*m.group(1, 2, 3)))
            took[m.group(4)].append(float(m.group(5)))
    return done, took


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def ensure_dit(args):
    """The transformer folder bench_dit.py writes (reused when complete)."""
    found = sorted(glob.glob(os.path.join(args.dit_workdir, "transformer-60")))
    if found and os.path.exists(os.path.join(found[0], "bench_dit_stamp.json")):
        return found[0]
    # bench_dit.py writes the weights only when it runs ours (one t2i step, timed: kept in the JSON).
    cmd = [sys.executable, os.path.join(HERE, "bench_dit.py"), "--tool", args.tool, "--cases", "t2i",
           "--skip-torch", "--workdir", args.dit_workdir,
           "--out", os.path.join(args.dit_workdir, "dit-step.json")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    folder = os.path.join(args.dit_workdir, "transformer-60")
    if p.returncode != 0 or not os.path.exists(os.path.join(folder, "bench_dit_stamp.json")):
        raise RuntimeError("bench_dit.py did not write the weights to " + folder + ": " +
                           (p.stderr or p.stdout)[-600:])
    return folder


def ensure_vae(vae_dir):
    if os.path.exists(os.path.join(vae_dir, "config.json")):
        return vae_dir
    sys.path.insert(0, HERE)
    import torch
    from bench_vae import ensure_model_dir

    ensure_model_dir("qwen", vae_dir, torch.bfloat16)
    return vae_dir


def ensure_prompt(path, tokens, width, seed):
    if os.path.exists(path):
        return path
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    save_file({"prompt_embeds": torch.randn((1, tokens, width), generator=g),
               "prompt_embeds_mask": torch.ones((1, tokens))}, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="/tmp/dev/bin/latent-tool", help="latent-tool (bench_dit.py needs it)")
    ap.add_argument("--out", default="img2img.json")
    ap.add_argument("--dit-workdir", default="/dev/shm/latent-dit")
    ap.add_argument("--vae-dir", default="/tmp/qwen-vae-bench")
    ap.add_argument("--size", default="1024x1024")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--strength", type=float, default=0.5, help="steps x strength transformer passes a frame")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--frames", type=int, default=8, help="frames a run (the first, with its plans, is left out)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--mod-cache", default="on",
                    help="on, off or on,off: the transformer's modulation cache (LATENT_DIT_MOD_CACHE); "
                         "on,off runs each dtype both ways (the A/B)")
    ap.add_argument("--fp8-attention", default="codes",
                    help="codes, amax, off or a list (codes,amax): dtype fp8's attention (cuDNN's FP8 "
                         "SDPA). codes (the default): q and k coded by joint_qk with static bounds; "
                         "amax (LATENT_FP8_ATTENTION=1; session 17's 'on'): q, k and v scaled by "
                         "their amax; off (=0): bf16, its output quantised after. A list runs the "
                         "fp8 rows each way in turn (the A/B)")
    ap.add_argument("--gated-add", default="on",
                    help="on, off or on,off: dtype fp8's gated residual adds inside the output "
                         "layers' GEMMs (LATENT_FP8_GATED_ADD; off: a gated_add pass after each); "
                         "a list runs the fp8 rows each way in turn")
    ap.add_argument("--ab", default="",
                    help="ENV=V1,V2: the fp8 rows run once with each value of environment variable ENV "
                         "(e.g. LATENT_FP8_JOIN_V=1,0), crossed with the options above")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    caches = [c for c in args.mod_cache.split(",") if c]
    if not caches or any(c not in ("on", "off") for c in caches):
        ap.error(f"--mod-cache {args.mod_cache}: give on, off or on,off")
    fp8_atts = [c for c in args.fp8_attention.split(",") if c]
    if not fp8_atts or any(c not in ("codes", "amax", "off") for c in fp8_atts):
        ap.error(f"--fp8-attention {args.fp8_attention}: give codes, amax, off or a list of them")
    gated = [c for c in args.gated_add.split(",") if c]
    if not gated or any(c not in ("on", "off") for c in gated):
        ap.error(f"--gated-add {args.gated_add}: give on, off or on,off")
    ab_name, ab_values = "", ["-"]
    if args.ab:
        ab_name, _, vals = args.ab.partition("=")
        ab_values = [v for v in vals.split(",") if v]
        if not ab_name or not ab_values:
            ap.error(f"--ab {args.ab}: give ENV=V1,V2")
    w, h = (int(v) for v in args.size.split("x"))
    prompt = os.path.join(args.dit_workdir, "prompt-64x3584.safetensors")
    vae = args.vae_dir
    dit = os.path.join(args.dit_workdir, "transformer-60")
    passes = round(args.steps * args.strength)

    def line(dtype):
        return (f"videotestsrc pattern=ball num-buffers=NUM ! video/x-raw,format=RGBA,width={w},height={h},framerate=30/1 "
                f"! vaeencode model={vae} ! ditdenoise model={dit} steps={args.steps} strength={args.strength} "
                f"guidance-scale=1 prompt-embeds={prompt} dtype={dtype} ! vaedecode model={vae} ! fakesink sync=false")

    if args.dry_run:
        for d in args.dtypes.split(","):
            print("gst-launch-1.0 " + line(d))
        return 0
    t0 = time.time()
    result = {"size": args.size, "steps": args.steps, "strength": args.strength,
              "transformer_passes_per_frame": passes, "guidance": "off (guidance-scale 1)",
              "frames": args.frames, "rows": []}
    try:
        import torch
        result["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        result["gpu"] = "unknown (no torch)"
    os.makedirs(args.dit_workdir, exist_ok=True)
    dit = ensure_dit(args)
    vae = ensure_vae(vae)
    ensure_prompt(prompt, 64, 3584, 0)
    result["setup_s"] = round(time.time() - t0, 1)
    targets = {"bf16": 450.0, "fp8": 350.0}
    variants = [(d, c, a, g, x) for d in args.dtypes.split(",") for c in caches
                for a in (fp8_atts if d == "fp8" else ["-"]) for g in (gated if d == "fp8" else ["-"])
                for x in (ab_values if d == "fp8" else ["-"])]
    for dtype, cache, att, gate, abv in variants:
        row = {"dtype": dtype, "mod_cache": cache, "fp8_attention": att, "gated_add": gate,
               "pipeline": "gst-launch-1.0 " + line(dtype)}
        if abv != "-":
            row["env"] = {ab_name: abv}
        label = f"modulation cache {cache}" + (f", fp8 attention {att}" if att != "-" else "") + \
            (f", gated add {gate}" if gate != "-" else "") + (f", {ab_name}={abv}" if abv != "-" else "")
        try:
            env = {"LATENT_DIT_MOD_CACHE": "1" if cache == "on" else "0"}
            if abv != "-":
                env[ab_name] = abv
            if att != "-":
                env["LATENT_FP8_ATTENTION"] = {"amax": "1", "off": "0", "codes": "codes"}[att]
            if gate != "-":
                env["LATENT_FP8_GATED_ADD"] = "1" if gate == "on" else "0"
            done, took = run(line(dtype), args.frames, args.timeout, env)
            out = done["vaedecode"]
            if len(out) != args.frames:
                raise RuntimeError(f"{len(out)} of {args.frames} frames reached vaedecode's log")
            # Steady state: the period between frames leaving the pipeline (the first frame, with
            # its plans, left out) and each stage's own time on a frame.
            periods = [1000 * (b - a) for a, b in zip(out[1:], out[2:])]
            # A frame's latency through the elements: from vaeencode taking it (the time its line
            # was written less what it says it took) to vaedecode's line. The period also holds
            # the source's time on the next frame (videotestsrc drawing 1024x1024 RGBA).
            enc = done["vaeencode"]
            latencies = [1000 * (d - e) + t for d, e, t in zip(out, enc, took["vaeencode"])][1:]
            row.update({"frame_ms": median(periods), "frame_periods_ms": [round(x, 1) for x in periods],
                        "latency_ms": median(latencies), "latencies_ms": [round(x, 1) for x in latencies],
                        "first_frame_stage_ms": {k: round(v[0], 1) for k, v in took.items() if v},
                        "stage_ms": {k: round(median(v[1:]), 1) for k, v in took.items()}})
            if dtype in targets:
                row["target_ms"] = targets[dtype]
            print(f"{dtype} ({label}): {row['frame_ms']:.0f} ms a frame, latency {row['latency_ms']:.0f} ms (target <= "
                  f"{targets.get(dtype, float('nan')):.0f}); stages {row['stage_ms']}", flush=True)
        except RuntimeError as e:
            row["error"] = str(e)
            print(f"{dtype} ({label}): failed: {str(e)[-300:]}", flush=True)
        result["rows"].append(row)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{'dtype':6} {'mod cache':9} {'fp8 att':7} {'gated':5} {'env':>22} {'ms/frame':>9} {'latency':>8} {'target':>7} {'encode':>7} {'denoise':>8} {'decode':>7}")
    for r in result["rows"]:
        st = r.get("stage_ms", {})
        print(f"{r['dtype']:6} {r['mod_cache']:9} {r.get('fp8_attention', '-'):7} {r.get('gated_add', '-'):5} "
              f"{','.join(f'{k}={v}' for k, v in r.get('env', {}).items()) or '-':>22} "
              f"{r.get('frame_ms', float('nan')):9.0f} {r.get('latency_ms', float('nan')):8.0f} "
              f"{r.get('target_ms', float('nan')):7.0f} "
              f"{st.get('vaeencode', float('nan')):7.1f} {st.get('ditdenoise', float('nan')):8.1f} "
              f"{st.get('vaedecode', float('nan')):7.1f}")
    print(f"({w}x{h}, {passes} transformer passes a frame without CFG; wrote {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
