"""The CUDA backend's plan files (engine/core/plan_cache.h) as the precompute job moves them.

With timed convolution algorithms (--conv-algorithms timed) every process times cuDNN's
candidates for a shape it has not seen and keeps the choice in a plan file; processes that time
the same shape at the same moment can choose differently, and so write different bytes. The job
therefore encodes its first clip alone, collects the plan files that clip wrote
(`collect`), and gives them to every worker before its model loads (`install`): every worker then
builds the same engines. A plan file is named by a hash of its GPU model and library versions, so
a worker on another GPU model ignores the file and times for itself.
"""

from __future__ import annotations

import json
import os
import tempfile

PLAN_STEM = "cuda-plans-"  # open_plan_cache() in engine/backends/cuda/graph.cpp
FORMAT = "gst-latent-plan-cache"


def folder() -> str | None:
    """The plan files' folder, as PlanCache::default_directory() names it: $LATENT_PLAN_CACHE
    (empty, 0 or off: none), else $XDG_CACHE_HOME/gst-latent, else $HOME/.cache/gst-latent."""
    v = os.environ.get("LATENT_PLAN_CACHE")
    if v is not None:
        return None if v in ("", "0", "off") else v
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "gst-latent")
    if os.environ.get("HOME"):
        return os.path.join(os.environ["HOME"], ".cache", "gst-latent")
    return None


def collect() -> dict[str, str]:
    """The plan files in this process's folder: file name -> contents (none when caching is off)."""
    where = folder()
    files = {}
    if not where or not os.path.isdir(where):
        return files
    for name in sorted(os.listdir(where)):
        if name.startswith(PLAN_STEM) and name.endswith(".json"):
            try:
                with open(os.path.join(where, name), encoding="utf-8") as f:
                    files[name] = f.read()
            except OSError:
                continue  # another process replacing it: its next state comes with the next job
    return files


def _parse(text: str) -> dict | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    ok = isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("entries"), dict)
    return doc if ok else None


def merged(local: str | None, shipped: str) -> str:
    """The file that results from `shipped` arriving where `local` is: the shipped entries win
    where both have one (the choice every worker must make), the local ones stay beside them when
    both files describe the same context, else the shipped file alone."""
    theirs = _parse(shipped)
    if theirs is None:
        raise ValueError("not a plan file")
    mine = _parse(local) if local is not None else None
    if (mine is None or mine.get("context") != theirs.get("context")
            or mine.get("version") != theirs.get("version")):
        return json.dumps(theirs, indent=1, sort_keys=True)
    entries = dict(mine["entries"])
    entries.update(theirs["entries"])
    return json.dumps(dict(theirs, entries=entries), indent=1, sort_keys=True)


def install(files: dict[str, str]) -> int:
    """Writes `files` (collect()'s) into this process's plan folder, merged with what is there;
    each file is replaced in one rename, so a backend loading meanwhile reads the old or the new
    one whole. Returns how many files were written. Call before the model loads."""
    where = folder()
    if not where or not files:
        return 0
    os.makedirs(where, exist_ok=True)
    written = 0
    for name, text in files.items():
        if os.path.basename(name) != name or not name.startswith(PLAN_STEM):
            raise ValueError(f"{name!r} is not a plan file name")
        path = os.path.join(where, name)
        try:
            with open(path, encoding="utf-8") as f:
                local = f.read()
        except FileNotFoundError:
            local = None
        out = merged(local, text)
        fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=where)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(out)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        written += 1
    return written
