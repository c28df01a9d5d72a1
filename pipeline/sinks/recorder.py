"""Record annotated frames to a video file (a Sink), crash-safe (see ``sapiens2_client.video``).

Timestamps come from the frames themselves, never from a frame counter, so a recording stays
in sync with reality when frames were dropped: files use the frame's pts/time_base, live
sources the wall-clock capture time. Encoding runs on a thread of its own (libx264 takes ~8 ms
per 1080p frame, which the sink thread has no time for beside annotation and publishing), behind
a queue of two frames. The encoder is always flushed and the file finalised on close; every write
error, the flush included, raises RecorderError (at the next write or at close) so the run fails
loudly.
"""

from __future__ import annotations

import logging
import queue
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np
from sapiens2_client.video import FALLBACKS, RecorderError, VideoWriter

from stages.types import Frame, FrameResult, StreamInfo

log = logging.getLogger(__name__)

__all__ = ["FALLBACKS", "RecorderError", "VideoRecorder"]


class VideoRecorder:
    """Sink that encodes ``result.annotated`` (or the raw frame) into ``path``.

    codec: libx264 (falls back to mpeg4 when missing), h264_nvenc/hevc_nvenc (fall back to
    software), or mpeg4. ``crf`` sets constant quality; ``bitrate`` (bits/s) overrides it.
    ``fps`` is the nominal rate written to the file (defaults to the stream's, else 30).
    ``fragment_s``: at most this much is lost when the process is killed (and the two frames
    waiting for the encoder). ``threaded=False`` encodes on the caller's thread.
    """

    QUEUE = 2  # frames waiting for the encoder thread

    def __init__(self, path: str | Path, *, fps: float | None = None, codec: str = "libx264", crf: int | None = 23,
                 bitrate: int | None = None, preset: str | None = None, fragment_s: float = 1.0,
                 threaded: bool = True) -> None:
        self.path = Path(path)
        self._writer_args = dict(fps=fps, codec=codec, crf=crf, bitrate=bitrate, preset=preset,
                                 fragment_s=fragment_s)
        self._writer = VideoWriter(self.path, **self._writer_args)  # validates the codec
        self._info: StreamInfo | None = None
        self._use_wallclock: bool | None = None
        self.threaded = threaded
        self._queue: queue.Queue[tuple[np.ndarray, Fraction] | None] = queue.Queue(maxsize=self.QUEUE)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # what the encoder thread met, raised on the caller's thread
        self._closed = False

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
        """Queue one frame for the encoder; ValueError for a malformed image, RecorderError when
        encoding failed (this frame or an earlier one)."""
        image = result.annotated if result.annotated is not None else result.frame.image
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or 0 in image.shape:
            raise ValueError(f"recorder: expected a non-empty (H, W, 3) uint8 image, got {image.shape} {image.dtype}")
        frame = result.frame
        if self._use_wallclock is None:
            live = self._info.live if self._info is not None else False
            self._use_wallclock = live or frame.pts is None or frame.time_base is None
            log.debug("recorder %s: timestamps from %s", self.path,
                      "capture clock" if self._use_wallclock else "frame pts")
        if self._closed:
            raise RecorderError(f"recorder {self.path}: write after close")
        if not self.threaded or not self._writer.started:  # the first frame here: a file that cannot be made fails now
            self._writer.write(image, self._media_time(frame))
            return
        self._raise_encoder_error()
        if self._thread is None:
            self._thread = threading.Thread(target=self._encode, name=f"encode-{self.path.name}", daemon=True)
            self._thread.start()
        while True:  # blocks while two frames wait; gives up when the encoder has stopped
            try:
                self._queue.put((image, self._media_time(frame)), timeout=0.2)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    self._raise_encoder_error()
                    raise RecorderError(f"recorder {self.path}: the encoder stopped")

    def close(self) -> None:
        """Encode what is queued, flush and finalise; idempotent. RecorderError when that fails (the
        file keeps what came before)."""
        self._closed = True
        thread, self._thread = self._thread, None
        if thread is not None:
            while thread.is_alive():
                try:
                    self._queue.put(None, timeout=0.2)
                    break
                except queue.Full:
                    continue
            thread.join(timeout=120.0)  # two frames and the encoder's delay: well under a second
            if thread.is_alive():
                raise RecorderError(f"recorder {self.path}: the encoder did not finish within 120 s")
        try:
            self._raise_encoder_error()
        finally:
            self._writer.close()

    def _encode(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._writer.write(*item)
            except BaseException as exc:  # raised on the sink thread at its next write or close
                self._error = exc
                return

    def _raise_encoder_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _media_time(self, frame: Frame) -> Fraction:
        if self._use_wallclock or frame.pts is None or frame.time_base is None:
            return Fraction(frame.capture_ns, 1_000_000_000)
        return frame.pts * frame.time_base

