"""Precompute the VAE latents of a dataset of clips and images: one latent file per input.

    latent-precompute --model M --input DIR|LIST --output DIR [--engine local|ray]
                      [--workers N] [--gpus-per-worker G] [--pipelines-per-worker K]
                      [--device D] [--resume]

Each worker loads the model once on one device and runs its clips through
--pipelines-per-worker pipelines (filesrc ! decodebin ! queue ! [videoconvert !] vaeencode !
queue ! latentsink, gst_latent.pipeline; default 2, so that one clip's start and teardown overlap
another clip's stream), each pipeline encoding its clips one after another.
`--engine ray` maps a Ray Data dataset of paths over a pool of such workers (one actor per GPU
with --gpus-per-worker 1), on a local Ray or on the cluster RAY_ADDRESS names; `--engine local`
runs the workers as local processes. The output for INPUT/rel/clip.mp4 is
OUTPUT/rel/clip.mp4.safetensors, byte-identical whichever engine or worker made it. A clip that
fails is a row in OUTPUT/failures.jsonl and the job goes on; the exit status is 3 when any clip
failed (2 for a usage or model error).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict

from gst_latent import plans
from gst_latent.latentfile import is_complete


def process_started_at() -> float | None:
    """When this process started (time.time(), ~10 ms resolution; Linux's /proc), else None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # the fields after the command's closing parenthesis; starttime is field 22 of the line
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


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
        if os.path.splitext(spec)[1].lower() in MEDIA_EXTENSIONS:
            raise ValueError(f"--input {spec} is a media file; give a folder of clips or a list file "
                             "(one path per line)")
        base = os.path.dirname(os.path.abspath(spec))
        try:
            with open(spec, encoding="utf-8") as f:
                lines = f.readlines()
        except UnicodeDecodeError:
            raise ValueError(f"--input {spec} is not a list file (one path per line): "
                             "it is not UTF-8 text") from None
        for line in lines:
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
    if not pairs:  # a wrong path, or clips with an extension not listed: not a job that did nothing
        if os.path.isdir(spec):
            raise ValueError(f"--input {spec}: no media files in this folder or below (looked for "
                             f"{' '.join(sorted(MEDIA_EXTENSIONS))}; names starting with '.' are skipped)")
        raise ValueError(f"--input {spec}: the list file names no clips (blank lines and # comments only)")
    return sorted(pairs.items())


def pipelines_per_worker(options: dict) -> int:
    """How many clip pipelines each worker runs at once (the job's --pipelines-per-worker)."""
    return max(1, int(options.get("pipelines", 1)))


def calls_per_worker(options: dict) -> int:
    """How many clips a worker takes at once: its pipelines, twice that with --preroll (one clip
    prerolling beside each one streaming)."""
    return pipelines_per_worker(options) * (2 if options.get("preroll") else 1)


def output_path(output: str, rel: str) -> str:
    return os.path.join(output, rel + ".safetensors")


# ---- workers ----------------------------------------------------------------------------------


class Worker:
    """`pipelines` pipelines on one device sharing one loaded model; `process` may be called from
    that many threads at once (each call takes a free pipeline), `__call__` takes a Ray Data
    batch of relative paths.

    With two or more, one clip's pipeline start (demuxer, decoder, negotiation) and return to NULL
    overlap another clip's stream, instead of leaving the GPU idle between clips.

    The pipelines' first clips start staggered: each waits for the previous pipeline's first
    latent (at most STAGGER_WAIT_S) and then as long again as that clip took to reach it (at most
    STAGGER_MAX_S). Started together, pipelines sharing one GPU stream at the same rate, so clips
    of one length end together and start together again: every pipeline between clips at once
    and the GPU idle, round after round (on an H100, 4 pipelines on 81-frame 720p clips: some
    clip streaming only 92-95 % of the time). Offsets once made persist, since the pipelines then
    share the GPU evenly (bench/NOTES.md, session 15); one pipeline alone keeps the GPU busy, so
    the later starts cost nothing but their wait.

    With `preroll` (--preroll) the worker has twice as many pipelines as streaming slots: a clip
    is prerolled (demuxer and decoder started, its first frames decoded and its first latents
    encoded, latentsink holding the first) while the slots stream other clips, starts streaming
    the moment a slot frees, and returns to NULL after giving its slot back. A slot then goes from
    one clip's EOS to the next clip's stream with no start and no teardown between; the stagger
    is not used (its clips' starts need not be spread)."""

    STAGGER_MAX_S = 2.0
    STAGGER_WAIT_S = 10.0

    def __init__(self, options: dict):
        # When this worker began and finished loading (time.time()): the rows carry it, so the
        # job can say where its start went (the engine's start, the load, the first dispatch).
        self.init_span = (time.time(), 0.0)
        self.process_start = process_started_at() or 0.0  # (0: not known)
        from gst_latent.pipeline import ClipEncoder

        self.options = options
        if options.get("plan_files"):
            # --conv-algorithms timed: the first clip's choices, before the model's backend loads
            # its plan file (gst_latent.plans)
            plans.install(options["plan_files"])
        self._preroll = bool(options.get("preroll"))
        count = calls_per_worker(options)
        self.encoders = []
        try:
            for i in range(count):
                self.encoders.append(ClipEncoder(
                    model=options["model"], device=options["device"], dtype=options["dtype"],
                    clip_timeout=options["clip_timeout"],
                    extra_encoder_props=options.get("encoder_props"),
                    latent_caps=options.get("latent_caps", ""), hold_model=i == 0,
                    keep_decoders=options.get("keep_decoders", True)))
        except Exception:
            self.close()
            raise
        self._free = queue.SimpleQueue()
        for enc in self.encoders:
            self._free.put(enc)
        # --preroll: the streaming slots (the job's pipelines per worker)
        self._slots = threading.Semaphore(pipelines_per_worker(options))
        # The first clip of each pipeline: when it started, and set at its first latent (the
        # stagger, see above).
        self._first_latents = [threading.Event() for _ in self.encoders]
        self._first_starts = [0.0] * len(self.encoders)
        self._calls = 0
        self._calls_lock = threading.Lock()
        # LATENT_PRECOMPUTE_STAGGER=0 starts them together (bench_precompute.py's A/B)
        self._staggered = os.environ.get("LATENT_PRECOMPUTE_STAGGER", "1") != "0"
        self.init_span = (self.init_span[0], time.time())

    def _stagger(self) -> threading.Event | None:
        """For one of the worker's first clips (one per pipeline): waits for the previous first
        clip's first latent, then as long again as that clip took to reach it; returns the event
        this clip sets at its own."""
        with self._calls_lock:
            n = self._calls
            self._calls += 1
        if n >= len(self._first_latents):
            return None
        if n > 0:
            # Set at the latest when that clip ends; a clip that takes longer (a first plan, a
            # stalled source) holds back the next pipeline's start at most STAGGER_WAIT_S.
            if self._first_latents[n - 1].wait(self.STAGGER_WAIT_S):
                lead = time.monotonic() - self._first_starts[n - 1]
                time.sleep(min(max(lead, 0.0), self.STAGGER_MAX_S))
        self._first_starts[n] = time.monotonic()
        return self._first_latents[n]

    def _row(self, result) -> dict:
        """A clip's result row, with when this worker began and finished loading (every row of a
        Ray batch has the same keys)."""
        row = dict(asdict(result), worker_init_start=self.init_span[0], worker_init_end=self.init_span[1],
                   worker_process_start=self.process_start)
        if self.options.get("collect_plans"):  # the timed warm-up clip: its plan files travel back
            row["plan_files"] = json.dumps(plans.collect())
        return row

    def process(self, rel: str, clip: str) -> dict:
        from gst_latent.pipeline import ClipResult

        o = self.options
        out = output_path(o["output"], rel)
        try:
            os.makedirs(os.path.dirname(out), exist_ok=True)
        except OSError as e:
            return self._row(ClipResult(path=rel, output=out,
                                        error=f"cannot make {os.path.dirname(out)}: {e.strerror}"))
        if self._preroll:
            enc = self._free.get()
            try:
                enc.prepare(clip, out, rel)
                try:
                    with self._slots:
                        enc.run()
                finally:
                    res = enc.finish()  # back to NULL (after the slot is free) whatever run() met
                return self._row(res)
            finally:
                self._free.put(enc)
        first_latent = self._stagger() if len(self.encoders) > 1 and self._staggered else None
        enc = self._free.get()
        try:
            return self._row(enc.encode(clip, out, rel, first_latent))
        finally:
            if first_latent is not None:
                first_latent.set()  # however encode() ended, the next pipeline need not wait more
            self._free.put(enc)

    def process_all(self, todo) -> Iterator[dict]:
        """Result rows for (rel, clip) pairs, in the order they finish, every pipeline busy."""
        if len(self.encoders) == 1:
            for rel, clip in todo:
                yield self.process(rel, clip)
            return
        from concurrent.futures import ThreadPoolExecutor, as_completed

        pool = ThreadPoolExecutor(max_workers=len(self.encoders))
        try:
            for fut in as_completed([pool.submit(self.process, rel, clip) for rel, clip in todo]):
                yield fut.result()
        finally:  # the caller stopped early (an error): the clips not started are not started
            pool.shutdown(wait=True, cancel_futures=True)

    def __call__(self, batch: dict) -> dict:
        rows = [self.process(str(rel), str(clip)) for rel, clip in zip(batch["path"], batch["file"])]
        return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}

    def close(self):
        # The model holder last: the clip pipelines release their share of the model first.
        for enc in reversed(self.encoders):
            enc.close()


def pin_device(options: dict, gpu_count: int | None = None) -> dict:
    """The options of a worker process that owns device cuda:N: CUDA_VISIBLE_DEVICES names that
    one GPU alone (the N-th of those this process sees) and the worker uses it as cuda:0, as a
    Ray actor does. Then every CUDA element of its pipelines, the hardware decoder that decodebin
    picks (nvh264dec is device 0's) included, works on that GPU and hands over CUDA memory of its
    context; without it, the decoders of every worker would run on the first GPU and each frame
    would reach vaeencode through system memory. Call before GStreamer or CUDA start in the
    process. Other devices (auto, cuda, cpu) are left as they are. `gpu_count`: the GPUs when
    CUDA_VISIBLE_DEVICES is unset (default: the /dev/nvidiaN nodes)."""
    device = str(options.get("device", ""))
    if not device.startswith("cuda:") or not device[5:].isdigit():
        return options  # vaeencode reports a malformed device itself
    index = int(device[5:])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        where = f"CUDA_VISIBLE_DEVICES={visible} makes {len(ids)} visible"
    else:
        ids = [str(i) for i in range(gpu_count if gpu_count is not None else _device_nodes())]
        where = f"this machine has {len(ids)}"
    if not ids:
        return options  # no GPU at all: vaeencode says so, naming the device as given
    if index >= len(ids):
        raise ValueError(f"--device {device}: no such GPU ({where})")
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[index]
    return dict(options, device="cuda:0", device_as_given=device)


def _device_nodes() -> int:
    """The NVIDIA GPUs this machine shows as /dev/nvidiaN."""
    import re

    try:
        return sum(1 for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n))
    except OSError:
        return 0


def _local_worker_main(options: dict, tasks, results) -> None:
    """A local worker process: its pipelines take (rel, clip) tasks until a None each."""
    try:
        options = pin_device(options)
    except ValueError as e:
        results.put({"__fatal__": f"worker on {options['device']}: {e}"})
        return
    try:
        worker = Worker(options)
    except Exception as e:  # the model does not load: the job stops with this message
        results.put({"__fatal__": f"worker on {options.get('device_as_given', options['device'])}: {e}"})
        return

    def loop():
        from gst_latent.pipeline import ClipResult

        while (task := tasks.get()) is not None:
            try:
                row = worker.process(*task)
            except Exception as e:  # encode() reports bad clips itself; anything else is a row too
                row = asdict(ClipResult(path=task[0], output=output_path(options["output"], task[0]),
                                        error=f"worker on {options.get('device_as_given', options['device'])}: {e}"))
            results.put(row)

    threads = [threading.Thread(target=loop) for _ in worker.encoders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worker.close()


def warmup_options(options: dict) -> dict:
    """The timed warm-up clip's worker: one pipeline (one process timing, one choice a shape),
    its plan files sent back with its row."""
    return dict(options, collect_plans=True, pipelines=1, preroll=False)


def with_warmup(todo, options: dict, timing: dict, run_first, run_rest) -> Iterator[dict]:
    """Rows of the first clip encoded alone (`run_first(todo[:1], options)` with
    warmup_options), then of the rest (`run_rest(todo[1:], options)`) with the plan files the
    first clip's row brought back (removed from that row); timing["timed_warmup"] says which clip
    went first, in how long, with how many plan files."""
    t = time.monotonic()
    files = {}
    for row in run_first(todo[:1], warmup_options(options)):
        files = json.loads(row.pop("plan_files", "") or "{}")
        timing["timed_warmup"] = {"clip": row.get("path"), "plan_files": len(files),
                                  "seconds": round(time.monotonic() - t, 3)}
        yield row
    yield from run_rest(todo[1:], dict(options, plan_files=files))


def run_local(todo: list[tuple[str, str]], options: dict, workers: int, warmup: bool = False,
              timing: dict | None = None, spawn: bool = False):
    """Yields result rows; one in-process worker, or `workers` processes (devices round-robin
    over the comma-separated --device list), each with its pipelines. `warmup` (timed
    convolution algorithms): the first clip alone in one process first, its plan files given to
    the workers (gst_latent.plans; timing["timed_warmup"] says so). `spawn`: a process even for
    one worker."""
    if warmup and len(todo) > 1:
        yield from with_warmup(todo, options, timing if timing is not None else {},
                               lambda t, o: run_local(t, o, 1, spawn=True),
                               lambda t, o: run_local(t, o, workers))
        return
    devices = [d.strip() for d in options["device"].split(",") if d.strip()] or ["auto"]
    if workers <= 1 and not spawn:
        from gst_latent.pipeline import gst_started

        one = dict(options, device=devices[0])
        if not gst_started():  # GStreamer (and CUDA) not started in this process yet
            one = pin_device(one)
        worker = Worker(one)
        try:
            yield from worker.process_all(todo)
        finally:
            worker.close()
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # GStreamer and CUDA do not survive fork
    tasks, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_local_worker_main, daemon=True,
                         args=(dict(options, device=devices[i % len(devices)]), tasks, results))
             for i in range(workers)]
    for p in procs:
        p.start()
    try:
        for task in todo:
            tasks.put(task)
        for _ in range(workers * calls_per_worker(options)):
            tasks.put(None)
        remaining = len(todo)
        while remaining:
            try:
                row = results.get(timeout=1.0)
            except queue.Empty:  # is anybody still working?
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError(f"the worker processes ended with {remaining} clips left "
                                       f"(exit codes {[p.exitcode for p in procs]})") from None
                continue
            if "__fatal__" in row:
                raise RuntimeError(row["__fatal__"])
            remaining -= 1
            yield row
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)


def run_ray(todo: list[tuple[str, str]], options: dict, workers: int, gpus_per_worker: float, ray_cpus: int,
            timing: dict | None = None, warmup: bool = False):
    """Yields result rows from a Ray Data job: a dataset of paths mapped by a pool of actors.
    `timing` (a dict) gets the seconds Ray took to start (`ray_init_s`) and to shut down
    (`ray_shutdown_s`): the job's fixed cost beside its clips. `warmup` (timed convolution
    algorithms): the first clip alone on one actor first, its plan files given to the pool's
    actors wherever they run (gst_latent.plans; timing["timed_warmup"] says so)."""
    import ray

    timing = timing if timing is not None else {}
    t_init = time.monotonic()
    # ray.data (pandas, pyarrow: 1.6 s on the H100 machine, session 31) is imported beside
    # ray.init, which mostly waits for the cluster's processes.
    data_import = threading.Thread(target=importlib.import_module, args=("ray.data",), daemon=True,
                                   name="import ray.data")
    data_import.start()

    address = os.environ.get("RAY_ADDRESS")
    if address:
        # A cluster's workers were started elsewhere: the job's environment travels with it.
        env_vars = {k: v for k, v in os.environ.items()
                    if k.startswith(("GST_", "LATENT_", "DNNL_", "ONEDNN_"))
                    or k in ("PYTHONPATH", "LD_LIBRARY_PATH", "OMP_NUM_THREADS")}
        ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=False)
    else:
        # A local cluster's workers inherit this process's environment. No runtime_env here: one
        # makes Ray start the actors in new worker processes for it instead of taking the ones it
        # prestarted (the first clip of a CPU job on a 2-core machine 2.1 s later).
        ray.init(num_cpus=ray_cpus or None, log_to_driver=False, include_dashboard=False)
    data_import.join()
    import ray.data  # noqa: F401 (done above; an import that failed there raises here)

    timing["ray_init_s"] = round(time.monotonic() - t_init, 3)
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
        if warmup and len(todo) > 1:
            yield from with_warmup(todo, options, timing,
                                   lambda t, o: _ray_map(ray, t, o, 1, gpus_per_worker),
                                   lambda t, o: _ray_map(ray, t, o, workers, gpus_per_worker))
        else:
            yield from _ray_map(ray, todo, options, workers, gpus_per_worker)
    finally:
        t_down = time.monotonic()
        ray.shutdown()
        timing["ray_shutdown_s"] = round(time.monotonic() - t_down, 3)


def _ray_map(ray, todo: list[tuple[str, str]], options: dict, workers: int, gpus_per_worker: float):
    """Result rows of `todo` mapped over a pool of `workers` Worker actors."""
    ds = ray.data.from_items([{"path": rel, "file": clip} for rel, clip in todo],
                             override_num_blocks=max(1, min(len(todo), 4 * workers)))
    pipelines = calls_per_worker(options)
    ds = ds.map_batches(
        Worker,
        fn_constructor_kwargs={"options": options},
        batch_size=1,
        # One call per pipeline at a time in each actor (Worker.process is thread-safe).
        compute=ray.data.ActorPoolStrategy(size=workers, max_concurrent_calls_per_actor=pipelines,
                                           max_tasks_in_flight_per_actor=pipelines,
                                           enable_true_multi_threading=pipelines > 1),
        num_gpus=gpus_per_worker,
        num_cpus=1,
        batch_format="numpy",
    )
    for row in ds.iter_rows():
        yield {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


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
    p.add_argument("--pipelines-per-worker", type=int, default=2, metavar="K",
                   help="clip pipelines per worker, sharing its loaded model (default 2: one "
                        "clip's start and teardown overlap another's stream; 1: one clip at a time)")
    p.add_argument("--preroll", action=argparse.BooleanOptionalAction, default=None,
                   help="preroll each clip (demuxer, decoder, first latents) while the worker's "
                        "pipelines stream others, so a pipeline goes from one clip's end to the "
                        "next clip's stream without a start or teardown between (twice the "
                        "pipelines; default: $LATENT_PRECOMPUTE_PREROLL=1 turns it on, else off)")
    p.add_argument("--keep-decoders", action=argparse.BooleanOptionalAction, default=True,
                   help="keep each pipeline's decoder from clip to clip (default) instead of "
                        "decodebin's, made and closed for every clip (a hardware decoder's opening "
                        "and closing takes ~0.3 s a clip and stalls the GPU's other pipelines)")
    p.add_argument("--dtype", default="", help="fp32, bf16 or fp16 (default: the device's)")
    p.add_argument("--encoder-prop", action="append", default=[], metavar="NAME=VALUE",
                   help="another vaeencode property, as in gst-launch (repeatable), e.g. "
                        "prefetch-depth=4")
    p.add_argument("--latent-caps", default="", metavar="CAPS",
                   help="caps between vaeencode and latentsink, e.g. application/x-latent to take "
                        "latents in system memory on a GPU (default: as negotiated)")
    p.add_argument("--conv-algorithms", choices=["heuristic", "timed"], default=None,
                   help="how cuDNN's convolution algorithms are chosen on a GPU: heuristic "
                        "(the engine's default: the same choice on every run and node, so the same "
                        "bytes) or timed (candidates timed once per shape and kept in the plan "
                        "cache, ~14%% faster for the Wan VAEs on an H100; with several workers the "
                        "first clip is encoded alone first and its choices go to every worker, so "
                        "workers of one GPU model agree for clips of that size; other sizes are "
                        "timed by each worker and can differ by bf16 rounding); default: "
                        "$LATENT_CUDNN_SEARCH when set, else heuristic")
    p.add_argument("--resume", action="store_true", help="skip inputs whose output is complete")
    p.add_argument("--clip-timeout", type=float, default=3600.0,
                   help="seconds before a clip counts as failed (0: no limit)")
    p.add_argument("--ray-cpus", type=int, default=0,
                   help="CPUs of a local Ray started here (default: all); ignored with RAY_ADDRESS")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--summary", default="", metavar="FILE",
                   help="also write the job's summary as JSON to FILE (counts, rates, per-clip "
                        "phases, decoders, when the first clip started and the last one ended)")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.pipelines_per_worker < 1:
        p.error("--pipelines-per-worker must be at least 1")
    if args.gpus_per_worker is not None and args.gpus_per_worker < 0:
        p.error("--gpus-per-worker must not be negative")
    for prop in args.encoder_prop:
        if "=" not in prop or not prop.split("=", 1)[0]:
            p.error(f"--encoder-prop {prop}: expected NAME=VALUE")
    if args.engine == "local" and args.gpus_per_worker:
        p.error("--gpus-per-worker is for --engine ray; the local engine takes --device cuda:0,cuda:1,...")
    return args


def conv_search_env(choice: str | None) -> str:
    """LATENT_CUDNN_SEARCH for the job's pipelines (local processes and threads, Ray actors):
    --conv-algorithms, else the variable as set (heuristic, timed or exhaustive), else heuristic."""
    if choice is None:
        choice = os.environ.get("LATENT_CUDNN_SEARCH") or "heuristic"
        if choice not in ("heuristic", "timed", "exhaustive"):
            raise ValueError(f"LATENT_CUDNN_SEARCH={choice} is not heuristic or timed "
                             "(or use --conv-algorithms)")
    return "heuristic" if choice == "heuristic" else "timed"


def main(argv=None) -> int:
    args = parse_args(argv)
    # Set before any backend exists: this process's pipelines (threads), the worker processes
    # it spawns and the Ray actors (runtime_env passes LATENT_*) all read it.
    try:
        os.environ["LATENT_CUDNN_SEARCH"] = conv_search_env(args.conv_algorithms)
        preroll_wanted(args.preroll)
    except ValueError as e:
        print(f"latent-precompute: {e}", file=sys.stderr)
        return EXIT_USAGE
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
    if not args.summary:
        return _run(args, inputs, output)[0]
    # An unwritable summary is found now, not after the job has run.
    created = not os.path.exists(args.summary)
    try:
        summary_file = open(args.summary, "w", encoding="utf-8")
    except OSError as e:
        print(f"latent-precompute: cannot write the summary {args.summary}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    summary = None
    try:
        code, summary = _run(args, inputs, output)
        if summary is not None:
            try:
                json.dump(summary, summary_file, indent=1)
                summary_file.flush()
            except OSError as e:  # a full disk: the clips' files and failures.jsonl still stand
                print(f"latent-precompute: cannot write the summary {args.summary}: {e.strerror}",
                      file=sys.stderr)
                if code == 0:  # exit status 3 (failed clips) says more
                    code = EXIT_USAGE
        return code
    finally:
        with contextlib.suppress(OSError):  # a failed write was reported above
            summary_file.close()
        if summary is None and created and os.path.isfile(args.summary):
            with contextlib.suppress(OSError):  # the job stopped first: leave no empty summary
                os.remove(args.summary)


def preroll_wanted(flag: bool | None) -> bool:
    """--preroll / --no-preroll, else LATENT_PRECOMPUTE_PREROLL (1 on, 0 or unset off)."""
    if flag is not None:
        return flag
    env = os.environ.get("LATENT_PRECOMPUTE_PREROLL", "0")
    if env not in ("0", "1"):
        raise ValueError(f"LATENT_PRECOMPUTE_PREROLL={env}: give 0 or 1")
    return env == "1"


def _run(args, inputs, output) -> tuple[int, dict | None]:
    """Runs the job: its exit status and its summary (None when it stopped before the end)."""
    todo = [(r, f) for r, f in inputs if not (args.resume and is_complete(output_path(output, r)))]
    skipped = len(inputs) - len(todo)
    options = {"model": args.model, "device": args.device, "dtype": args.dtype,
               "clip_timeout": args.clip_timeout, "output": output,
               "encoder_props": dict(p.split("=", 1) for p in args.encoder_prop),
               "latent_caps": args.latent_caps, "pipelines": args.pipelines_per_worker,
               "preroll": preroll_wanted(args.preroll), "keep_decoders": args.keep_decoders}

    from tqdm import tqdm

    failures_path = os.path.join(output, "failures.jsonl")
    failed = done = frames = 0
    paths = {}  # (decoder, memory) -> clips
    # Sums over the written clips: their whole time (set-up to NULL) and its phases.
    phases = {"seconds": 0.0, "pad_added_s": 0.0, "first_frame_s": 0.0, "first_latent_s": 0.0,
              "stream_s": 0.0, "teardown_s": 0.0, "preroll_s": 0.0}
    span = [float("inf"), 0.0]  # the first written clip's start, the last one's end (time.time())
    workers_up = {}  # each worker's (start, end) of its load, from its rows (time.time())
    workers_proc = {}  # each worker's load start -> its process's start (time.time())
    streaming = []  # (start, end) of each written clip's stream: first latent to EOS (time.time())
    t0, t0_wall = time.monotonic(), time.time()
    engine_timing = {}  # Ray's own start and shutdown (run_ray); the timed warm-up
    # Timed convolution algorithms and more than one process: the first clip alone first, and
    # its choices to every worker (gst_latent.plans), so that every worker writes the same bytes.
    # (run_local and run_ray skip it for a single clip.)
    warmup = os.environ["LATENT_CUDNN_SEARCH"] == "timed" and (args.engine == "ray" or args.workers > 1)
    if args.engine == "ray":
        gpus = args.gpus_per_worker
        if gpus is None:
            gpus = 1.0 if _cluster_has_gpus() else 0.0
        rows = run_ray(todo, options, args.workers, gpus, args.ray_cpus, engine_timing, warmup)
    else:
        rows = run_local(todo, options, args.workers, warmup, engine_timing)
    bar = tqdm(total=len(todo), unit="clip", disable=args.no_progress or None, file=sys.stderr,
               desc="latents", dynamic_ncols=True)
    with open(failures_path, "w", encoding="utf-8") as failures:
        try:
            for row in rows:
                if row.get("worker_init_end"):
                    workers_up[float(row["worker_init_start"])] = float(row["worker_init_end"])
                    workers_proc[float(row["worker_init_start"])] = float(row.get("worker_process_start") or 0.0)
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
                    if row.get("started"):
                        start = float(row["started"])
                        span[0] = min(span[0], start)
                        span[1] = max(span[1], start + float(row["seconds"]))
                        if row.get("stream_s"):
                            first = start + float(row.get("first_latent_s") or 0.0)
                            streaming.append((first, first + float(row["stream_s"])))
                elapsed = max(time.monotonic() - t0, 1e-9)
                bar.set_postfix({"frames/s": f"{frames / elapsed:.1f}", "failed": failed}, refresh=False)
                bar.update(1)
        except Exception as e:  # a model that cannot load, a Ray cluster that went away
            bar.close()
            print(f"latent-precompute: {e}", file=sys.stderr)
            return EXIT_USAGE, None
    bar.close()
    elapsed = time.monotonic() - t0
    # The job's fixed cost beside its clips: from its start to the first clip's start (workers,
    # Ray, the model load) and from the last clip's end to here (Ray's shutdown, the last rows).
    warmed = engine_timing.pop("timed_warmup", None)
    fixed = ({"before_first_clip_s": round(span[0] - t0_wall, 3),
              "after_last_clip_s": round(t0_wall + elapsed - span[1], 3), **engine_timing}
             if done else dict(engine_timing))
    if done and workers_up:
        # Of the time before the first clip: when the first worker began loading (the engine's
        # start: processes, Ray, its actors), the longest load, and from the first loaded worker
        # to the first clip's start (the dispatch of the first clip).
        fixed.update({"worker_start_s": round(min(workers_up) - t0_wall, 3),
                      "worker_load_s": round(max(e - b for b, e in workers_up.items()), 3),
                      "first_dispatch_s": round(span[0] - min(workers_up.values()), 3)})
        # When the first worker's process started, where that came after the job's start (a
        # process of its own: a Ray actor, --workers >= 2): the engine's start splits into the
        # time before that process (Ray: its start, Ray Data's plan and the actor's placement)
        # and the process's own start-up to the worker's constructor (Python, Ray's worker).
        proc = workers_proc.get(min(workers_up), 0.0)
        if proc > t0_wall:
            fixed["worker_process_start_s"] = round(proc - t0_wall, 3)
    while_running = frames / max(span[1] - span[0], 1e-9) / args.workers if done else 0.0
    print(f"latent-precompute: {done} written, {failed} failed, {skipped} skipped (complete); "
          f"{frames} frames in {elapsed:.1f} s ({frames / max(elapsed, 1e-9):.1f} frames/s)"
          + (f"; failures in {failures_path}" if failed else ""), file=sys.stderr)
    if warmed:
        print(f"latent-precompute: timed convolution algorithms: {warmed['clip']} encoded alone first "
              f"({warmed['seconds']:.1f} s), its {warmed['plan_files']} plan file(s) given to every "
              "worker", file=sys.stderr)
    if paths:
        print("latent-precompute: decoded by " + ", ".join(
            f"{d} into {m} ({n} clip{'s' if n != 1 else ''})" for (d, m), n in sorted(paths.items())),
            file=sys.stderr)
    # The share of the time between the first clip's start and the last one's end during which
    # some clip was streaming (from its first latent to its EOS): where it falls short of 1, every
    # pipeline was starting or stopping a clip at once and the GPU had nothing from this job.
    stream_share = (covered_seconds(streaming) / (span[1] - span[0])
                    if done and span[1] > span[0] else None)
    if done:
        # The rate while clips ran leaves out the job's start-up (processes, Ray, the model load):
        # a worker's steady rate, comparable with the encoder's own.
        print(f"latent-precompute: per clip (mean of {done}): {phases['seconds'] / done:.3f} s = "
              f"{phases['first_latent_s'] / done:.3f} s to the first latent (the decoded stream's "
              f"pad at {phases['pad_added_s'] / done:.3f} s, the first frame at "
              f"{phases['first_frame_s'] / done:.3f} s"
              + (f"; {phases['preroll_s'] / done:.3f} s prerolled, waiting for a streaming slot"
                 if options.get("preroll") else "") + ") + "
              f"{phases['stream_s'] / done:.3f} s streaming + "
              f"{phases['teardown_s'] / done:.3f} s teardown; "
              f"{while_running:.1f} frames/s per worker while clips ran"
              + (f"; some clip streaming {100 * stream_share:.1f} % of that time"
                 if stream_share is not None else ""), file=sys.stderr)
        print(f"latent-precompute: the first clip started {fixed['before_first_clip_s']:.1f} s into the "
              f"job, the last ended {fixed['after_last_clip_s']:.1f} s before its end"
              + (f" (a worker began loading {fixed['worker_start_s']:.1f} s in"
                 + (f" (its process started {fixed['worker_process_start_s']:.1f} s in)"
                    if "worker_process_start_s" in fixed else "")
                 + f", loaded in {fixed['worker_load_s']:.1f} s, the first clip "
                 f"{fixed['first_dispatch_s']:.1f} s after)"
                 if "worker_start_s" in fixed else "")
              + (f" (Ray: {fixed['ray_init_s']:.1f} s to start, {fixed.get('ray_shutdown_s', 0.0):.1f} s "
                 "to shut down)" if "ray_init_s" in fixed else ""), file=sys.stderr)
    summary = {"written": done, "failed": failed, "skipped": skipped, "frames": frames,
               "seconds": round(elapsed, 3), "frames_per_s": round(frames / max(elapsed, 1e-9), 2),
               "workers": args.workers, "pipelines_per_worker": args.pipelines_per_worker,
               "preroll": options["preroll"],
               "conv_algorithms": os.environ["LATENT_CUDNN_SEARCH"],
               "frames_per_s_per_worker_while_clips_ran": round(while_running, 2),
               "clips_ran": [span[0], span[1]] if done else None,
               "streaming_share": round(stream_share, 4) if stream_share is not None else None,
               "per_clip_mean_s": {k: round(v / done, 4) for k, v in phases.items()} if done else None,
               "decoded_by": [{"decoder": d, "memory": m, "clips": n} for (d, m), n in sorted(paths.items())],
               "fixed_s": fixed,
               # timed algorithms: the clip encoded alone first, the plan files it gave the workers
               "timed_warmup": warmed}
    if not failed and os.path.getsize(failures_path) == 0:
        os.remove(failures_path)
    return (EXIT_FAILED_CLIPS if failed else 0), summary


def covered_seconds(intervals) -> float:
    """The length of the union of (start, end) intervals."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _cluster_has_gpus() -> bool:
    """Whether the Ray cluster to be used has GPUs (a local one: whether this host has any)."""
    if os.environ.get("RAY_ADDRESS"):
        return True  # a cluster is for GPUs; --gpus-per-worker 0 says otherwise
    return os.path.exists("/dev/nvidia0") or bool(os.environ.get("CUDA_VISIBLE_DEVICES", "").strip(" -"))


if __name__ == "__main__":
    sys.exit(main())
