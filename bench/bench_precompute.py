#!/usr/bin/env python3
"""Dataset precompute throughput on the GPU machine (issue 11 item 4).

On a set of 720p H.264 clips (generated here when --clips-dir has none), for each model:

  ray      scripts/latent-precompute --engine ray --workers NGPU --gpus-per-worker 1
           (filesrc ! decodebin ! vaeencode ! latentsink per actor; decodebin picks nvh264dec
           when GStreamer's nvcodec plugin is there, and its CUDA memory goes straight in);
           ray-cluster: the same joining a local cluster started before the row (`ray start
           --head`, RAY_ADDRESS=auto): a cluster that is already up, as on a real one
  encoder  the encoder alone: the job's 8 distinct clips decoded beforehand to raw NV12, read back
           (filesrc ! rawvideoparse ! queue ! cudaupload ! vaeencode ! fakesink; system memory
           without cudaupload), start-up removed by two frame counts (the "standalone frames/s"
           the target compares with); --encoder-source black: videotestsrc pattern=black
  torch    a plain PyTorch + diffusers loop over the same clips: decode (PyAV, else torchvision,
           else GStreamer through appsink), encode with the model's diffusers class (video mode:
           the whole clip [1, 3, T, H, W] for AutoencoderKLWan / AutoencoderKLQwenImage; per-frame
           batches otherwise), latents to the host, saved with safetensors.torch

Each row: clips/s, video frames/s and latent frames/s per GPU, the GPU's busy fraction
(nvidia-smi utilization.gpu sampled every 100 ms while the row runs; mean over the GPUs used),
wall seconds. The Ray row's time is the whole job's, Ray's start-up and model loading included
(use enough clips that they do not matter). JSON after every row, a table at the end.

  python3 bench/bench_precompute.py --models /models/Wan2.1-VAE,models/default \\
      --clips 32 --frames 81 --out bench/results/precompute-h100.json \\
      [--encoder-prop video-mode=true] [--dtype bf16] [--skip-torch]
      [--engine ray,local] [--gpus 1,2]   # both engines, on 1 and on 2 GPUs: the scaling rows
      [--pipelines 1,2]                   # the job's --pipelines-per-worker (rows localx1p1, ...)
      [--torch-clips 32]                  # the PyTorch loop over the first 32 clips only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

from gst_latent.latentfile import read_header  # noqa: E402

W, H = 1280, 720


# ---- helpers ------------------------------------------------------------------------------------


def have_element(name: str) -> bool:
    return subprocess.run(["gst-inspect-1.0", "--exists", name]).returncode == 0


def make_clips(folder: str, count: int, frames: int, fps: int) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    enc = next((e for e in ("nvh264enc", "x264enc", "openh264enc", "avenc_h264_omx") if have_element(e)), None)
    if enc is None:
        raise SystemExit("bench_precompute: no H.264 encoder (nvh264enc, x264enc, openh264enc); "
                         "give --clips-dir with clips")
    mux = "mp4mux" if have_element("mp4mux") else "matroskamux"
    ext = "mp4" if mux == "mp4mux" else "mkv"
    patterns = ["ball", "smpte", "snow", "circular", "pinwheel", "spokes", "gamut", "zone-plate"]
    paths = [os.path.join(folder, f"clip_{i:04d}.{ext}") for i in range(count)]

    def make(i):
        path = paths[i]
        if os.path.exists(path):
            return
        desc = (f"videotestsrc num-buffers={frames} pattern={patterns[i % len(patterns)]} ! "
                f"video/x-raw,width={W},height={H},framerate={fps}/1 ! videoconvert ! {enc} ! "
                f"h264parse ! {mux} ! filesink location={path}.tmp")
        subprocess.run(["gst-launch-1.0", "-q"] + desc.split(), check=True, timeout=600)
        os.rename(path + ".tmp", path)

    # Software encoders use a core or two each: one clip per two cores at a time (the clips are the
    # same whatever the order; the hardware encoder has few sessions, so two at a time). Clip i
    # shows pattern i % 8 from its first frame, so the clips past the eighth are copies of the
    # first eight (the same frames to decode and encode; a 200-clip set costs 8 encodes).
    from concurrent.futures import ThreadPoolExecutor

    jobs = 2 if enc == "nvh264enc" else max(1, (os.cpu_count() or 2) // 2)
    distinct = min(count, len(patterns))
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(make, range(distinct)))
    for i in range(distinct, count):
        if not os.path.exists(paths[i]):
            shutil.copyfile(paths[i % len(patterns)], paths[i] + ".tmp")
            os.rename(paths[i] + ".tmp", paths[i])
    return paths


class GpuSampler:
    """nvidia-smi utilization.gpu of each GPU every 100 ms in the background."""

    def __init__(self, gpus: list[int]):
        self.gpus = gpus
        self.samples: list[tuple[float, float, int]] = []  # (time.time(), busy fraction, GPU index)
        self.proc = None
        self.thread = None

    def __enter__(self):
        if shutil.which("nvidia-smi") is None:
            return self
        ids = ",".join(str(g) for g in self.gpus)
        self.proc = subprocess.Popen(
            ["nvidia-smi", f"--id={ids}", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits",
             "-lms", "100"], stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                index, busy = (v.strip() for v in line.split(","))
                self.samples.append((time.time(), float(busy) / 100.0, int(index)))
            except ValueError:
                pass

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def busy(self, start: float = 0.0, end: float = float("inf")):
        """The mean busy fraction of the samples taken between `start` and `end` (time.time()),
        over every GPU sampled."""
        v = [b for t, b, _ in self.samples if start <= t <= end]
        return round(sum(v) / len(v), 3) if v else None

    def busy_per_gpu(self, start: float = 0.0, end: float = float("inf")):
        """{GPU index: mean busy fraction} of the samples between `start` and `end`."""
        per: dict[int, list[float]] = {}
        for t, b, g in self.samples:
            if start <= t <= end:
                per.setdefault(g, []).append(b)
        return {g: round(sum(v) / len(v), 3) for g, v in sorted(per.items())} or None


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
        return max(1, sum(1 for l in out.splitlines() if l.startswith("GPU ")))
    except (OSError, subprocess.CalledProcessError):
        return 1


# ---- rows ---------------------------------------------------------------------------------------


def ray_cli(argv, env, check=True) -> None:
    """`ray ARGV` from the job's Python environment ($LATENT_VENV, as scripts/latent-precompute)."""
    venv = os.environ.get("LATENT_VENV", os.path.expanduser("~/.cache/gst-latent/venv"))
    p = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "ray.scripts.scripts", *argv],
                       capture_output=True, text=True, timeout=120, env=env)
    if check and p.returncode != 0:
        raise RuntimeError(f"ray {' '.join(argv)}: {(p.stderr or p.stdout)[-800:]}")


def row_name(engine: str, gpus: int, per_gpu: int, pipelines: int) -> str:
    """A job row's name (and its trace's): ENGINExG[wW]pK."""
    return f"{engine}x{gpus}{f'w{per_gpu}' if per_gpu > 1 else ''}p{pipelines}"


def nvcodec_decoders() -> list[str]:
    """The decoders GStreamer's nvcodec plugin registered here (none without it or a GPU)."""
    p = subprocess.run(["gst-inspect-1.0", "nvcodec"], capture_output=True, text=True)
    return sorted({m.group(1) for m in re.finditer(r"^\s*(nv\w*dec):", p.stdout, re.M)})


def run_job(model, clips_dir, out_dir, gpus, args, engine="ray", pipelines=2, per_gpu=1) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    # local-together: the local engine with its pipelines' first clips not staggered;
    # local-preroll / ray-preroll: with --preroll (clips prerolled while others stream)
    # ray-cluster: the Ray engine joining a local cluster started before the row (`ray start
    # --head`, as a cluster that is already up; RAY_ADDRESS=auto), not one the job starts;
    # local-decodebin: decodebin made anew for every clip (--no-keep-decoders); local-cpudecode:
    # the CPU's decoders (nvcodec's ranked out: GST_PLUGIN_FEATURE_RANK)
    job_engine = "local" if engine in ("local-together", "local-preroll", "local-decodebin",
                                       "local-cpudecode") else \
        "ray" if engine in ("ray-preroll", "ray-cluster") else engine
    # per_gpu > 1: that many workers (processes or actors, each with its own model, backend and
    # CUDA stream) share each GPU, so one worker's host-bound launches leave the others' queued work
    # to run
    cmd = [os.path.join(ROOT, "scripts", "latent-precompute"), "--engine", job_engine, "--workers", str(gpus * per_gpu),
           "--model", model, "--input", clips_dir, "--output", out_dir, "--no-progress",
           "--pipelines-per-worker", str(pipelines)]
    summary = os.path.join(args.work, "summary.json")
    cmd += ["--summary", summary]
    if engine.endswith("-preroll"):
        cmd += ["--preroll"]
    if engine == "local-decodebin":
        cmd += ["--no-keep-decoders"]
    if job_engine == "ray":
        cmd += ["--gpus-per-worker", f"{1 / per_gpu:g}"]
    else:  # one worker process per GPU, devices dealt in turn
        cmd += ["--device", ",".join(f"cuda:{i}" for i in range(gpus))]
    if args.dtype:
        cmd += ["--dtype", args.dtype]
    for p in args.encoder_prop:
        cmd += ["--encoder-prop", p]
    traced = trace_env(args, row_name(engine, gpus, per_gpu, pipelines))
    env = traced
    if engine == "local-together":  # (the trace, when there is one, is still traced's file)
        env = dict(traced or os.environ, LATENT_PRECOMPUTE_STAGGER="0")
    if engine == "local-cpudecode":
        env = dict(traced or os.environ,
                   GST_PLUGIN_FEATURE_RANK=",".join(f"{d}:NONE" for d in nvcodec_decoders()))
    cluster_s = None
    if engine == "ray-cluster":
        env = dict(env or os.environ, RAY_ADDRESS="auto")
        t_up = time.perf_counter()
        ray_cli(["start", "--head", f"--num-gpus={gpus}", "--disable-usage-stats",
                 "--include-dashboard=false"], env)
        cluster_s = round(time.perf_counter() - t_up, 3)
    try:
        with GpuSampler(list(range(gpus))) as gpu:
            t0 = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
            wall = time.perf_counter() - t0
    finally:
        if engine == "ray-cluster":
            ray_cli(["stop"], env, check=False)
    if p.returncode not in (0, 3):
        raise RuntimeError(p.stderr[-1500:])
    files = [os.path.join(d, f) for d, _, fs in os.walk(out_dir) for f in fs if f.endswith(".safetensors")]
    frames = latents = 0
    for f in files:
        _, meta = read_header(f)
        frames += meta["frame_count"]
        latents += meta["latent_frames"]
    with open(summary) as f:
        job = json.load(f)
    inside = job.get("frames_per_s_per_worker_while_clips_ran")
    if inside is not None:  # per GPU: the job's figure is per worker
        inside = round(inside * per_gpu, 2)
    span = job.get("clips_ran") or [0.0, 0.0]
    failed = 0
    fpath = os.path.join(out_dir, "failures.jsonl")
    if os.path.exists(fpath):
        failed = sum(1 for _ in open(fpath))
    row = {"clips": len(files), "failed": failed, "frames": frames, "latent_frames": latents,
            "seconds": round(wall, 3), "gpu_busy": gpu.busy(), "gpus": gpus, "workers_per_gpu": per_gpu,
            "pipelines_per_worker": pipelines,
            # from the first clip's start to the last one's end (no start-up, no shutdown)
            "gpu_busy_while_clips_ran": gpu.busy(*span) if span[1] > span[0] else None,
            # each GPU's own (issue 14: no GPU idle more than 5 % of the run)
            "gpu_busy_per_gpu": gpu.busy_per_gpu(),
            "gpu_busy_per_gpu_while_clips_ran": gpu.busy_per_gpu(*span) if span[1] > span[0] else None,
            "log_tail": p.stderr.strip().splitlines()[-3:] if p.stderr else [],
            "decoded_by": job.get("decoded_by"),
            # the job's mean per-clip phases (s): whole clip, to the first frame and latent,
            # streaming, teardown
            "per_clip": job.get("per_clip_mean_s"),
            # frames / (the last clip's end - the first one's start) / workers: the job without
            # its start-up (processes, Ray, the model load), the figure to hold against the
            # encoder alone
            "frames_per_s_while_clips_ran": inside,
            # the share of that span during which some clip was streaming (first latent to EOS)
            "streaming_share": job.get("streaming_share"),
            # the job's fixed cost: to the first clip's start, after the last one's end, Ray's
            # start and shutdown
            "fixed_s": job.get("fixed_s"),
            # ray-cluster: seconds `ray start --head` took before the row (not in its time)
            "cluster_start_s": cluster_s}
    if traced is not None and span[1] > span[0]:
        row["trace"] = trace_summary(traced["LATENT_TRACE"], span[0], span[1])
    return row


def trace_env(args, name: str):
    """The environment for a traced run (LATENT_TRACE=WORK/trace-NAME.txt), None without --trace."""
    if not args.trace:
        return None
    path = os.path.join(args.work, f"trace-{name}.txt")
    if os.path.exists(path):
        os.remove(path)
    return dict(os.environ, LATENT_TRACE=path)


def trace_summary(path: str, t0=None, t1=None) -> dict:
    """bench/trace_gaps.py's reading of a trace, between t0 and t1 (time.time()), gaps >= 5 ms."""
    from trace_gaps import analyse, read_marks

    r = analyse(read_marks(path), t0, t1, gap_ms=5.0)
    longest = sorted(r["gaps"], key=lambda g: -g["ms"])[:8]
    return {"file": path, "device_busy_share": r["busy_share"],
            "device_busy_share_max": r["busy_share_max"], "idle_s": r["idle_s"],
            "idle_by_state_s": r["idle_by_state_s"], "gaps_5ms": len(r["gaps"]),
            "gaps_5ms_total_ms": round(sum(g["ms"] for g in r["gaps"]), 1), "longest_gaps": longest,
            "all_streaming": r["all_streaming"]}


def decoded_clips(clip_paths, work: str) -> str:
    """The job's distinct clips (the first 8: make_clips cycles 8 patterns) decoded once into one
    raw NV12 file, WORK/decoded-<key>-once.nv12, and that file twice over, ...-twice.nv12 (made
    when missing; the key names the clips, their sizes and times). Returns the first path."""
    import hashlib

    key = hashlib.sha1(repr([(os.path.abspath(c), os.path.getsize(c), os.path.getmtime(c), W, H)
                             for c in clip_paths[:8]]).encode()).hexdigest()[:12]
    once = os.path.join(work, f"decoded-{key}-once.nv12")
    twice = os.path.join(work, f"decoded-{key}-twice.nv12")
    if os.path.exists(once) and os.path.exists(twice):
        return once
    os.makedirs(work, exist_ok=True)
    parts = []
    for i, clip in enumerate(clip_paths[:8]):
        raw = os.path.join(work, f"decoded-{i}.nv12")
        desc = (f"filesrc location={clip} ! decodebin ! videoconvert ! "
                f"video/x-raw,format=NV12,width={W},height={H} ! filesink location={raw}")
        subprocess.run(["gst-launch-1.0", "-q"] + desc.split(), check=True, timeout=600)
        parts.append(raw)
    for path, times in ((once + ".tmp", 1), (twice + ".tmp", 2)):
        with open(path, "wb") as out:
            for _ in range(times):
                for raw in parts:
                    with open(raw, "rb") as f:
                        shutil.copyfileobj(f, out, 16 << 20)
    for raw in parts:
        os.remove(raw)
    os.rename(twice + ".tmp", twice)
    os.rename(once + ".tmp", once)
    return once


_ENCODER_WARM: set = set()  # (model, source) run once untimed in this process


def run_encoder_alone(model, args, clip_paths=None) -> dict:
    props = " ".join(f"{p}" for p in args.encoder_prop)
    dtype = f"dtype={args.dtype}" if args.dtype else ""

    # The frames as the job's decoder hands them over (NV12 in CUDA memory, cudaupload), from a
    # source that costs nothing, a queue between them. Without GStreamer's CUDA elements: the
    # same frames in system memory (vaeencode uploads).
    # --encoder-source clips (the default): the job's own clips, decoded once beforehand (raw
    # NV12 read back from the page cache), so that the encoder alone sees the content the job
    # encodes. Under the power cap the content can move the rate: black frames give every layer
    # of the random-weight model a spatially constant input (fewer bit flips per multiply, less
    # power, higher clocks).
    # black: videotestsrc pattern=black (sessions 4-27's denominator; videotestsrc's ball
    # pattern alone runs only ~150-300 frames/s at 720p on the CPU and bounded session 4's first
    # figure). Two runs of n1 and n2 frames, the difference timed (start-up left out).
    if args.encoder_source == "clips" and clip_paths:
        once = decoded_clips(clip_paths, os.path.join(args.work, "decoded"))
        twice = once[:-len("once.nv12")] + "twice.nv12"
        n1 = os.path.getsize(once) // (W * H * 3 // 2)
        n2 = 2 * n1
        parse = f"rawvideoparse format=nv12 width={W} height={H} framerate=24/1"
        files = {n1: once, n2: twice}
        sources = [f"filesrc location={{file}} ! {parse} ! queue ! cudaupload ! video/x-raw(memory:CUDAMemory)",
                   f"filesrc location={{file}} ! {parse} ! queue"]
    else:
        # Five times the frames in the second run: start-up varies by some 0.3 s between runs.
        n1, n2 = args.frames, args.frames * 5
        files = {n1: "", n2: ""}
        sources = [f"videotestsrc num-buffers={{n}} pattern=black ! video/x-raw,format=NV12,width={W},height={H},"
                   "framerate=30/1 ! queue ! cudaupload ! video/x-raw(memory:CUDAMemory)",
                   f"videotestsrc num-buffers={{n}} pattern=black ! video/x-raw,format=RGBA,width={W},height={H},"
                   "framerate=30/1 ! queue"]

    # cuDNN's choices as the job makes them (latent-precompute: LATENT_CUDNN_SEARCH as set, else
    # heuristic, which also keeps the 3-D graphs on the heuristics' first engine).
    env = dict(trace_env(args, "encoder") or os.environ)
    env.setdefault("LATENT_CUDNN_SEARCH", "heuristic")

    def once(src, n):
        desc = f"{src.format(n=n, file=files[n])} ! vaeencode model={model} device=cuda {dtype} {props} ! fakesink"
        t0 = time.perf_counter()
        subprocess.run(["gst-launch-1.0", "-q"] + desc.split(), check=True, timeout=args.timeout,
                       capture_output=True, env=env)
        return time.perf_counter() - t0

    # The pair is timed --encoder-reps times and the median pair kept: one pair's rate varied by
    # 3-5 % between calls on one H100 (70.8 / 73.1 frames/s), and it is the denominator of the
    # issue's ratio.
    for i, src in enumerate(sources):
        pairs = []
        try:
            # The process's first run on a machine also makes the plan cache (and finds the
            # kernels), which the pair's difference would take off the longer run only: the first
            # bracket on a fresh H200 read 763 frames/s (session 30). One untimed run first.
            if (model, src) not in _ENCODER_WARM:
                once(src, n1)
                _ENCODER_WARM.add((model, src))
            with GpuSampler([0]) as gpu:
                for _ in range(max(1, args.encoder_reps)):
                    pairs.append((once(src, n1), once(src, n2)))
        except subprocess.CalledProcessError:
            if i + 1 < len(sources):
                continue
            raise
        pairs.sort(key=lambda p: p[1] - p[0])
        t1, t2 = pairs[len(pairs) // 2]
        row = {"frames": n2 - n1, "seconds": round(t2 - t1, 3), "gpu_busy": gpu.busy(), "gpus": 1,
               "source": src.format(n="N", file=files[n2]), "content": args.encoder_source,
               "frames_per_s_each": sorted(round((n2 - n1) / (b - a), 2) for a, b in pairs)}
        if os.path.exists(env.get("LATENT_TRACE", "")):
            # The second, longer run's marks from its 10th frame on (start-up left out).
            from trace_gaps import read_marks

            marks = read_marks(env["LATENT_TRACE"])
            runs = [i for i, m in enumerate(marks) if m["label"] == "in" and m["n"] == 0]
            if len(runs) >= 2:
                steady = [m for m in marks[runs[-1]:] if m["n"] >= 10]
                if steady:
                    row["trace"] = trace_summary(env["LATENT_TRACE"], steady[0]["queued"],
                                                 max(m["reached"] for m in steady))
        return row


def run_torch(model, clip_paths, args) -> dict:
    import numpy as np
    import torch
    import diffusers
    from safetensors.torch import save_file

    cfg_dir = model if os.path.exists(os.path.join(model, "config.json")) else os.path.join(model, "vae")
    cls_name = json.load(open(os.path.join(cfg_dir, "config.json")))["_class_name"]
    cls = getattr(diffusers, cls_name)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype or "bf16"]
    vae = cls.from_pretrained(cfg_dir, torch_dtype=dtype).to("cuda").eval()
    video = cls_name in ("AutoencoderKLWan", "AutoencoderKLQwenImage")

    def frames_of(path):
        try:
            import av

            with av.open(path) as c:
                return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
        except ImportError:
            pass
        try:
            import torchvision

            v, _, _ = torchvision.io.read_video(path, pts_unit="sec", output_format="THWC")
            return v.numpy()
        except Exception:  # torchvision without video support
            pass
        import gi

        gi.require_version("Gst", "1.0")
        from gi.repository import Gst

        Gst.init(None)
        pipe = Gst.parse_launch(f"filesrc location={path} ! decodebin ! videoconvert ! "
                                "video/x-raw,format=RGB ! appsink name=s sync=false")
        sink = pipe.get_by_name("s")
        pipe.set_state(Gst.State.PLAYING)
        out = []
        while True:
            sample = sink.emit("pull-sample")
            if sample is None:
                break
            buf = sample.get_buffer()
            s = sample.get_caps().get_structure(0)
            w, h = s.get_value("width"), s.get_value("height")
            ok, info = buf.map(Gst.MapFlags.READ)
            out.append(np.frombuffer(info.data, np.uint8)[: w * h * 3].reshape(h, w, 3).copy())
            buf.unmap(info)
        pipe.set_state(Gst.State.NULL)
        return np.stack(out)

    out_dir = os.path.join(args.work, "torch-out")
    os.makedirs(out_dir, exist_ok=True)
    frames = latents = 0
    with GpuSampler([0]) as gpu, torch.inference_mode():
        t0 = time.perf_counter()
        for i, path in enumerate(clip_paths):
            rgb = frames_of(path)  # [T, H, W, 3] uint8
            x = torch.from_numpy(rgb).to("cuda").permute(0, 3, 1, 2).to(dtype) / 127.5 - 1.0
            if video:
                z = vae.encode(x.permute(1, 0, 2, 3).unsqueeze(0)).latent_dist.mode()  # [1, C, t, h, w]
                z = z[0].permute(1, 0, 2, 3)
            else:
                enc = vae.encode(x)
                z = enc.latents if hasattr(enc, "latents") else enc.latent_dist.mode()
            save_file({"latents": z.contiguous().cpu()}, os.path.join(out_dir, f"{i:04d}.safetensors"))
            frames += rgb.shape[0]
            latents += z.shape[0]
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    return {"clips": len(clip_paths), "frames": frames, "latent_frames": latents, "seconds": round(wall, 3),
            "gpu_busy": gpu.busy(), "gpus": 1, "decoder": "pyav/torchvision/gstreamer (first available)",
            "diffusers_class": cls_name, "video_mode": video}


def rates(row: dict) -> dict:
    s, g = row.get("seconds") or 0, row.get("gpus", 1)
    if s > 0:
        if "clips" in row:
            row["clips_per_s_per_gpu"] = round(row["clips"] / s / g, 3)
        row["frames_per_s_per_gpu"] = round(row["frames"] / s / g, 2)
        if "latent_frames" in row:
            row["latent_frames_per_s_per_gpu"] = round(row["latent_frames"] / s / g, 2)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="comma-separated model paths")
    ap.add_argument("--clips", type=int, default=32)
    ap.add_argument("--frames", type=int, default=81, help="frames per clip")
    ap.add_argument("--fps", type=int, default=24)
    ap.add_argument("--clips-dir", default="", help="default: WORK/clips (generated when missing)")
    ap.add_argument("--work", default="/tmp/bench-precompute")
    ap.add_argument("--gpus", default="0",
                    help="workers, one a GPU (default: every GPU); a comma-separated list runs the job "
                         "once per count (scaling: 1,2)")
    ap.add_argument("--engine", default="ray", help="the job's engine(s): ray, local, local-together (the local engine with "
                         "LATENT_PRECOMPUTE_STAGGER=0), local-preroll / ray-preroll (with --preroll), local-decodebin "
                         "(--no-keep-decoders: decodebin made anew for every clip), local-cpudecode (the CPU's "
                         "decoders: nvcodec's ranked out), ray-cluster "
                         "(joining a local cluster started before the row: `ray start --head`) or a "
                         "comma-separated list, run in that order (a name may repeat: alternation)")
    ap.add_argument("--pipelines", default="2",
                    help="the job's --pipelines-per-worker; a comma-separated list runs it once per value")
    ap.add_argument("--workers-per-gpu", default="1",
                    help="workers sharing each GPU (processes on the local engine, fractional-GPU actors on "
                         "Ray), each with its own model and CUDA stream; a comma-separated list runs the job "
                         "once per value (rows ENGINExGwWpK)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--encoder-prop", action="append", default=[], help="NAME=VALUE for vaeencode")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--torch-clips", type=int, default=0,
                    help="the PyTorch loop over the first N clips only (default: all; its rate is per "
                         "frame, so a long job's comparison need not run the slow loop over all of it)")
    ap.add_argument("--skip-encoder", action="store_true")
    ap.add_argument("--encoder-bracket", action="store_true",
                    help="also time the encoder alone once right before and after each job row (a "
                         "run between two rows serves both) and give each row its ratio to the mean "
                         "of the two: the machine's rate drifted by up to 8 %% within one call")
    ap.add_argument("--encoder-source", choices=("clips", "black"), default="clips",
                    help="the encoder alone's frames: the job's own clips decoded beforehand (default: the "
                         "same content as the job; under the power cap content can move the rate) or "
                         "videotestsrc's black frames (sessions 4-27)")
    ap.add_argument("--encoder-reps", type=int, default=3,
                    help="time the encoder alone this many times (clips: the 8 distinct clips once against "
                         "twice; black: 81 against 405 frames); the median")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--trace", action="store_true",
                    help="run the job and the encoder alone with LATENT_TRACE (WORK/trace-*.txt) and "
                         "add bench/trace_gaps.py's reading of the device's idle time to their rows")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    clips_dir = args.clips_dir or os.path.join(args.work, "clips")
    clip_paths = make_clips(clips_dir, args.clips, args.frames, args.fps)
    counts = [int(g) for g in str(args.gpus).split(",") if g.strip()]
    counts = [g or gpu_count() for g in counts] or [gpu_count()]
    pipelines = [int(k) for k in str(args.pipelines).split(",") if k.strip()] or [2]
    per_gpu = [int(w) for w in str(args.workers_per_gpu).split(",") if w.strip()] or [1]
    if min(per_gpu) < 1:
        raise SystemExit(f"--workers-per-gpu {args.workers_per_gpu}: each value must be at least 1")
    results = {"size": f"{W}x{H}", "clips": args.clips, "frames_per_clip": args.frames,
               "dtype": args.dtype, "encoder_props": args.encoder_prop, "rows": []}

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)

    for model in [m for m in args.models.split(",") if m]:
        jobs = [(row_name(eng, g, w, k), lambda eng=eng, g=g, k=k, w=w: run_job(
                    model, clips_dir, os.path.join(args.work, f"{eng}-out"), g, args, eng, k, w))
                for eng in args.engine.split(",") for g in counts for w in per_gpu for k in pipelines]
        if not args.skip_encoder:
            jobs.append(("encoder", lambda: run_encoder_alone(model, args, clip_paths)))
        if not args.skip_torch:
            loop_clips = clip_paths[:args.torch_clips] if args.torch_clips > 0 else clip_paths
            jobs.append(("torch", lambda: run_torch(model, loop_clips, args)))
        def encoder_now():
            try:
                return rates(run_encoder_alone(model, argparse.Namespace(**{**vars(args), "encoder_reps": 1,
                                                                             "trace": False}),
                                               clip_paths))["frames_per_s_per_gpu"]
            except Exception as e:  # a bracket that failed leaves its rows without one
                print(f"encoder bracket failed: {str(e)[-300:]}", file=sys.stderr)
                return None

        bracket = None
        for name, fn in jobs:
            job_row = name not in ("encoder", "torch")
            if args.encoder_bracket and job_row and bracket is None:
                bracket = encoder_now()
            before = bracket
            try:
                row = rates(fn())
            except Exception as e:  # a row that failed says why; the others still run
                row = {"error": str(e)[-1500:]}
            if args.encoder_bracket and job_row:
                bracket = encoder_now()
                row["encoder_bracket_fps"] = [before, bracket]
            row.update({"model": model, "run": name})
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            save()

    print(f"\n{'model':32} {'run':8} {'clips/s/GPU':>11} {'frames/s/GPU':>12} {'running':>8} "
          f"{'latents/s/GPU':>13} {'GPU busy':>8} {'running':>8}")
    for r in results["rows"]:
        if "error" in r:
            print(f"{os.path.basename(r['model'].rstrip('/')):32} {r['run']:8} error: {r['error'][:80]}")
            continue
        busy = f"{100 * r['gpu_busy']:.0f} %" if r.get("gpu_busy") is not None else "-"
        busy_running = (f"{100 * r['gpu_busy_while_clips_ran']:.0f} %"
                        if r.get("gpu_busy_while_clips_ran") is not None else "-")
        inside = r.get("frames_per_s_while_clips_ran") or "-"
        print(f"{os.path.basename(r['model'].rstrip('/')):32} {r['run']:8} {r.get('clips_per_s_per_gpu', '-'):>11} "
              f"{r.get('frames_per_s_per_gpu', '-'):>12} {inside:>8} "
              f"{r.get('latent_frames_per_s_per_gpu', '-'):>13} {busy:>8} {busy_running:>8}")
    # The ratios: the job against the encoder alone (whole job, and while clips ran:
    # without the job's start-up) and against the PyTorch loop, per model.
    for model in dict.fromkeys(r["model"] for r in results["rows"]):
        rows = {r["run"]: r for r in results["rows"] if r["model"] == model and "error" not in r}
        enc, torch_row = rows.get("encoder"), rows.get("torch")
        for run, r in rows.items():
            if run in ("encoder", "torch") or not r.get("frames_per_s_per_gpu"):
                continue
            parts = []
            if enc and enc.get("frames_per_s_per_gpu"):
                r["vs_encoder"] = round(r["frames_per_s_per_gpu"] / enc["frames_per_s_per_gpu"], 3)
                parts.append(f"{r['vs_encoder']:.2f} of the encoder alone")
                if r.get("frames_per_s_while_clips_ran"):
                    r["while_clips_ran_vs_encoder"] = round(r["frames_per_s_while_clips_ran"] / enc["frames_per_s_per_gpu"], 3)
                    parts.append(f"{r['while_clips_ran_vs_encoder']:.2f} while clips ran")
            around = [f for f in r.get("encoder_bracket_fps") or [] if f]
            if len(around) == 2:
                mean = sum(around) / 2
                r["vs_encoder_bracket"] = round(r["frames_per_s_per_gpu"] / mean, 3)
                parts.append(f"{r['vs_encoder_bracket']:.2f} of the encoder alone around it "
                             f"({around[0]:.1f} / {around[1]:.1f})")
                if r.get("frames_per_s_while_clips_ran"):
                    r["while_clips_ran_vs_encoder_bracket"] = round(r["frames_per_s_while_clips_ran"] / mean, 3)
                    parts.append(f"{r['while_clips_ran_vs_encoder_bracket']:.2f} while clips ran")
            if torch_row and torch_row.get("frames_per_s_per_gpu"):
                r["vs_torch"] = round(r["frames_per_s_per_gpu"] / torch_row["frames_per_s_per_gpu"], 2)
                parts.append(f"{r['vs_torch']:.2f}x the PyTorch loop")
            if parts:
                print(f"{os.path.basename(model.rstrip('/'))} {run}: " + ", ".join(parts))
    # The traced rows: how much of the time the device had nothing queued, and why.
    for r in results["rows"]:
        t = r.get("trace")
        if not t:
            continue
        why = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in t["idle_by_state_s"].items())
        print(f"{os.path.basename(r['model'].rstrip('/'))} {r['run']}: device busy "
              f"{100 * t['device_busy_share']:.1f}-{100 * t['device_busy_share_max']:.1f} % by the "
              f"trace (the upper bound counts launches as busy); idle {t['idle_s'] * 1e3:.0f} ms "
              f"({why}); {t['gaps_5ms']} gaps >= 5 ms ({t['gaps_5ms_total_ms']:.0f} ms)"
              + (f"; some clip streaming {100 * r['streaming_share']:.1f} % of the time"
                 if r.get("streaming_share") is not None else "")
              + (f"; {t['all_streaming']['frames_per_s']:.1f} frames/s while every pipeline streamed "
                 f"({t['all_streaming']['to_s'] - t['all_streaming']['from_s']:.1f} s)"
                 if t.get("all_streaming") else ""))
    # Scaling efficiency: frames/s on N GPUs over N x frames/s on one (issue 14).
    for r in results["rows"]:
        m = re.fullmatch(r"(\w+)x(\d+)(p\d+)", r.get("run", ""))
        if not m or m.group(2) == "1" or "error" in r:
            continue
        eng, n, p = m.groups()
        one = next((o for o in results["rows"] if o.get("model") == r["model"]
                    and o.get("run") == f"{eng}x1{p}" and "error" not in o), None)
        if one and one.get("frames_per_s_per_gpu"):
            # The whole job (start-up included) and while clips ran (the job's own span; its
            # frames/s is per worker already).
            r["scaling_efficiency"] = round(r["frames_per_s_per_gpu"] / one["frames_per_s_per_gpu"], 3)
            line = (f"{os.path.basename(r['model'].rstrip('/'))}: {eng} on {n} GPUs: scaling efficiency "
                    f"{r['scaling_efficiency']:.3f} (whole job)")
            if r.get("frames_per_s_while_clips_ran") and one.get("frames_per_s_while_clips_ran"):
                r["scaling_efficiency_while_clips_ran"] = round(
                    r["frames_per_s_while_clips_ran"] / one["frames_per_s_while_clips_ran"], 3)
                line += f", {r['scaling_efficiency_while_clips_ran']:.3f} while clips ran"
            per = r.get("gpu_busy_per_gpu_while_clips_ran")
            if per:
                line += "; GPU busy while clips ran " + ", ".join(f"{g}: {100 * b:.0f} %" for g, b in per.items())
            print(line)
    save()


if __name__ == "__main__":
    main()
