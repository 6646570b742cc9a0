#!/usr/bin/env python3
"""Where a GPU ran dry: reads a LATENT_TRACE file (elements/gstlatentbase.h) and says how much of
the traced span the device had nothing queued, and what each element's thread was doing then.

Every line is `<queued_us> <reached_us> <pipeline/element> <label> <n>`: a mark placed on the
backend's stream (`queued`) and the time the device had run everything queued before it
(`reached`). vaeencode in video mode marks `in` (starts reading frame n), `locked` (holds the run
lock) and `out` (after the work it queued for that frame); it queues device work only between its
`in` and `out`. So at any moment:
  - the device is busy when some mark queued before that moment is not reached yet;
  - otherwise it has nothing queued before the last mark, and each element is `reading` (between
    in and locked: the frame's copy and conversion are being queued, or the run lock is awaited),
    `launching` (between locked and out), `between frames` (after out, waiting for its next
    frame) or `between clips` (after a clip's last out, until the next clip's first in).
While an element is launching, the work it has queued since its `locked` carries no mark: the
device may be busy with it. So a stretch put down to `launching` is not known to be idle:
`busy_share` counts it as idle (a lower bound), `busy_share_max` as busy (an upper bound); only
the other states are idle for certain (a chunk's launch of a video encoder can take tens of ms).

Marks of several devices or models in one file: give --element to keep the ones of interest.

    python3 bench/trace_gaps.py TRACE [--json OUT] [--from T0] [--to T1] [--gap-ms 2]
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict


def read_marks(path: str, element: str = "") -> list[dict]:
    marks = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 5:
                raise SystemExit(f"{path}:{lineno}: expected 5 fields, got {len(parts)}: {line!r}")
            queued, reached, who, label, n = int(parts[0]), int(parts[1]), parts[2], parts[3], int(parts[4])
            if element and element not in who:
                continue
            if reached < 0:
                raise SystemExit(f"{path}:{lineno}: a mark whose wait failed (reached -1)")
            marks.append({"queued": queued / 1e6, "reached": max(reached, queued) / 1e6,
                          "who": who, "label": label, "n": n})
    if not marks:
        raise SystemExit(f"{path}: no marks" + (f" of '{element}'" if element else ""))
    return marks


def analyse(marks: list[dict], t0: float | None = None, t1: float | None = None,
            gap_ms: float = 2.0) -> dict:
    by_queued = sorted(marks, key=lambda m: m["queued"])
    queued_times = [m["queued"] for m in by_queued]
    prefix_reached = []
    best = float("-inf")
    for m in by_queued:
        best = max(best, m["reached"])
        prefix_reached.append(best)

    per_element = defaultdict(list)
    for m in by_queued:
        per_element[m["who"]].append(m)
    element_times = {w: [m["queued"] for m in ms] for w, ms in per_element.items()}

    def busy(t: float) -> bool:
        i = bisect.bisect_right(queued_times, t) - 1
        return i >= 0 and prefix_reached[i] > t

    def state(who: str, t: float) -> str:
        ms, times = per_element[who], element_times[who]
        i = bisect.bisect_right(times, t) - 1
        if i < 0:
            return "between clips"
        label = ms[i]["label"]
        if label == "in":
            return "reading"
        if label == "locked":
            return "launching"
        nxt = ms[i + 1] if i + 1 < len(ms) else None
        return "between clips" if nxt is None or nxt["n"] == 0 else "between frames"

    start = t0 if t0 is not None else by_queued[0]["queued"]
    end = t1 if t1 is not None else max(m["reached"] for m in marks)
    points = sorted({start, end} | {m["queued"] for m in marks if start < m["queued"] < end}
                    | {m["reached"] for m in marks if start < m["reached"] < end})
    idle = 0.0
    why = defaultdict(float)  # the busiest element state while idle -> seconds
    gaps = []  # (start, length, states) of idle stretches >= gap_ms
    cur = None
    order = ["launching", "reading", "between frames", "between clips"]
    for a, b in zip(points, points[1:]):
        mid = (a + b) / 2
        if busy(mid):
            if cur is not None:
                if cur[1] * 1e3 >= gap_ms:
                    gaps.append(cur)
                cur = None
            continue
        idle += b - a
        states = {w: state(w, mid) for w in per_element}
        # The stretch is put down to the element closest to giving the device work.
        top = min(states.values(), key=order.index)
        why[top] += b - a
        if cur is None:
            cur = [a, b - a, states]
        else:
            cur[1] += b - a
    if cur is not None and cur[1] * 1e3 >= gap_ms:
        gaps.append(cur)
    span = end - start
    # While every element streamed: from the last element's first `in` to the first element's
    # last `out` reached, frames whose work the device finished in it per second (a job's rate
    # without its start, its stagger and its tail; marks of one element per pipeline).
    # Only the marks inside [start, end] (a window given by --from / --to).
    inside = {w: [m for m in ms if m["queued"] >= start and m["reached"] <= end]
              for w, ms in per_element.items()}
    firsts = [min((m["queued"] for m in ms if m["label"] == "in"), default=None)
              for ms in inside.values()]
    lasts = [max((m["reached"] for m in ms if m["label"] == "out"), default=None)
             for ms in inside.values()]
    all_streaming = None
    if None not in firsts and None not in lasts and min(lasts) > max(firsts):
        w0, w1 = max(firsts), min(lasts)
        done = sum(1 for ms in inside.values() for m in ms
                   if m["label"] == "out" and w0 <= m["reached"] < w1)
        all_streaming = {"from_s": round(w0 - start, 4), "to_s": round(w1 - start, 4),
                         "frames": done, "frames_per_s": round(done / (w1 - w0), 2)}
    return {
        "span_s": round(span, 4),
        "elements": sorted(per_element),
        "marks": len(marks),
        "busy_share": round(1 - idle / span, 4) if span > 0 else None,
        "busy_share_max": round(1 - (idle - why["launching"]) / span, 4) if span > 0 else None,
        "idle_s": round(idle, 4),
        "idle_by_state_s": {k: round(why[k], 4) for k in order if why[k] > 0},
        "all_streaming": all_streaming,
        "gaps_over_ms": gap_ms,
        "gaps": [{"at_s": round(g[0] - start, 4), "ms": round(g[1] * 1e3, 2), "states": g[2]}
                 for g in gaps],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--element", default="", help="keep marks whose pipeline/element contains this")
    ap.add_argument("--from", dest="t0", type=float, help="start (time.time() seconds)")
    ap.add_argument("--to", dest="t1", type=float, help="end (time.time() seconds)")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="list idle stretches at least this long")
    ap.add_argument("--json", help="write the analysis here")
    args = ap.parse_args(argv)
    r = analyse(read_marks(args.trace, args.element), args.t0, args.t1, args.gap_ms)
    print(f"{r['marks']} marks of {len(r['elements'])} elements over {r['span_s']:.3f} s: device busy "
          f"{100 * r['busy_share']:.1f} % (up to {100 * r['busy_share_max']:.1f} % if it ran while an "
          f"element launched), idle {r['idle_s'] * 1e3:.1f} ms")
    a = r["all_streaming"]
    if a:
        print(f"  every element streaming from {a['from_s']:.2f} to {a['to_s']:.2f} s: {a['frames']} "
              f"frames done, {a['frames_per_s']:.1f} frames/s")
    for k, v in r["idle_by_state_s"].items():
        print(f"  idle while the closest element was {k:>14}: {v * 1e3:9.1f} ms "
              f"({100 * v / r['span_s']:.1f} % of the span)")
    print(f"  {len(r['gaps'])} idle stretches >= {args.gap_ms:g} ms; the longest:")
    for g in sorted(r["gaps"], key=lambda g: -g["ms"])[:10]:
        print(f"    at {g['at_s']:8.3f} s: {g['ms']:7.2f} ms  {g['states']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
