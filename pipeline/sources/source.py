"""Frame sources: a decode thread per source, flow control, and a watchdog that reopens.

``open_source(spec)`` turns a ``--source`` string into an opened ``Source``. Two policies:

* ordered (files, images, ``demo``): every frame, in order, through a bounded queue; the decode
  thread blocks on a full queue (checking the stop event), so nothing is dropped.
* live (cameras, network streams, and files/demo with ``realtime=True``): a 1-slot mailbox; the
  decode thread never blocks, the newest frame replaces an unread one, and each replacement is a drop.

Cameras and network streams also get a watchdog: after ``stall_timeout_s`` without a frame (or an
error or end) the reader is reopened with exponential backoff while ``read`` returns None; each change
is queued as an event with its wall-clock time (``stalled``, ``reconnecting``, ``resumed``;
``poll_events``). A reopened stream starts a new session (``Frame.session``); its pts continue after the
old ones, the outage included, in the first session's time base: pts never go backwards across a reconnect.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator

from pipeline.cli.sourcespecs import VIDEO_SUFFIXES
from pipeline.sources.demo import DemoReader
from pipeline.sources.flow import Channel, Pacer, Terminal, open_with_timeout
from pipeline.sources.readers import (
    IMAGE_SUFFIXES,
    NETWORK_SCHEMES,
    FrameReader,
    ImageReader,
    LoopingReader,
    RawFrame,
    SourceEnded,
    SourceError,
    image_paths,
    open_camera,
    open_file,
    open_network,
)
from stages.types import Frame, StreamInfo

log = logging.getLogger(__name__)

__all__ = ["Source", "SourceEnded", "SourceError", "open_source"]

Opener = Callable[[], FrameReader]
_JOIN_TIMEOUT_S = 2.0


class Source:
    """A started decode thread delivering Frames; see the module docstring for the policies.

    ``read(timeout)`` returns the next Frame, None if none arrived within ``timeout`` seconds
    (also during a reconnect), raises ``SourceEnded`` after the last frame of a finite source
    (and on every later call), and raises ``SourceError`` when the source failed for good.
    Frame indices count decoded frames, so gaps show drops.
    """

    def __init__(
        self,
        opener: Opener,
        *,
        label: str,
        source_id: str = "src",
        live: bool = False,
        pace: bool = False,
        reconnect: bool = False,
        stall_timeout_s: float = 5.0,
        open_timeout_s: float = 15.0,
        queue_size: int = 8,
        backoff_initial_s: float = 0.25,
        backoff_max_s: float = 10.0,
    ) -> None:
        if stall_timeout_s <= 0 or open_timeout_s <= 0 or queue_size < 1:
            raise ValueError("stall_timeout_s and open_timeout_s must be > 0 and queue_size >= 1")
        self.label, self.source_id = label, source_id
        self.live, self.pace, self.reconnect = live, pace, reconnect
        self.stall_timeout_s, self.open_timeout_s = stall_timeout_s, open_timeout_s
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._opener = opener
        self._channel = Channel(queue_size, latest_wins=live)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending: tuple[FrameReader, RawFrame] | None = None
        self._info: StreamInfo | None = None
        self._frames_decoded = self._frames_dropped = self._frames_delivered = self._reopens = 0
        self._health = "starting"
        self._last_frame = time.monotonic()  # watchdog: last frame, or the start of the current session
        self._last_delivery = self._last_frame  # monotonic time of the last frame delivered
        self._events: deque[dict[str, Any]] = deque(maxlen=1000)
        self._frame_count: int | None = None
        self._errors_before = 0  # decode errors of sessions before the current one
        self._reader: FrameReader | None = None
        # Timestamps across sessions: the pts that the current session's first frame maps to.
        self._pts_offset: int | None = 0
        self._last_pts: int | None = None
        self._outage_started: tuple[int, float] | None = None  # (time_ns, monotonic) when frames stopped

    # -- counters -------------------------------------------------------------------------
    @property
    def frames_decoded(self) -> int:
        return self._frames_decoded

    @property
    def frames_dropped(self) -> int:
        """Frames decoded but replaced before anyone read them (live policy only)."""
        return self._frames_dropped

    @property
    def frames_delivered(self) -> int:
        return self._frames_delivered

    @property
    def reopens(self) -> int:
        """Successful reopens after a stall, error or end of a live stream."""
        return self._reopens

    @property
    def health(self) -> str:
        """One of: starting, ok, stalled, reconnecting, ended, failed."""
        return self._health

    @property
    def frame_count(self) -> int | None:
        """Frames in a file (for a progress bar), None when unknown or live."""
        return self._frame_count

    @property
    def decode_errors(self) -> int:
        """Packets that did not decode and were skipped, over all sessions."""
        reader = self._reader
        return self._errors_before + int(getattr(reader, "decode_errors", 0) or 0)

    def mark_random_weights(self) -> None:
        """Say in the stream's facts that its results come from random weights (sinks label them)."""
        self._info = replace(self.info, random_weights=True)

    def poll_events(self) -> list[dict[str, Any]]:
        """Health changes since the last call, oldest first: ``{"event", "source_id", "time_ns", ...}``."""
        out = []
        while self._events:
            out.append(self._events.popleft())
        return out

    def _emit(self, event: str, **extra: Any) -> None:
        self._events.append({"event": event, "source_id": self.source_id, "time_ns": time.time_ns(),
                             "session": self._reopens, **extra})

    @property
    def info(self) -> StreamInfo:
        if self._info is None:
            self.open()
        assert self._info is not None
        return self._info

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> StreamInfo:
        """Open the reader and decode its first frame (bounded by open_timeout_s); idempotent."""
        if self._info is None:
            reader, first = self._open_reader()
            self._pending = (reader, first)
            self._reader = reader
            count = getattr(reader, "frame_count", None)
            self._frame_count = None if self.live or not count else int(count)
            self._info = StreamInfo(
                source_id=self.source_id,
                width=first.image.shape[1],
                height=first.image.shape[0],
                fps=reader.fps,
                time_base=reader.time_base,
                live=self.live,
            )
            self._health = "ok"
        return self._info

    def start(self) -> Source:
        """Open if needed and start the decode thread; idempotent."""
        if self._thread is None:
            self.open()
            assert self._pending is not None
            reader, first = self._pending
            self._pending = None
            target = self._supervise if self.reconnect else self._decode
            thread = threading.Thread(target=target, args=(reader, first), name=f"source-{self.source_id}",
                                      daemon=True)
            thread.start()  # (kept only once started: a Ctrl-C or SIGTERM inside start() leaves none to join)
            self._thread = thread
        return self

    def stop(self) -> None:
        """Stop decoding and release the reader; safe to call repeatedly and before start."""
        self._stop.set()
        if self._pending is not None:
            self._pending[0].close()
            self._pending = None
        if self._thread is not None:
            self._thread.join(timeout=_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("%s: decode thread still busy after %.1f s; abandoning it", self.label, _JOIN_TIMEOUT_S)
        self._channel.finish(Terminal(None))
        if self._health != "failed":
            self._health = "ended"

    def __enter__(self) -> Source:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def read(self, timeout: float) -> Frame | None:
        """Next frame, or None after ``timeout`` s; raises SourceEnded / SourceError (see class doc)."""
        if self._thread is None and not self._stop.is_set():
            self.start()
        item = self._channel.get(timeout)
        if item is None:
            return None
        if isinstance(item, Terminal):
            if item.error is not None:
                raise item.error
            raise SourceEnded(f"{self.label}: end of stream")
        with self._lock:
            item.skipped_before = item.index - self._frames_delivered  # every earlier index: delivered or replaced
            self._frames_delivered += 1
        return item

    def __iter__(self) -> Iterator[Frame]:
        """Every frame until the source ends or is stopped (waits through reconnects)."""
        while True:
            try:
                frame = self.read(timeout=0.5)
            except SourceEnded:
                return
            if frame is not None:
                yield frame

    # -- threads --------------------------------------------------------------------------
    def _open_reader(self) -> tuple[FrameReader, RawFrame]:
        return open_with_timeout(self._opener, label=self.label, timeout_s=self.open_timeout_s, stop=self._stop)

    def _deliver(self, item: RawFrame, abort: threading.Event) -> None:
        with self._lock:
            if abort.is_set():
                return  # a stale session after a reopen; its frames are not ours any more
            index, session = self._frames_decoded, self._reopens
            self._frames_decoded += 1
            now = time.monotonic()
            pts, time_base = self._continuous_pts(item, now)
            self._last_frame = self._last_delivery = now
            if self._health in ("stalled", "reconnecting", "starting"):
                if self._health != "starting":
                    started = self._outage_started
                    outage = None if started is None else round(now - started[1], 3)
                    self._emit("resumed", outage_s=outage, first_frame=index)
                self._health = "ok"
            self._outage_started = None
        frame = Frame(index, item.image, pts, time_base, time.time_ns(), self.source_id, session, live=self.live)
        if self._channel.put(frame, lambda: abort.is_set() or self._stop.is_set()):
            with self._lock:
                self._frames_dropped += 1

    def _continuous_pts(self, item: RawFrame, now: float) -> tuple[int | None, Fraction | None]:
        """pts in the first session's time base, continuing after the last one across a reopen
        (the outage as a gap); the reader's own pts within a session. Caller holds the lock."""
        out_tb = self._info.time_base if self._info is not None and self._info.time_base else item.time_base
        if item.pts is None or item.time_base is None or out_tb is None:
            return item.pts, item.time_base
        pts = item.pts if item.time_base == out_tb else round(item.pts * item.time_base / out_tb)
        if self._pts_offset is None:  # first frame of a new session
            gap_s = max(now - self._last_delivery, 1e-3)
            step = max(1, round(Fraction(gap_s).limit_denominator(10**6) / out_tb))
            self._pts_offset = (self._last_pts + step - pts) if self._last_pts is not None else 0
        pts += self._pts_offset
        if self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1  # a stream that restarts its clock mid-session: stay monotonic
        self._last_pts = pts
        return pts, out_tb

    def _pump(self, reader: FrameReader, first: RawFrame, abort: threading.Event) -> None:
        """Read until end of stream or abort; raises SourceError."""
        pacer = Pacer(reader.fps) if self.pace else None
        item: RawFrame | None = first
        while item is not None and not abort.is_set() and not self._stop.is_set():
            if pacer is not None and not pacer.wait(item, self._stop):
                return
            self._deliver(item, abort)
            item = reader.read()

    def _decode(self, reader: FrameReader, first: RawFrame) -> None:
        """Thread body for sources without reconnect: run to the end, then post the terminal."""
        error: SourceError | None = None
        try:
            self._pump(reader, first, self._stop)
        except SourceError as exc:
            error = exc
        except Exception as exc:  # keep one clear error for the consumer instead of a dead thread
            log.debug("%s: decoder crashed", self.label, exc_info=True)  # the consumer reports it
            error = SourceError(f"{self.label}: decoder crashed ({exc!r})")
        finally:
            reader.close()
        self._health = "failed" if error else "ended"
        if error is not None:
            log.debug("%s", error)  # raised to the consumer by read(); the CLI prints it once
        self._channel.finish(Terminal(error))

    def _supervise(self, reader: FrameReader, first: RawFrame) -> None:
        """Thread body for live sources: run sessions, reopen on stall/error/end with backoff."""
        backoff = self.backoff_initial_s
        while not self._stop.is_set():
            decoded_before = self._frames_decoded
            self._reader = reader
            session = _Session(self, reader, first)
            reason = self._watch(session)
            session.abort()
            if reason is None:
                break
            with self._lock:
                if self._outage_started is None:
                    self._outage_started = (time.time_ns(), self._last_delivery)
                self._errors_before += int(getattr(reader, "decode_errors", 0) or 0)
                self._reader = None
                self._health = "reconnecting"
                self._emit("reconnecting", reason=reason)
            log.warning("%s: %s; reopening", self.label, reason)
            if self._frames_decoded > decoded_before:
                backoff = self.backoff_initial_s
            opened = self._reopen(backoff)
            if opened is None:
                break
            (reader, first), backoff = opened
        self._channel.finish(Terminal(None))

    def _watch(self, session: _Session) -> str | None:
        """Wait until the session ends or stalls (returns why) or we are stopped (None)."""
        poll = min(0.05, self.stall_timeout_s / 4)
        while not self._stop.is_set():
            if session.done.wait(poll):
                return session.reason
            if time.monotonic() - self._last_frame > self.stall_timeout_s:
                with self._lock:
                    self._health = "stalled"
                    silent = time.monotonic() - self._last_delivery
                    self._outage_started = (time.time_ns() - int(silent * 1e9), self._last_delivery)
                    self._emit("stalled", last_frame=self._frames_decoded - 1, silent_s=self.stall_timeout_s)
                return f"no frame for {self.stall_timeout_s:.1f} s (stalled)"
        return None

    def _reopen(self, backoff: float) -> tuple[tuple[FrameReader, RawFrame], float] | None:
        while not self._stop.wait(backoff):
            backoff = min(backoff * 2, self.backoff_max_s)
            try:
                opened = self._open_reader()
            except SourceError as exc:
                log.warning("%s: reopen failed (%s); retrying in %.2f s", self.label, exc, backoff)
                continue
            with self._lock:
                self._reopens += 1
                self._pts_offset = None  # the new session's first frame sets it
            log.info("%s: reopened (reopen #%d)", self.label, self._reopens)
            return opened, backoff
        return None


class _Session:
    """One open reader being pumped on its own thread; abandoned (not joined) when it stalls."""

    def __init__(self, source: Source, reader: FrameReader, first: RawFrame) -> None:
        self.reader = reader
        self.done = threading.Event()
        self.reason = "end of stream"
        self._abort = threading.Event()
        self._source = source
        source._last_frame = time.monotonic()
        threading.Thread(target=self._run, args=(first,), name=f"session-{source.source_id}", daemon=True).start()

    def _run(self, first: RawFrame) -> None:
        try:
            self._source._pump(self.reader, first, self._abort)
        except SourceError as exc:
            self.reason = str(exc)
        except Exception as exc:  # reported to the supervisor, which reopens
            log.exception("%s: reader crashed", self._source.label)
            self.reason = f"reader crashed ({exc!r})"
        finally:
            self.reader.close()
            self.done.set()

    def abort(self) -> None:
        self._abort.set()
        interrupt = getattr(self.reader, "interrupt", None)
        if callable(interrupt):
            interrupt()


def id_from_name(name: str) -> str:
    """A source id from a file name: runs of other characters than letters, digits, '_' and '-' become '_'."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "src"


def open_source(
    spec: str,
    *,
    realtime: bool = False,
    stall_timeout_s: float = 5.0,
    source_id: str | None = None,
    open_timeout_s: float = 15.0,
    queue_size: int = 8,
    image_fps: float = 30.0,
    camera_size: tuple[int, int] | None = None,
    camera_fps: float | None = None,
    backoff_max_s: float = 10.0,
) -> Source:
    """Open a source named by ``spec`` and decode its first frame; raises SourceError.

    Specs: ``demo``; ``webcam`` / ``webcam:N`` / ``/dev/videoN``; rtsp/http(s)/udp/tcp URLs;
    a video file; ``loop:FILE`` (a video file played over and over, endless); an image file; a folder
    or glob of images. ``realtime`` paces files, images and the demo at their frame rate under the
    live (newest-wins) policy.
    """
    spec = spec.strip()
    live, reconnect = realtime, False
    opener: Opener
    if spec == "demo":
        opener, label, default_id = DemoReader, "demo clip", "demo"
    elif spec == "webcam" or spec.startswith(("webcam:", "/dev/video")):
        match = re.fullmatch(r"webcam(?::(\d+))?|/dev/video(\d+)", spec)
        if match is None:
            raise SourceError(f"bad camera spec {spec!r}; use webcam, webcam:N or /dev/videoN")
        number = match.group(1) or match.group(2) or "0"
        device = f"/dev/video{number}"
        w, h = camera_size or (None, None)
        opener = lambda: open_camera(device, width=w, height=h, fps=camera_fps, open_timeout_s=open_timeout_s)  # noqa: E731
        label, default_id, live, reconnect = f"camera {device}", f"cam{number}", True, True
    elif spec.startswith("loop:"):
        path = spec[len("loop:"):]
        label = f"looping file {path!r}"
        opener = lambda: LoopingReader(path, label=label)  # noqa: E731
        default_id = id_from_name(Path(path).stem)
    elif spec.lower().startswith(NETWORK_SCHEMES):
        # The watchdog owns the stall timeout (a hung camera is "stalled", then reopened); the socket's
        # own read timeout is a backstop a little later, which frees the abandoned session's thread.
        read_timeout_s = stall_timeout_s + max(1.0, stall_timeout_s / 2)
        opener = lambda: open_network(spec, open_timeout_s=open_timeout_s, read_timeout_s=read_timeout_s)  # noqa: E731
        label, default_id, live, reconnect = f"stream {spec}", "stream", True, True
    elif Path(spec).is_dir() or any(ch in spec for ch in "*?[") or Path(spec).suffix.lower() in IMAGE_SUFFIXES:
        paths = image_paths(spec)
        if len(paths) == 1 and not paths[0].is_file():
            raise SourceError(f"image {spec!r}: no such file; check the path")
        videos = [] if paths or not Path(spec).is_dir() else \
            sorted(p.name for p in Path(spec).iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
        if videos:  # a folder of videos is an archive: every video once is what batch does
            raise SourceError(f"folder {spec!r} holds videos ({len(videos)}: {', '.join(videos[:3])}"
                              f"{', ...' if len(videos) > 3 else ''}) and no images; run every video of it with "
                              f"`sapiens2-stream batch {spec} --out DIR`, or give --source one video")
        label = f"images {spec!r}"
        opener = lambda: ImageReader(paths, label=label, fps=image_fps)  # noqa: E731
        default_id = id_from_name(Path(spec).stem) if len(paths) == 1 else "images"
    else:
        label = f"video file {spec!r}"
        opener = lambda: open_file(spec, label=label)  # noqa: E731
        default_id = id_from_name(Path(spec).stem)
    source = Source(
        opener,
        label=label,
        source_id=source_id or default_id,
        live=live,
        pace=realtime and not reconnect,
        reconnect=reconnect,
        stall_timeout_s=stall_timeout_s,
        open_timeout_s=open_timeout_s,
        queue_size=queue_size,
        backoff_max_s=backoff_max_s,
    )
    source.open()
    log.info("opened %s: %dx%d, fps=%s, live=%s", label, source.info.width, source.info.height,
             source.info.fps, live)
    return source
