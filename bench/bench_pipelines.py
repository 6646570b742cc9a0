#!/usr/bin/env python3
"""Streaming throughput of whole gst-launch pipelines (frames/s), on the GPU machine:

  videotestsrc ! video/x-raw,format=RGBA,WxH ! vaeencode ! vaedecode ! fakesink      (system memory)
  videotestsrc ! ... ! cudaupload ! vaeencode ! vaedecode ! cudadownload ! fakesink   (CUDA memory)

for each model and size. Start-up (model load, plan building) is removed by running each pipeline
with two frame counts and dividing the extra frames by the extra time. Writes JSON and prints a
table.

  python3 bench/bench_pipelines.py --models models/default,/tmp/latent-bench/qwen --out bench/results/pipelines.json
"""
import argparse
import json
import os
import subprocess
import time

SIZES = ["1024x1024", "1920x1080"]


def run(desc, frames):
    cmd = ["gst-launch-1.0", "-q"] + desc.replace("NUM", str(frames)).split()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError((p.stderr or p.stdout).strip()[-600:])
    return dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="comma-separated model paths")
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--memory", default="system,cuda")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--out", default="bench/results/pipelines.json")
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        for size in args.sizes.split(","):
            w, h = size.split("x")
            for mem in args.memory.split(","):
                caps = f"video/x-raw,format=RGBA,width={w},height={h},framerate=1000/1"
                stages = f"vaeencode model={model} device=cuda ! vaedecode model={model} device=cuda"
                if mem == "cuda":
                    desc = f"videotestsrc num-buffers=NUM ! {caps} ! cudaupload ! video/x-raw(memory:CUDAMemory) ! {stages} ! cudadownload ! fakesink sync=false"
                else:
                    desc = f"videotestsrc num-buffers=NUM ! {caps} ! {stages} ! fakesink sync=false"
                # The source alone, to show what the test source costs.
                src_only = f"videotestsrc num-buffers=NUM ! {caps} ! fakesink sync=false"
                row = {"model": os.path.basename(model.rstrip("/")), "size": size, "memory": mem}
                try:
                    n1, n2 = max(2, args.frames // 6), args.frames
                    t1, t2 = run(desc, n1), run(desc, n2)
                    row["fps"] = (n2 - n1) / (t2 - t1)
                    s1, s2 = run(src_only, n1), run(src_only, n2)
                    row["source_only_fps"] = (n2 - n1) / max(s2 - s1, 1e-9)
                except RuntimeError as e:
                    row["error"] = str(e)
                rows.append(row)
                print(json.dumps(row), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    print(f"\n{'model':24} {'size':10} {'memory':7} {'frames/s':>9} {'source-only':>12}")
    for r in rows:
        print(f"{r['model']:24} {r['size']:10} {r['memory']:7} {r.get('fps', float('nan')):9.1f} "
              f"{r.get('source_only_fps', float('nan')):12.1f}" + (f"  ERROR {r['error'][:200]}" if "error" in r else ""))


if __name__ == "__main__":
    main()
