#!/usr/bin/env python3
"""Where a local Ray cluster's start goes (the precompute job's fixed cost, bench/NOTES.md session 14).

Times `ray.init` for a local cluster with the job's arguments and with one setting changed at a
time, each in a fresh process (a cluster per run), then an actor's first call. The variants:

  job          ray.init(num_cpus=None, include_dashboard=False, log_to_driver=False), as the job
  cpus4        num_cpus=4 (fewer workers prestarted)
  localhost    _node_ip_address="127.0.0.1" (no look-up of the node's address)
  store2g      object_store_memory=2 GiB (a small object store instead of 30 % of the RAM)

    python3 bench/bench_ray_start.py [--variants job,cpus4,localhost,store2g] [--reps 2] [--out F]

Prints a table (init s, first actor call s, shutdown s, median of --reps) and one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

VARIANTS = {
    "job": {},
    "cpus4": {"num_cpus": 4},
    "localhost": {"_node_ip_address": "127.0.0.1"},
    "store2g": {"object_store_memory": 2 << 30},
}

CHILD = r"""
import json, sys, time
kw = json.loads(sys.argv[1])
t0 = time.monotonic()
import ray
t_import = time.monotonic()
ray.init(include_dashboard=False, log_to_driver=False, **kw)
t_init = time.monotonic()

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
                  "first_actor_call_s": t_actor - t_init, "shutdown_s": t_down - t_actor}))
"""


def run_once(kw: dict, timeout: int) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(kw)], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"exit {p.returncode}: {(p.stderr or p.stdout)[-600:]}")
    return json.loads(lines[-1])


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
            med = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
            rows.append({"variant": name, "kwargs": {k: str(v) for k, v in VARIANTS[name].items()},
                         "runs": runs, **med})
    print(f"{'variant':10} {'import s':>8} {'init s':>7} {'actor s':>8} {'shutdown s':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:10} error: {r['error'][:100]}")
        else:
            print(f"{r['variant']:10} {r['import_s']:8.2f} {r['init_s']:7.2f} "
                  f"{r['first_actor_call_s']:8.2f} {r['shutdown_s']:10.2f}")
    result = {"cpus": os.cpu_count(), "rows": rows}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
