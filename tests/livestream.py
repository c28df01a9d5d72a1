"""A live network camera for tests: frames served as H.264 in MPEG-TS over tcp://127.0.0.1:PORT
(a listening socket of ours, PyAV's muxer writing into the accepted connection) at a steady rate,
the picture chosen by a clock several servers can share (their streams then show the same scene at
the same moment, as cameras side by side would), until stopped or the client goes away."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction

import av
import numpy as np


class LiveStream:
    """Serves ``picture(t)`` (an (H, W, 3) uint8 RGB image for the seconds ``t`` since ``t0``) at
    ``fps``, H.264 in MPEG-TS, to one client of ``url`` at a time, each from a fresh encoder (its
    timestamps from 0, as a camera that restarted). ``stall()`` stops sending and keeps the connection
    open, a camera that hangs; ``resume()`` drops that connection and serves the next client (the one
    that reconnected). ``frames`` counts frames sent, ``clients`` connections served."""

    def __init__(self, picture: Callable[[float], np.ndarray], size: tuple[int, int], *, fps: int = 30,
                 t0: float | None = None) -> None:
        self.picture, self.size, self.fps = picture, size, fps
        self.t0 = time.monotonic() if t0 is None else t0
        self._listener = socket.create_server(("127.0.0.1", 0))  # listening now: a client never finds it closed
        self._listener.settimeout(0.2)
        self.url = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self.frames = self.clients = 0
        self.error: BaseException | None = None
        self._stop, self._stalled, self._drop = threading.Event(), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"live-{self.url}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                self.clients += 1
                self._drop.clear()
                with conn:
                    self._stream_to(conn)
        finally:
            self._listener.close()

    def _stream_to(self, conn: socket.socket) -> None:
        try:
            with conn.makefile("wb", buffering=0) as wire, av.open(wire, mode="w", format="mpegts") as out:
                stream = out.add_stream("libx264", rate=self.fps)
                stream.width, stream.height = self.size
                stream.pix_fmt = "yuv420p"
                stream.codec_context.time_base = Fraction(1, self.fps)
                stream.codec_context.gop_size = self.fps  # a key frame a second, as cameras send: a client joins fast
                stream.options = {"preset": "ultrafast", "tune": "zerolatency", "crf": "10"}
                start, sent = time.monotonic(), 0
                while not self._stop.is_set() and not self._drop.is_set():
                    if self._stalled.is_set():  # (the connection stays open, silent, until resume() drops it)
                        self._stop.wait(0.05)
                        continue
                    wait = start + sent / self.fps - time.monotonic()
                    if wait > 0:
                        self._stop.wait(wait)
                    frame = av.VideoFrame.from_ndarray(self.picture(time.monotonic() - self.t0), format="rgb24")
                    frame.pts = sent  # from 0 on each connection
                    for packet in stream.encode(frame):
                        out.mux(packet)
                    sent += 1
                    self.frames += 1
        except (OSError, ValueError, av.error.FFmpegError) as exc:  # the client went away: the camera unplugged
            if not (self._stop.is_set() or self._drop.is_set()):
                self.error = exc

    def stall(self) -> None:
        self._stalled.set()

    def resume(self) -> None:
        self._drop.set()
        self._stalled.clear()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> LiveStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cycling(images: Sequence[np.ndarray], hold_s: float) -> Callable[[float], np.ndarray]:
    """A picture function showing each of ``images`` for ``hold_s`` seconds, over and over."""
    return lambda t: images[int(t / hold_s) % len(images)]
