#!/usr/bin/env python3
"""Streaming throughput of whole gst-launch pipelines (frames/s), on the GPU machine:

  videotestsrc ! video/x-raw,format=RGBA,WxH ! vaeencode ! vaedecode ! fakesink      (system memory)
  videotestsrc ! ... ! queue ! vaeencode ! vaedecode ! fakesink   (system-queue: the source draws
                                                 on its own thread, as a decoder's output would)
  videotestsrc ! ... ! cudaupload ! vaeencode ! vaedecode ! cudadownload ! fakesink   (CUDA memory)

for each model and size, and variants: system memory with the default `prefetch-depth` and with
`prefetch-depth=0`; `cuda-graphs=true` and `=false` when `gst-inspect-1.0 vaeencode` lists that
property. Start-up (model load, plan building) is removed by running each pipeline with two frame
counts and dividing the extra frames by the extra time. The source alone is timed once per size.

`--models` takes paths, or `qwen`: the full-config Qwen-Image VAE with bench_vae.py's random
weights, written to `--qwen-dir` when missing (needs torch + diffusers).

`--stream` also runs `latent-tool stream` (copy only, compute only, serial, overlapped per-frame
ms at 1920x1080) when the tool has that command, and checks overlapped ~ max(copy, compute) rather
than their sum; without it the rows say why they were skipped.

Writes JSON after every row and prints a table.

  python3 bench/bench_pipelines.py --models models/default,qwen --out bench/results/pipelines.json \\
      --tool /tmp/dev/bin/latent-tool --stream
  python3 bench/bench_pipelines.py --dry-run --models models/default,qwen   # print the launch lines
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

SIZES = ["1024x1024", "1920x1080"]


def run(desc, frames, timeout, env=None):
    cmd = ["gst-launch-1.0", "-q"] + desc.replace("NUM", str(frames)).split()
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **env) if env else None)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timed out after {timeout} s: {' '.join(cmd)[:300]}")
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError((p.stderr or p.stdout).strip()[-600:])
    return dt


def element_properties(element):
    """Property names gst-inspect-1.0 lists for an element (empty when it cannot be inspected)."""
    try:
        p = subprocess.run(["gst-inspect-1.0", element], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    props, on = set(), False
    for line in p.stdout.splitlines():
        if line.startswith("Element Properties"):
            on = True
            continue
        if on and line and not line[0].isspace():
            break
        m = re.match(r"^  ([a-z][a-z0-9-]*)\s*:", line) if on else None
        if m:
            props.add(m.group(1))
    return props


def ensure_qwen(qwen_dir):
    if os.path.exists(os.path.join(qwen_dir, "config.json")):
        return qwen_dir
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from bench_vae import ensure_model_dir

    ensure_model_dir("qwen", qwen_dir, torch.bfloat16)
    return qwen_dir


def tool_has_stream(tool):
    if not tool or not os.path.exists(tool):
        return False, f"no latent-tool at {tool}"
    try:
        p = subprocess.run([tool, "help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    if re.search(r"^\s+stream\b", p.stdout + p.stderr, re.M):
        return True, ""
    return False, "latent-tool has no 'stream' command (its usage does not list it)"


CATS = ("copy", "compute", "serial", "overlap")


def pick(d, word):
    """The number in d (or in a nested dict) whose key names this category and no other (the
    stream JSON's key names are the other engineer's; match them loosely, prefer ms keys)."""
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update({f"{k}_{kk}": vv for kk, vv in v.items()})
        else:
            flat[k] = v
    hits = [k for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
            and word in k.lower() and not any(c in k.lower() for c in CATS if c != word)]
    hits.sort(key=lambda k: ("ms" not in k.lower(), len(k)))
    return flat[hits[0]] if hits else None


def stream_row(tool, model, size, frames, depth, timeout):
    w, h = size.split("x")
    cmd = [tool, "stream", "--model", model, "--device", "cuda", "--dtype", "bf16", "--size", size,
           "--frames", str(frames), "--prefetch-depth", str(depth), "--json"]
    row = {"kind": "latent-tool stream", "model": os.path.basename(model.rstrip("/")), "size": size,
           "prefetch_depth": depth, "frames": frames, "cmd": " ".join(cmd)}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row["error"] = f"timed out after {timeout} s"
        return row
    lines = [l for l in p.stdout.splitlines() if l.strip().startswith("{")]
    if p.returncode != 0 or not lines:
        row["error"] = (p.stderr or p.stdout).strip()[-600:] or f"exit {p.returncode}, no JSON line"
        return row
    j = json.loads(lines[-1])
    row["stream"] = j
    copy, comp = pick(j, "copy"), pick(j, "compute")
    serial, over = pick(j, "serial"), pick(j, "overlap")
    row.update(copy_ms=copy, compute_ms=comp, serial_ms=serial, overlapped_ms=over)
    if None not in (copy, comp, over):
        row["overlapped_over_max"] = over / max(copy, comp)
        row["overlapped_over_sum"] = over / (copy + comp)
        # overlapped ~ max(copy, compute): nearer the max than the sum
        row["overlap_ok"] = abs(over - max(copy, comp)) < abs(over - (copy + comp))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="comma-separated model paths, or 'qwen'")
    ap.add_argument("--qwen-dir", default="/tmp/latent-bench/qwen")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--memory", default="system,system-queue,cuda",
                    help="rows: system (the source on the elements' thread), system-queue (a queue "
                         "after the source; the element's default prefetch depth and graphs only), cuda")
    ap.add_argument("--frames", type=int, default=300,
                    help="frames of the long run (the short one has a tenth); 60 was too few at 100+ frames/s: "
                         "start-up jitter swamped the 0.5 s difference")
    ap.add_argument("--qwen-frames", type=int, default=60, help="frames for the Qwen-Image VAE (~12 frames/s at 1080p)")
    ap.add_argument("--prefetch-depths", default="default,0",
                    help="system-memory rows: 'default' (the element's) and/or numbers")
    ap.add_argument("--cuda-graphs", default="auto", choices=["auto", "off"],
                    help="auto: rows for cuda-graphs=true and false when vaeencode has that property")
    ap.add_argument("--tool", default="/tmp/dev/bin/latent-tool", help="latent-tool, for --stream")
    ap.add_argument("--stream", action="store_true", help="also latent-tool stream rows")
    ap.add_argument("--stream-only", action="store_true", help="only the latent-tool stream rows")
    ap.add_argument("--stream-size", default="1920x1080")
    ap.add_argument("--stream-frames", type=int, default=100)
    ap.add_argument("--stream-depths", default="2,0")
    ap.add_argument("--repeat", type=int, default=1, help="pairs of runs per row; frames/s is their median")
    ap.add_argument("--ab-env", default="", metavar="NAME=V1,V2",
                    help="each gst-launch row once per value of environment variable NAME, the "
                         "values alternated within each repeat (an A/B in one run), e.g. "
                         "LATENT_PINNED_INPUT=0,1")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per gst-launch")
    ap.add_argument("--budget-s", type=float, default=0, help="start no new row after this; 0: no cap")
    ap.add_argument("--device", default="cuda", help="element device; cpu (system-memory rows only) for a dry run")
    ap.add_argument("--dry-run", action="store_true", help="print the launch lines and exit")
    ap.add_argument("--out", default="bench/results/pipelines.json")
    args = ap.parse_args()
    t_start = time.time()
    ab_name, ab_values = "", [None]
    if args.ab_env:
        if "=" not in args.ab_env or not args.ab_env.split("=", 1)[0]:
            ap.error(f"--ab-env {args.ab_env}: expected NAME=V1,V2")
        ab_name, values = args.ab_env.split("=", 1)
        ab_values = values.split(",")

    stream_ok, stream_why = (True, "") if args.dry_run else tool_has_stream(args.tool)
    if args.stream_only and not stream_ok:  # nothing to run: do not make the Qwen folder
        args.models = ",".join(m for m in args.models.split(",") if m != "qwen")
    models = []
    for m in args.models.split(","):
        if m == "qwen":
            m = args.qwen_dir if args.dry_run else ensure_qwen(args.qwen_dir)
        models.append(m)
    props = element_properties("vaeencode") if not args.dry_run else {"prefetch-depth", "cuda-graphs"}
    dprops = element_properties("vaedecode") if not args.dry_run else {"cuda-graphs"}
    graphs = ["true", "false"] if args.cuda_graphs == "auto" and "cuda-graphs" in props else [None]
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "frames": args.frames, "ab_env": args.ab_env,
           "vaeencode_properties": sorted(props), "cuda_graphs_rows": graphs != [None]}
    if not props:
        env["note"] = "gst-inspect-1.0 vaeencode listed no properties (plugin not found?)"
    print(f"# {env}", flush=True)
    rows = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def dump():
        with open(args.out + ".tmp", "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    def over_budget():
        return args.budget_s and time.time() - t_start > args.budget_s

    src_fps = {}
    if not args.stream_only:
        for model in models:
            frames = args.qwen_frames if model == args.qwen_dir else args.frames
            n1, n2 = max(2, frames // 10), frames
            for size in args.sizes.split(","):
                w, h = size.split("x")
                caps = f"video/x-raw,format=RGBA,width={w},height={h},framerate=1000/1"
                variants = []
                for mem in args.memory.split(","):
                    depths = args.prefetch_depths.split(",") if mem == "system" else ["default"]
                    for d in depths:  # cuda-graphs rows only at the element's default depth
                        for gr in (graphs if d == "default" else [None]):
                            if mem == "system-queue" and gr not in (graphs[0], None):
                                continue
                            variants.append((mem, d, gr))
                for mem, depth, gr in variants:
                    if over_budget():
                        env["stopped_at"] = f"{model} {size} {mem} (budget)"
                        break
                    if mem == "cuda" and args.device == "cpu":
                        continue
                    enc = f"vaeencode model={model} device={args.device}"
                    dec = f"vaedecode model={model} device={args.device}"
                    if depth != "default":
                        enc += f" prefetch-depth={depth}"
                    if gr is not None:
                        enc += f" cuda-graphs={gr}"
                        if "cuda-graphs" in dprops:
                            dec += f" cuda-graphs={gr}"
                    stages = f"{enc} ! {dec}"
                    if mem == "cuda":
                        desc = f"videotestsrc num-buffers=NUM ! {caps} ! cudaupload ! video/x-raw(memory:CUDAMemory) ! {stages} ! cudadownload ! fakesink sync=false"
                    elif mem == "system-queue":
                        desc = f"videotestsrc num-buffers=NUM ! {caps} ! queue max-size-buffers=4 ! {stages} ! fakesink sync=false"
                    else:
                        desc = f"videotestsrc num-buffers=NUM ! {caps} ! {stages} ! fakesink sync=false"
                    base = {"kind": "gst-launch", "model": os.path.basename(model.rstrip("/")), "size": size,
                            "memory": mem, "prefetch_depth": depth, "frames": [n1, n2], "cuda_graphs": gr,
                            "pipeline": desc}
                    if args.dry_run:
                        print("gst-launch-1.0 -q " + desc.replace("NUM", str(n2)))
                        continue
                    variant_rows = [dict(base, **({"env": {ab_name: v}} if v is not None else {}))
                                    for v in ab_values]
                    fps = {i: [] for i in range(len(ab_values))}
                    starts = {i: [] for i in range(len(ab_values))}
                    try:
                        for _ in range(args.repeat):
                            for i, v in enumerate(ab_values):  # alternated within each repeat
                                env_v = {ab_name: v} if v is not None else None
                                t1 = run(desc, n1, args.timeout, env_v)
                                t2 = run(desc, n2, args.timeout, env_v)
                                fps[i].append((n2 - n1) / (t2 - t1))
                                starts[i].append(t1 - n1 / fps[i][-1])
                        for i, row in enumerate(variant_rows):
                            row["fps_runs"] = [round(f, 2) for f in fps[i]]
                            row["fps"] = sorted(fps[i])[len(fps[i]) // 2]
                            row["startup_s"] = round(sorted(starts[i])[len(starts[i]) // 2], 2)
                        if size not in src_fps:
                            src = f"videotestsrc num-buffers=NUM ! {caps} ! fakesink sync=false"
                            s1, s2 = run(src, 10, args.timeout), run(src, 60, args.timeout)
                            src_fps[size] = 50 / (s2 - s1) if s2 > s1 else float("nan")
                        for row in variant_rows:
                            row["source_only_fps"] = src_fps[size]
                    except RuntimeError as e:
                        for row in variant_rows:
                            row["error"] = str(e)
                    for row in variant_rows:
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                    dump()

    if args.stream or args.stream_only:
        if not stream_ok:
            env["stream_skipped"] = stream_why
            print(f"# latent-tool stream skipped: {stream_why}", flush=True)
        else:
            for model in models:
                for depth in args.stream_depths.split(","):
                    if over_budget():
                        break
                    if args.dry_run:
                        print(f"{args.tool} stream --model {model} --size {args.stream_size} --prefetch-depth {depth} ...")
                        continue
                    row = stream_row(args.tool, model, args.stream_size, args.stream_frames, int(depth), args.timeout)
                    rows.append(row)
                    dump()
                    print(json.dumps(row), flush=True)
    if args.dry_run:
        return
    env["total_s"] = round(time.time() - t_start, 1)
    dump()
    nan = float("nan")
    if any(r["kind"] == "gst-launch" for r in rows):
        print(f"\n{'model':16} {'size':10} {'memory':12} {'prefetch':>8} {'graphs':>6} {'frames/s':>9} {'start s':>7} {'source-only':>12}"
              + (f"  {ab_name}" if ab_name else ""))
    for r in rows:
        if r["kind"] != "gst-launch":
            continue
        print(f"{r['model'][:16]:16} {r['size']:10} {r['memory']:12} {r['prefetch_depth']:>8} {str(r['cuda_graphs'] or '-'):>6} "
              f"{r.get('fps', nan):9.1f} {r.get('startup_s', nan):7.1f} {r.get('source_only_fps', nan):12.1f}"
              + (f"  {r['env'][ab_name]}" if "env" in r else "")
              + (f"  ERROR {r['error'][:200]}" if "error" in r else ""))
    srows = [r for r in rows if r["kind"] == "latent-tool stream"]
    if srows:
        print(f"\n{'stream model':16} {'size':10} {'depth':>5} {'copy':>7} {'compute':>8} {'serial':>7} {'overlap':>8} {'ov/max':>7} {'ov/sum':>7}")
        for r in srows:
            f = lambda k: r.get(k) if r.get(k) is not None else nan
            print(f"{r['model'][:16]:16} {r['size']:10} {r['prefetch_depth']:5} {f('copy_ms'):7.2f} {f('compute_ms'):8.2f} "
                  f"{f('serial_ms'):7.2f} {f('overlapped_ms'):8.2f} {f('overlapped_over_max'):7.2f} {f('overlapped_over_sum'):7.2f}"
                  + (f"  ERROR {r['error'][:200]}" if "error" in r else ""))
    if "stream_skipped" in env:
        print(f"\nlatent-tool stream: skipped ({env['stream_skipped']})")
    print(f"\nwrote {args.out} ({env['total_s']} s)")


if __name__ == "__main__":
    main()
