"""Frame readers: the blocking, single-threaded decoders behind a Source.

A reader is opened by an *opener* (a zero-argument callable that returns an open reader or
raises ``SourceError``), then read from one thread until ``read()`` returns None (end of
stream). The threading, flow control and reconnection live in ``pipeline.sources.source``; readers
only decode.
"""

from __future__ import annotations

import glob
import logging
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Protocol

import av
import cv2
import numpy as np

from sapiens2_client.timing import time_base_for_fps

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
NETWORK_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")


class SourceError(RuntimeError):
    """A source cannot be opened or read; the message says what is wrong and what to do."""


class SourceEnded(Exception):
    """Raised by ``Source.read`` once a finite source (file, images, demo) has delivered its last frame."""


@dataclass
class RawFrame:
    """One decoded picture before the Source stamps it into a Frame.

    image: (H, W, 3) uint8 RGB; pts in units of time_base (None when the reader has no clock).
    """

    image: np.ndarray
    pts: int | None
    time_base: Fraction | None


class FrameReader(Protocol):
    """What a Source needs from a decoder. ``read`` blocks; returns None at end of stream.

    Optional: ``frame_count`` (frames in a file, None when unknown) and ``decode_errors``."""

    fps: float | None
    time_base: Fraction | None

    def read(self) -> RawFrame | None: ...

    def close(self) -> None: ...


class PyAVReader:
    """Decodes the first video stream of anything FFmpeg opens: files, URLs, capture devices.

    Frames are turned as the stream's display matrix says (a phone clip shot upright is delivered
    upright, with its displayed width and height). A packet that does not decode (corrupt data in
    the middle of a file, a damaged network packet) is skipped and counted in ``decode_errors``,
    and decoding goes on with the next one, as FFmpeg does; only ``max_consecutive_errors`` bad
    packets in a row end the stream with an error.

    ``timeout`` is PyAV's (open_s, read_s) interrupt timeout; it is best effort, which is why
    live Sources also run a watchdog.
    """

    def __init__(
        self,
        url: str,
        *,
        label: str,
        format: str | None = None,
        options: dict[str, str] | None = None,
        timeout: tuple[float, float] | None = None,
        check_length: bool = False,
        hint: str = "check the URL and that the stream is up",
        max_consecutive_errors: int = 100,
    ) -> None:
        self.label, self._hint = label, hint
        self._check_length = check_length
        self._max_errors = max_consecutive_errors
        try:
            self._container = av.open(url, format=format, options=options or {}, timeout=timeout)
        except FileNotFoundError as exc:
            raise SourceError(f"{label}: not found ({exc}); check the path or URL") from exc
        except av.error.FFmpegError as exc:
            raise SourceError(f"{label}: cannot open ({exc}); {hint}") from exc
        if not self._container.streams.video:
            self._container.close()
            raise SourceError(f"{label}: contains no video stream; pass a video file, camera or stream URL")
        stream = self._container.streams.video[0]
        stream.thread_type = "AUTO"
        self._stream = stream
        self.time_base: Fraction | None = stream.time_base
        rate = stream.average_rate or stream.guessed_rate
        self.fps: float | None = float(rate) if rate else None
        self.frame_count: int | None = int(stream.frames) or None
        self.duration_s = self._declared_duration()
        self.decode_errors = 0
        self._decoded = 0
        self._last_pts: int | None = None
        self._packets = self._container.demux(stream)
        self._ready: list[av.VideoFrame] = []

    def read(self) -> RawFrame | None:
        frame = self._next_frame()
        if frame is None:
            expected = self.frame_count or 0
            # A skipped packet loses a frame or two; many more missing frames mean the file was cut short.
            if self._check_length and expected and expected - self._decoded > 1 + 2 * self.decode_errors:
                raise SourceError(
                    f"{self.label}: ended after {self._decoded} of {expected} frames; the file is "
                    "truncated or corrupt — re-export or re-download it"
                )
            if self._check_length and not expected:
                self._check_duration()
            if self.decode_errors:
                log.warning("%s: %d packet(s) did not decode and were skipped (%d frames delivered)", self.label,
                            self.decode_errors, self._decoded)
            return None
        self._decoded += 1
        if frame.pts is not None:
            self._last_pts = frame.pts if self._last_pts is None else max(self._last_pts, frame.pts)
        image = frame.to_ndarray(format="rgb24")
        turns = round((frame.rotation or 0) / 90) % 4  # counter-clockwise quarter turns for display
        if turns:
            image = np.ascontiguousarray(np.rot90(image, turns))
        return RawFrame(image, frame.pts, frame.time_base or self.time_base)

    def _declared_duration(self) -> float | None:
        """Seconds of video the file says it holds: the stream's own duration, or the container's
        when the video is its only stream (with audio, the container's may be the audio's)."""
        stream = self._stream
        if stream.duration and stream.time_base:
            return float(stream.duration * stream.time_base)
        if self._container.duration and len(self._container.streams) == 1:
            return self._container.duration / 1_000_000  # AV_TIME_BASE
        return None

    def _check_duration(self) -> None:
        """For files that state no frame count (Matroska, WebM, MPEG-TS): SourceError when the video
        decoded ends well before the duration the file declares (cut short, or unreadable after damage)."""
        if not self.duration_s or self._last_pts is None or not self.time_base or not self.fps:
            return
        start = self._stream.start_time or 0
        reached = float((self._last_pts - start) * self.time_base) + 1.0 / self.fps
        slack = max(1.0, 0.05 * self.duration_s) + 2 * self.decode_errors / self.fps
        if self.duration_s - reached > slack:
            raise SourceError(f"{self.label}: ended after {self._decoded} frames, {reached:.1f} s of the "
                              f"{self.duration_s:.1f} s it declares; the file is truncated or corrupt — re-export "
                              "or re-download it")

    def _next_frame(self) -> av.VideoFrame | None:
        """The next decoded frame, skipping packets that do not decode; None at the end."""
        consecutive = 0
        while not self._ready:
            try:
                packet = next(self._packets)
            except StopIteration:
                return None
            except av.error.FFmpegError as exc:  # the container itself cannot be read on
                raise SourceError(f"{self.label}: reading failed after {self._decoded} frames ({exc}); "
                                  f"{self._hint}") from exc
            try:
                self._ready = list(packet.decode())
                consecutive = 0
            except av.error.FFmpegError as exc:
                self.decode_errors += 1
                consecutive += 1
                log.debug("%s: skipped a packet that does not decode: %s", self.label, exc)
                if consecutive >= self._max_errors:
                    raise SourceError(f"{self.label}: {consecutive} packets in a row do not decode ({exc}); "
                                      f"{self._hint}") from exc
        return self._ready.pop(0)

    def close(self) -> None:
        container, self._container = getattr(self, "_container", None), None
        if container is not None:
            try:
                container.close()
            except av.error.FFmpegError as exc:  # closing a broken stream must not mask the real error
                log.debug("%s: error while closing: %s", self.label, exc)


def open_file(path: str, *, label: str | None = None) -> PyAVReader:
    """Open a video file; missing, unreadable, truncated or corrupt files raise SourceError."""
    p = Path(path)
    label = label or f"video file {path!r}"
    if not p.exists():
        raise SourceError(f"{label}: no such file; check the path (use --source demo for the built-in clip)")
    if not p.is_file():
        raise SourceError(f"{label}: not a regular file")
    if p.stat().st_size == 0:
        raise SourceError(f"{label}: file is empty; re-export or re-download it")
    hint = "the file is truncated, corrupt or not a video; re-export or re-download it"
    return PyAVReader(str(p), label=label, check_length=True, hint=hint)


class LoopingReader:
    """A video file played over and over (``loop:PATH``): a camera that never ends, for fleets, soak
    runs and demos. Timestamps keep rising across the restarts (each pass is offset by the length of
    the ones before), so recordings and subscribers see one continuous stream."""

    def __init__(self, path: str, *, label: str) -> None:
        self.path, self.label = path, label
        self._reader = open_file(path, label=label)
        self.fps, self.time_base = self._reader.fps, self._reader.time_base
        self.frame_count: int | None = None  # endless
        self.passes = 1
        self._offset = 0  # added to the pts of the current pass, in units of time_base
        self._end = 0  # pts just after the last frame delivered

    @property
    def decode_errors(self) -> int:
        return self._reader.decode_errors

    def read(self) -> RawFrame | None:
        raw = self._reader.read()
        if raw is None:
            self._reader.close()
            self._reader = open_file(self.path, label=self.label)
            self.passes += 1
            self._offset = self._end
            raw = self._reader.read()
            if raw is None:
                raise SourceError(f"{self.label}: no frame on pass {self.passes}; the file changed or is empty")
        if raw.pts is None or self.time_base is None or raw.time_base != self.time_base:
            return raw
        pts = raw.pts + self._offset
        step = round(1 / (self.fps * self.time_base)) if self.fps else 1
        self._end = max(self._end, pts + max(1, step))
        return RawFrame(raw.image, pts, raw.time_base)

    def close(self) -> None:
        self._reader.close()


def open_network(url: str, *, open_timeout_s: float = 10.0, read_timeout_s: float = 5.0) -> PyAVReader:
    """Open a network stream with low-delay demuxing (rtsp over TCP, no input buffering)."""
    options = {"fflags": "nobuffer", "flags": "low_delay", "max_delay": "500000"}
    if url.startswith(("rtsp://", "rtsps://")):
        options["rtsp_transport"] = "tcp"
        options["timeout"] = str(int(read_timeout_s * 1e6))  # socket timeout, microseconds
    elif url.startswith(("http://", "https://", "tcp://", "rtmp://")):
        options["rw_timeout"] = str(int(read_timeout_s * 1e6))
    return PyAVReader(url, label=f"stream {url}", options=options, timeout=(open_timeout_s, read_timeout_s))


def open_camera(device: str, *, width: int | None = None, height: int | None = None,
                fps: float | None = None, open_timeout_s: float = 10.0) -> PyAVReader:
    """Open a V4L2 capture device such as /dev/video0."""
    label = f"camera {device}"
    if not Path(device).exists():
        raise SourceError(
            f"{label}: no such device; connect a camera or list cameras with `v4l2-ctl --list-devices` "
            "(or use --source demo)"
        )
    if "v4l2" not in av.formats_available:
        raise SourceError(f"{label}: this FFmpeg build has no v4l2 input; install PyAV with v4l2 support")
    options: dict[str, str] = {}
    if width and height:
        options["video_size"] = f"{width}x{height}"
    if fps:
        options["framerate"] = str(fps)
    return PyAVReader(device, label=label, format="v4l2", options=options, timeout=(open_timeout_s, 5.0))


class ImageReader:
    """A sorted list of still images, one frame each; pts counts frames at ``fps``."""

    def __init__(self, paths: list[Path], *, label: str, fps: float = 30.0) -> None:
        if not paths:
            raise SourceError(f"{label}: no images found (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
        self.label = label
        self._paths = list(paths)
        self.frame_count: int | None = len(self._paths)
        self.decode_errors = 0
        self.fps: float | None = fps
        self.time_base: Fraction | None = time_base_for_fps(fps)
        self._next = 0

    def read(self) -> RawFrame | None:
        if self._next >= len(self._paths):
            return None
        path = self._paths[self._next]
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if bgr is None:
            raise SourceError(f"{self.label}: cannot decode image {str(path)!r}; it is corrupt or not an image")
        pts = self._next
        self._next += 1
        return RawFrame(np.ascontiguousarray(bgr[:, :, ::-1]), pts, self.time_base)

    def close(self) -> None:
        self._next = len(self._paths)


def image_paths(spec: str) -> list[Path]:
    """Images named by a file, a folder (non-recursive) or a glob pattern, sorted by name."""
    p = Path(spec)
    if p.is_dir():
        return sorted(q for q in p.iterdir() if q.suffix.lower() in IMAGE_SUFFIXES and q.is_file())
    if any(ch in spec for ch in "*?["):
        return sorted(Path(q) for q in glob.glob(spec) if Path(q).suffix.lower() in IMAGE_SUFFIXES)
    return [p]
