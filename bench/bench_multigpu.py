#!/usr/bin/env python3
"""Pipelines on several GPUs of one host (issue 14): does each run at full speed?

For N = 2 .. --gpus (every GPU by default), the same pipeline per device

  videotestsrc pattern=black ! NV12 WxH ! queue ! cudaupload ! vaeencode device=cuda:d !
      vaedecode device=cuda:d ! fakesink

(cudaupload's device left to the context it finds, as a user writes it) is timed

  alone      on each device by itself, one after another;
  process    all N branches in one gst-launch-1.0 (one process, one pipeline);
  processes  N gst-launch-1.0 processes at once, one a device.

Each process is this script again (--branches), which plays its branches with PyGObject and
times each at its sink: frames/s from its --skip-th frame to its last (start-up, the model load
and planning left out). Each row gives the frames/s of every pipeline, its ratio to the same
device alone ("efficiency"), and each GPU's busy fraction while the rows ran (nvidia-smi
utilization.gpu every 100 ms). JSON with --out, a table at the end.

  python3 bench/bench_multigpu.py --model models/default --size 1920x1080 --out multigpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_precompute import GpuSampler, gpu_count  # noqa: E402


def branch(model: str, device: int, frames: int, width: int, height: int, props: list[str]) -> str:
    extra = " ".join(props)
    return (f"videotestsrc num-buffers={frames} pattern=black ! video/x-raw,format=NV12,width={width},"
            f"height={height},framerate=30/1 ! queue ! cudaupload ! video/x-raw(memory:CUDAMemory) ! "
            f"vaeencode model={model} device=cuda:{device} {extra} ! vaedecode model={model} "
            f"device=cuda:{device} {extra} ! fakesink sync=false")


def play_branches(devices: list[int], args) -> dict:
    """In this process: one pipeline with a branch per device; {device: frames/s} at the sinks."""
    import gi

    gi.require_version("Gst", "1.0")
    from gi.repository import Gst

    Gst.init(None)
    w, h = (int(v) for v in args.size.split("x"))
    desc = "  ".join(branch(args.model, d, args.frames, w, h, args.prop).replace(
        "fakesink sync=false", f"fakesink name=out{d} sync=false") for d in devices)
    pipe = Gst.parse_launch(desc)
    times: dict[int, list[float]] = {d: [] for d in devices}

    def probe(pad, info, d):
        times[d].append(time.perf_counter())
        return Gst.PadProbeReturn.OK

    for d in devices:
        pipe.get_by_name(f"out{d}").get_static_pad("sink").add_probe(Gst.PadProbeType.BUFFER, probe, d)
    pipe.set_state(Gst.State.PLAYING)
    msg = pipe.get_bus().timed_pop_filtered(int(args.timeout * Gst.SECOND),
                                            Gst.MessageType.EOS | Gst.MessageType.ERROR)
    pipe.set_state(Gst.State.NULL)
    if msg is None or msg.type == Gst.MessageType.ERROR:
        raise SystemExit(f"bench_multigpu: {msg.parse_error()[0].message if msg else 'timed out'}")
    fps = {}
    for d, t in times.items():
        if len(t) <= args.skip + 1:
            raise SystemExit(f"bench_multigpu: cuda:{d} gave {len(t)} frames, fewer than --skip + 2")
        fps[d] = round((len(t) - 1 - args.skip) / (t[-1] - t[args.skip]), 2)
    return fps


def timed(devices: list[int], how: str, args) -> dict:
    """Frames/s of each device's pipeline when `devices` run together `how` ("alone" is one
    device in one process, "process" one process with a branch per device, "processes" one
    process per device)."""
    groups = [[d] for d in devices] if how == "processes" else [devices]
    cmd = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--size", args.size,
           "--frames", str(args.frames), "--skip", str(args.skip), "--timeout", str(args.timeout)]
    for p in args.prop:
        cmd += ["--prop", p]
    with GpuSampler(devices) as gpu:
        t0 = time.time()
        procs = [subprocess.Popen(cmd + ["--branches", ",".join(map(str, g))], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for g in groups]
        outs = [p.communicate(timeout=args.timeout + 60) for p in procs]
        t1 = time.time()
    fps = {}
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"exit {p.returncode}: {err.strip()[-600:]}")
        fps.update({int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()})
    return {"how": how, "devices": devices, "frames": args.frames, "skip": args.skip,
            "frames_per_s": {d: fps[d] for d in devices}, "seconds": round(t1 - t0, 2),
            "gpu_busy": gpu.busy_per_gpu()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(os.path.dirname(HERE), "models", "default"))
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--frames", type=int, default=900, help="frames per pipeline")
    ap.add_argument("--skip", type=int, default=60, help="frames left out of the rate (warm-up)")
    ap.add_argument("--branches", default="", help="(internal) play these devices' branches here")
    ap.add_argument("--gpus", type=int, default=0, help="the most GPUs to use (default: every one)")
    ap.add_argument("--prop", action="append", default=[], help="NAME=VALUE for both elements")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.branches:
        print(json.dumps(play_branches([int(d) for d in args.branches.split(",")], args)))
        return

    count = min(args.gpus or gpu_count(), gpu_count())
    if count < 2:
        raise SystemExit(f"bench_multigpu: {count} GPU here; this bench needs two or more")
    results = {"model": args.model, "size": args.size, "gpus": count, "rows": []}

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)

    alone = {}
    for d in range(count):
        row = timed([d], "alone", args)
        alone[d] = row["frames_per_s"][d]
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
        save()
    for n in sorted({2, count}):
        for how in ("process", "processes"):
            try:
                row = timed(list(range(n)), how, args)
            except RuntimeError as e:
                row = {"how": how, "devices": list(range(n)), "error": str(e)}
            if "frames_per_s" in row:
                row["efficiency"] = {d: round(f / alone[d], 3) for d, f in row["frames_per_s"].items()}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()

    print(f"\n{os.path.basename(args.model.rstrip('/'))} at {args.size}, vaeencode ! vaedecode, CUDA frames")
    print(f"{'run':22} {'frames/s per pipeline':40} {'of alone':24} {'GPU busy':24}")
    for r in results["rows"]:
        name = f"{r['how']} x{len(r['devices'])}"
        if "error" in r:
            print(f"{name:22} error: {r['error'][:100]}")
            continue
        fps = " ".join(f"{f:.1f}" for f in r["frames_per_s"].values())
        eff = " ".join(f"{e:.3f}" for e in r.get("efficiency", {}).values()) or "-"
        busy = " ".join(f"{100 * b:.0f}%" for b in (r["gpu_busy"] or {}).values()) or "-"
        print(f"{name:22} {fps:40} {eff:24} {busy:24}")
    save()


if __name__ == "__main__":
    main()
