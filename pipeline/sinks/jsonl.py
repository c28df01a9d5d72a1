"""Write per-frame keypoints as JSON Lines (a Sink).

One object per frame, one line each, flushed as written so that a killed process leaves only
complete, parsable lines (at most the last one is lost)::

    {"frame": 12, "pts": 6144, "time_base": "1/15360", "capture_ns": 1712345678901234567,
     "width": 1280, "height": 720, "random_weights": false,
     "persons": [{"id": 3, "box": [x1, y1, x2, y2], "score": 0.91,
                  "keypoints": [[x, y, score], ...]}]}

``id`` is the track id (-1 when untracked); ``keypoints`` is null when pose did not run.
Non-finite numbers are written as null so every line is strict JSON.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import IO, Any

import numpy as np

from stages.types import FrameResult, StreamInfo

log = logging.getLogger(__name__)


class JsonlError(RuntimeError):
    """The JSONL file cannot be created or written; the message says what to do."""


def _finite(value: float, digits: int) -> float | None:
    return round(value, digits) if math.isfinite(value) else None


def _rows(array: np.ndarray, digits: int) -> list[Any]:
    """Nested lists of rounded floats with non-finite values as None."""
    values = np.asarray(array, dtype=np.float64)
    if np.isfinite(values).all():
        return np.round(values, digits).tolist()
    return [[_finite(float(v), digits) for v in row] for row in values.reshape(-1, values.shape[-1])]


def result_to_record(result: FrameResult) -> dict[str, Any]:
    """The JSON-ready dict for one frame (see the module docstring)."""
    frame, det = result.frame, result.detections
    persons = []
    for i in range(len(det)):
        keypoints = None
        if result.keypoints is not None:
            xy_score = np.concatenate([result.keypoints.xy[i], result.keypoints.scores[i][:, None]], axis=1)
            keypoints = _rows(xy_score, 3)  # (K, 3): x, y, score
        persons.append({
            "id": int(det.track_ids[i]),
            "box": _rows(det.boxes[i][None], 2)[0],
            "score": _finite(float(det.scores[i]), 4),
            "keypoints": keypoints,
        })
    time_base = frame.time_base
    return {
        "frame": frame.index,
        "pts": frame.pts,
        "time_base": f"{time_base.numerator}/{time_base.denominator}" if time_base is not None else None,
        "capture_ns": frame.capture_ns,
        "width": frame.width,
        "height": frame.height,
        "random_weights": bool(result.random_weights),
        "persons": persons,
    }


class KeypointWriter:
    """Sink writing one JSON line per frame to ``path``; ``close`` is idempotent."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lines_written = 0
        self._file: IO[str] | None = None
        self._closed = False
        self._random_weights = False

    def open(self, info: StreamInfo) -> None:
        """Create (truncate) the file."""
        self._random_weights = info.random_weights
        self._ensure_open()

    def write(self, result: FrameResult) -> None:
        """Append and flush one line for ``result``."""
        if self._closed:
            raise JsonlError(f"keypoint file {self.path}: write after close")
        handle = self._ensure_open()
        record = result_to_record(result)
        record["random_weights"] = record["random_weights"] or self._random_weights
        try:
            handle.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
            handle.flush()
        except OSError as exc:
            raise JsonlError(f"keypoint file {self.path}: write failed ({exc}); check disk space") from exc
        self.lines_written += 1

    def close(self) -> None:
        """Flush and close; safe to call repeatedly and after errors."""
        self._closed = True
        handle, self._file = self._file, None
        if handle is not None:
            try:
                handle.close()
            except OSError as exc:
                log.error("keypoint file %s: close failed: %s", self.path, exc)

    def _ensure_open(self) -> IO[str]:
        if self._file is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            except OSError as exc:
                raise JsonlError(f"keypoint file {self.path}: cannot create it ({exc}); pick a writable path") from exc
        return self._file
