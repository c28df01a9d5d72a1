"""Clock helpers shared by the pipeline and clients: time bases from frame rates, rate meters."""

from __future__ import annotations

import time
from fractions import Fraction


def time_base_for_fps(fps: float) -> Fraction:
    """The time base of a stream at ``fps`` frames per second (exact for NTSC rates: 30000/1001)."""
    if not fps or fps <= 0:
        raise ValueError(f"frame rate must be positive, got {fps!r}")
    return 1 / Fraction(fps).limit_denominator(1001)


class RateMeter:
    """Events per second: over the whole run (``overall``) and over the last ``window_s`` (``rate``)."""

    def __init__(self, window_s: float = 1.0, clock=time.monotonic) -> None:
        self.window_s = max(window_s, 1e-3)
        self._clock = clock
        self.started = clock()
        self.last = self.started  # the clock at the last tick
        self.total = 0
        self._window = (self.started, 0)  # (start, events) of the window being filled
        self._rate = 0.0  # of the last full window

    def tick(self, n: int = 1) -> None:
        now = self._clock()
        self.last = now
        self.total += n
        start, count = self._window
        count += n
        if now - start >= self.window_s:
            self._rate = count / (now - start)
            start, count = now, 0
        self._window = (start, count)

    @property
    def rate(self) -> float:
        """The last full window's rate; the running one's when the last full window is stale."""
        start, count = self._window
        since = self._clock() - start
        return self._rate if since < 2 * self.window_s else count / since

    @property
    def overall(self) -> float:
        elapsed = self._clock() - self.started
        return self.total / elapsed if elapsed > 0 else 0.0
