"""One encoding pipeline on one device, reused clip after clip.

    filesrc ! parsebin ! DECODER ! queue ! [videoconvert !] vaeencode device=D ! queue ! latentsink

The queues give the decoder and the file writer threads of their own: vaeencode's thread only
encodes (it waits for each latent to be complete before it pushes it, and without the queues the
GPU would also wait while the next frames are decoded and the last latent is written).

The decoder is picked as decodebin picks it (the highest-ranked decoder that takes the stream's
caps) and is kept from clip to clip (`keep_decoders`, the default), out of the pipeline's state
changes (locked in PLAYING, flushed before each clip). decodebin opened and closed nvh264dec for
every clip (its NVDEC decoder and CUDA frame pool made and freed), which took 0.2 s of each
clip's start and 0.1 s of its teardown, and while it did, the other pipelines' kernel launches on
the same GPU stalled for 20-100 ms with the device empty (session 29's trace of the Wan 2.1 job;
with the decoder kept the longest such gap is 6 ms). Its links down to vaeencode stay in place
from clip to clip too: relinking sent it a RECONFIGURE, and its new ALLOCATION query swapped its
CUDA frame pool at every clip's start. A decoder that fails a clip is dropped; the next clip gets
a new one. `keep_decoders=False` puts decodebin in parsebin's and the decoder's place, made anew
for every clip (the same bytes). The first encoder of a process loads the plugins of the
first-choice H.264 and H.265 decoders with its model (`preload_decoders`): loaded with the first
decoder instead, nvcodec's plugin (its init probes every GPU's decoders) held the job's first
frame back ~1.4 s on an H200.

The decoded frames go straight to vaeencode when a GPU decoder gives 8-bit 4:2:0 (nvh264dec /
nvh265dec hand over NV12 frames in GPU memory: no download, no CPU conversion, vaeencode reads
them in place); everything else goes through videoconvert, which passes through what vaeencode
takes (I420, NV12, the RGB orders, in system or CUDA memory) and converts the rest (grey, 10-bit,
4:4:4, ...). Each result names the decoder and the memory its frames came in. The model is loaded
once: an idle `vaeencode` with the same model, device and dtype stays started for the encoder's
lifetime, and the stages of one process share a loaded model, so each clip's pipeline start finds
it in memory.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass

_GST = None
_GST_LOCK = threading.Lock()


def gst():
    """Gst, initialised once (PyGObject from Debian's python3-gi), by one thread.

    Once, in a Ray actor running two pipelines, every pad-added callback failed with "Expected
    Gst.Caps, but got gi.repository.Gst.Caps": the process had wrapped a GstCaps with the raw
    introspected class instead of the overridden one. PyGObject loads types lazily, and the likely
    cause is two threads loading them at once; so the types the callbacks meet are loaded here,
    under a lock, before any pipeline exists."""
    global _GST
    with _GST_LOCK:
        if _GST is None:
            import gi

            gi.require_version("Gst", "1.0")
            from gi.repository import Gst

            Gst.init(None)
            # Instances too: wrapping one registers its GType with the overridden class.
            caps = Gst.Caps.from_string("video/x-raw")
            caps.get_structure(0)
            caps.get_features(0)
            for name in ("Pad", "PadProbeInfo", "PadProbeType", "PadProbeReturn", "PadLinkReturn",
                         "Buffer", "Structure", "CapsFeatures", "Element", "Bin", "Pipeline",
                         "Bus", "Message", "MessageType", "Iterator", "IteratorResult",
                         "ElementFactory", "State", "StateChangeReturn"):
                getattr(Gst, name)
            _GST = Gst
    return _GST


# Frames (and latents) a queue holds: enough to cover a video-mode chunk (4 frames) while the
# decoder runs ahead, little enough to keep host and device memory bounded.
QUEUE_FRAMES = 8
# Each ClipEncoder's pipeline gets a name of its own (precompute0, precompute1, ...): logs and
# LATENT_TRACE lines (pipeline/element) then tell the pipelines of one process apart.
_PIPELINE_NUMBERS = itertools.count()


class PipelineError(RuntimeError):
    """The first ERROR a pipeline posted, with its debug string."""


@dataclass
class ClipResult:
    path: str  # relative path of the clip (the job's key)
    output: str = ""
    frames: int = 0  # video frames encoded
    latent_frames: int = 0
    started: float = 0.0  # time.time() when the clip started
    seconds: float = 0.0  # set_state(PLAYING) to back at NULL
    decoder: str = ""  # the decoder decodebin picked (its factory name)
    frames_memory: str = ""  # "CUDAMemory" or "SystemMemory": what vaeencode received
    error: str = ""  # empty on success
    # Where the clip's time went (seconds; 0 where a phase was not reached): from the start to the
    # first latent vaeencode pushed (demuxer and decoder start, negotiation, the stage's plan and
    # first chunk), from there to EOS (the stream), and the pipeline's return to NULL; and within
    # the first, from the start to the first frame vaeencode received (demuxer and decoder), and
    # to decodebin's video pad (the stream typed, demuxed and parsed, the decoder made and its
    # output caps known: what is left to the first frame is the decoder's start and first frame).
    pad_added_s: float = 0.0
    first_frame_s: float = 0.0
    first_latent_s: float = 0.0
    stream_s: float = 0.0
    teardown_s: float = 0.0
    # Prerolled (the precompute job's --preroll): from the start to PLAYING, the clip prerolled
    # and waiting for a free streaming slot (0 without).
    preroll_s: float = 0.0


def _bus_error(msg) -> str:
    err, debug = msg.parse_error()
    src = msg.src.get_name() if msg.src else "pipeline"
    text = f"{src}: {err.message}"
    if debug:
        text += f" ({debug})"
    return text


def _wait(pipeline, timeout_s: float) -> str:
    """Waits for EOS or ERROR; returns the error text ('' at EOS)."""
    Gst = gst()
    bus = pipeline.get_bus()
    timeout = int(timeout_s * Gst.SECOND) if timeout_s > 0 else Gst.CLOCK_TIME_NONE
    msg = bus.timed_pop_filtered(timeout, Gst.MessageType.EOS | Gst.MessageType.ERROR)
    if msg is None:
        return f"timed out after {timeout_s:g} s"
    if msg.type == Gst.MessageType.ERROR:
        return _bus_error(msg)
    return ""


def gst_started() -> bool:
    """Whether gst() has initialised GStreamer in this process (and so may have started CUDA)."""
    return _GST is not None


def decoder_in(bin_) -> str:
    """The factory name of the first video or image decoder inside `bin_` (e.g. the one decodebin
    picked), "" for none. Ask before the bin goes to NULL: decodebin drops its children then."""
    it = bin_.iterate_recurse()
    while True:
        ok, el = it.next()
        if ok != gst().IteratorResult.OK:
            return ""
        factory = el.get_factory()
        klass = (factory.get_metadata("klass") or "") if factory else ""
        if "Decoder" in klass and ("Video" in klass or "Image" in klass):
            return factory.get_name()  # (not an audio track's decoder)


def decoder_factories(caps) -> list:
    """The decoders that may take a parsed stream of `caps`, in the order decodebin tries them
    (rank, then name; the templates only intersect: a decoder must still accept the caps)."""
    Gst = gst()
    factories = Gst.ElementFactory.list_get_elements(
        Gst.ELEMENT_FACTORY_TYPE_DECODER | Gst.ELEMENT_FACTORY_TYPE_MEDIA_VIDEO |
        Gst.ELEMENT_FACTORY_TYPE_MEDIA_IMAGE, Gst.Rank.MARGINAL)
    factories = Gst.ElementFactory.list_filter(factories, caps, Gst.PadDirection.SINK, False)
    factories.sort(key=lambda f: (-f.get_rank(), f.get_name()))
    return factories


# The streams whose first-choice decoder's plugin is loaded with the model: otherwise the plugin
# loads with the first decoder a process makes, and loading nvcodec (it probes every GPU's
# decoders) kept the job's first clip from its first frame for ~1.4 s on an H200 (session 30).
PRELOAD_CAPS = ("video/x-h264, stream-format=(string)byte-stream, alignment=(string)au",
                "video/x-h265, stream-format=(string)byte-stream, alignment=(string)au")


def preload_decoders() -> threading.Thread:
    """Loads, in a thread of its own, the plugin of the decoder each of PRELOAD_CAPS would get
    (decoder_factories' first); returns the thread. A plugin that does not load is left to
    fail where the decoder is made, as it would have without this."""
    Gst = gst()

    def load():
        for text in PRELOAD_CAPS:
            try:
                for factory in decoder_factories(Gst.Caps.from_string(text))[:1]:
                    factory.load()
            except Exception:  # noqa: BLE001 (the clip that needs the decoder reports it)
                pass

    thread = threading.Thread(target=load, name="preload-decoders", daemon=True)
    thread.start()
    return thread


def _set_from_string(el, factory: str, name: str, text: str) -> None:
    """Sets a property from its gst-launch spelling (numbers, booleans, enums). A value that does
    not parse or is out of range raises PipelineError naming it: GLib and
    gst_util_set_object_arg only log a warning and keep the old value."""
    Gst = gst()
    spec = el.find_property(name)
    where = f"{factory} property '{name}'"
    lo, hi = getattr(spec, "minimum", None), getattr(spec, "maximum", None)
    if lo is not None and hi is not None:
        try:
            value = int(text, 0) if isinstance(lo, int) else float(text)
        except ValueError:
            raise PipelineError(f"{where}: '{text}' is not a number") from None
        if not lo <= value <= hi:  # NaN included
            raise PipelineError(f"{where}: {text} is outside [{lo}, {hi}]")
        el.set_property(name, value)
        return
    try:
        parsed, _ = Gst.Structure.from_string(f"p, v=({spec.value_type.name}){text}")
    except TypeError:  # PyGObject raises for the NULL of a value that does not parse
        parsed = None
    if parsed is None:
        choices = ""
        values = getattr(type(spec.default_value), "__enum_values__", None)
        if values:
            choices = " (one of " + ", ".join(e.value_nick for e in values.values()) + ")"
        raise PipelineError(f"{where}: '{text}' is not a valid value{choices}")
    Gst.util_set_object_arg(el, name, text)  # parsed like gst-launch


class ClipEncoder:
    """Encodes clips to latent files, one after another, with one loaded model."""

    def __init__(self, model: str = "", device: str = "auto", dtype: str = "",
                 clip_timeout: float = 0.0, extra_encoder_props: dict | None = None,
                 latent_caps: str = "", hold_model: bool = True, keep_decoders: bool = True):
        """`extra_encoder_props`: more vaeencode properties, values as gst-launch strings;
        `latent_caps`: caps between vaeencode and latentsink (e.g. "application/x-latent" for
        system memory; empty: what they negotiate, CUDA memory on a GPU); `hold_model`: load
        the model now and keep it loaded until close() (False for the second and later
        encoders of a process, which share the instance the first one holds); `keep_decoders`:
        keep the decoder from clip to clip (see the module's notes) instead of decodebin's."""
        Gst = gst()
        self.timeout = clip_timeout
        props = {"model": model, "device": device}
        if dtype:
            props["dtype"] = dtype
        props.update(extra_encoder_props or {})
        self.extra = dict(extra_encoder_props or {})
        self.model = model

        # The model holder: started once, never fed (none for an encoder that shares another's).
        # The likely decoders' plugins load first (preload_decoders): GStreamer loads one plugin
        # at a time, so the model's load (its vaeencode made) waits for nvcodec's. Started after
        # this pipeline's elements instead, the two overlapped, but the first clip then waited for
        # nvcodec and the pipelines' staggered starts with it: 82.9-83.6 frames/s against
        # 83.7-84.7 (H200, session 30).
        self._holder = None
        self.preloading = None
        if hold_model:
            self.preloading = preload_decoders()
            self._holder = Gst.Pipeline.new("model-holder")
            self._holder.add(self._make("vaeencode", "holder", props))
            if self._holder.set_state(Gst.State.PAUSED) == Gst.StateChangeReturn.FAILURE:
                msg = self._holder.get_bus().pop_filtered(Gst.MessageType.ERROR)
                text = _bus_error(msg) if msg else "vaeencode could not start"
                self._holder.set_state(Gst.State.NULL)
                raise PipelineError(f"loading model '{model or 'default'}' on {device}: {text}")

        self._pipeline = Gst.Pipeline.new(f"precompute{next(_PIPELINE_NUMBERS)}")
        self._src = self._make("filesrc", "src", {})
        # parsebin (demuxer and parsers, made anew for every clip) and the kept decoders; or
        # decodebin, which makes its decoder anew for every clip
        self.keep_decoders = keep_decoders
        self._decode = self._make("parsebin" if keep_decoders else "decodebin", "decode", {})
        self._decoders: dict[str, object] = {}  # factory name -> kept decoder (locked in PLAYING)
        self._decoder = None  # the current clip's
        # (kept decoder, straight to vaeencode) whose links down to vaeencode were left in place
        # after the last clip: a relink would send the decoder a RECONFIGURE, and its new ALLOCATION
        # query would swap its frame pool (for nvh264dec: 10 CUDA frames freed and allocated).
        self._kept_path = None
        # Bounded by frames only (a 720p frame is 1.4-3.7 MB; time is meaningless for a file).
        bounded = {"max-size-buffers": QUEUE_FRAMES, "max-size-bytes": 0, "max-size-time": 0}
        self._frames = self._make("queue", "frames", bounded)
        self._convert = self._make("videoconvert", "convert", {})
        self._encode = self._make("vaeencode", "encode", props)
        self._latents = self._make("queue", "latents", bounded)
        self._sink = self._make("latentsink", "sink", {"model": model or "default"})
        for el in (self._src, self._decode, self._frames, self._convert, self._encode,
                   self._latents, self._sink):
            self._pipeline.add(el)
        if latent_caps:
            caps = Gst.Caps.from_string(latent_caps)
            if caps is None:
                raise PipelineError(f"invalid latent caps '{latent_caps}'")
            linked = self._encode.link_filtered(self._latents, caps)
        else:
            linked = self._encode.link(self._latents)
        if not (linked and self._latents.link(self._sink) and self._src.link(self._decode)):
            raise PipelineError(f"cannot link filesrc ! {self._decode.get_factory().get_name()}, "
                                "vaeencode ! queue ! latentsink")
        self._link_error = ""
        self._video_linked = False
        self._decode.connect("pad-added", self._on_pad_added)
        self._decode.connect("no-more-pads", self._on_no_more_pads)
        self._streams: list[str] = []  # the current clip's streams (caps names), as exposed
        self._said_no_video = False
        # When the current clip's first frame entered vaeencode and its first latent left it
        # (one-shot probes on its pads, added for each clip), and the event to set at the latter.
        self._first = {}
        self._first_event = None
        self._prerolled = False

    def _probe_first(self, pad_name: str):
        """One-shot probe: when the clip's first buffer passes vaeencode's `pad_name` pad; on the
        src pad it also sets the current clip's first-latent event (run())."""
        Gst = gst()
        self._first.pop(pad_name, None)

        def once(pad, info):
            self._first.setdefault(pad_name, time.monotonic())
            event = self._first_event if pad_name == "src" else None
            if event is not None:
                event.set()
            return Gst.PadProbeReturn.REMOVE

        self._encode.get_static_pad(pad_name).add_probe(Gst.PadProbeType.BUFFER, once)

    @staticmethod
    def _make(factory: str, name: str, props: dict):
        Gst = gst()
        el = Gst.ElementFactory.make(factory, name)
        if el is None:
            raise PipelineError(
                f"GStreamer element '{factory}' not found (is the latent plugin on GST_PLUGIN_PATH?)")
        for k, v in props.items():
            if el.find_property(k) is None:
                raise PipelineError(f"{factory} has no property '{k}' (see gst-inspect-1.0 {factory})")
            if isinstance(v, str) and el.find_property(k).value_type.name != "gchararray":
                _set_from_string(el, factory, k, v)
            else:
                el.set_property(k, v)
        return el

    def _on_pad_added(self, decodebin, pad):
        self._first.setdefault("pad", time.monotonic())
        # An exception here would leave the pad unlinked and the clip waiting: fail the clip.
        try:
            caps = pad.get_current_caps() or pad.query_caps(None)
            if caps is not None and not caps.is_empty():
                self._streams.append(caps.get_structure(0).get_name())
            self._link_decoded(pad)
            if not pad.is_linked():
                # A stream not encoded (audio, a second video, one with no decoder): its buffers
                # are dropped. parsebin exposes every pad before any buffer flows (and, unlike
                # decodebin, signals no no-more-pads), so the first one arriving here with no video
                # linked means the clip has none to encode.
                Gst = gst()

                def unlinked(_pad, _info):
                    self._fail_without_video(decodebin)
                    return Gst.PadProbeReturn.DROP

                pad.add_probe(Gst.PadProbeType.BUFFER | Gst.PadProbeType.BUFFER_LIST, unlinked)
        except Exception as e:  # noqa: BLE001 (anything PyGObject raises)
            self._link_error = f"linking the decoded stream failed: {e}"
            self._fail(decodebin, self._link_error)

    def _on_no_more_pads(self, decodebin):
        """decodebin has exposed every stream: without a video stream linked the clip fails now
        (parsebin does not signal it; the first buffer of an unlinked stream tells instead)."""
        self._fail_without_video(decodebin)

    def _fail_without_video(self, element) -> None:
        """Fails the clip (once) when no video stream is linked, saying why: the link error, else
        its streams."""
        if self._video_linked or self._said_no_video:
            return
        self._said_no_video = True
        self._fail(element, self._link_error or
                   f"no video stream (its streams: {', '.join(self._streams) or 'none'})")

    @staticmethod
    def _fail(element, text: str) -> None:
        """Posts an ERROR for the clip from `element` (the run waits for it on the bus)."""
        Gst = gst()
        from gi.repository import GLib

        err = GLib.Error.new_literal(Gst.core_error_quark(), text, int(Gst.CoreError.NEGOTIATION))
        element.post_message(Gst.Message.new_error(element, err, ""))

    def _link_decoded(self, pad):
        """Links a pad of decodebin (decoded frames) or parsebin (a parsed stream, which goes
        through a kept decoder first; raw video goes on as it is) to vaeencode."""
        Gst = gst()
        caps = pad.get_current_caps() or pad.query_caps(None)
        if caps is None or caps.is_empty():
            return
        name = caps.get_structure(0).get_name()
        if not (name.startswith("video/") or (self.keep_decoders and name.startswith("image/"))):
            return  # audio and other streams stay unlinked
        if self._video_linked:
            return  # a second video stream: the first one is encoded
        encode_sink = self._encode.get_static_pad("sink")
        frames_sink = self._frames.get_static_pad("sink")
        frames_src = self._frames.get_static_pad("src")
        where = self._decode.get_factory().get_name()
        if not self.keep_decoders:
            # Straight to vaeencode when it takes what the decoder gives (its current caps once
            # it has them; a decoder that can give CUDA memory then renegotiates to it).
            direct = caps.can_intersect(encode_sink.query_caps(None))
            out = pad
        elif name == "video/x-raw":
            direct, out = False, pad  # no decoder; videoconvert passes through what fits
        else:
            decoder = self._kept_decoder(caps)
            if decoder is None:
                self._link_error = f"no decoder for {caps.to_string()}"
                return
            if pad.link(decoder.get_static_pad("sink")) != Gst.PadLinkReturn.OK:
                self._link_error = f"cannot link {caps.to_string()} from parsebin to {decoder.get_name()}"
                return
            self._decoder = decoder
            direct, out = self._gpu_frames(decoder, caps), decoder.get_static_pad("src")
            if self._kept_path == (decoder, direct) and out.get_peer() == frames_sink:
                self._video_linked = True  # the last clip's links, still in place
                return
        self._unlink_path()
        if direct and frames_src.link(encode_sink) == Gst.PadLinkReturn.OK:
            pass
        elif not (self._frames.link(self._convert) and self._convert.link(self._encode)):
            self._link_error = f"cannot link {caps.to_string()} from {where} to vaeencode"
            return
        if out.link(frames_sink) == Gst.PadLinkReturn.OK:
            self._video_linked = True
            if self._decoder is not None:
                self._kept_path = (self._decoder, direct)
        else:
            self._link_error = f"cannot link {caps.to_string()} from {where} to vaeencode"

    def _kept_decoder(self, caps):
        """The decoder for a parsed stream of `caps`: a kept one that accepts them (flushed of the
        last clip), else the highest-ranked decoder that starts (as decodebin picks), then kept.
        None when none does."""
        Gst = gst()
        for decoder in self._decoders.values():
            if self._accepts(decoder, caps):
                return decoder  # (flushed of the last clip by prepare())
        for factory in decoder_factories(caps):
            if factory.get_name() in self._decoders:
                continue  # kept, and refused these caps
            decoder = factory.create(None)
            # The templates only intersect; the decoder itself must take the caps (decodebin's
            # check too: vp8alphadecodebin takes only VP8 with codec-alpha=true)
            if decoder is None or not self._accepts(decoder, caps):
                continue
            decoder.set_locked_state(True)  # not taken to NULL with each clip's pipeline
            self._pipeline.add(decoder)
            if decoder.set_state(Gst.State.PLAYING) == Gst.StateChangeReturn.FAILURE:
                self._drop_decoder(decoder)
                continue
            self._decoders[factory.get_name()] = decoder
            return decoder
        return None

    @staticmethod
    def _accepts(decoder, caps) -> bool:
        """Whether `decoder` takes a stream of `caps`: its ACCEPT_CAPS answer for fixed caps (the
        query is defined for those only), else its sink template's."""
        sink = decoder.get_static_pad("sink")
        if caps.is_fixed():
            return sink.query_accept_caps(caps)
        return caps.can_intersect(sink.get_pad_template_caps())

    def _flush_decoders(self) -> None:
        """Flushes the kept decoders of the last clip (its EOS and anything else it left), with
        the pipeline at NULL: the flush goes no further than the decoders' own pads."""
        Gst = gst()
        for decoder in self._decoders.values():
            sink = decoder.get_static_pad("sink")
            sink.send_event(Gst.Event.new_flush_start())
            sink.send_event(Gst.Event.new_flush_stop(True))

    def _unlink_path(self) -> None:
        """Unlinks the frames' way into vaeencode (a kept decoder's src to the queue, the queue to
        videoconvert or vaeencode, videoconvert to vaeencode)."""
        self._unlink_sinks((self._frames, self._encode, self._convert))
        self._kept_path = None

    @staticmethod
    def _unlink_sinks(elements) -> None:
        """Unlinks each element's sink pad from its peer, where it has one."""
        for el in elements:
            sink = el.get_static_pad("sink")
            peer = sink.get_peer()
            if peer is not None:
                peer.unlink(sink)

    def _drop_decoder(self, decoder) -> None:
        Gst = gst()
        if self._kept_path is not None and self._kept_path[0] is decoder:
            self._unlink_path()
        decoder.set_state(Gst.State.NULL)
        self._decoders = {k: d for k, d in self._decoders.items() if d is not decoder}
        if decoder.get_parent() is self._pipeline:
            self._pipeline.remove(decoder)

    @staticmethod
    def _gpu_frames(decoder, caps) -> bool:
        """Whether `decoder` hands this stream to vaeencode directly: it can give frames in CUDA
        memory and the stream is 8-bit 4:2:0 (NV12 then; what the parsers say of other streams
        goes through videoconvert, as do software decoders' frames)."""
        src = decoder.get_static_pad("src").query_caps(None)
        if not any(src.get_features(i).contains("memory:CUDAMemory") for i in range(src.get_size())):
            return False
        st = caps.get_structure(0)
        ok, depth = st.get_uint("bit-depth-luma")
        if ok and depth != 8:
            return False
        chroma = st.get_string("chroma-format")
        return chroma in (None, "4:2:0")

    def _unlink_last_clip(self):
        """Undoes the last clip's links: the kept decoders' sinks (parsebin's pads go at NULL, as do
        decodebin's). The way from a kept decoder down to vaeencode stays linked (`_kept_path`)
        until a clip needs another one. The kept decoders are flushed."""
        self._unlink_sinks(self._decoders.values())
        if self._kept_path is None:
            self._unlink_path()
        self._flush_decoders()
        self._video_linked = False
        self._decoder = None

    def encode(self, clip: str, output: str, source: str, first_latent=None) -> ClipResult:
        """Encodes `clip` into `output` (its folder must exist); `source` is recorded in the file.
        `first_latent` (a threading.Event) is set when the first latent leaves vaeencode, or when
        the clip ends without one.

        Never raises for a bad clip: the error is in the result.
        """
        self.prepare(clip, output, source, preroll=False)
        try:
            self.run(first_latent)
        finally:
            res = self.finish()  # back to NULL whatever run() met
        return res

    def prepare(self, clip: str, output: str, source: str, preroll: bool = True) -> None:
        """Sets the pipeline up for `clip`. With `preroll` it goes to PAUSED: the demuxer and the
        decoder start, frames reach vaeencode and its first latents reach latentsink, which holds
        the first until run() (the latents' queue holds one more meanwhile, so a prerolled clip
        takes little of the GPU from the clips streaming). Never raises for a bad clip: a failure
        is the result's error (run() then returns at once)."""
        Gst = gst()
        self._res = res = ClipResult(path=source, output=output)
        res.started = time.time()
        self._t0 = time.monotonic()
        self._t_play = self._t_end = None
        self._src.set_property("location", clip)
        self._sink.set_property("location", output)
        self._sink.set_property("source", source)
        self._link_error = ""
        self._streams = []
        self._said_no_video = False
        self._unlink_last_clip()
        self._first.pop("pad", None)
        self._first_event = None
        self._probe_first("sink")
        self._probe_first("src")
        self._failed_start = False
        self._prerolled = preroll
        self._latents.set_property("max-size-buffers", 1 if preroll else QUEUE_FRAMES)
        if preroll and self._pipeline.set_state(Gst.State.PAUSED) == Gst.StateChangeReturn.FAILURE:
            self._failed_start = True

    def run(self, first_latent=None) -> None:
        """Streams the prepared clip to its EOS (or error). `first_latent` as for encode()."""
        Gst = gst()
        res = self._res
        self._first_event = first_latent
        if self._first.get("src") is not None and first_latent is not None:
            first_latent.set()  # (prerolled: the first latent left vaeencode already)
        try:
            self._latents.set_property("max-size-buffers", QUEUE_FRAMES)
            self._t_play = time.monotonic()
            if self._failed_start or \
                    self._pipeline.set_state(Gst.State.PLAYING) == Gst.StateChangeReturn.FAILURE:
                msg = self._pipeline.get_bus().pop_filtered(Gst.MessageType.ERROR)
                res.error = _bus_error(msg) if msg else "the pipeline could not start"
            else:
                res.error = _wait(self._pipeline, self.timeout)
            self._t_end = time.monotonic()
            if self._link_error and res.error and not res.error.startswith(self._link_error):
                res.error = f"{self._link_error}: {res.error}"
            elif res.error and not self._video_linked and self._streams and \
                    "no video stream" not in res.error:
                res.error = f"no video stream (its streams: {', '.join(self._streams)}): {res.error}"
            res.decoder = self._decoder.get_factory().get_name() if self._decoder is not None \
                else decoder_in(self._decode)
            caps = self._encode.get_static_pad("sink").get_current_caps()
            if caps is not None and not caps.is_empty():
                features = caps.get_features(0)
                res.frames_memory = "CUDAMemory" if features and features.contains("memory:CUDAMemory") \
                    else "SystemMemory"
        finally:
            if first_latent is not None:
                first_latent.set()  # no latent came: whoever waits for one need not wait more

    def finish(self) -> ClipResult:
        """Takes the pipeline back to NULL and returns the clip's result (its file read back)."""
        from gst_latent.latentfile import LatentFileError, read_header

        Gst = gst()
        res, t0, t_end = self._res, self._t0, self._t_end
        if res.error and self._decoder is not None:
            self._drop_decoder(self._decoder)  # a clip that failed may have left it in any state
            self._decoder = None
        self._pipeline.set_state(Gst.State.NULL)
        self._pipeline.get_bus().set_flushing(True)  # drop what is left of this clip
        self._pipeline.get_bus().set_flushing(False)
        t_null = time.monotonic()
        res.seconds = t_null - t0
        t_play = self._t_play if self._t_play is not None else t0
        res.preroll_s = t_play - t0 if self._prerolled else 0.0
        if "pad" in self._first:
            res.pad_added_s = self._first["pad"] - t0
        if "sink" in self._first:
            res.first_frame_s = self._first["sink"] - t0
        first = self._first.get("src")
        if first is not None:
            # A prerolled clip streams from its start (its first latent came before).
            first = max(first, t_play)
            res.first_latent_s = first - t0
            if t_end is not None:
                res.stream_s = max(t_end - first, 0.0)
        if t_end is not None:
            res.teardown_s = t_null - t_end
        if not res.error:
            try:
                _, meta = read_header(res.output)
                res.frames = meta["frame_count"]
                res.latent_frames = meta["latent_frames"]
            except (LatentFileError, OSError, KeyError) as e:
                res.error = f"latentsink reported success but {res.output} does not read back: {e}"
        return res

    def close(self):
        Gst = gst()
        self._pipeline.set_state(Gst.State.NULL)
        for decoder in list(self._decoders.values()):
            self._drop_decoder(decoder)
        if self._holder is not None:
            self._holder.set_state(Gst.State.NULL)


def plugin_env(root: str | None = None) -> dict:
    """GST_PLUGIN_PATH for a build tree (`root`/build/plugin) when it exists and none is set."""
    env = {}
    if not (os.environ.get("GST_PLUGIN_PATH") or os.environ.get("GST_PLUGIN_PATH_1_0")) and root:
        plugin = os.path.join(root, "build", "plugin")
        if os.path.isdir(plugin):
            env["GST_PLUGIN_PATH"] = plugin
    return env
