"""Record annotated frames to a video file (a Sink), crash-safe (see ``sapiens2_client.video``).

Timestamps come from the frames themselves, never from a frame counter, so a recording stays
in sync with reality when frames were dropped: files use the frame's pts/time_base, live
sources the wall-clock capture time. The encoder is always flushed and the file finalised on
close; every write error, the flush included, raises RecorderError so the run fails loudly.
"""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path

from sapiens2_client.video import FALLBACKS, RecorderError, VideoWriter
from stages.types import Frame, FrameResult, StreamInfo

log = logging.getLogger(__name__)

__all__ = ["FALLBACKS", "RecorderError", "VideoRecorder"]


class VideoRecorder:
    """Sink that encodes ``result.annotated`` (or the raw frame) into ``path``.

    codec: libx264 (falls back to mpeg4 when missing), h264_nvenc/hevc_nvenc (fall back to
    software), or mpeg4. ``crf`` sets constant quality; ``bitrate`` (bits/s) overrides it.
    ``fps`` is the nominal rate written to the file (defaults to the stream's, else 30).
    ``fragment_s``: at most this much is lost when the process is killed.
    """

    def __init__(self, path: str | Path, *, fps: float | None = None, codec: str = "libx264", crf: int | None = 23,
                 bitrate: int | None = None, preset: str | None = None, fragment_s: float = 1.0) -> None:
        self.path = Path(path)
        self._writer_args = dict(fps=fps, codec=codec, crf=crf, bitrate=bitrate, preset=preset,
                                 fragment_s=fragment_s)
        self._writer = VideoWriter(self.path, **self._writer_args)  # validates the codec
        self._info: StreamInfo | None = None
        self._use_wallclock: bool | None = None

    @property
    def codec(self) -> str | None:
        return self._writer.codec

    @property
    def frames_written(self) -> int:
        return self._writer.frames_written

    def open(self, info: StreamInfo) -> None:
        """Remember the stream facts; the file itself is created on the first frame."""
        self._info = info
        if self._writer_args["fps"] is None and info.fps:
            self._writer = VideoWriter(self.path, **{**self._writer_args, "fps": info.fps})

    def write(self, result: FrameResult) -> None:
        """Encode one frame; ValueError for a malformed image, RecorderError when encoding fails."""
        image = result.annotated if result.annotated is not None else result.frame.image
        frame = result.frame
        if self._use_wallclock is None:
            live = self._info.live if self._info is not None else False
            self._use_wallclock = live or frame.pts is None or frame.time_base is None
            log.debug("recorder %s: timestamps from %s", self.path,
                      "capture clock" if self._use_wallclock else "frame pts")
        self._writer.write(image, self._media_time(frame))

    def close(self) -> None:
        """Flush and finalise; idempotent. RecorderError when that fails (the file keeps what came before)."""
        self._writer.close()

    def _media_time(self, frame: Frame) -> Fraction:
        if self._use_wallclock or frame.pts is None or frame.time_base is None:
            return Fraction(frame.capture_ns, 1_000_000_000)
        return frame.pts * frame.time_base

