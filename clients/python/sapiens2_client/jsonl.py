"""Keypoints as JSON Lines: the record of one frame, and a writer that never leaves a torn line.

One object per frame, one line each (the pipeline's ``--save-keypoints`` and the client's
``--save-keypoints`` write the same records)::

    {"frame": 12, "pts": 6144, "time_base": "1/15360", "capture_ns": 1712345678901234567,
     "width": 1280, "height": 720, "random_weights": false,
     "persons": [{"id": 3, "box": [x1, y1, x2, y2], "score": 0.91,
                  "keypoints": [[x, y, score], ...]}]}

``id`` is the track id (-1 when untracked); ``keypoints`` is null when pose did not run. With 3D
keypoints (the pipeline's ``--keypoints3d``) each person also has ``"keypoints3d": [[x, y, z] or
null, ...]`` (K entries, null where not valid), ``"root3d": [x, y, z]`` or null, and the line has
``"keypoints3d_metric": true|false`` (docs/WIRE.md says what the units are). Lines
with an ``event`` key instead of ``frame`` mark what happened to the source between frames
(``stalled``, ``reconnecting``, ``resumed``; each with ``time_ns``). Non-finite numbers are
written as null: every line is strict JSON.

:class:`LineWriter` creates the file at its first line (a run that fails to start leaves an
existing file untouched), writes each line with one ``write`` call, and when a write fails part
way (a full disk) cuts the file back to the end of the last whole line before raising.
"""

from __future__ import annotations

import json
import logging
import math
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from .paths import unwritable

log = logging.getLogger(__name__)


class JsonlError(RuntimeError):
    """The JSONL file cannot be created or written; the message says what to do."""


def _finite(value: float, digits: int) -> float | None:
    return round(value, digits) if math.isfinite(value) else None


def rows(array: np.ndarray, digits: int) -> list[list[float | None]]:
    """A 2-D array as lists of rounded floats, non-finite values as None."""
    values = np.asarray(array, dtype=np.float64)
    if np.isfinite(values).all():
        return np.round(values, digits).tolist()
    return [[_finite(float(v), digits) for v in row] for row in values]


def keypoint_record(*, frame: int, pts: int | None, time_base: Fraction | None, capture_ns: int, width: int,
                    height: int, random_weights: bool, boxes: np.ndarray, box_scores: np.ndarray,
                    track_ids: np.ndarray, keypoints: np.ndarray | None, scores: np.ndarray | None,
                    keypoints3d: Any = None, **extra: Any) -> dict[str, Any]:
    """The JSON-ready record of one frame (see the module docstring).

    boxes (N, 4) xyxy, box_scores (N,), track_ids (N,), keypoints (N, K, 2) and scores (N, K) or None;
    keypoints3d: anything with xyz (N, K, 3), valid (N, K), root (N, 3), root_valid (N,) and
    metric, or None.
    """
    persons = []
    for i in range(len(boxes)):
        kp = None
        if keypoints is not None and scores is not None and keypoints.shape[1]:
            kp = rows(np.concatenate([keypoints[i], scores[i][:, None]], axis=1), 3)  # (K, 3): x, y, score
        person = {
            "id": int(track_ids[i]),
            "box": rows(np.asarray(boxes[i])[None], 2)[0],
            "score": _finite(float(box_scores[i]), 4),
            "keypoints": kp,
        }
        if keypoints3d is not None:
            person["keypoints3d"] = _points3d(keypoints3d.xyz[i], keypoints3d.valid[i])
            person["root3d"] = _points3d(keypoints3d.root[i][None], keypoints3d.root_valid[i][None])[0]
        persons.append(person)
    if keypoints3d is not None:
        extra = {**extra, "keypoints3d_metric": bool(keypoints3d.metric)}
    return {
        "frame": int(frame),
        "pts": None if pts is None else int(pts),
        "time_base": f"{time_base.numerator}/{time_base.denominator}" if time_base is not None else None,
        "capture_ns": int(capture_ns),
        "width": int(width),
        "height": int(height),
        "random_weights": bool(random_weights),
        **extra,
        "persons": persons,
    }


def _points3d(xyz: np.ndarray, valid: np.ndarray) -> list[list[float | None] | None]:
    """(M, 3) points -> [[x, y, z] or None, ...]: None where not valid or not finite; 0.1 mm steps."""
    ok = np.asarray(valid, bool) & np.isfinite(xyz).all(axis=-1)
    values = np.round(np.where(ok[:, None], xyz, 0.0).astype(np.float64), 4).tolist()
    return [v if good else None for v, good in zip(values, ok.tolist())]


class LineWriter:
    """Appends JSON lines to ``path``; see the module docstring for what survives a fault."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lines_written = 0
        self._fd: int | None = None
        self._size = 0  # bytes of whole lines written
        self._closed = False

    def check(self) -> None:
        """Fail now, with JsonlError, if the file could not be created later (nothing is left on disk)."""
        why = unwritable(self.path)
        if why is not None:
            raise JsonlError(f"keypoint file {self.path}: cannot create it ({why}); pick a writable path")

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as one line; JsonlError when it cannot be written whole."""
        if self._closed:
            raise JsonlError(f"keypoint file {self.path}: write after close")
        data = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        fd = self._open()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            self._cut_back(fd)
            raise JsonlError(f"keypoint file {self.path}: write failed ({exc}); check disk space") from exc
        self._size += len(data)
        self.lines_written += 1

    def close(self) -> None:
        """Close; safe to call repeatedly and after errors."""
        self._closed = True
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                log.error("keypoint file %s: close failed: %s", self.path, exc)

    def _open(self) -> int:
        if self._fd is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as exc:
                raise JsonlError(f"keypoint file {self.path}: cannot create it ({exc}); pick a writable path") from exc
        return self._fd

    def _cut_back(self, fd: int) -> None:
        """Drop a partly written line, so the file ends with the last whole one."""
        try:
            os.ftruncate(fd, self._size)
            os.lseek(fd, self._size, os.SEEK_SET)
        except OSError as exc:  # nothing more can be done; the reader skips an unterminated last line
            log.error("keypoint file %s: cannot cut back a torn line: %s", self.path, exc)
