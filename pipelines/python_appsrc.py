#!/usr/bin/python3
"""Frames from Python through vaeencode ! vaedecode and back (PyGObject, appsrc / appsink).

    /usr/bin/python3 pipelines/python_appsrc.py [--frames 10] [--size 128x96] [--model PATH]

The application makes RGB frames itself (a moving gradient), pushes them into an appsrc, the
pipeline runs the VAE round trip on the built-in default model (or --model), and an appsink
hands the decoded frames back; the script prints the round trip's PSNR per frame and overall.
Needs /usr/bin/python3 with python3-gi (Debian); nothing else (no numpy).
"""
import argparse
import math
import sys

import gi

gi.require_version("Gst", "1.0")
from gi.repository import Gst  # noqa: E402


def make_frame(width, height, index):
    """An RGB frame as bytes: a gradient that moves with `index`."""
    row = bytearray(width * 3)
    out = bytearray()
    for y in range(height):
        for x in range(width):
            row[3 * x] = (x * 255 // max(1, width - 1) + 8 * index) & 0xFF
            row[3 * x + 1] = y * 255 // max(1, height - 1)
            row[3 * x + 2] = ((x + y) * 2 + 16 * index) & 0xFF
        out += row
    return bytes(out)


def psnr(a, b):
    mse = sum((p - q) ** 2 for p, q in zip(a, b)) / len(a)
    return math.inf if mse == 0 else 10 * math.log10(255 * 255 / mse)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=10, help="frames to push (default 10)")
    ap.add_argument("--size", default="128x96", help="frame size WxH (default 128x96)")
    ap.add_argument("--model", default="", help="model path (default: the built-in default model)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    ap.add_argument("--min-psnr", type=float, default=0.0, help="fail below this mean PSNR (dB)")
    args = ap.parse_args()
    try:
        width, height = (int(v) for v in args.size.split("x"))
    except ValueError:
        ap.error(f"--size {args.size}: expected WxH")
    if args.frames < 1:
        ap.error("--frames must be at least 1")

    Gst.init(None)
    if Gst.ElementFactory.find("vaeencode") is None:
        print("python_appsrc: the latent plugin is not found (set GST_PLUGIN_PATH)", file=sys.stderr)
        return 1
    model = f' model="{args.model}"' if args.model else ""
    caps = f"video/x-raw,format=RGB,width={width},height={height},framerate=10/1"
    pipeline = Gst.parse_launch(
        f'appsrc name=src format=time caps="{caps}" ! vaeencode device={args.device}{model} '
        f"! vaedecode device={args.device}{model} ! videoconvert ! video/x-raw,format=RGB "
        f"! appsink name=sink sync=false max-buffers=4")
    src = pipeline.get_by_name("src")
    sink = pipeline.get_by_name("sink")
    bus = pipeline.get_bus()
    pipeline.set_state(Gst.State.PLAYING)

    def first_error():
        msg = bus.pop_filtered(Gst.MessageType.ERROR)
        if msg is None:
            return None
        err, debug = msg.parse_error()
        return f"{msg.src.get_name()}: {err.message} ({debug})"

    sent = []
    scores = []
    error = None
    duration = Gst.SECOND // 10
    for i in range(args.frames):
        data = make_frame(width, height, i)
        buf = Gst.Buffer.new_wrapped(data)
        buf.pts = i * duration
        buf.duration = duration
        sent.append(data)
        if src.emit("push-buffer", buf) != Gst.FlowReturn.OK:
            error = first_error() or f"appsrc refused frame {i}"
            break
    else:
        src.emit("end-of-stream")
    while error is None and len(scores) < len(sent):
        sample = sink.emit("try-pull-sample", 120 * Gst.SECOND)
        if sample is None:
            error = first_error() or ("timeout" if not sink.is_eos() else "EOS before every frame")
            break
        buf = sample.get_buffer()
        ok, info = buf.map(Gst.MapFlags.READ)
        if not ok:
            error = "cannot map a decoded frame"
            break
        got = bytes(info.data)
        buf.unmap(info)
        i = len(scores)
        if len(got) != len(sent[i]):
            error = f"frame {i}: {len(got)} bytes, expected {len(sent[i])}"
            break
        scores.append(psnr(sent[i], got))
        print(f"frame {i}: PSNR {scores[-1]:.2f} dB")
    error = error or first_error()
    pipeline.set_state(Gst.State.NULL)
    if error:
        print(f"python_appsrc: {error}", file=sys.stderr)
        return 1
    mean = sum(scores) / len(scores)
    print(f"python_appsrc: {len(scores)} frames of {width}x{height} through vaeencode ! vaedecode, "
          f"mean PSNR {mean:.2f} dB")
    if mean < args.min_psnr:
        print(f"python_appsrc: mean PSNR {mean:.2f} dB is below --min-psnr {args.min_psnr}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
