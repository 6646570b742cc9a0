"""Reading latent files (latentsink's safetensors) with the standard library only.

`safetensors.safe_open(path, "np")` (or "pt") reads them too; this module needs neither numpy
nor safetensors, so the precompute job can check outputs with nothing installed.
"""

from __future__ import annotations

import json
import os
import struct

TENSOR = "latents"
VERSION = "1"
_DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2}
_DTYPES = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}  # __metadata__ dtype -> tensor dtype
_SIDE = 16384
# The integer keys and the ranges the C++ reader (engine/weights/latent_file.cpp) accepts.
_INT_RANGES = {
    "channels": (1, 1024), "latent_width": (1, _SIDE), "latent_height": (1, _SIDE),
    "frame_width": (1, _SIDE), "frame_height": (1, _SIDE), "temporal_factor": (1, 1024),
    "frame_count": (0, 2**63 - 1), "latent_frames": (0, 2**63 - 1),
}
_MAX_HEADER = 100_000_000


class LatentFileError(ValueError):
    """A file that is not a complete latent file; the message names the file and the problem."""


def read_header(path: str) -> tuple[dict, dict]:
    """Returns (tensor record of `latents`, `__metadata__` with list values decoded).

    Checks what makes a file complete: header length, JSON, the tensor's byte range against the
    file size, latentsink's version key, and the metadata as the C++ reader does (every key there,
    a string, parsed and in range; the lists as long as the tensor has latent frames, its shape and
    dtype the ones the metadata describes).
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
    if not isinstance(header, dict):
        raise LatentFileError(f"{path}: the safetensors header is not a JSON object")
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or "gst_latent_version" not in meta:
        raise LatentFileError(f"{path}: not a latent file written by latentsink (no gst_latent_version)")
    if meta["gst_latent_version"] != VERSION:
        raise LatentFileError(f"{path}: a latent file of version {meta['gst_latent_version']}; "
                              f"this reader reads version {VERSION}")
    rec = header.get(TENSOR)
    if not isinstance(rec, dict):
        raise LatentFileError(f"{path}: no tensor '{TENSOR}'")
    try:
        begin, end = (int(x) for x in rec["data_offsets"])
        shape = [int(d) for d in rec["shape"]]
        dtype = str(rec["dtype"])
    except (KeyError, TypeError, ValueError):
        raise LatentFileError(f"{path}: tensor '{TENSOR}' has no valid shape, dtype and "
                              "data_offsets") from None
    count = 1
    for d in shape:
        count *= d
    if (min(shape, default=0) < 0 or end - begin != count * _DTYPE_BYTES.get(dtype, 0)
            or 8 + n + end != size):
        raise LatentFileError(
            f"{path}: tensor '{TENSOR}' {rec['shape']} {rec['dtype']} does not match the file's "
            f"{size} bytes (truncated?)")
    bad = sorted(k for k, v in meta.items() if not isinstance(v, str))
    if bad:
        raise LatentFileError(f"{path}: __metadata__ '{bad[0]}' is not a string (safetensors "
                              "metadata maps strings to strings)")
    decoded = dict(meta)
    for key in ("pts", "durations", "offsets", "offset_ends"):
        text = _meta(path, meta, key)
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            value = None
        if not isinstance(value, list) or not all(
                x is None or (type(x) is int and x >= 0) for x in value):
            raise LatentFileError(f"{path}: __metadata__ '{key}' is not a JSON list of "
                                  "non-negative integers and null")
        decoded[key] = value
    for key, (lo, hi) in _INT_RANGES.items():
        text = _meta(path, meta, key)
        try:
            decoded[key] = int(text)
        except (TypeError, ValueError):
            raise LatentFileError(f"{path}: __metadata__ '{key}' is '{text}', not an integer") from None
        if not lo <= decoded[key] <= hi:
            raise LatentFileError(f"{path}: __metadata__ '{key}' is {decoded[key]}, outside "
                                  f"[{lo}, {hi}]")
    if not _meta(path, meta, "latent_space"):
        raise LatentFileError(f"{path}: __metadata__ 'latent_space' is empty")
    if _DTYPES.get(_meta(path, meta, "dtype")) != dtype:
        raise LatentFileError(f"{path}: __metadata__ 'dtype' is '{meta['dtype']}' but tensor "
                              f"'{TENSOR}' is {dtype} (fp32 F32, bf16 BF16, fp16 F16)")
    if _meta(path, meta, "size_policy") not in ("pad", "crop", "scale"):
        raise LatentFileError(f"{path}: __metadata__ 'size_policy' is '{meta['size_policy']}' "
                              "(pad, crop or scale)")
    n_d = _meta(path, meta, "framerate").split("/")
    if (len(n_d) != 2 or not all(x.isdigit() for x in n_d) or int(n_d[1]) == 0
            or max(int(x) for x in n_d) > 2**31 - 1):
        raise LatentFileError(f"{path}: __metadata__ 'framerate' is '{meta['framerate']}', "
                              "expected N/D")
    if _meta(path, meta, "video_mode") not in ("true", "false"):
        raise LatentFileError(f"{path}: __metadata__ 'video_mode' is '{meta['video_mode']}', "
                              "not true or false")
    decoded["video_mode"] = meta["video_mode"] == "true"
    if decoded["video_mode"] != (decoded["temporal_factor"] > 1):
        raise LatentFileError(f"{path}: __metadata__ 'video_mode' is '{meta['video_mode']}' but "
                              f"'temporal_factor' is {decoded['temporal_factor']}")
    t = decoded["latent_frames"]
    lengths = [len(decoded[k]) for k in ("pts", "durations", "offsets", "offset_ends")]
    want = [t, decoded["channels"], decoded["latent_height"], decoded["latent_width"]]
    if lengths != [t] * 4 or shape != want:
        raise LatentFileError(
            f"{path}: tensor '{TENSOR}' {shape} and __metadata__ (latent_frames {t}, lists of "
            f"{lengths}, [T, C, h, w] {want}) disagree")
    return rec, decoded


def _meta(path: str, meta: dict, key: str):
    if key not in meta:
        raise LatentFileError(f"{path}: __metadata__ has no '{key}'")
    return meta[key]


def is_complete(path: str) -> bool:
    """Whether `path` is a complete latent file (what --resume skips)."""
    try:
        read_header(path)
        return True
    except LatentFileError:
        return False


def read_latents(path: str, framework: str = "np"):
    """(latents [T, C, h, w], metadata) through safetensors (numpy: "np", PyTorch: "pt").

    bf16 needs framework="pt" (numpy has no bfloat16).
    """
    from safetensors import safe_open  # optional dependency

    _, meta = read_header(path)
    with safe_open(path, framework=framework) as f:
        return f.get_tensor(TENSOR), meta
