"""Precompute the VAE latents of a dataset of clips and images: one latent file per input.

    latent-precompute --model M --input DIR|LIST --output DIR [--engine local|ray]
                      [--workers N] [--gpus-per-worker G] [--device D] [--resume]

Each worker owns one pipeline on one device (filesrc ! decodebin ! [videoconvert !] vaeencode !
latentsink, gst_latent.pipeline), loads the model once and encodes its clips one after another.
`--engine ray` maps a Ray Data dataset of paths over a pool of such workers (one actor per GPU
with --gpus-per-worker 1), on a local Ray or on the cluster RAY_ADDRESS names; `--engine local`
runs the workers as local processes. The output for INPUT/rel/clip.mp4 is
OUTPUT/rel/clip.mp4.safetensors, byte-identical whichever engine or worker made it. A clip that
fails is a row in OUTPUT/failures.jsonl and the job goes on; the exit status is 3 when any clip
failed (2 for a usage or model error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

from gst_latent.latentfile import is_complete

EXIT_FAILED_CLIPS = 3
EXIT_USAGE = 2

MEDIA_EXTENSIONS = {
    ".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".ts", ".mts", ".mpg", ".mpeg", ".flv",
    ".ogv", ".ogg", ".y4m", ".h264", ".h265", ".hevc", ".ivf",
    ".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif",
}


def list_inputs(spec: str) -> list[tuple[str, str]]:
    """Sorted (relative path, file) pairs: the media files under a folder (recursively), or the
    entries of a list file (one path per line, relative ones to the list's folder, # comments;
    an absolute entry's relative path is its full path without the leading /)."""
    pairs = {}
    if os.path.isdir(spec):
        root = os.path.abspath(spec)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                if name.startswith(".") or os.path.splitext(name)[1].lower() not in MEDIA_EXTENSIONS:
                    continue
                path = os.path.join(dirpath, name)
                pairs[os.path.relpath(path, root)] = path
    elif os.path.isfile(spec):
        base = os.path.dirname(os.path.abspath(spec))
        with open(spec, encoding="utf-8") as f:
            for line in f:
                entry = line.strip()
                if not entry or entry.startswith("#"):
                    continue
                if os.path.isabs(entry):
                    path = os.path.normpath(entry)
                    rel = path.lstrip("/")
                else:
                    rel = os.path.normpath(entry)
                    if rel == ".." or rel.startswith(".." + os.sep):
                        raise ValueError(f"{spec}: '{entry}' leaves the list's folder; give it as an absolute path")
                    path = os.path.join(base, rel)
                pairs[rel] = path
    else:
        raise ValueError(f"--input {spec}: no such folder or list file")
    return sorted(pairs.items())


def output_path(output: str, rel: str) -> str:
    return os.path.join(output, rel + ".safetensors")


# ---- workers ----------------------------------------------------------------------------------


class Worker:
    """One pipeline on one device; `__call__` takes a Ray Data batch of relative paths."""

    def __init__(self, options: dict):
        from gst_latent.pipeline import ClipEncoder

        self.options = options
        self.encoder = ClipEncoder(model=options["model"], device=options["device"],
                                   dtype=options["dtype"], clip_timeout=options["clip_timeout"],
                                   extra_encoder_props=options.get("encoder_props"),
                                   latent_caps=options.get("latent_caps", ""))

    def process(self, rel: str, clip: str) -> dict:
        from gst_latent.pipeline import ClipResult

        o = self.options
        out = output_path(o["output"], rel)
        try:
            os.makedirs(os.path.dirname(out), exist_ok=True)
        except OSError as e:
            return asdict(ClipResult(path=rel, output=out, error=f"cannot make {os.path.dirname(out)}: {e.strerror}"))
        return asdict(self.encoder.encode(clip, out, rel))

    def __call__(self, batch: dict) -> dict:
        rows = [self.process(str(rel), str(clip)) for rel, clip in zip(batch["path"], batch["file"])]
        return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}


_LOCAL_WORKER: Worker | None = None


def _local_init(options: dict, devices: list[str], counter) -> None:
    global _LOCAL_WORKER
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    opts = dict(options)
    opts["device"] = devices[index % len(devices)]
    _LOCAL_WORKER = Worker(opts)


def _local_process(rel: str, clip: str) -> dict:
    assert _LOCAL_WORKER is not None
    return _LOCAL_WORKER.process(rel, clip)


def run_local(todo: list[tuple[str, str]], options: dict, workers: int):
    """Yields result rows; one in-process worker, or `workers` processes (devices round-robin
    over the comma-separated --device list)."""
    devices = [d.strip() for d in options["device"].split(",") if d.strip()] or ["auto"]
    if workers <= 1:
        opts = dict(options, device=devices[0])
        worker = Worker(opts)
        try:
            for rel, clip in todo:
                yield worker.process(rel, clip)
        finally:
            worker.encoder.close()
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn")  # GStreamer and CUDA do not survive fork
    counter = ctx.Value("i", 0)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_local_init,
                             initargs=(options, devices, counter)) as pool:
        futures = {pool.submit(_local_process, rel, clip): rel for rel, clip in todo}
        for fut in as_completed(futures):
            try:
                yield fut.result()
            except BrokenProcessPool as e:  # a worker could not start (model error) or died
                raise RuntimeError(f"a worker process failed: {e}") from e


def run_ray(todo: list[tuple[str, str]], options: dict, workers: int, gpus_per_worker: float, ray_cpus: int):
    """Yields result rows from a Ray Data job: a dataset of paths mapped by a pool of actors."""
    import ray

    address = os.environ.get("RAY_ADDRESS")
    env_vars = {k: v for k, v in os.environ.items()
                if k.startswith(("GST_", "LATENT_", "DNNL_", "ONEDNN_"))
                or k in ("PYTHONPATH", "LD_LIBRARY_PATH", "OMP_NUM_THREADS")}
    runtime_env = {"env_vars": env_vars}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        ray.init(num_cpus=ray_cpus or None, runtime_env=runtime_env, log_to_driver=False,
                 include_dashboard=False)
    try:
        # A pool Ray cannot place waits for ever: say so instead.
        have = ray.cluster_resources()
        gpus_total, cpus_total = have.get("GPU", 0.0), have.get("CPU", 0.0)
        if workers * gpus_per_worker > gpus_total:
            raise RuntimeError(
                f"{workers} workers x {gpus_per_worker:g} GPUs need {workers * gpus_per_worker:g} GPUs; "
                f"the Ray cluster has {gpus_total:g} (--workers, --gpus-per-worker 0 for CPUs)")
        if workers > cpus_total:
            raise RuntimeError(f"{workers} workers need a CPU each; the Ray cluster has {cpus_total:g} "
                               "(--workers, --ray-cpus)")
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # ours (tqdm) shows clips, frames/s and the ETA
        ctx.execution_options.preserve_order = False
        ds = ray.data.from_items([{"path": rel, "file": clip} for rel, clip in todo],
                                 override_num_blocks=max(1, min(len(todo), 4 * workers)))
        ds = ds.map_batches(
            Worker,
            fn_constructor_kwargs={"options": options},
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_gpus=gpus_per_worker,
            num_cpus=1,
            batch_format="numpy",
        )
        for row in ds.iter_rows():
            yield {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
    finally:
        ray.shutdown()


# ---- the job ------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="latent-precompute",
        description="Encode every clip/image of a dataset to a latent file (gst-latent pipelines, "
                    "locally or on Ray).")
    p.add_argument("--model", default="", help="model folder / pipeline root / .safetensors file "
                   "(default: the built-in default model)")
    p.add_argument("--input", required=True, help="a folder (media files under it) or a list file "
                   "(one path per line)")
    p.add_argument("--output", required=True, help="output folder: OUTPUT/<relative path>.safetensors")
    p.add_argument("--engine", choices=["local", "ray"], default="local")
    p.add_argument("--workers", type=int, default=1, help="pipelines running at once (default 1)")
    p.add_argument("--gpus-per-worker", type=float, default=None,
                   help="Ray: GPUs per actor (default 1 when the Ray cluster has GPUs, else 0)")
    p.add_argument("--device", default="auto", help="vaeencode device: auto, cpu, cuda, cuda:N; "
                   "local engine: a comma-separated list is dealt to the workers in turn; Ray: the "
                   "device inside each actor (auto = the GPU Ray gave it)")
    p.add_argument("--dtype", default="", help="fp32, bf16 or fp16 (default: the device's)")
    p.add_argument("--encoder-prop", action="append", default=[], metavar="NAME=VALUE",
                   help="another vaeencode property, as in gst-launch (repeatable), e.g. "
                        "prefetch-depth=4")
    p.add_argument("--latent-caps", default="", metavar="CAPS",
                   help="caps between vaeencode and latentsink, e.g. application/x-latent to take "
                        "latents in system memory on a GPU (default: as negotiated)")
    p.add_argument("--resume", action="store_true", help="skip inputs whose output is complete")
    p.add_argument("--clip-timeout", type=float, default=3600.0,
                   help="seconds before a clip counts as failed (0: no limit)")
    p.add_argument("--ray-cpus", type=int, default=0,
                   help="CPUs of a local Ray started here (default: all); ignored with RAY_ADDRESS")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.gpus_per_worker is not None and args.gpus_per_worker < 0:
        p.error("--gpus-per-worker must not be negative")
    for prop in args.encoder_prop:
        if "=" not in prop or not prop.split("=", 1)[0]:
            p.error(f"--encoder-prop {prop}: expected NAME=VALUE")
    if args.engine == "local" and args.gpus_per_worker:
        p.error("--gpus-per-worker is for --engine ray; the local engine takes --device cuda:0,cuda:1,...")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        inputs = list_inputs(args.input)
    except (ValueError, OSError) as e:
        print(f"latent-precompute: {e}", file=sys.stderr)
        return EXIT_USAGE
    output = os.path.abspath(args.output)
    try:
        os.makedirs(output, exist_ok=True)
        probe = os.path.join(output, ".latent-precompute-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        print(f"latent-precompute: cannot write to output folder {output}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    todo = [(r, f) for r, f in inputs if not (args.resume and is_complete(output_path(output, r)))]
    skipped = len(inputs) - len(todo)
    options = {"model": args.model, "device": args.device, "dtype": args.dtype,
               "clip_timeout": args.clip_timeout, "output": output,
               "encoder_props": dict(p.split("=", 1) for p in args.encoder_prop),
               "latent_caps": args.latent_caps}

    from tqdm import tqdm

    failures_path = os.path.join(output, "failures.jsonl")
    failed = done = frames = 0
    paths = {}  # (decoder, memory) -> clips
    phases = {"first_latent_s": 0.0, "stream_s": 0.0, "teardown_s": 0.0}  # sums over written clips
    t0 = time.monotonic()
    if args.engine == "ray":
        gpus = args.gpus_per_worker
        if gpus is None:
            gpus = 1.0 if _cluster_has_gpus() else 0.0
        rows = run_ray(todo, options, args.workers, gpus, args.ray_cpus)
    else:
        rows = run_local(todo, options, args.workers)
    bar = tqdm(total=len(todo), unit="clip", disable=args.no_progress or None, file=sys.stderr,
               desc="latents", dynamic_ncols=True)
    with open(failures_path, "w", encoding="utf-8") as failures:
        try:
            for row in rows:
                if row.get("error"):
                    failed += 1
                    failures.write(json.dumps({"path": row["path"], "error": row["error"],
                                               "seconds": round(row["seconds"], 3)}) + "\n")
                    failures.flush()
                else:
                    done += 1
                    frames += int(row["frames"])
                    key = (row.get("decoder") or "?", row.get("frames_memory") or "?")
                    paths[key] = paths.get(key, 0) + 1
                    for k in phases:
                        phases[k] += float(row.get(k) or 0.0)
                elapsed = max(time.monotonic() - t0, 1e-9)
                bar.set_postfix({"frames/s": f"{frames / elapsed:.1f}", "failed": failed}, refresh=False)
                bar.update(1)
        except Exception as e:  # a model that cannot load, a Ray cluster that went away
            bar.close()
            print(f"latent-precompute: {e}", file=sys.stderr)
            return EXIT_USAGE
    bar.close()
    elapsed = time.monotonic() - t0
    print(f"latent-precompute: {done} written, {failed} failed, {skipped} skipped (complete); "
          f"{frames} frames in {elapsed:.1f} s ({frames / max(elapsed, 1e-9):.1f} frames/s)"
          + (f"; failures in {failures_path}" if failed else ""), file=sys.stderr)
    if paths:
        print("latent-precompute: decoded by " + ", ".join(
            f"{d} into {m} ({n} clip{'s' if n != 1 else ''})" for (d, m), n in sorted(paths.items())),
            file=sys.stderr)
    if done:
        print(f"latent-precompute: per clip (mean of {done}): "
              f"{phases['first_latent_s'] / done:.3f} s to the first latent, "
              f"{phases['stream_s'] / done:.3f} s streaming, "
              f"{phases['teardown_s'] / done:.3f} s teardown", file=sys.stderr)
    if not failed and os.path.getsize(failures_path) == 0:
        os.remove(failures_path)
    return EXIT_FAILED_CLIPS if failed else 0


def _cluster_has_gpus() -> bool:
    """Whether the Ray cluster to be used has GPUs (a local one: whether this host has any)."""
    if os.environ.get("RAY_ADDRESS"):
        return True  # a cluster is for GPUs; --gpus-per-worker 0 says otherwise
    return os.path.exists("/dev/nvidia0") or bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip(" -"))


if __name__ == "__main__":
    sys.exit(main())
