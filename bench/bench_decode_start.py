#!/usr/bin/env python3
"""How long a clip takes to start decoding when many pipelines start clips at once (issue 14).

The precompute job's clips start later the more pipelines the machine runs (bench/NOTES.md,
session 13: decodebin's video pad after 0.22 s with 2 pipelines, 2.19 s with 16, across four
GPUs). This runs only the decoding part, the way the job does (one process per worker, pinned to
a GPU with CUDA_VISIBLE_DEVICES, its pipelines taking clips one after another, each clip from NULL
to EOS), for a total of N pipelines spread over the GPUs, and times each clip's start:

  pad     decodebin's video pad (typefind, demuxer, parser, decoder made and configured)
  first   the first decoded frame at the sink
  total   PLAYING to EOS

with the decoder decodebin picks (nvh264dec on a GPU machine) and, as the control that touches no
GPU, openh264dec forced by raising its rank. If the start grows with N for nvh264dec and not for
openh264dec, the serialised step is on the GPU side (the decoder's creation or its memory).

  python3 bench/bench_decode_start.py --pipelines 1,4,8,16 [--clips-dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def worker(gpu: str, pipelines: int, clips: list[str], decoder: str, out) -> None:
    """One process: `pipelines` threads, each playing every clip of `clips` in turn."""
    import threading

    if gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    from gst_latent.pipeline import decoder_in, gst

    Gst = gst()  # initialised once, with the types the threads' callbacks meet loaded first
    if decoder == "openh264dec":  # the CPU control: outrank the hardware decoders
        f = Gst.ElementFactory.find("openh264dec")
        if f is None:
            out.put({"error": "openh264dec not found"})
            return
        f.set_rank(Gst.Rank.PRIMARY + 1000)
    rows = []
    lock = threading.Lock()

    def run():
        pipe = Gst.parse_launch("filesrc name=src ! decodebin name=dec ! fakesink name=sink sync=false")
        src, dec, sink = (pipe.get_by_name(n) for n in ("src", "dec", "sink"))
        marks = {}

        def on_pad(_dec, pad):
            marks.setdefault("pad", time.monotonic())
            pad.link(sink.get_static_pad("sink"))

        def on_buffer(_pad, _info):
            marks.setdefault("first", time.monotonic())
            return Gst.PadProbeReturn.OK

        dec.connect("pad-added", on_pad)
        sink.get_static_pad("sink").add_probe(Gst.PadProbeType.BUFFER, on_buffer)
        for clip in clips:
            marks.clear()
            src.set_property("location", clip)
            t0 = time.monotonic()
            pipe.set_state(Gst.State.PLAYING)
            msg = pipe.get_bus().timed_pop_filtered(120 * Gst.SECOND,
                                                    Gst.MessageType.EOS | Gst.MessageType.ERROR)
            t1 = time.monotonic()
            used = decoder_in(dec)
            pipe.set_state(Gst.State.NULL)
            ok = msg is not None and msg.type == Gst.MessageType.EOS
            with lock:
                rows.append({"ok": ok, "pad": marks.get("pad", t1) - t0,
                             "first": marks.get("first", t1) - t0, "total": t1 - t0, "decoder": used})


    threads = [threading.Thread(target=run) for _ in range(pipelines)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put({"rows": rows})


def measure(n: int, gpus: int, clips: list[str], decoder: str) -> dict:
    """N pipelines in all: two a process (as the job runs them), processes dealt over the GPUs."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    per = [2] * (n // 2) + ([1] if n % 2 else [])
    procs = [ctx.Process(target=worker, args=(str(i % gpus) if gpus else "", k, clips, decoder, out))
             for i, k in enumerate(per)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    rows, errors = [], []
    for _ in procs:
        r = out.get(timeout=600)
        rows += r.get("rows", [])
        if "error" in r:
            errors.append(r["error"])
    for p in procs:
        p.join()
    ok = [r for r in rows if r["ok"]]
    med = lambda k: round(statistics.median(r[k] for r in ok), 3) if ok else None  # noqa: E731
    return {"pipelines": n, "processes": len(procs), "gpus": gpus, "decoder_asked": decoder,
            "decoders": sorted({r["decoder"] for r in rows}), "clips": len(rows), "failed": len(rows) - len(ok),
            "pad_s": med("pad"), "first_frame_s": med("first"), "clip_s": med("total"),
            "wall_s": round(time.monotonic() - t0, 2), "errors": errors}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", default="1,4,8,16", help="total pipelines, a run each")
    ap.add_argument("--clips-dir", default="/tmp/bench-precompute/clips")
    ap.add_argument("--clips", type=int, default=8, help="clips each pipeline plays")
    ap.add_argument("--decoders", default="auto,openh264dec", help="auto: what decodebin picks")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from bench_precompute import gpu_count, make_clips

    clips = make_clips(args.clips_dir, max(args.clips, 1), 81, 24)[: args.clips]
    gpus = gpu_count() if os.path.exists("/dev/nvidia0") else 0
    results = {"gpus": gpus, "clips_per_pipeline": len(clips), "rows": []}
    for decoder in args.decoders.split(","):
        for n in (int(v) for v in args.pipelines.split(",")):
            row = measure(n, gpus, clips, decoder)
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    print(f"\n{'decoder':14} {'pipelines':>9} {'pad s':>7} {'first s':>8} {'clip s':>7}  decoders")
    for r in results["rows"]:
        print(f"{r['decoder_asked']:14} {r['pipelines']:>9} {r['pad_s']!s:>7} {r['first_frame_s']!s:>8} "
              f"{r['clip_s']!s:>7}  {','.join(r['decoders'])}{' ' + str(r['errors']) if r['errors'] else ''}")


if __name__ == "__main__":
    main()
