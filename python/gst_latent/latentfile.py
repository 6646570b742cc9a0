"""Reading latent files (latentsink's safetensors) with the standard library only.

`safetensors.safe_open(path, "np")` (or "pt") reads them too; this module needs neither numpy
nor safetensors, so the precompute job can check outputs with nothing installed.
"""

from __future__ import annotations

import json
import os
import struct

TENSOR = "latents"
_DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2}
_MAX_HEADER = 100_000_000


class LatentFileError(ValueError):
    """A file that is not a complete latent file; the message names the file and the problem."""


def read_header(path: str) -> tuple[dict, dict]:
    """Returns (tensor record of `latents`, `__metadata__` with list values decoded).

    Checks what makes a file complete: header length, JSON, the tensor's byte range against the
    file size, and latentsink's version key.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise LatentFileError(f"{path}: {size} bytes, too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise LatentFileError(f"{path}: header length {n} does not fit in {size} bytes")
            text = f.read(n)
    except OSError as e:
        raise LatentFileError(f"{path}: {e.strerror or e}") from e
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LatentFileError(f"{path}: the safetensors header is not JSON ({e})") from e
    meta = header.get("__metadata__") or {}
    if "gst_latent_version" not in meta:
        raise LatentFileError(f"{path}: not a latent file written by latentsink (no gst_latent_version)")
    rec = header.get(TENSOR)
    if not isinstance(rec, dict):
        raise LatentFileError(f"{path}: no tensor '{TENSOR}'")
    begin, end = rec["data_offsets"]
    count = 1
    for d in rec["shape"]:
        count *= d
    if end - begin != count * _DTYPE_BYTES.get(rec["dtype"], 0) or 8 + n + end != size:
        raise LatentFileError(
            f"{path}: tensor '{TENSOR}' {rec['shape']} {rec['dtype']} does not match the file's "
            f"{size} bytes (truncated?)")
    decoded = dict(meta)
    for key in ("pts", "durations", "offsets", "offset_ends"):
        decoded[key] = json.loads(meta[key])
    for key in ("channels", "latent_width", "latent_height", "frame_width", "frame_height",
                "temporal_factor", "frame_count", "latent_frames"):
        decoded[key] = int(meta[key])
    decoded["video_mode"] = meta["video_mode"] == "true"
    return rec, decoded


def is_complete(path: str) -> bool:
    """Whether `path` is a complete latent file (what --resume skips)."""
    try:
        read_header(path)
        return True
    except (LatentFileError, KeyError, TypeError, ValueError):
        return False


def read_latents(path: str, framework: str = "np"):
    """(latents [T, C, h, w], metadata) through safetensors (numpy: "np", PyTorch: "pt").

    bf16 needs framework="pt" (numpy has no bfloat16).
    """
    from safetensors import safe_open  # optional dependency

    _, meta = read_header(path)
    with safe_open(path, framework=framework) as f:
        return f.get_tensor(TENSOR), meta
