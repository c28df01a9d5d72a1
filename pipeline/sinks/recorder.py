"""Record annotated frames to a video file (a Sink).

Timestamps come from the frames themselves, never from a frame counter, so a recording stays
in sync with reality when frames were dropped: files use the frame's pts/time_base, live
sources the wall-clock capture time. Output pts are strictly increasing in the stream's
time_base. The encoder is always flushed and the container closed, even after an error.
"""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np

from sapiens2_client.timing import time_base_for_fps
from stages.types import Frame, FrameResult, StreamInfo

log = logging.getLogger(__name__)

# Encoders tried, in order, when the requested one is missing or cannot open here.
_FALLBACKS = {
    "h264_nvenc": ("h264_nvenc", "libx264", "mpeg4"),
    "hevc_nvenc": ("hevc_nvenc", "libx264", "mpeg4"),
    "libx264": ("libx264", "mpeg4"),
    "h264": ("libx264", "mpeg4"),
    "mpeg4": ("mpeg4",),
}
_MPEG4_TIME_BASE = Fraction(1, 30000)  # MPEG-4 Part 2 caps the time base denominator at 65535
_FINE_TIME_BASE = Fraction(1, 90000)


class RecorderError(RuntimeError):
    """The recording cannot be created or written; the message says what to do."""


def _probe_encoder(name: str, width: int, height: int, time_base: Fraction) -> bool:
    """True when ``name`` exists in this FFmpeg build and its encoder opens at this size."""
    try:
        ctx = av.CodecContext.create(name, "w")
        ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = width, height, "yuv420p", time_base
        ctx.open()
    except (av.error.FFmpegError, ValueError) as exc:
        log.debug("encoder %s unavailable: %s", name, exc)
        return False
    return True


class VideoRecorder:
    """Sink that encodes ``result.annotated`` (or the raw frame) into ``path``.

    codec: libx264 (falls back to mpeg4 when missing), h264_nvenc/hevc_nvenc (fall back to
    software), or mpeg4. ``crf`` sets constant quality; ``bitrate`` (bits/s) overrides it.
    ``fps`` is the nominal rate written to the file (defaults to the stream's, else 30).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fps: float | None = None,
        codec: str = "libx264",
        crf: int | None = 23,
        bitrate: int | None = None,
        preset: str | None = None,
    ) -> None:
        if codec not in _FALLBACKS:
            raise RecorderError(f"unknown codec {codec!r}; choose one of {sorted(_FALLBACKS)}")
        self.path = Path(path)
        self.fps, self.requested_codec, self.crf, self.bitrate, self.preset = fps, codec, crf, bitrate, preset
        self.codec: str | None = None  # the encoder actually used, known after the first frame
        self.frames_written = 0
        self._info: StreamInfo | None = None
        self._container: av.container.OutputContainer | None = None
        self._stream: av.video.stream.VideoStream | None = None
        self._size: tuple[int, int] | None = None  # (width, height) of the content before padding
        self._origin: Fraction | None = None  # media time (s) that maps to output pts 0
        self._use_wallclock: bool | None = None
        self._last_pts = -1
        self._closed = False

    def open(self, info: StreamInfo) -> None:
        """Remember the stream facts; the file itself is created on the first frame."""
        self._info = info

    def write(self, result: FrameResult) -> None:
        """Encode one frame; ValueError for a malformed image, RecorderError when encoding fails."""
        if self._closed:
            raise RecorderError(f"recorder {self.path}: write after close")
        image = result.annotated if result.annotated is not None else result.frame.image
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or 0 in image.shape:
            raise ValueError(f"recorder: expected a non-empty (H, W, 3) uint8 image, got {image.shape} {image.dtype}")
        if self._container is None:
            self._start(image, result.frame)
        assert self._stream is not None and self._container is not None and self._size is not None
        if (image.shape[1], image.shape[0]) != self._size:
            image = cv2.resize(image, self._size, interpolation=cv2.INTER_AREA)
        video_frame = av.VideoFrame.from_ndarray(_even(np.ascontiguousarray(image)), format="rgb24")
        video_frame.pts = self._pts_for(result.frame)
        video_frame.time_base = self._stream.codec_context.time_base
        try:
            for packet in self._stream.encode(video_frame):
                self._container.mux(packet)
        except av.error.FFmpegError as exc:
            raise RecorderError(f"recorder {self.path}: encoding failed ({exc}); check disk space") from exc
        self.frames_written += 1

    def close(self) -> None:
        """Flush the encoder and finalise the file; idempotent and safe after errors."""
        if self._closed:
            return
        self._closed = True
        container, stream = self._container, self._stream
        self._container = self._stream = None
        if container is None:
            log.warning("recorder %s: no frames were written; no file created", self.path)
            return
        try:
            assert stream is not None
            for packet in stream.encode(None):
                container.mux(packet)
        except av.error.FFmpegError as exc:
            log.error("recorder %s: flushing the encoder failed: %s", self.path, exc)
        finally:
            container.close()
        log.info("recorder %s: %d frames (%s)", self.path, self.frames_written, self.codec)

    # -- internals ------------------------------------------------------------------------
    def _start(self, image: np.ndarray, frame: Frame) -> None:
        height, width = image.shape[:2]
        out_w, out_h = width + width % 2, height + height % 2
        fps = self.fps or (self._info.fps if self._info and self._info.fps else None) or 30.0
        rate = 1 / time_base_for_fps(fps)
        codec = None
        for name in _FALLBACKS[self.requested_codec]:
            tb = _MPEG4_TIME_BASE if name == "mpeg4" else _FINE_TIME_BASE
            if _probe_encoder(name, out_w, out_h, tb):
                codec, time_base = name, tb
                break
        if codec is None:
            raise RecorderError(f"recorder {self.path}: no usable encoder among {_FALLBACKS[self.requested_codec]}")
        if codec != self.requested_codec and not (self.requested_codec == "h264" and codec == "libx264"):
            log.warning("recorder: encoder %s unavailable here; using %s", self.requested_codec, codec)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            container = av.open(str(self.path), "w")
        except (av.error.FFmpegError, ValueError) as exc:
            raise RecorderError(
                f"recorder {self.path}: cannot create the file ({exc}); use a .mp4/.mkv/.mov path "
                "in a writable folder"
            ) from exc
        try:
            stream = container.add_stream(codec, rate=rate, options=self._options(codec))
            stream.width, stream.height, stream.pix_fmt = out_w, out_h, "yuv420p"
            stream.codec_context.time_base = time_base
            if self.bitrate:
                stream.bit_rate = int(self.bitrate)
            elif codec == "mpeg4":
                stream.bit_rate = int(out_w * out_h * float(rate) * 0.2)  # mpeg4 has no crf
        except (av.error.FFmpegError, ValueError) as exc:
            container.close()
            raise RecorderError(f"recorder {self.path}: cannot set up {codec} ({exc})") from exc
        self._container, self._stream, self.codec, self._size = container, stream, codec, (width, height)
        live = self._info.live if self._info is not None else False
        self._use_wallclock = live or frame.pts is None or frame.time_base is None
        log.info("recorder %s: %dx%d %s, timestamps from %s", self.path, out_w, out_h, codec,
                 "capture clock" if self._use_wallclock else "frame pts")

    def _options(self, codec: str) -> dict[str, str]:
        options: dict[str, str] = {}
        if codec == "libx264":
            options["preset"] = self.preset or "veryfast"
            if self.crf is not None and not self.bitrate:
                options["crf"] = str(self.crf)
        elif codec.endswith("_nvenc"):
            options["preset"] = self.preset or "p4"
            if self.crf is not None and not self.bitrate:
                options["rc"], options["cq"] = "vbr", str(self.crf)
        return options

    def _pts_for(self, frame: Frame) -> int:
        """Output pts (stream time_base) from the frame's own clock; strictly increasing."""
        assert self._stream is not None
        if self._use_wallclock or frame.pts is None or frame.time_base is None:
            media = Fraction(frame.capture_ns, 1_000_000_000)
        else:
            media = frame.pts * frame.time_base
        if self._origin is None:
            self._origin = media
        pts = round((media - self._origin) / self._stream.codec_context.time_base)
        pts = max(pts, self._last_pts + 1)  # clock went backwards or collided: keep order, never duplicate
        self._last_pts = pts
        return pts


def _even(image: np.ndarray) -> np.ndarray:
    """Pad to even width/height by repeating the last row/column (yuv420p needs even sizes)."""
    pad_h, pad_w = image.shape[0] % 2, image.shape[1] % 2
    if pad_h or pad_w:
        image = np.pad(image, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return image
