#!/usr/bin/env python3
"""GPU time per kernel name from Nsight Compute CSV (bench/NOTES.md, session 7).

Record a run twice, the second with one more forward (or two more video chunks) than the first:

  ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw CMD ... > a.csv
  ncu ... (one more forward) > b.csv
  python3 bench/ncu_kernel_sums.py a.csv b.csv      # the kernels b has beyond a, summed by name

With one file, every kernel of it is summed. Nothing is synchronised, so small kernels are not
inflated as under LATENT_CUDA_PROFILE=1, and the sum can be set against the wall time to see the
gaps between launches.
"""
import argparse
import collections
import csv
import re


def load(path):
    """(kernel name, duration ns, grid) per launch, in launch order."""
    lines = open(path).read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.reader(lines[start:]))
    head = rows[0]
    ki, ti, gi = head.index("Kernel Name"), head.index("gpu__time_duration.sum"), head.index("Grid Size")
    out = []
    for r in rows[2:]:  # rows[1]: units
        try:
            out.append((r[ki], float(r[ti].replace(",", "")), r[gi]))
        except (IndexError, ValueError):
            pass
    return out


def short(name):
    name = re.sub(r"\(.*", "", name)
    for s in ("void ", "latent::", "<unnamed>::", "cuda::"):
        name = name.replace(s, "")
    return name[:90]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="ncu CSV of the shorter run (or the only one)")
    ap.add_argument("longer", nargs="?", help="ncu CSV of the run with one more forward")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--by-grid", action="store_true", help="sum per kernel name and grid (layer shapes apart)")
    args = ap.parse_args()
    a = load(args.base)
    if args.longer:
        b = load(args.longer)
        extra = len(b) - len(a)
        if extra <= 0:
            raise SystemExit(f"{args.longer} has no more kernels than {args.base}")
        tail = b[-extra:]
    else:
        tail = a
    total = sum(t for _, t, _ in tail)
    print(f"{len(tail)} kernels, {total / 1e6:.3f} ms")
    agg = collections.defaultdict(lambda: [0.0, 0])
    for name, t, grid in tail:
        key = short(name) + (f" {grid}" if args.by_grid else "")
        agg[key][0] += t
        agg[key][1] += 1
    for name, (t, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{t / 1e6:9.3f} ms {100 * t / total:5.1f} % {n:5d}  {name}")


if __name__ == "__main__":
    main()
