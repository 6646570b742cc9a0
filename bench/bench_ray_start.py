#!/usr/bin/env python3
"""Where a local Ray cluster's start goes (the precompute job's fixed cost, bench/NOTES.md session 14).

Times `ray.init` for a local cluster with the job's arguments and with one setting changed at a
time, each in a fresh process (a cluster per run), then an actor's first call. The variants:

  job          ray.init(num_cpus=None, include_dashboard=False, log_to_driver=False), as the job
  cpus4        num_cpus=4 (fewer workers prestarted)
  localhost    _node_ip_address="127.0.0.1" (no look-up of the node's address)
  store2g      object_store_memory=2 GiB (a small object store instead of 30 % of the RAM)
  nometrics    _system_config={"enable_metrics_collection": False} (the agents export no metrics)

Each run also reads its session's logs (gcs_server, raylet, the dashboard / runtime-env agents,
the workers): for each log file, when its first and its last line before ray.init returned were
written, in seconds after ray.init was called (the "timeline" of each row's first run): where
those seconds go.

    python3 bench/bench_ray_start.py [--variants job,cpus4,localhost,store2g] [--reps 2] [--out F]

Prints a table (init s, first actor call s, shutdown s, median of --reps) and one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys

VARIANTS = {
    "job": {},
    "cpus4": {"num_cpus": 4},
    "localhost": {"_node_ip_address": "127.0.0.1"},
    "store2g": {"object_store_memory": 2 << 30},
    "nometrics": {"_system_config": {"enable_metrics_collection": False}},
}

CHILD = r"""
import json, sys, time
kw = json.loads(sys.argv[1])
t0 = time.monotonic()
import ray
t_import = time.monotonic()
wall_init = time.time()
ray.init(include_dashboard=False, log_to_driver=False, **kw)
t_init = time.monotonic()
wall_ready = time.time()
try:
    session = ray._private.worker._global_node.get_session_dir_path()
except Exception:
    session = ""

@ray.remote(num_cpus=1)
class A:
    def ping(self):
        return 1

a = A.remote()
ray.get(a.ping.remote())
t_actor = time.monotonic()
ray.shutdown()
t_down = time.monotonic()
print(json.dumps({"import_s": t_import - t0, "init_s": t_init - t_import,
                  "first_actor_call_s": t_actor - t_init, "shutdown_s": t_down - t_actor,
                  "session": session, "wall_init": wall_init, "wall_ready": wall_ready}))
"""

STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d{3})")


def timeline(session: str, wall_init: float, wall_ready: float, top: int = 12) -> list[dict]:
    """Per log file of the session: seconds after ray.init was called of its first line and of its
    last line before ray.init returned (Ray writes local times with milliseconds)."""
    logs = os.path.join(session, "logs") if session else ""
    if not logs or not os.path.isdir(logs):
        return []
    rows = []
    for name in sorted(os.listdir(logs)):
        path = os.path.join(logs, name)
        if not os.path.isfile(path):
            continue
        first = last = None
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    m = STAMP.search(line[:64])
                    if not m:
                        continue
                    t = datetime.datetime.strptime(m.group(1).replace(".", ","), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    if t > wall_ready + 0.5:
                        break
                    first = t if first is None else first
                    last = t
        except OSError:
            continue
        if first is not None:
            rows.append({"log": name, "first_s": round(first - wall_init, 3), "last_s": round(last - wall_init, 3)})
    rows.sort(key=lambda r: r["first_s"])
    return rows[:top]


def run_once(kw: dict, timeout: int) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(kw)], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"exit {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    run = json.loads(lines[-1])
    run["timeline"] = timeline(run.pop("session", ""), run.pop("wall_init", 0.0), run.pop("wall_ready", 0.0))
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    rows = []
    for name in names:
        runs = []
        for _ in range(max(1, args.reps)):
            try:
                runs.append(run_once(VARIANTS[name], args.timeout))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                rows.append({"variant": name, "error": str(e)[-600:]})
                break
        else:
            med = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0] if k != "timeline"}
            rows.append({"variant": name, "kwargs": {k: str(v) for k, v in VARIANTS[name].items()},
                         "runs": runs, **med})
    print(f"{'variant':10} {'import s':>8} {'init s':>7} {'actor s':>8} {'shutdown s':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:10} error: {r['error'][:100]}")
        else:
            print(f"{r['variant']:10} {r['import_s']:8.2f} {r['init_s']:7.2f} "
                  f"{r['first_actor_call_s']:8.2f} {r['shutdown_s']:10.2f}")
    for r in rows:  # where the first run's ray.init went, log by log
        line = r.get("runs", [{}])[0].get("timeline") if "error" not in r else None
        if line:
            print(f"{r['variant']} timeline (s after ray.init was called, first-last line): "
                  + ", ".join(f"{t['log']} {t['first_s']:.2f}-{t['last_s']:.2f}" for t in line))
    result = {"cpus": os.cpu_count(), "rows": rows}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
