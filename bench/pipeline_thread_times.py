#!/usr/bin/env python3
"""Where a one-thread pipeline's frame time goes, from the stages' own per-frame log lines.

Runs (on the GPU machine, with the GStreamer runtime and the plugin on the paths)

  videotestsrc num-buffers=N ! video/x-raw,format=RGBA,WxH ! [queue !] vaeencode ! vaedecode ! fakesink

with GST_DEBUG=vaeencode:6,vaedecode:6: each stage logs "frame K took X ms" when its transform is done
(gst_latent_base_frame_done: vaeencode's conversion, encode and latent write with its wait;
vaedecode's decode and the wait for the download `prefetch-depth` frames back). From the log's
timestamps, per frame after a warm-up:

  period     the encoder's frame-to-frame interval (1000 / frames/s)
  enc, dec   each stage's own time (the log's "took")
  gap        from the decoder's frame K-1 done to the encoder's frame K start: the source's
             drawing, vaeencode's staging of the frame (the upload's slot), the push to fakesink

Each variant is a row; env variables per row (e.g. LATENT_FENCED_LATENTS=1) after the name.

  python3 bench/pipeline_thread_times.py --frames 400 --out times.json \\
      plain: queued:queue fenced:LATENT_FENCED_LATENTS=1
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

LINE = re.compile(r"^(\d+):(\d\d):(\d\d)\.(\d+)\s.*<(\w+)> frame (\d+) took ([\d.]+) ms")


def parse(log: str):
    """{element: {frame: (done_s, took_ms)}} from a GST_DEBUG log."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for line in log.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        h, mi, s, frac, name, k, took = m.groups()
        t = int(h) * 3600 + int(mi) * 60 + int(s) + float("0." + frac)
        out.setdefault(name, {})[int(k)] = (t, float(took))
    return out


def summarise(times, enc: str, dec: str, skip: int) -> dict:
    e, d = times.get(enc, {}), times.get(dec, {})
    ks = sorted(k for k in e if k > skip and k - 1 in e and k - 1 in d)
    if len(ks) < 10:
        return {"error": f"only {len(ks)} frames logged by {enc} and {dec}"}
    period = [1000 * (e[k][0] - e[k - 1][0]) for k in ks]
    gap = [1000 * ((e[k][0] - e[k][1] / 1000) - d[k - 1][0]) for k in ks]
    return {
        "frames": len(ks),
        "period_ms": round(statistics.median(period), 3),
        "fps": round(1000 / statistics.median(period), 1),
        "enc_ms": round(statistics.median(e[k][1] for k in ks), 3),
        "dec_ms": round(statistics.median(d[k][1] for k in ks if k in d), 3),
        "gap_ms": round(statistics.median(gap), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", help="NAME:[queue][,VAR=VALUE...] e.g. fenced:LATENT_FENCED_LATENTS=1")
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "models", "default"))
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--skip", type=int, default=30, help="warm-up frames left out")
    ap.add_argument("--encoder-props", default="", help="extra vaeencode properties")
    ap.add_argument("--device", default="cuda", help="cpu for a dry run here")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    w, h = args.size.split("x")
    rows = []
    for spec in args.variants:
        name, _, rest = spec.partition(":")
        queue = False
        env = dict(os.environ, GST_DEBUG="vaeencode:6,vaedecode:6", GST_DEBUG_NO_COLOR="1")
        for item in filter(None, rest.split(",")):
            if item == "queue":
                queue = True
            elif "=" in item:
                k, v = item.split("=", 1)
                env[k] = v
            else:
                print(f"{spec}: '{item}' is neither 'queue' nor VAR=VALUE", file=sys.stderr)
                return 2
        line = (f"videotestsrc num-buffers={args.frames} ! video/x-raw,format=RGBA,width={w},height={h} ! "
                + ("queue max-size-buffers=4 ! " if queue else "")
                + f"vaeencode name=enc model={args.model} device={args.device} {args.encoder_props} ! "
                + f"vaedecode name=dec model={args.model} device={args.device} ! fakesink sync=false")
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as logf:
            env["GST_DEBUG_FILE"] = logf.name
            r = subprocess.run(["gst-launch-1.0", "-q"] + line.split(), env=env,
                               capture_output=True, text=True, timeout=300)
            log = open(logf.name, encoding="utf-8", errors="replace").read()
        row = {"name": name, "queue": queue, "env": {k: env[k] for k in env if k.startswith("LATENT_")},
               "pipeline": line, "rc": r.returncode}
        row.update(summarise(parse(log), "enc", "dec", args.skip) if r.returncode == 0
                   else {"error": r.stderr[-400:]})
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{'variant':<14} {'f/s':>7} {'period':>7} {'enc':>6} {'dec':>6} {'gap':>6}  (ms, medians)")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<14} error: {r['error'][:100]}")
        else:
            print(f"{r['name']:<14} {r['fps']:>7} {r['period_ms']:>7} {r['enc_ms']:>6} {r['dec_ms']:>6} {r['gap_ms']:>6}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
