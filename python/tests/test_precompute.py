"""The precompute job on tiny generated clips (CPU): local and Ray engines give the same files,
failures are rows, --resume, unwritable output, a full disk; latent files through safetensors.

Run from ctest (tests/CMakeLists.txt: python_precompute) with the venv of
scripts/install-deps.sh; needs the plugin on GST_PLUGIN_PATH(_1_0) and LATENT_FIXTURES.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYTHON_DIR)
sys.path.insert(0, PYTHON_DIR)

from gst_latent.latentfile import LatentFileError, is_complete, read_header, read_latents  # noqa: E402

FIXTURES = os.environ.get("LATENT_FIXTURES", os.path.join(ROOT, "tests", "fixtures"))
MODEL = os.path.join(FIXTURES, "tiny_taesd")


def gst_launch(*args: str) -> None:
    subprocess.run(["gst-launch-1.0", "-q", *args], check=True, timeout=120)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A folder of tiny inputs: two WebM clips, a PNG, a corrupt file, and a text file."""
    d = tmp_path_factory.mktemp("clips")
    (d / "sub").mkdir()
    gst_launch("videotestsrc", "num-buffers=6", "pattern=ball", "!",
               "video/x-raw,width=64,height=48,framerate=10/1", "!", "vp8enc", "!", "webmmux", "!",
               "filesink", f"location={d / 'a.webm'}")
    gst_launch("videotestsrc", "num-buffers=4", "pattern=smpte", "!",
               "video/x-raw,width=40,height=36,framerate=25/1", "!", "vp8enc", "!", "webmmux", "!",
               "filesink", f"location={d / 'sub' / 'b.webm'}")
    gst_launch("videotestsrc", "num-buffers=1", "pattern=snow", "!", "video/x-raw,width=40,height=32",
               "!", "pngenc", "!", "filesink", f"location={d / 'sub' / 'img.png'}")
    (d / "sub" / "corrupt.mp4").write_bytes(bytes(range(256)) * 8)
    (d / "notes.txt").write_text("not a clip\n")
    return d


GOOD = ["a.webm", "sub/b.webm", "sub/img.png"]


def run_job(*args: str, env_extra=None, preexec=None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # CPU results depend on the thread count (oneDNN's reductions); Ray gives an actor
    # OMP_NUM_THREADS = its CPUs (1). Byte-identical files need the same count everywhere.
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "gst_latent.precompute", "--model", MODEL,
                           "--no-progress", *args], env=env, capture_output=True, text=True,
                          timeout=600, preexec_fn=preexec)


def outputs(out) -> dict[str, bytes]:
    return {rel: (out / (rel + ".safetensors")).read_bytes() for rel in GOOD}


def failures(out) -> list[dict]:
    with open(out / "failures.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def local_out(clips, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    r = run_job("--input", str(clips), "--output", str(out))
    assert r.returncode == 3, r.stderr  # the corrupt clip failed, the job went on
    return out


def test_local_engine_writes_every_good_clip_and_records_the_bad_one(local_out):
    for rel in GOOD:
        assert is_complete(str(local_out / (rel + ".safetensors"))), rel
    rows = failures(local_out)
    assert [r["path"] for r in rows] == ["sub/corrupt.mp4"]
    assert "Could not determine type of stream" in rows[0]["error"]
    assert not (local_out / "notes.txt.safetensors").exists()
    assert not list(local_out.rglob("*.partial"))


def test_metadata_describes_the_clip(local_out):
    _, meta = read_header(str(local_out / "a.webm.safetensors"))
    assert meta["latent_space"] == "sd"
    assert meta["model"] == MODEL
    assert len(meta["model_config_sha256"]) == 64
    assert meta["source"] == "a.webm"
    assert (meta["frame_width"], meta["frame_height"]) == (64, 48)
    assert meta["framerate"] == "10/1"
    assert meta["frame_count"] == 6 and meta["latent_frames"] == 6
    assert meta["pts"] == [i * 100_000_000 for i in range(6)]
    assert len(meta["offsets"]) == len(meta["offset_ends"]) == 6  # as vaeencode set them
    _, img = read_header(str(local_out / "sub/img.png.safetensors"))
    assert img["latent_frames"] == 1 and img["source"] == "sub/img.png"


def test_decoded_frames_go_straight_to_vaeencode(clips, tmp_path):
    # vp8dec's I420 and pngdec's RGB are formats vaeencode takes: no videoconvert on the way (on a
    # GPU machine nvh264dec's CUDA memory goes the same way); the summary names the decoders.
    r = run_job("--input", str(clips), "--output", str(tmp_path / "out"))
    assert r.returncode == 3, r.stderr
    assert "decoded by " in r.stderr, r.stderr
    assert "vp8dec into SystemMemory (2 clips)" in r.stderr, r.stderr
    assert "pngdec into SystemMemory (1 clip)" in r.stderr, r.stderr


def test_the_summary_says_where_each_clip_s_time_went(clips, tmp_path):
    # ClipEncoder times each clip's phases: to the first latent, streaming, teardown.
    from gst_latent.pipeline import ClipEncoder

    enc = ClipEncoder(model=MODEL, device="cpu")
    try:
        res = enc.encode(str(clips / "a.webm"), str(tmp_path / "a.safetensors"), "a.webm")
        bad = enc.encode(str(clips / "sub" / "corrupt.mp4"), str(tmp_path / "c.safetensors"), "c")
    finally:
        enc.close()
    assert not res.error, res.error
    assert res.first_latent_s > 0 and res.stream_s >= 0 and res.teardown_s >= 0, res
    assert 0 < res.pad_added_s <= res.first_frame_s <= res.first_latent_s, res
    assert res.first_latent_s + res.stream_s + res.teardown_s <= res.seconds + 1e-6, res
    assert bad.error and bad.first_latent_s == 0 and bad.stream_s == 0, bad  # no latent left
    assert bad.first_frame_s == 0 and bad.pad_added_s == 0, bad
    r = run_job("--input", str(clips), "--output", str(tmp_path / "out"),
                "--summary", str(tmp_path / "summary.json"))
    assert r.returncode == 3, r.stderr
    assert "per clip (mean of 3): " in r.stderr and "s to the first latent" in r.stderr, r.stderr
    assert "frames/s per worker while clips ran" in r.stderr, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["written"] == 3 and summary["failed"] == 1 and summary["frames"] == 6 + 4 + 1
    start, end = summary["clips_ran"]
    assert 0 < end - start <= summary["seconds"] and summary["frames_per_s_per_worker_while_clips_ran"] > 0
    assert set(summary["per_clip_mean_s"]) == {"seconds", "pad_added_s", "first_frame_s", "first_latent_s",
                                               "stream_s", "teardown_s", "preroll_s"}
    assert summary["per_clip_mean_s"]["preroll_s"] == 0 and summary["preroll"] is False  # (the default)
    # cuDNN's choices are cuDNN's heuristics unless asked otherwise: the same bytes on every node.
    assert summary["conv_algorithms"] == "heuristic"
    # One pipeline: some clip streams only between a clip's first latent and its EOS.
    assert 0 < summary["streaming_share"] < 1, summary
    assert "some clip streaming" in r.stderr, r.stderr
    # The job's fixed cost beside its clips: before the first clip's start, after the last one's end.
    fixed = summary["fixed_s"]
    assert set(fixed) == {"before_first_clip_s", "after_last_clip_s", "worker_start_s", "worker_load_s",
                          "first_dispatch_s"}, fixed
    assert fixed["before_first_clip_s"] > 0 and fixed["after_last_clip_s"] >= 0, fixed
    # ... of which: the worker's start, its load, the first clip's dispatch, in that order
    assert 0 <= fixed["worker_start_s"] and 0 < fixed["worker_load_s"] and 0 <= fixed["first_dispatch_s"], fixed
    assert fixed["worker_start_s"] + fixed["worker_load_s"] + fixed["first_dispatch_s"] \
        <= fixed["before_first_clip_s"] + 0.01, fixed
    assert fixed["before_first_clip_s"] + (end - start) + fixed["after_last_clip_s"] <= summary["seconds"] + 0.05
    assert "the first clip started " in r.stderr, r.stderr


def test_trace_gaps_finds_when_the_device_had_nothing_queued():
    # Two elements on one stream: A's frame runs 0-10 ms on the device, B's 12-20 ms; B read its
    # frame from 10 ms (its `in`) and queued at 12 ms, so 10-12 ms are idle while B was reading;
    # 20-25 ms idle with both between frames; A's second frame then runs 25-30 ms, its last.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from trace_gaps import analyse

    ms = 1e-3
    marks = [
        {"queued": 0 * ms, "reached": 0 * ms, "who": "p0/encode", "label": "in", "n": 0},
        {"queued": 0.5 * ms, "reached": 0.5 * ms, "who": "p0/encode", "label": "locked", "n": 0},
        {"queued": 1 * ms, "reached": 10 * ms, "who": "p0/encode", "label": "out", "n": 0},
        {"queued": 10 * ms, "reached": 10 * ms, "who": "p1/encode", "label": "in", "n": 0},
        {"queued": 11.5 * ms, "reached": 11.5 * ms, "who": "p1/encode", "label": "locked", "n": 0},
        {"queued": 12 * ms, "reached": 20 * ms, "who": "p1/encode", "label": "out", "n": 0},
        {"queued": 25 * ms, "reached": 25 * ms, "who": "p0/encode", "label": "in", "n": 1},
        {"queued": 25.2 * ms, "reached": 25.2 * ms, "who": "p0/encode", "label": "locked", "n": 1},
        {"queued": 25.5 * ms, "reached": 30 * ms, "who": "p0/encode", "label": "out", "n": 1},
    ]
    r = analyse(marks, gap_ms=1.0)
    assert abs(r["span_s"] - 0.030) < 1e-9, r
    # Idle: 0-1 ms (A reading/launching before its work), 10-12 (B), 20-25 (between frames),
    # 25-25.5 (A again).
    assert abs(r["idle_s"] - (1 + 2 + 5 + 0.5) * ms) < 1e-9, r
    by = r["idle_by_state_s"]
    assert abs(by["between frames"] - 5 * ms) < 1e-9, r
    assert abs(by["reading"] + by["launching"] - 3.5 * ms) < 1e-9, r
    assert [round(g["ms"], 3) for g in r["gaps"]] == [1.0, 2.0, 5.5], r
    # Launching (locked to out: 0.5-1, 11.5-12, 25.2-25.5 ms) may have kept the device busy with
    # work the marks do not see: the upper bound counts it as busy.
    assert abs(by["launching"] - 1.3 * ms) < 1e-9, r
    assert abs(r["busy_share_max"] - (1 - (8.5 - 1.3) / 30)) < 1e-4, r
    # Both streamed from B's first `in` (10 ms) to B's last `out` reached (20 ms): one frame (A's
    # first, done at 10 ms) finished in it, 100 frames/s.
    a = r["all_streaming"]
    assert (a["from_s"], a["to_s"], a["frames"]) == (0.01, 0.02, 1) and abs(a["frames_per_s"] - 100) < 1e-6, a


def test_covered_seconds_is_the_union_of_intervals():
    from gst_latent.precompute import covered_seconds

    assert covered_seconds([]) == 0.0
    assert covered_seconds([(1.0, 2.0)]) == 1.0
    # Overlapping, nested, touching and disjoint intervals, in any order.
    assert covered_seconds([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (1.5, 1.7), (3.0, 4.0)]) == 5.0


def test_process_started_at_is_when_the_process_started():
    """The start a worker's row carries (/proc/self/stat's starttime): a process made now says
    it started between just before it was made and the moment it answers."""
    before = time.time()
    r = subprocess.run([sys.executable, "-c", "import time, sys; time.sleep(1.5); "
                        "from gst_latent.precompute import process_started_at as p; "
                        "print(p(), time.time())"],
                       env=dict(os.environ, PYTHONPATH=PYTHON_DIR), capture_output=True, text=True,
                       timeout=60, check=True)
    started, answered = (float(x) for x in r.stdout.split())
    # /proc counts in clock ticks (10 ms) from the boot, and /proc/uptime in 10 ms too
    assert before - 0.05 <= started <= answered - 1.5 + 0.05, (before, started, answered)


def test_each_pipeline_keeps_its_decoder_from_clip_to_clip_with_the_same_bytes(clips, tmp_path):
    # A hardware decoder opened and closed for every clip stalled the whole GPU, so a pipeline
    # keeps its decoder (one per codec, flushed before each clip) out of its per-clip state
    # changes. The files are byte for byte those of decodebin made anew for every clip; a clip
    # that fails drops the decoder it used, and close() takes the kept ones to NULL.
    from gst_latent.pipeline import ClipEncoder

    Gst = __import__("gst_latent.pipeline", fromlist=["gst"]).gst()
    order = ["a.webm", "sub/b.webm", "sub/img.png", "a.webm"]
    kept = ClipEncoder(model=MODEL, device="cpu")
    fresh = ClipEncoder(model=MODEL, device="cpu", keep_decoders=False)
    decoders, results = [], []
    try:
        for i, rel in enumerate(order):
            results.append(kept.encode(str(clips / rel), str(tmp_path / f"k{i}.safetensors"), rel))
            decoders.append(dict(kept._decoders))
            r = fresh.encode(str(clips / rel), str(tmp_path / f"f{i}.safetensors"), rel)
            assert not r.error, r.error
        bad = kept.encode(str(clips / "sub" / "corrupt.mp4"), str(tmp_path / "c.safetensors"), "c")
        after_bad = dict(kept._decoders)
        # a clip whose pipeline fails while the kept VP8 decoder is linked: it is dropped
        real = kept._gpu_frames
        kept._gpu_frames = lambda decoder, caps: (_ for _ in ()).throw(TypeError("broken on purpose"))
        broken = kept.encode(str(clips / "a.webm"), str(tmp_path / "x.safetensors"), "a.webm")
        kept._gpu_frames = real
        again = kept.encode(str(clips / "a.webm"), str(tmp_path / "k9.safetensors"), "a.webm")
        last = dict(kept._decoders)
    finally:
        kept.close()
        fresh.close()
    for i, r in enumerate(results):
        assert not r.error, (order[i], r.error)
        assert (tmp_path / f"k{i}.safetensors").read_bytes() == (tmp_path / f"f{i}.safetensors").read_bytes(), order[i]
    assert [r.decoder for r in results] == ["vp8dec", "vp8dec", "pngdec", "vp8dec"]
    vp8 = decoders[0]["vp8dec"]
    assert decoders[1]["vp8dec"] is vp8 and decoders[3]["vp8dec"] is vp8, "the VP8 decoder was made anew"
    assert set(decoders[2]) == {"vp8dec", "pngdec"}
    assert bad.error and after_bad == decoders[3], "a clip that failed before any decoder dropped one"
    assert "broken on purpose" in broken.error, broken
    assert "vp8dec" not in last or last["vp8dec"] is not vp8, "the decoder of a failed clip was kept"
    assert not again.error and again.decoder == "vp8dec", again
    assert (tmp_path / "k9.safetensors").read_bytes() == (tmp_path / "k0.safetensors").read_bytes()
    assert vp8.get_state(0)[1] == Gst.State.NULL and not kept._decoders


def test_a_kept_decoder_negotiates_its_frame_pool_once_for_clips_of_one_stream(tmp_path):
    # Relinking a kept decoder for each clip sent it a RECONFIGURE; its new ALLOCATION query
    # swapped its frame pool, and for nvh264dec that freed and allocated CUDA memory at every
    # clip's start, which stalled the GPU's other pipelines. Its links stay in place from clip to
    # clip: an H.264 decoder (openh264dec here, which like nvh264dec keeps its configuration
    # across a flush) asks downstream for a pool for the first clip and not again while the
    # stream stays the same; a clip of another size asks again, as it must.
    from gst_latent.pipeline import ClipEncoder

    Gst = __import__("gst_latent.pipeline", fromlist=["gst"]).gst()
    for size, name in (("64x48", "a.mp4"), ("48x32", "b.mp4")):
        w, h = size.split("x")
        gst_launch("videotestsrc", "num-buffers=5", "pattern=ball", "!",
                   f"video/x-raw,width={w},height={h},framerate=10/1", "!", "openh264enc", "!",
                   "h264parse", "!", "mp4mux", "!", "filesink", f"location={tmp_path / name}")
    kept = ClipEncoder(model=MODEL, device="cpu")
    asked = []

    def allocation(_pad, info):
        if info.get_query().type == Gst.QueryType.ALLOCATION:
            asked.append(len(results))
        return Gst.PadProbeReturn.OK

    kept._frames.get_static_pad("sink").add_probe(Gst.PadProbeType.QUERY_DOWNSTREAM, allocation)
    order = ["a.mp4", "a.mp4", "a.mp4", "b.mp4", "a.mp4"]
    results = []
    try:
        for i, rel in enumerate(order):
            results.append(kept.encode(str(tmp_path / rel), str(tmp_path / f"k{i}.safetensors"), rel))
    finally:
        kept.close()
    for i, r in enumerate(results):
        assert not r.error, (order[i], r.error)
    assert [r.decoder for r in results] == ["openh264dec"] * len(order)
    assert 0 in asked and 3 in asked and 4 in asked, f"ALLOCATION queries during clips {asked}"
    assert 1 not in asked and 2 not in asked, f"the same stream renegotiated: {asked}"
    first = (tmp_path / "k0.safetensors").read_bytes()
    assert (tmp_path / "k2.safetensors").read_bytes() == first
    assert (tmp_path / "k4.safetensors").read_bytes() == first


def test_the_likely_decoders_plugins_load_while_the_model_loads():
    # The plugin of a process's first decoder loaded with that decoder, at the first clip's
    # start: nvcodec's load (it probes every GPU's decoders) held the job's first frame back
    # ~1.4 s. The first encoder of a process loads the plugins of the first-choice H.264 and H.265
    # decoders in a thread of its own while its model loads. A fresh process, so that nothing
    # loaded them before.
    code = f"""
import json, sys; sys.path.insert(0, {PYTHON_DIR!r})
from gst_latent.pipeline import ClipEncoder, PRELOAD_CAPS, decoder_factories, gst
Gst = gst()
firsts = [decoder_factories(Gst.Caps.from_string(c))[:1] for c in PRELOAD_CAPS]
plugins = sorted({{f[0].get_plugin_name() for f in firsts if f}})
reg = Gst.Registry.get()
before = [reg.find_plugin(p).is_loaded() for p in plugins]
enc = ClipEncoder(model={MODEL!r}, device="cpu")
enc.preloading.join(60)
after = [reg.find_plugin(p).is_loaded() for p in plugins]
enc.close()
print(json.dumps(dict(plugins=plugins, before=before, after=after)))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "openh264" in got["plugins"], f"no H.264 decoder plugin to preload: {got}"
    assert not any(got["before"]), f"loaded before the encoder was made: {got}"
    assert all(got["after"]), f"a first-choice decoder's plugin did not load: {got}"


def test_a_file_without_video_fails_at_once_naming_its_streams(tmp_path):
    # An audio-only file: the clip fails as soon as its data flows, saying there is no video and
    # what there is (parsebin once left such a file waiting for the clip's timeout), with the
    # decoders kept and with decodebin; a video clip after it is fine.
    from gst_latent.pipeline import ClipEncoder

    gst_launch("audiotestsrc", "num-buffers=20", "!", "vorbisenc", "!", "oggmux", "!", "filesink",
               f"location={tmp_path / 'audio.ogg'}")
    gst_launch("videotestsrc", "num-buffers=3", "!", "video/x-raw,width=32,height=24", "!", "jpegenc",
               "!", "avimux", "!", "filesink", f"location={tmp_path / 'v.avi'}")
    # and a clip with sound: its audio is left out, the decoder named is the video's
    gst_launch("matroskamux", "name=m", "!", "filesink", f"location={tmp_path / 'av.mkv'}",
               "videotestsrc", "num-buffers=5", "!", "video/x-raw,width=32,height=24,framerate=10/1",
               "!", "vp8enc", "!", "m.", "audiotestsrc", "num-buffers=5", "!", "vorbisenc", "!", "m.")
    for keep in (True, False):
        enc = ClipEncoder(model=MODEL, device="cpu", clip_timeout=60.0, keep_decoders=keep)
        try:
            bad = enc.encode(str(tmp_path / "audio.ogg"), str(tmp_path / "a.safetensors"), "audio.ogg")
            good = enc.encode(str(tmp_path / "v.avi"), str(tmp_path / "v.safetensors"), "v.avi")
            av = enc.encode(str(tmp_path / "av.mkv"), str(tmp_path / "av.safetensors"), "av.mkv")
        finally:
            enc.close()
        assert "no video stream" in bad.error and "audio/x-" in bad.error, (keep, bad.error)
        assert bad.seconds < 10, (keep, bad)
        assert not (tmp_path / "a.safetensors").exists()
        assert not good.error and good.frames == 3 and good.decoder == "jpegdec", (keep, good)
        assert not av.error and av.frames == 5 and av.decoder == "vp8dec", (keep, av)
    # No decoder for the stream (jpegdec ranked out): the clip fails at once, saying so.
    Gst = __import__("gst_latent.pipeline", fromlist=["gst"]).gst()
    jpegdec = Gst.Registry.get().lookup_feature("jpegdec")
    rank = jpegdec.get_rank()
    jpegdec.set_rank(Gst.Rank.NONE)
    try:
        for keep, says in ((True, "no decoder for image/jpeg"), (False, "missing a plug-in")):
            enc = ClipEncoder(model=MODEL, device="cpu", clip_timeout=60.0, keep_decoders=keep)
            try:
                none = enc.encode(str(tmp_path / "v.avi"), str(tmp_path / "n.safetensors"), "v.avi")
            finally:
                enc.close()
            assert says in none.error and none.seconds < 10, (keep, none)
    finally:
        jpegdec.set_rank(rank)


def test_an_error_while_linking_the_decoded_stream_fails_the_clip(clips, tmp_path):
    # Whatever goes wrong in the pad-added callback fails that clip at once (an ERROR on the
    # bus) instead of leaving the pad unlinked and the clip waiting for its timeout; the next
    # clip on the same pipeline is fine.
    from gst_latent.pipeline import ClipEncoder

    enc = ClipEncoder(model=MODEL, device="cpu", clip_timeout=60.0)
    real = enc._link_decoded

    def broken(pad):
        raise TypeError("argument caps2: Expected Gst.Caps, but got gi.repository.Gst.Caps")

    try:
        enc._link_decoded = broken
        bad = enc.encode(str(clips / "a.webm"), str(tmp_path / "a.safetensors"), "a.webm")
        enc._link_decoded = real
        good = enc.encode(str(clips / "a.webm"), str(tmp_path / "b.safetensors"), "a.webm")
    finally:
        enc.close()
    assert "linking the decoded stream failed" in bad.error and "Expected Gst.Caps" in bad.error, bad
    assert bad.seconds < 30, bad
    assert not (tmp_path / "a.safetensors").exists()
    assert not good.error and good.frames == 6, good


def test_formats_vaeencode_does_not_take_go_through_videoconvert(clips, tmp_path):
    # A grey PNG (GRAY8) needs videoconvert; the clips around it do not: one worker switches the
    # links clip by clip and every file comes out.
    src = tmp_path / "in"
    src.mkdir()
    for name in ("a_grey.png", "c_grey.png"):
        gst_launch("videotestsrc", "num-buffers=1", "pattern=ball", "!",
                   "video/x-raw,format=GRAY8,width=40,height=32", "!", "pngenc", "!", "filesink",
                   f"location={src / name}")
    shutil.copy(clips / "a.webm", src / "b.webm")
    r = run_job("--input", str(src), "--output", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "pngdec into SystemMemory (2 clips)" in r.stderr and "vp8dec" in r.stderr, r.stderr
    for name, frames in (("a_grey.png", 1), ("b.webm", 6), ("c_grey.png", 1)):
        _, meta = read_header(str(tmp_path / "out" / (name + ".safetensors")))
        assert meta["frame_count"] == frames and (meta["frame_width"], meta["frame_height"]) != (0, 0)


def test_a_video_vae_writes_video_mode_latents(clips, tmp_path):
    # The tiny Wan VAE streams in video mode (mode=auto): 6 frames are 1 + 4 + 1 (padded), 3 latents.
    wan = os.path.join(FIXTURES, "wan_vae_video_tiny")
    src, out = tmp_path / "in", tmp_path / "wan"
    src.mkdir()
    shutil.copy(clips / "a.webm", src / "a.webm")
    trace = tmp_path / "trace.txt"
    r = run_job("--input", str(src), "--output", str(out), "--model", wan,
                env_extra={"LATENT_TRACE": str(trace)})
    assert r.returncode == 0, r.stderr
    (path,) = [p for p in out.rglob("*.safetensors")]
    latents, meta = read_latents(str(path))
    assert meta["video_mode"] and meta["temporal_factor"] == 4
    assert meta["frame_count"] == 6 and meta["latent_frames"] == 3
    assert latents.shape[0] == 3
    assert meta["offsets"] == [0, 1, 5] and meta["offset_ends"] == [1, 5, 6]
    # LATENT_TRACE: vaeencode marked each of the 6 frames in, locked, out, in order; the marks
    # were reached (the CPU backend's work is done when queued), and bench/trace_gaps.py reads them.
    lines = [line.split() for line in trace.read_text().splitlines()]
    mine = [(f[3], int(f[4])) for f in lines if f[2].endswith("/encode")]
    assert mine == [(label, n) for n in range(6) for label in ("in", "locked", "out")], lines
    assert all(int(f[0]) > 0 and int(f[1]) >= int(f[0]) for f in lines), lines
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from trace_gaps import analyse, read_marks

    report = analyse(read_marks(str(trace), "/encode"))
    assert report["marks"] == 18 and 0 <= report["busy_share"] <= 1, report


def test_the_file_round_trips_through_safetensors(local_out):
    pytest.importorskip("safetensors")
    from safetensors import safe_open
    from safetensors.numpy import save_file

    path = str(local_out / "sub/b.webm.safetensors")
    latents, meta = read_latents(path)
    assert latents.shape == (4, 4, 5, 5)  # [T, C, h, w]: 40x36 frames padded to 40x40, /8
    assert str(latents.dtype) == "float32"
    with safe_open(path, framework="np") as f:
        assert list(f.keys()) == ["latents"]
        raw_meta = f.metadata()
    assert all(isinstance(v, str) for v in raw_meta.values())
    # Written back by safetensors itself, the file is still a latent file latentsrc can play.
    again = str(local_out / "resaved.safetensors")
    save_file({"latents": latents}, again, metadata=raw_meta)
    assert read_header(again)[1]["latent_frames"] == 4
    gst_launch("latentsrc", f"location={again}", "!", "vaedecode", f"model={MODEL}", "!", "fakesink")


def test_a_worker_loads_the_model_once(clips, tmp_path):
    # The stages log each model load and each share of a loaded one under their own debug
    # category (GST_DEBUG=vaeencode:5).
    r = run_job("--input", str(clips), "--output", str(tmp_path / "o"),
                env_extra={"GST_DEBUG": "vaeencode:5", "GST_DEBUG_NO_COLOR": "1"})
    assert r.returncode == 3, r.stderr[-2000:]
    assert r.stderr.count("> loaded model") == 1, r.stderr[-2000:]
    assert r.stderr.count("sharing the loaded model") >= len(GOOD)


def test_local_workers_give_the_same_bytes(clips, local_out, tmp_path):
    out = tmp_path / "local2"
    r = run_job("--input", str(clips), "--output", str(out), "--workers", "2", "--device", "cpu,cpu")
    assert r.returncode == 3, r.stderr
    assert outputs(out) == outputs(local_out)


def test_a_stalled_first_clip_holds_back_the_next_pipeline_only_a_while(monkeypatch):
    # The stagger waits for the previous pipeline's first latent, but a first clip that never
    # delivers one (a stalled source) delays the next pipeline by STAGGER_WAIT_S only.
    import threading
    import time

    from gst_latent.precompute import Worker

    w = Worker.__new__(Worker)  # the stagger's state alone, no pipelines
    w._first_latents = [threading.Event(), threading.Event(), threading.Event()]
    w._first_starts = [0.0] * 3
    w._calls = 0
    w._calls_lock = threading.Lock()
    monkeypatch.setattr(Worker, "STAGGER_WAIT_S", 0.3)
    monkeypatch.setattr(Worker, "STAGGER_MAX_S", 0.2)
    first = w._stagger()  # returns at once: nobody before it
    assert first is w._first_latents[0]
    t0 = time.monotonic()
    second = w._stagger()  # the first clip never delivers: waits STAGGER_WAIT_S, no more
    assert second is w._first_latents[1]
    assert 0.25 <= time.monotonic() - t0 < 0.5
    # A first latent that came: the next waits as long again as that clip took (capped).
    w._first_starts[1] = time.monotonic() - 0.1
    second.set()
    t0 = time.monotonic()
    assert w._stagger() is w._first_latents[2]
    assert 0.08 <= time.monotonic() - t0 < 0.25
    assert w._stagger() is None  # the pipelines' later clips start when a pipeline is free


def test_pipelines_per_worker_overlap_clips_and_give_the_same_bytes(clips, local_out, tmp_path):
    # Two pipelines of one worker run two clips at once on one loaded model; one runs them in
    # turn. The files are the same either way (the default is 2). In this process the CPU
    # thread count is pytest's (run_job's jobs use 1), so these files are compared with each other.
    from gst_latent.precompute import Worker, list_inputs

    good = [t for t in list_inputs(str(clips)) if t[0] in GOOD]
    todo = good + [("again/" + rel, path) for rel, path in good]
    made = []
    for count, overlap in ((1, False), (2, True)):
        out = tmp_path / f"p{count}"
        worker = Worker({"model": MODEL, "device": "cpu", "dtype": "", "clip_timeout": 120.0,
                         "output": str(out), "pipelines": count})
        try:
            rows = list(worker.process_all(todo))
        finally:
            worker.close()
        assert len(rows) == len(todo) and not any(r["error"] for r in rows), rows
        spans = sorted((r["started"], r["started"] + r["seconds"]) for r in rows)
        overlapped = any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
        assert overlapped == overlap, (count, spans)
        if count > 1:  # the second pipeline's first clip starts after twice the first one's lead
            first, second = sorted(rows, key=lambda r: r["started"])[:2]
            assert first["first_latent_s"] > 0, first
            assert second["started"] >= first["started"] + 2 * first["first_latent_s"] - 0.005, \
                (first, second)
        made.append({rel: (out / (rel + ".safetensors")).read_bytes() for rel, _ in todo})
    assert made[0] == made[1]
    r = run_job("--input", str(clips), "--output", str(tmp_path / "p3"), "--pipelines-per-worker", "3")
    assert r.returncode == 3, r.stderr
    assert outputs(tmp_path / "p3") == outputs(local_out)


def test_prerolled_clips_give_the_same_bytes_and_stream_one_per_slot(clips, local_out, tmp_path):
    # --preroll: a worker with 2 streaming slots has 4 pipelines; clips preroll while others
    # stream. The files are the same, at most 2 clips stream at once, and a clip's streaming
    # interval starts when it got its slot (not during its preroll).
    from gst_latent.precompute import Worker, list_inputs

    good = [t for t in list_inputs(str(clips)) if t[0] in GOOD]
    todo = good + [("again/" + rel, path) for rel, path in good]
    out = tmp_path / "preroll"
    worker = Worker({"model": MODEL, "device": "cpu", "dtype": "", "clip_timeout": 120.0,
                     "output": str(out), "pipelines": 2, "preroll": True})
    try:
        assert len(worker.encoders) == 4
        rows = list(worker.process_all(todo))
    finally:
        worker.close()
    assert len(rows) == len(todo) and not any(r["error"] for r in rows), rows
    made = {rel: (out / (rel + ".safetensors")).read_bytes() for rel, _ in todo}
    assert {rel: made[rel] for rel in GOOD} == outputs(local_out)
    streams = [(r["started"] + r["first_latent_s"], r["started"] + r["first_latent_s"] + r["stream_s"])
               for r in rows]
    events = sorted([(a, 1) for a, _ in streams] + [(b, -1) for _, b in streams], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, step in events:  # (an end sorts before a start at the same instant)
        running += step
        most = max(most, running)
    assert most <= 2, streams
    assert all(r["preroll_s"] >= 0 and r["first_latent_s"] >= r["preroll_s"] - 1e-6 for r in rows), rows
    assert any(r["preroll_s"] > 0 for r in rows), rows  # 6 clips, 2 slots: some waited prerolled
    # The command line: --preroll, and the corrupt clip still fails on its own.
    r = run_job("--input", str(clips), "--output", str(tmp_path / "cli"), "--preroll",
                "--summary", str(tmp_path / "summary.json"))
    assert r.returncode == 3, r.stderr
    assert outputs(tmp_path / "cli") == outputs(local_out)
    assert [row["path"] for row in failures(tmp_path / "cli")] == ["sub/corrupt.mp4"]
    assert json.loads((tmp_path / "summary.json").read_text())["preroll"] is True
    r = run_job("--input", str(clips), "--output", str(tmp_path / "bad"),
                env_extra={"LATENT_PRECOMPUTE_PREROLL": "yes"})
    assert r.returncode == 2 and "LATENT_PRECOMPUTE_PREROLL=yes" in r.stderr, r.stderr


def test_ray_engine_gives_the_same_bytes(clips, local_out, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    env = {"RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"}
    r = run_job("--input", str(clips), "--output", str(out), "--engine", "ray", "--workers", "2",
                "--ray-cpus", "2", "--gpus-per-worker", "0", "--summary", str(tmp_path / "summary.json"),
                env_extra=env)
    assert r.returncode == 3, r.stderr
    assert outputs(out) == outputs(local_out)
    assert [row["path"] for row in failures(out)] == ["sub/corrupt.mp4"]
    # Ray's own start and shutdown are part of the job's fixed cost, and said.
    fixed = json.loads((tmp_path / "summary.json").read_text())["fixed_s"]
    assert fixed["ray_init_s"] > 0 and fixed["ray_shutdown_s"] >= 0, fixed
    assert fixed["before_first_clip_s"] >= fixed["ray_init_s"], fixed
    assert fixed["worker_start_s"] >= fixed["ray_init_s"] and fixed["worker_load_s"] > 0, fixed
    assert "(Ray: " in r.stderr and " s to start" in r.stderr, r.stderr
    # An actor runs in a process of Ray's, started during the job: when, said too.
    assert 0 < fixed["worker_process_start_s"] <= fixed["worker_start_s"], fixed
    assert "its process started " in r.stderr, r.stderr


def test_ray_joins_a_running_cluster(clips, local_out, tmp_path):
    """RAY_ADDRESS: the job joins a cluster that is already up (one cluster, many jobs): the same
    bytes as the local engine, and the cluster is still up after the job (the job disconnects;
    it stops only a cluster it started)."""
    pytest.importorskip("ray")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS="")
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    start = subprocess.run(ray + ["start", "--head", "--num-cpus", "2", "--num-gpus", "0",
                                  "--disable-usage-stats", "--include-dashboard=false"],
                           env=env, capture_output=True, text=True, timeout=180)
    assert start.returncode == 0, start.stderr[-2000:]
    try:
        out = tmp_path / "ray"
        r = run_job("--input", str(clips), "--output", str(out), "--engine", "ray", "--workers", "2",
                    "--gpus-per-worker", "0", "--summary", str(tmp_path / "summary.json"),
                    env_extra={"RAY_ADDRESS": "auto", "RAY_AUTH_MODE": "disabled"})
        assert r.returncode == 3, r.stderr
        assert outputs(out) == outputs(local_out)
        assert [row["path"] for row in failures(out)] == ["sub/corrupt.mp4"]
        fixed = json.loads((tmp_path / "summary.json").read_text())["fixed_s"]
        assert fixed["ray_init_s"] > 0 and fixed["worker_load_s"] > 0, fixed
        status = subprocess.run(ray + ["status", "--address", "auto"], env=env, capture_output=True,
                                text=True, timeout=120)
        assert status.returncode == 0, status.stderr[-2000:]
    finally:
        subprocess.run(ray + ["stop", "--force"], env=env, capture_output=True, timeout=120)


def test_ray_refuses_a_pool_it_cannot_place(clips, tmp_path):
    pytest.importorskip("ray")
    r = run_job("--input", str(clips), "--output", str(tmp_path / "o"), "--engine", "ray",
                "--workers", "1", "--ray-cpus", "1", "--gpus-per-worker", "1",
                env_extra={"RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled", "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2, r.stderr
    assert "need 1 GPUs; the Ray cluster has 0" in r.stderr


def test_a_list_file_and_resume(clips, local_out, tmp_path):
    lst = clips / "list.txt"
    lst.write_text("# two clips\na.webm\nsub/img.png\n")
    out = tmp_path / "listed"
    r = run_job("--input", str(lst), "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert not (out / "failures.jsonl").exists()
    assert (out / "a.webm.safetensors").read_bytes() == outputs(local_out)["a.webm"]
    # --resume skips complete outputs and redoes a truncated one (a foreign writer's leftovers).
    data = (out / "sub/img.png.safetensors").read_bytes()
    (out / "sub/img.png.safetensors").write_bytes(data[:-10])
    stamp = os.stat(out / "a.webm.safetensors").st_mtime_ns
    r = run_job("--input", str(lst), "--output", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    assert "1 written, 0 failed, 1 skipped" in r.stderr
    assert os.stat(out / "a.webm.safetensors").st_mtime_ns == stamp
    assert (out / "sub/img.png.safetensors").read_bytes() == data


def test_an_unwritable_output_is_a_clear_error(clips, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = run_job("--input", str(clips), "--output", str(blocker / "out"))
    assert r.returncode == 2
    assert "cannot write to output folder" in r.stderr and str(blocker) in r.stderr
    # A sub-folder that cannot be made fails its clips only.
    out = tmp_path / "partly"
    out.mkdir()
    (out / "sub").write_text("in the way")
    r = run_job("--input", str(clips), "--output", str(out))
    assert r.returncode == 3, r.stderr
    assert is_complete(str(out / "a.webm.safetensors"))
    bad = {row["path"]: row["error"] for row in failures(out)}
    assert set(bad) == {"sub/b.webm", "sub/img.png", "sub/corrupt.mp4"}
    assert "cannot make" in bad["sub/b.webm"]


def test_an_unwritable_summary_is_refused_before_the_job_runs(clips, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = tmp_path / "out"
    r = run_job("--input", str(clips), "--output", str(out), "--summary", str(blocker / "summary.json"))
    assert r.returncode == 2, r.stderr
    assert "cannot write the summary" in r.stderr and str(blocker) in r.stderr
    assert not list(out.glob("**/*.safetensors")), "the job ran although its summary could not be written"
    # A job that stops before its summary (here: a model that does not load) leaves no empty file.
    summary = tmp_path / "summary.json"
    r = run_job("--input", str(clips), "--output", str(out), "--summary", str(summary),
                "--model", str(tmp_path / "no-such-model"))
    assert r.returncode == 2, r.stderr
    assert not summary.exists()
    # A summary that cannot be written at the end (a full disk: /dev/full) keeps exit status 3
    # for failed clips and the clips' files.
    r = run_job("--input", str(clips), "--output", str(out), "--summary", "/dev/full")
    assert r.returncode == 3, r.stderr
    assert "cannot write the summary /dev/full" in r.stderr
    assert is_complete(str(out / "a.webm.safetensors"))
    assert {row["path"] for row in failures(out)} == {"sub/corrupt.mp4"}


def test_a_full_disk_fails_the_clips_and_keeps_finished_files(clips, local_out, tmp_path):
    out = tmp_path / "full"
    out.mkdir()
    shutil.copy(local_out / "a.webm.safetensors", out / "a.webm.safetensors")
    before = (out / "a.webm.safetensors").read_bytes()

    def small_disk():
        # Writes past 2 KiB fail with EFBIG (SIGXFSZ ignored): the latents of the clips do not
        # fit, the job's own small files do.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    r = run_job("--input", str(clips), "--output", str(out), "--resume", preexec=small_disk)
    assert r.returncode == 3, r.stderr
    bad = {row["path"]: row["error"] for row in failures(out)}
    assert "sub/b.webm" in bad and "File too large" in bad["sub/b.webm"], bad
    assert (out / "a.webm.safetensors").read_bytes() == before
    assert not (out / "sub/b.webm.safetensors").exists()
    assert not list(out.rglob("*.partial"))


def test_reader_names_what_is_wrong(tmp_path):
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(LatentFileError, match="too short"):
        read_header(str(p))
    p.write_bytes((16).to_bytes(8, "little") + b'{"x": 1}        ')
    with pytest.raises(LatentFileError, match="not a latent file"):
        read_header(str(p))
    assert not is_complete(str(tmp_path / "missing.safetensors"))

    # latentsink's layout; each change below is one way a foreign or damaged file differs.
    meta = {"gst_latent_version": "1", "latent_space": "sd", "model": "m", "dtype": "fp32",
            "channels": "4", "latent_width": "5", "latent_height": "3", "frame_width": "40",
            "frame_height": "24", "size_policy": "pad", "framerate": "25/1", "video_mode": "false",
            "temporal_factor": "1", "frame_count": "2", "latent_frames": "2", "source": "",
            "pts": "[0,40000000]", "durations": "[40000000,40000000]", "offsets": "[0,1]",
            "offset_ends": "[1,2]"}

    def write(header_changes=None, meta_changes=None, header=None):
        m = {k: v for k, v in {**meta, **(meta_changes or {})}.items() if v is not None}
        h = {"__metadata__": m,
             "latents": {"dtype": "F32", "shape": [2, 4, 3, 5], "data_offsets": [0, 480]},
             **(header_changes or {})}
        text = json.dumps(h if header is None else header).encode()
        p.write_bytes(len(text).to_bytes(8, "little") + text + bytes(480))
        return str(p)

    _, decoded = read_header(write())
    assert decoded["pts"] == [0, 40000000] and decoded["latent_frames"] == 2
    for kwargs, message in (
            ({"header": [1, 2]}, "the safetensors header is not a JSON object"),
            ({"meta_changes": {"gst_latent_version": "2"}}, "a latent file of version 2"),
            ({"meta_changes": {"pts": None}}, "__metadata__ has no 'pts'"),
            ({"meta_changes": {"pts": "not json"}}, "'pts' is not a JSON list of non-negative integers"),
            ({"meta_changes": {"offsets": '["a", 1]'}}, "'offsets' is not a JSON list"),
            ({"meta_changes": {"durations": "[-1, 0]"}}, "'durations' is not a JSON list"),
            ({"meta_changes": {"latent_frames": "two"}}, "'latent_frames' is 'two', not an integer"),
            ({"meta_changes": {"video_mode": "maybe"}}, "'video_mode' is 'maybe', not true or false"),
            ({"meta_changes": {"temporal_factor": "4"}}, "'video_mode' is 'false' but 'temporal_factor' is 4"),
            ({"meta_changes": {"latent_frames": "3"}}, "and __metadata__ (latent_frames 3"),
            ({"meta_changes": {"channels": "16"}}, "[2, 4, 3, 5] and __metadata__"),
            ({"header_changes": {"latents": {"dtype": "F32", "shape": [2, 4, 3, 5]}}},
             "has no valid shape, dtype and data_offsets"),
            # the C++ reader's value checks (engine/weights/latent_file.cpp), the same here
            ({"meta_changes": {"channels": 4}}, "'channels' is not a string"),
            ({"meta_changes": {"channels": "0"}}, "'channels' is 0, outside [1, 1024]"),
            ({"meta_changes": {"frame_width": "99999"}}, "'frame_width' is 99999, outside"),
            ({"meta_changes": {"latent_space": ""}}, "'latent_space' is empty"),
            ({"meta_changes": {"dtype": "bf16"}}, "'dtype' is 'bf16' but tensor 'latents' is F32"),
            ({"meta_changes": {"dtype": "int8"}}, "'dtype' is 'int8'"),
            ({"meta_changes": {"size_policy": "stretch"}}, "'size_policy' is 'stretch' (pad, crop or scale)"),
            ({"meta_changes": {"framerate": "25"}}, "'framerate' is '25', expected N/D"),
            ({"meta_changes": {"framerate": "25/0"}}, "'framerate' is '25/0'"),
            ({"meta_changes": {"framerate": "-1/1"}}, "'framerate' is '-1/1'")):
        path = write(**kwargs)
        with pytest.raises(LatentFileError) as e:
            read_header(path)
        assert path in str(e.value) and message in str(e.value), (kwargs, str(e.value))
        assert not is_complete(path), kwargs


def plan_file(entries: dict) -> str:
    return json.dumps({"format": "gst-latent-plan-cache", "version": 1,
                       "context": {"gpu": "NVIDIA H100", "compute_capability": "9.0"},
                       "entries": entries})


def test_conv_algorithms_reach_the_pipelines(clips, local_out, tmp_path):
    # --conv-algorithms sets LATENT_CUDNN_SEARCH for every pipeline (threads, worker processes,
    # Ray actors); an unknown value of the variable is refused, not ignored. On the CPU the
    # files are the same either way. Timed, with two workers, the first clip runs alone first
    # and its plan files go to both workers (here a plan file of another GPU sits in the folder:
    # it travels and stays as it was).
    out = tmp_path / "timed"
    cache = tmp_path / "plans"
    cache.mkdir()
    (cache / "cuda-plans-0123456789abcdef.json").write_text(plan_file({"conv x": {"algo": 3}}))
    r = run_job("--input", str(clips), "--output", str(out), "--conv-algorithms", "timed",
                "--workers", "2", "--summary", str(tmp_path / "s.json"),
                env_extra={"LATENT_PLAN_CACHE": str(cache)})
    assert r.returncode == 3, r.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["conv_algorithms"] == "timed"
    warm = summary["timed_warmup"]
    assert warm["clip"] == "a.webm" and warm["plan_files"] == 1 and warm["seconds"] > 0, warm
    assert "a.webm encoded alone first" in r.stderr, r.stderr[-2000:]
    assert json.loads((cache / "cuda-plans-0123456789abcdef.json").read_text())["entries"] == {
        "conv x": {"algo": 3}}
    assert outputs(out) == outputs(local_out)
    r = run_job("--input", str(clips), "--output", str(tmp_path / "o2"), "--summary", str(tmp_path / "t.json"),
                env_extra={"LATENT_CUDNN_SEARCH": "timed"})
    assert r.returncode == 3, r.stderr
    assert json.loads((tmp_path / "t.json").read_text())["conv_algorithms"] == "timed"
    r = run_job("--input", str(clips), "--output", str(tmp_path / "o3"), env_extra={"LATENT_CUDNN_SEARCH": "fast"})
    assert r.returncode == 2 and "LATENT_CUDNN_SEARCH=fast is not heuristic or timed" in r.stderr, r.stderr
    from gst_latent.precompute import conv_search_env
    assert conv_search_env("heuristic") == "heuristic" and conv_search_env("timed") == "timed"
    # One worker (its pipelines share one backend) or heuristic choices: no warm-up.
    assert json.loads((tmp_path / "t.json").read_text())["timed_warmup"] is None


def test_ray_timed_warms_up_on_one_actor_and_gives_the_same_bytes(clips, local_out, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    cache = tmp_path / "plans"
    env = {"RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled", "LATENT_PLAN_CACHE": str(cache)}
    r = run_job("--input", str(clips), "--output", str(out), "--engine", "ray", "--workers", "2",
                "--ray-cpus", "2", "--gpus-per-worker", "0", "--conv-algorithms", "timed",
                "--summary", str(tmp_path / "summary.json"), env_extra=env)
    assert r.returncode == 3, r.stderr
    assert outputs(out) == outputs(local_out)
    warm = json.loads((tmp_path / "summary.json").read_text())["timed_warmup"]
    assert warm["clip"] == "a.webm" and warm["plan_files"] == 0, warm  # the CPU keeps no plans


def test_plan_files_travel_and_merge(tmp_path, monkeypatch):
    # collect() reads this process's plan folder, install() writes another's: shipped entries
    # win, local ones of the same context stay, a file of another context is replaced, and a
    # name that is not a plan file is refused.
    from gst_latent import plans

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "cuda-plans-00000000000000aa.json").write_text(plan_file({"k1": 1, "k2": 2}))
    (src / "cuda-plans-00000000000000bb.json").write_text(plan_file({"k3": 3}))
    (src / "other.json").write_text("{}")
    monkeypatch.setenv("LATENT_PLAN_CACHE", str(src))
    files = plans.collect()
    assert sorted(files) == ["cuda-plans-00000000000000aa.json", "cuda-plans-00000000000000bb.json"]
    dst.mkdir()
    (dst / "cuda-plans-00000000000000aa.json").write_text(plan_file({"k1": 9, "k0": 0}))
    foreign = json.loads(plan_file({"k9": 9}))
    foreign["context"]["gpu"] = "NVIDIA H200"
    (dst / "cuda-plans-00000000000000bb.json").write_text(json.dumps(foreign))
    monkeypatch.setenv("LATENT_PLAN_CACHE", str(dst))
    assert plans.install(files) == 2
    got = json.loads((dst / "cuda-plans-00000000000000aa.json").read_text())
    assert got["entries"] == {"k0": 0, "k1": 1, "k2": 2}
    assert json.loads((dst / "cuda-plans-00000000000000bb.json").read_text())["entries"] == {"k3": 3}
    assert sorted(os.listdir(dst)) == sorted(files)  # no temporary file left
    with pytest.raises(ValueError, match="not a plan file name"):
        plans.install({"../x.json": plan_file({})})
    with pytest.raises(ValueError, match="not a plan file"):
        plans.install({"cuda-plans-00000000000000cc.json": "{"})
    monkeypatch.setenv("LATENT_PLAN_CACHE", "off")
    assert plans.collect() == {} and plans.install(files) == 0
    monkeypatch.delenv("LATENT_PLAN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert plans.folder() == str(tmp_path / "xdg" / "gst-latent")


def test_bad_arguments(tmp_path):
    r = run_job("--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and "no such folder or list file" in r.stderr
    # A clip given instead of its folder or a list, and a list file that is not text.
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42\x82\xff")
    r = run_job("--input", str(clip), "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and f"--input {clip} is a media file; give a folder" in r.stderr, r.stderr
    binary = tmp_path / "clips.lst"
    binary.write_bytes(b"\x82\xff\x00")
    r = run_job("--input", str(binary), "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and f"--input {binary} is not a list file" in r.stderr, r.stderr
    # A folder without media files and a list without entries: no job that writes nothing.
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "notes.txt").write_text("not a clip\n")
    r = run_job("--input", str(tmp_path / "empty"), "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and "no media files in this folder or below (looked for" in r.stderr, r.stderr
    assert ".mp4" in r.stderr
    blank = tmp_path / "blank.lst"
    blank.write_text("# nothing yet\n\n")
    r = run_job("--input", str(blank), "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and "the list file names no clips" in r.stderr, r.stderr
    r = run_job("--input", str(tmp_path), "--output", str(tmp_path / "o"), "--workers", "0")
    assert r.returncode == 2 and "--workers must be at least 1" in r.stderr
    r = run_job("--input", str(tmp_path), "--output", str(tmp_path / "o"), "--pipelines-per-worker", "0")
    assert r.returncode == 2 and "--pipelines-per-worker must be at least 1" in r.stderr


def test_encoder_settings_that_do_not_parse_stop_the_job_naming_them(clips, tmp_path):
    """--dtype, --device and --encoder-prop values GLib would only warn about (and ignore, the
    job running on the defaults) are usage errors naming the property and the value."""
    out = tmp_path / "o"
    lst = tmp_path / "list.txt"
    lst.write_text(str(clips / "a.webm") + "\n")
    for args, message in (
            (["--dtype", "fp64"], "property 'dtype': 'fp64' is not a valid value (one of auto, fp32"),
            (["--encoder-prop", "size-policy=bogus"], "'bogus' is not a valid value (one of pad, crop, scale)"),
            (["--encoder-prop", "prefetch-depth=-1"], "property 'prefetch-depth': -1 is outside [0, 16]"),
            (["--encoder-prop", "prefetch-depth=two"], "property 'prefetch-depth': 'two' is not a number"),
            (["--encoder-prop", "qos=maybe"], "property 'qos': 'maybe' is not a valid value"),
            (["--device", "tpu"], "device 'tpu' is not a device")):
        r = run_job("--input", str(lst), "--output", str(out), *args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr, (args, r.stderr)
        assert not list(out.glob("**/*.safetensors")), args
    # Values that parse are applied.
    r = run_job("--input", str(lst), "--output", str(out), "--encoder-prop", "size-policy=crop",
                "--encoder-prop", "prefetch-depth=4", "--encoder-prop", "qos=false")
    assert r.returncode == 0, r.stderr
    written = list(out.glob("**/*.safetensors"))
    assert len(written) == 1
    assert read_header(str(written[0]))[1]["size_policy"] == "crop"


def test_a_local_worker_on_cuda_n_sees_that_gpu_alone(monkeypatch):
    """A local worker process for --device cuda:N gets CUDA_VISIBLE_DEVICES = that GPU and runs it
    as cuda:0, so the hardware decoder decodebin picks (device 0's) works on the same GPU."""
    from gst_latent.precompute import pin_device

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    got = pin_device({"device": "cuda:2", "model": "m"}, gpu_count=4)
    assert got == {"device": "cuda:0", "device_as_given": "cuda:2", "model": "m"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    # The N-th of the GPUs the job itself was given.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert pin_device({"device": "cuda:1"})["device"] == "cuda:0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with pytest.raises(ValueError, match=r"--device cuda:2: no such GPU \(CUDA_VISIBLE_DEVICES=3,5 makes 2 visible\)"):
        pin_device({"device": "cuda:2"})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(ValueError, match=r"--device cuda:4: no such GPU \(this machine has 4\)"):
        pin_device({"device": "cuda:4"}, gpu_count=4)
    # Nothing to pin: no GPU (vaeencode names the device), or no index.
    for opts, count in (({"device": "cuda:1"}, 0), ({"device": "cuda"}, 4), ({"device": "auto"}, 4),
                        ({"device": "cpu"}, 4), ({"device": "cuda:x"}, 4)):
        assert pin_device(dict(opts), gpu_count=count) == opts
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
