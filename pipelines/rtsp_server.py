#!/usr/bin/python3
"""An RTSP server whose stream is a live source through vaeencode ! vaedecode (gst-rtsp-server).

    /usr/bin/python3 pipelines/rtsp_server.py [--port 8554] [--model PATH] [--size 256x256]
    gst-launch-1.0 rtspsrc location=rtsp://127.0.0.1:8554/latent ! rtpvp8depay ! vp8dec \
        ! videoconvert ! autovideosink

Listens on 127.0.0.1 only. Each client gets the factory's pipeline (shared between clients):
a live videotestsrc, the VAE round trip on the built-in default model (or --model) and VP8 over
RTP. --port 0 picks a free port. The first line on stdout is the stream's URL; the server runs
until interrupted (SIGINT / SIGTERM).
"""
import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def launch_line(model, width, height, fps):
    model_prop = f' model="{model}"' if model else ""
    # A live source: vaeencode/vaedecode keep up or drop late frames (QoS); queue leaky keeps
    # the latency bounded when a client reads slower than the source.
    return (
        f"( videotestsrc is-live=true pattern=ball ! video/x-raw,width={width},height={height},"
        f"framerate={fps}/1 ! vaeencode{model_prop} ! vaedecode{model_prop} ! videoconvert "
        f"! queue leaky=downstream max-size-buffers=2 ! vp8enc deadline=1 keyframe-max-dist={fps} "
        f"! rtpvp8pay name=pay0 pt=96 )"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8554, help="TCP port (0: any free port)")
    ap.add_argument("--model", default="", help="model path (default: the built-in default model)")
    ap.add_argument("--size", default="256x256", help="frame size WxH (multiples of 8)")
    ap.add_argument("--fps", type=int, default=10, help="frames per second of the source")
    ap.add_argument("--mount", default="/latent", help="the stream's path")
    args = ap.parse_args()
    try:
        width, height = (int(v) for v in args.size.split("x"))
    except ValueError:
        ap.error(f"--size {args.size}: expected WxH")
    if not 0 <= args.port <= 65535:
        ap.error(f"--port {args.port}: expected 0..65535")

    Gst.init(None)
    if Gst.ElementFactory.find("vaeencode") is None:
        print("rtsp_server: the latent plugin is not found (set GST_PLUGIN_PATH)", file=sys.stderr)
        return 1
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch_line(args.model, width, height, args.fps))
    factory.set_shared(True)
    server.get_mount_points().add_factory(args.mount, factory)
    if server.attach(None) == 0:
        print(f"rtsp_server: cannot listen on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1
    loop = GLib.MainLoop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"rtsp://127.0.0.1:{server.get_bound_port()}{args.mount}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
