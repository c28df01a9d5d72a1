"""Flow-control primitives shared by sources: a bounded/newest-wins channel, a pacer, a guarded open."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from pipeline.sources.readers import FrameReader, RawFrame, SourceError
from stages.types import Frame

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Terminal:
    """Queued after the last frame: a clean end (error None) or the error that ended the source."""

    error: SourceError | None


class Channel:
    """Bounded frame queue; with ``latest_wins`` a 1-slot mailbox whose put never blocks."""

    def __init__(self, capacity: int, latest_wins: bool) -> None:
        assert capacity >= 1
        self._capacity = 1 if latest_wins else capacity
        self._latest_wins = latest_wins
        self._items: deque[Frame] = deque()
        self._terminal: Terminal | None = None
        self._cond = threading.Condition()

    def put(self, frame: Frame, cancel: Callable[[], bool]) -> bool:
        """Queue ``frame``; True when it replaced an unread frame (a drop)."""
        with self._cond:
            if self._latest_wins:
                dropped = bool(self._items)
                self._items.clear()
                self._items.append(frame)
                self._cond.notify_all()
                return dropped
            while len(self._items) >= self._capacity:
                if cancel():
                    return False
                self._cond.wait(0.1)
            self._items.append(frame)
            self._cond.notify_all()
            return False

    def finish(self, terminal: Terminal) -> None:
        with self._cond:
            if self._terminal is None:
                self._terminal = terminal
            self._cond.notify_all()

    def get(self, timeout: float) -> Frame | Terminal | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if self._terminal is not None:
                    return self._terminal
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            frame = self._items.popleft()
            self._cond.notify_all()
            return frame


class Pacer:
    """Releases frames at their own timestamps (``realtime``), re-anchoring after long hiccups."""

    def __init__(self, fps: float | None) -> None:
        self._period = 1.0 / fps if fps else 1.0 / 30.0
        self._anchor: tuple[float, float] | None = None  # (wall, media seconds)
        self._count = 0

    def wait(self, item: RawFrame, stop: threading.Event) -> bool:
        """Sleep until ``item`` is due; False when stopped meanwhile."""
        if item.pts is not None and item.time_base is not None:
            media = float(item.pts * item.time_base)
        else:
            media = self._count * self._period
        self._count += 1
        now = time.monotonic()
        if self._anchor is None or media < self._anchor[1]:
            self._anchor = (now, media)
        delay = self._anchor[0] + (media - self._anchor[1]) - now
        if delay < -1.0:  # fell far behind (slow decode): restart the clock instead of bursting
            self._anchor = (now, media)
        elif delay > 0:
            return not stop.wait(delay)
        return True


def open_with_timeout(
    opener: Callable[[], FrameReader], *, label: str, timeout_s: float, stop: threading.Event
) -> tuple[FrameReader, RawFrame]:
    """Open a reader and decode its first frame within ``timeout_s``; raises SourceError.

    The work runs on a helper thread so a hung open (PyAV timeouts are best effort) cannot hang
    the caller; an abandoned open closes its reader when it eventually returns.
    """
    box: dict[str, object] = {}
    done = threading.Event()
    guard = threading.Lock()

    def work() -> None:
        try:
            reader = opener()
            with guard:
                box["reader"] = reader
            first = reader.read()
            if first is None:
                reader.close()
                raise SourceError(f"{label}: contains no frames; check the file or stream")
            box["first"] = first
        except SourceError as exc:
            box["error"] = exc
        except Exception as exc:  # an opener bug must surface as one clear error, not a hang
            log.debug("%s: opener raised", label, exc_info=True)
            box["error"] = SourceError(f"{label}: cannot open ({exc!r})")
        with guard:
            done.set()
            if box.get("abandoned") and "first" in box:
                box["reader"].close()  # type: ignore[union-attr]

    threading.Thread(target=work, name="source-open", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not done.wait(0.05):
        if time.monotonic() > deadline or stop.is_set():
            with guard:
                if not done.is_set():
                    box["abandoned"] = True
                    interrupt = getattr(box.get("reader"), "interrupt", None)
                    if callable(interrupt):
                        interrupt()
                    raise SourceError(
                        f"{label}: no frame within {timeout_s:.1f} s of opening; "
                        "check that the camera/stream is delivering frames"
                    )
            break
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["reader"], box["first"]  # type: ignore[return-value]
