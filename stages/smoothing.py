"""One-Euro filtering of keypoint trajectories (Casiez et al., CHI 2012).

The One-Euro filter is a low-pass filter whose cutoff rises with speed: at rest it removes jitter
(cutoff ``min_cutoff`` Hz), when the point moves fast the cutoff grows by ``beta`` per unit of
speed so the filtered point does not lag. Units: coordinates in pixels, time in seconds, so
``beta`` is in Hz per (pixel / second).
"""

from __future__ import annotations

import math

import numpy as np


def _alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
    """Smoothing factor of an exponential filter with the given cutoff (Hz) and step (s)."""
    tau = 1.0 / (2.0 * math.pi * cutoff)
    return 1.0 / (1.0 + tau / dt)


class OneEuroFilter:
    """One-Euro filter over an array of independent values (e.g. (K, 2) keypoint coordinates).

    Every element is filtered separately; the shape is fixed by the first call.
    """

    def __init__(self, min_cutoff: float = 1.0, beta: float = 0.01, d_cutoff: float = 1.0) -> None:
        if min_cutoff <= 0 or d_cutoff <= 0 or beta < 0:
            raise ValueError(
                f"OneEuroFilter: need min_cutoff > 0, d_cutoff > 0, beta >= 0; got {min_cutoff}, {d_cutoff}, {beta}"
            )
        self.min_cutoff, self.beta, self.d_cutoff = min_cutoff, beta, d_cutoff
        self._x: np.ndarray | None = None  # last filtered value
        self._dx: np.ndarray | None = None  # last filtered derivative
        self._t: float | None = None

    def reset(self) -> None:
        """Forget the state; the next value passes through unchanged."""
        self._x, self._dx, self._t = None, None, None

    @property
    def last_time(self) -> float | None:
        """Timestamp (s) of the last value filtered, None before the first."""
        return self._t

    def __call__(self, x: np.ndarray, t: float) -> np.ndarray:
        """Filter one sample ``x`` taken at time ``t`` (seconds); returns the filtered sample."""
        x = np.asarray(x, dtype=np.float64)
        if self._x is None or self._t is None or self._x.shape != x.shape:
            self._x, self._dx, self._t = x.copy(), np.zeros_like(x), float(t)
            return x.astype(np.float32)
        dt = float(t) - self._t
        if dt <= 0:  # repeated or out-of-order timestamp: keep the state, repeat the last output
            return self._x.astype(np.float32)
        assert self._dx is not None
        # Non-finite input (a lost keypoint) would poison the state forever: hold the last value.
        # An element never seen finite yet starts from its first finite value.
        finite = np.isfinite(x)
        fresh = finite & ~np.isfinite(self._x)
        x = np.where(finite, x, self._x)
        with np.errstate(invalid="ignore"):
            dx = (x - self._x) / dt
            dx_hat = self._dx + _alpha(self.d_cutoff, dt) * (dx - self._dx)
            cutoff = self.min_cutoff + self.beta * np.abs(dx_hat)
            x_hat = self._x + _alpha(cutoff, dt) * (x - self._x)
        x_hat = np.where(fresh, x, x_hat)
        dx_hat = np.where(fresh | ~np.isfinite(dx_hat), 0.0, dx_hat)
        self._x, self._dx, self._t = x_hat, dx_hat, float(t)
        return x_hat.astype(np.float32)


class KeypointSmoother:
    """One One-Euro filter per track id, applied to a frame's (N, K, D) keypoints (2D or 3D).

    Persons with track id -1 (untracked) cannot be matched across frames and pass through
    unchanged. A track's state is dropped when it has not been seen for ``max_age_s`` seconds, so
    a returning id starts afresh instead of being pulled towards a stale position.
    """

    def __init__(
        self,
        min_cutoff: float = 1.0,
        beta: float = 0.01,
        d_cutoff: float = 1.0,
        max_age_s: float = 1.0,
    ) -> None:
        OneEuroFilter(min_cutoff, beta, d_cutoff)  # validates the parameters
        self.min_cutoff, self.beta, self.d_cutoff, self.max_age_s = min_cutoff, beta, d_cutoff, max_age_s
        self._filters: dict[int, OneEuroFilter] = {}

    @property
    def track_ids(self) -> list[int]:
        """Ids that currently hold a filter state."""
        return sorted(self._filters)

    def reset(self) -> None:
        """Drop every track's state."""
        self._filters.clear()

    def __call__(self, xy: np.ndarray, track_ids: np.ndarray, timestamp_s: float) -> np.ndarray:
        """Smooth xy (N, K, D) (D = 2 for image keypoints, 3 for 3D ones) of the persons with ids (N,)
        at time ``timestamp_s``; returns (N, K, D). A NaN coordinate holds its track's last value."""
        xy = np.asarray(xy, dtype=np.float32)
        track_ids = np.asarray(track_ids, dtype=np.int64).reshape(-1)
        if xy.ndim != 3 or xy.shape[2] not in (2, 3) or len(track_ids) != len(xy):
            raise ValueError(
                f"KeypointSmoother: expected xy (N, K, 2|3) and ids (N,), got {xy.shape} and {track_ids.shape}"
            )
        out = xy.copy()
        for i, tid in enumerate(track_ids.tolist()):
            if tid < 0:
                continue
            filt = self._filters.get(tid)
            if filt is None:
                filt = self._filters[tid] = OneEuroFilter(self.min_cutoff, self.beta, self.d_cutoff)
            out[i] = filt(xy[i], timestamp_s)
        self._expire(timestamp_s)
        return out

    def _expire(self, now: float) -> None:
        stale = [
            tid
            for tid, filt in self._filters.items()
            if filt.last_time is not None and now - filt.last_time > self.max_age_s
        ]
        for tid in stale:
            del self._filters[tid]
