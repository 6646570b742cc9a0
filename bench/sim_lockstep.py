#!/usr/bin/env python3
"""Why the precompute job staggers its pipelines' first clips (bench/NOTES.md, session 15).

A model, not a measurement: K pipelines share one GPU evenly while they stream; each clip needs W
seconds of the GPU alone, then G seconds between clips (teardown, the next clip's start) with no
GPU work. Started together, clips of one length end together and start together again, so the
GPU idles G of every round; started DELTA s apart, the offsets persist and the GPU stays busy.

    python3 bench/sim_lockstep.py [--w 1.23] [--g 0.9] [--seconds 120]

W = 81 frames / 66 f/s (the Wan 2.1 encoder alone at 720p on an H100), G = 0.6 s to the first
latent + 0.3 s teardown (the job's per-clip phases there). Prints the GPU's busy share for K = 2,
4, 8 and first-clip offsets of 0, 0.05, 0.3 and 1 s.
"""

import argparse


def simulate(k: int, w: float, g: float, delta: float, seconds: float, dt: float = 5e-4):
    work = [None] * k                        # GPU seconds left of the clip streaming, or None
    gap = [i * delta for i in range(k)]      # seconds left before the next clip streams, or None
    busy = t = 0.0
    clips = 0
    while t < seconds:
        streaming = [i for i in range(k) if work[i] is not None]
        if streaming:
            busy += dt
            for i in streaming:
                work[i] -= dt / len(streaming)
                if work[i] <= 0:
                    work[i], gap[i] = None, g
                    clips += 1
        for i in range(k):
            if work[i] is None:
                gap[i] -= dt
                if gap[i] <= 0:
                    work[i], gap[i] = w, None
        t += dt
    return busy / seconds, clips


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--w", type=float, default=81 / 66)
    ap.add_argument("--g", type=float, default=0.9)
    ap.add_argument("--seconds", type=float, default=120.0)
    args = ap.parse_args()
    print("pipelines  offset s  GPU busy  clips")
    for k in (2, 4, 8):
        for delta in (0.0, 0.05, 0.3, 1.0):
            busy, clips = simulate(k, args.w, args.g, delta, args.seconds)
            print(f"{k:9d}  {delta:8.2f}  {100 * busy:7.1f} %  {clips:5d}")


if __name__ == "__main__":
    main()
