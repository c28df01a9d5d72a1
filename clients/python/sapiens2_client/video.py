"""Crash-safe video recording with PyAV (``pip install sapiens2-stream-client[video]``).

While recording, the file on disk is always playable up to the last frame written, whatever the
frame rate:

* ``.mp4`` / ``.mov`` are written as fragmented MP4: an empty ``moov``, then one ``moof``+``mdat``
  fragment per frame (about 100 bytes of overhead each), flushed as written, from an encoder that
  holds no frames back (no look-ahead, no B-frames). A SIGKILL or a full disk loses at most the
  frame being written. A fragment need not start at a keyframe to play from the start; keyframes
  come every ``fragment_s`` x 2 seconds of media, for seeking.
* ``.mkv`` closes a Matroska cluster every 0.1 s of media (the muxer writes a cluster out only
  when it closes, so this bounds the loss: about 3 frames at 30 fps, whatever the processing rate),
  flushed as written; keyframes every ``fragment_s`` x 2 seconds of media, for seeking.

On a clean close (end of input, SIGINT, SIGTERM) the encoder is flushed and a fragmented MP4 is
remuxed (packets copied, nothing re-encoded) into a standard MP4 with its index at the front,
written next to it and renamed over it, so a crash during the remux leaves the fragmented file.

Timestamps come from the caller (media seconds), never from a frame counter, so a recording stays
in sync with reality when frames were dropped; output pts are strictly increasing. Every write
error, the flush and the remux included, raises :class:`RecorderError`.
"""

from __future__ import annotations

import logging
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from .paths import unwritable
from .timing import time_base_for_fps

log = logging.getLogger(__name__)

MKV_CLUSTER_S = 0.1  # longest Matroska cluster: what a SIGKILL or a full disk can lose of an .mkv

# Encoders tried, in order, when the requested one is missing or cannot open here.
FALLBACKS = {
    "h264_nvenc": ("h264_nvenc", "libx264", "mpeg4"),
    "hevc_nvenc": ("hevc_nvenc", "libx264", "mpeg4"),
    "libx264": ("libx264", "mpeg4"),
    "h264": ("libx264", "mpeg4"),
    "mpeg4": ("mpeg4",),
}
FRAGMENTED = (".mp4", ".mov", ".m4v")
RECORD_SUFFIXES = (*FRAGMENTED, ".mkv")  # what VideoWriter writes
_MPEG4_TIME_BASE = Fraction(1, 30000)  # MPEG-4 Part 2 caps the time base denominator at 65535
_FINE_TIME_BASE = Fraction(1, 90000)


class RecorderError(RuntimeError):
    """The recording cannot be created or written; the message says what to do."""


def _av():
    try:
        import av
    except ImportError as exc:  # pragma: no cover - the pipeline always has PyAV
        raise RecorderError("recording needs PyAV: pip install 'sapiens2-stream-client[video]'") from exc
    return av


def probe_encoder(name: str, width: int, height: int, rate: Fraction, options: dict[str, str] | None = None,
                  settings: dict[str, Any] | None = None) -> bool:
    """True when ``name`` exists in this FFmpeg build and opens at this size and frame rate, with the
    codec ``options`` and context ``settings`` (time_base, gop_size, bit_rate) the real stream will use.

    The probe always sets the frame rate (a time base of one frame unless ``settings`` name another), as
    hardware encoders (NVENC) need for rate control; a probe without them, or without the stream's own
    options, can pass or fail where the real stream would not.
    """
    av = _av()
    try:
        ctx = av.CodecContext.create(name, "w")
        ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
        ctx.framerate, ctx.time_base = rate, 1 / rate
        ctx.options = dict(options or {})
        for key, value in (settings or {}).items():
            setattr(ctx, key, value)
        ctx.open()
    except (av.error.FFmpegError, ValueError) as exc:
        log.debug("encoder %s unavailable: %s", name, exc)
        return False
    return True


class VideoWriter:
    """Encodes (H, W, 3) uint8 RGB images into ``path`` (see the module docstring).

    codec: libx264 (falls back to mpeg4), h264_nvenc/hevc_nvenc (fall back to software), or mpeg4.
    ``crf`` sets constant quality; ``bitrate`` (bits/s) overrides it. ``fps`` is the nominal rate
    written to the file (default 30). The file is created by the first ``write``; until then
    nothing on disk is touched.
    """

    def __init__(self, path: str | Path, *, fps: float | None = None, codec: str = "libx264", crf: int | None = 23,
                 bitrate: int | None = None, preset: str | None = None, fragment_s: float = 1.0) -> None:
        if codec not in FALLBACKS:
            raise RecorderError(f"unknown codec {codec!r}; choose one of {sorted(FALLBACKS)}")
        if not 0 < fragment_s <= 60:  # a keyframe at least every two minutes of media (NaN refused too)
            raise RecorderError(f"fragment_s must be within (0, 60] seconds, got {fragment_s}")
        self.path = Path(path)
        self.fps, self.requested_codec, self.crf, self.bitrate, self.preset = fps, codec, crf, bitrate, preset
        self.fragment_s = fragment_s
        self.codec: str | None = None  # the encoder actually used, known after the first frame
        self.frames_written = 0
        self._container = None
        self._stream = None
        self._size: tuple[int, int] | None = None  # (width, height) of the content before padding
        self._origin: Fraction | None = None  # media time (s) that maps to output pts 0
        self._last_pts = -1
        self._good_size = 0  # bytes of whole fragments on disk
        self._closed = False

    def check(self) -> None:
        """Fail now, with RecorderError, if the file could not be written later (nothing is left on disk)."""
        if self.path.suffix.lower() not in RECORD_SUFFIXES:
            raise RecorderError(f"recorder {self.path}: cannot write {self.path.suffix or 'a file without a suffix'}; "
                                f"name a {'/'.join(RECORD_SUFFIXES)} file")
        why = unwritable(self.path)
        if why is not None:
            raise RecorderError(f"recorder {self.path}: cannot create the file ({why}); pick a writable path")

    @property
    def started(self) -> bool:
        return self._container is not None

    def write(self, image: np.ndarray, media_s: Fraction) -> None:
        """Encode one frame shown at ``media_s`` seconds; ValueError for a malformed image."""
        av = _av()
        if self._closed:
            raise RecorderError(f"recorder {self.path}: write after close")
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or 0 in image.shape:
            raise ValueError(f"recorder: expected a non-empty (H, W, 3) uint8 image, got {image.shape} {image.dtype}")
        if self._container is None:
            self._start(image)
        assert self._stream is not None and self._size is not None
        frame = av.VideoFrame.from_ndarray(_even(np.ascontiguousarray(image)), format="rgb24")
        if (image.shape[1], image.shape[0]) != self._size:  # the stream changed size: scale to the first one
            frame = frame.reformat(width=self._stream.width, height=self._stream.height)
        frame.pts = self._pts_for(media_s)
        frame.time_base = self._stream.codec_context.time_base
        try:
            packets = self._stream.encode(frame)
        except av.error.FFmpegError as exc:  # the encoder refused a setting the probe accepted
            raise RecorderError(f"recorder {self.path}: the {self.codec} encoder failed ({exc}); try --record-codec "
                                "libx264") from None
        self._mux(packets)
        self.frames_written += 1

    def close(self) -> None:
        """Flush the encoder, finalise the file (remux to a standard MP4); idempotent.

        Raises RecorderError when any of it fails; the file then keeps what was written before."""
        if self._closed:
            return
        self._closed = True
        container, stream = self._container, self._stream
        self._container = self._stream = None
        if container is None:
            log.warning("recorder %s: no frames were written; no file created", self.path)
            return
        error: RecorderError | None = None
        try:
            self._mux_to(container, stream.encode(None))
        except RecorderError as exc:
            error = exc
        finally:
            try:
                container.close()
            except Exception as exc:  # av raises OSError subclasses and FFmpegError for a failing trailer
                error = error or RecorderError(f"recorder {self.path}: finishing the file failed ({exc}); "
                                               "check disk space")
        fragmented = self.path.suffix.lower() in FRAGMENTED
        if error is None and fragmented and whole_fragments_end(self.path) != self.path.stat().st_size:
            # FFmpeg's output layer can lose a failed write without an error: the file itself tells.
            error = RecorderError(f"recorder {self.path}: writing failed (the file ends in a partial fragment); "
                                  "check disk space")
        if error is None and fragmented:
            error = self._remux_standard()
        if error is not None:
            self._cut_back()
            raise error
        log.info("recorder %s: %d frames (%s)", self.path, self.frames_written, self.codec)

    # -- internals ------------------------------------------------------------------------
    def _mux(self, packets) -> None:
        self._mux_to(self._container, packets)

    def _mux_to(self, container, packets) -> None:
        av = _av()
        try:
            for packet in packets:
                container.mux(packet)
        except (av.error.FFmpegError, OSError) as exc:
            self._cut_back()
            raise RecorderError(f"recorder {self.path}: writing failed ({exc}); check disk space and the "
                                "folder") from None
        # With flush_packets, a mux call returns with whole fragments on disk: remember where they end.
        try:
            self._good_size = self.path.stat().st_size
        except OSError:
            pass

    def _cut_back(self) -> None:
        """After a failed write (a full disk), drop a partial fragment so the file ends cleanly: for
        MP4 at the end of its last whole moof+mdat pair, otherwise where the last whole write ended."""
        try:
            size = self.path.stat().st_size
            good = whole_fragments_end(self.path) if self.path.suffix.lower() in FRAGMENTED else self._good_size
            if good and size > good:
                os.truncate(self.path, good)
                log.info("recorder %s: cut a partial fragment off (%d -> %d bytes)", self.path, size, good)
        except OSError as exc:
            log.debug("recorder %s: cannot cut back a partial fragment: %s", self.path, exc)

    def _start(self, image: np.ndarray) -> None:
        av = _av()
        height, width = image.shape[:2]
        out_w, out_h = width + width % 2, height + height % 2
        rate = 1 / time_base_for_fps(self.fps or 30.0)
        codec = next((name for name in FALLBACKS[self.requested_codec]
                      if probe_encoder(name, out_w, out_h, rate, self._options(name),
                                       self._settings(name, out_w, out_h, rate))), None)
        if codec is None:
            raise RecorderError(f"recorder {self.path}: no usable encoder among {FALLBACKS[self.requested_codec]}")
        if codec != self.requested_codec and not (self.requested_codec == "h264" and codec == "libx264"):
            log.warning("recorder: encoder %s unavailable here; using %s", self.requested_codec, codec)
        suffix = self.path.suffix.lower()
        options = {"flush_packets": "1"}
        if suffix in FRAGMENTED:
            options["movflags"] = "frag_every_frame+empty_moov+default_base_moof"
        elif suffix == ".mkv":
            options["cluster_time_limit"] = str(int(min(self.fragment_s, MKV_CLUSTER_S) * 1000))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            container = av.open(str(self.path), "w", options=options)
        except (av.error.FFmpegError, ValueError, OSError) as exc:
            raise RecorderError(
                f"recorder {self.path}: cannot create the file ({exc}); use a .mp4/.mkv/.mov path "
                "in a writable folder"
            ) from exc
        try:
            stream = container.add_stream(codec, rate=rate, options=self._options(codec))
            stream.width, stream.height, stream.pix_fmt = out_w, out_h, "yuv420p"
            stream.codec_context.framerate = rate
            for key, value in self._settings(codec, out_w, out_h, rate).items():
                setattr(stream.codec_context, key, value)
        except (av.error.FFmpegError, ValueError) as exc:
            container.close()
            raise RecorderError(f"recorder {self.path}: cannot set up {codec} ({exc})") from exc
        self._container, self._stream, self.codec, self._size = container, stream, codec, (width, height)
        log.info("recorder %s: %dx%d %s, crash-safe (%s)", self.path, out_w, out_h, codec,
                 "a fragment per frame" if suffix in FRAGMENTED else
                 f"a cluster every {min(self.fragment_s, MKV_CLUSTER_S):g} s of media")

    def _settings(self, codec: str, width: int, height: int, rate: Fraction) -> dict[str, Any]:
        """The encoder context's settings besides size and rate (the probe opens the encoder with them)."""
        settings: dict[str, Any] = {"time_base": _MPEG4_TIME_BASE if codec == "mpeg4" else _FINE_TIME_BASE,
                                    "gop_size": max(1, round(float(rate) * self.fragment_s * 2))}  # for seeking
        if self.bitrate:
            settings["bit_rate"] = int(self.bitrate)
        elif codec == "mpeg4":
            settings["bit_rate"] = int(width * height * float(rate) * 0.2)  # mpeg4 has no crf
        return settings

    def _options(self, codec: str) -> dict[str, str]:
        options: dict[str, str] = {}
        if codec == "libx264":
            options["preset"] = self.preset or "veryfast"
            options["tune"] = "zerolatency"  # no look-ahead or B-frames: every frame reaches the file promptly
            if self.crf is not None and not self.bitrate:
                options["crf"] = str(self.crf)
        elif codec.endswith("_nvenc"):
            options["preset"] = self.preset or "p4"
            options["delay"], options["bf"] = "0", "0"
            if self.crf is not None and not self.bitrate:
                options["rc"], options["cq"] = "vbr", str(self.crf)
        elif codec == "mpeg4":
            options["bf"] = "0"
        return options

    def _pts_for(self, media_s: Fraction) -> int:
        """Output pts (stream time_base) from the caller's clock; strictly increasing."""
        assert self._stream is not None
        if self._origin is None:
            self._origin = media_s
        pts = round((media_s - self._origin) / self._stream.codec_context.time_base)
        pts = max(pts, self._last_pts + 1)  # clock went backwards or collided: keep order, never duplicate
        self._last_pts = pts
        return pts

    def _remux_standard(self) -> RecorderError | None:
        """Fragmented MP4 -> standard MP4 (index first), by packet copy; atomic rename over the original."""
        av = _av()
        tmp = self.path.with_name(f".{self.path.name}.finalising{self.path.suffix}")
        try:
            with av.open(str(self.path)) as src, av.open(str(tmp), "w", options={"movflags": "faststart"}) as dst:
                in_stream = src.streams.video[0]
                out_stream = dst.add_stream_from_template(in_stream)
                for packet in src.demux(in_stream):
                    if packet.dts is None:
                        continue
                    packet.stream = out_stream
                    dst.mux(packet)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except (av.error.FFmpegError, OSError) as exc:
            tmp.unlink(missing_ok=True)
            return RecorderError(f"recorder {self.path}: finalising the MP4 failed ({exc}); the fragmented "
                                 "recording is kept and plays as it is")
        return None


def whole_fragments_end(path: Path) -> int:
    """Byte offset where the whole boxes of a fragmented MP4 end: after the last complete box,
    where a ``moof`` counts only together with the whole ``mdat`` that follows it."""
    good, moof, pos = 0, False, 0
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        while pos + 8 <= size:
            handle.seek(pos)
            head = handle.read(16)
            length, kind = int.from_bytes(head[:4], "big"), head[4:8]
            if length == 1 and len(head) == 16:
                length = int.from_bytes(head[8:16], "big")
            if length < 8 or pos + length > size:
                break  # a box that runs past the end: the partial one
            if kind == b"moof":
                moof = True  # whole only with the mdat after it
            elif not moof or kind == b"mdat":
                good, moof = pos + length, False
            pos += length
    return good


def _even(image: np.ndarray) -> np.ndarray:
    """Pad to even width/height by repeating the last row/column (yuv420p needs even sizes)."""
    pad_h, pad_w = image.shape[0] % 2, image.shape[1] % 2
    if pad_h or pad_w:
        image = np.pad(image, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return image
