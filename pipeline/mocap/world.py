"""The world step of a run and its JSON Lines record.

``WorldStep`` turns the results of one engine step (one frame of each camera) into a WorldFrame
through ``stages.mocap.fuse.WorldFuser``. Each frame's clock is its capture time for a live source and
its media time for a file, counted from that file's first frame (files that start at other timestamps
still line up frame by frame). The runner's sink thread calls it, off the device loop.

``world_record`` is one step's line of the world JSONL (``--save-world``, pipeline.sinks.world) and
``read_world`` reads such a file back; the format, field by field: docs/MOCAP.md, "World JSONL"
(points that are not valid are null; nothing non-finite is written).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from stages.mocap.fuse import CameraView, WorldFrame, WorldFuser
from stages.types import FrameResult, Keypoints

log = logging.getLogger(__name__)


class WorldStep:
    """A run's world fusion: ``__call__(results)`` -> the step's WorldFrame (None when no result
    of the step is from a camera of the rig, e.g. a step of sources that all ended)."""

    def __init__(self, fuser: WorldFuser, num_keypoints: int = 308) -> None:
        self.fuser = fuser
        self.num_keypoints = num_keypoints
        self._start: dict[str, float] = {}  # a file's first clock: its frames count from there
        self.frames = 0

    def __call__(self, results: list[FrameResult]) -> WorldFrame | None:
        views = {}
        random_weights = False
        for result in results:
            frame = result.frame
            if frame.source_id not in self.fuser.rig.cameras:
                continue
            clock = frame.clock_s
            if not frame.live:
                clock -= self._start.setdefault(frame.source_id, clock)
            keypoints = result.keypoints
            if keypoints is None:
                keypoints = Keypoints.empty(self.num_keypoints)
            views[frame.source_id] = CameraView(frame.index, clock, frame.capture_ns, result.detections, keypoints)
            random_weights = random_weights or result.random_weights
        if not views:
            return None
        world = self.fuser.step(views, random_weights)
        self.frames += 1
        if world.late:
            log.debug("world step %d: %s outside the %.0f ms window", world.index, ", ".join(world.late),
                      self.fuser.spec.window_s * 1000)
        return world


def _points(values: np.ndarray, valid: np.ndarray, digits: int) -> list:
    rounded = np.round(np.where(valid[..., None] if values.ndim > valid.ndim else valid, values, 0.0)
                       .astype(np.float64), digits).tolist()
    return [v if ok else None for v, ok in zip(rounded, valid.tolist())]


def world_record(world: WorldFrame) -> dict[str, Any]:
    """The JSON-ready record of one world step (see the module docstring)."""
    persons = []
    for p in range(len(world)):
        valid = world.valid[p]
        persons.append({
            "id": int(world.ids[p]),
            "keypoints": _points(world.xyz[p], valid, 5),  # 0.01 mm steps
            "error_px": _points(world.error[p], valid, 3),
            "views": world.views[p].astype(int).tolist(),
            "members": {world.cameras[c]: int(i) for c, i in enumerate(world.members[p].tolist()) if i >= 0},
        })
    return {
        "step": int(world.index), "capture_ns": int(world.capture_ns), "time_s": round(float(world.time_s), 6),
        "units": "m", "cameras": dict(world.camera_frames), "late": list(world.late),
        "random_weights": bool(world.random_weights), "persons": persons,
        "single_view": [{"camera": world.cameras[c], "person": int(i)} for c, i in world.single_view.tolist()],
    }


def read_lines(path: str | Path, what: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON Lines file in order. A last line cut short (a killed run: no newline
    after it) is skipped with a warning; any other line that does not parse is a ValueError naming it
    (``what`` says what the file should be)."""
    path = Path(path)
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):  # the write was cut: the lines before are whole
                log.warning("%s: the last line is incomplete (the run was cut short); it is skipped", path)
                return
            raise ValueError(f"{path}:{number}: not a JSON line of {what}") from None
        if isinstance(record, dict):
            yield record


def read_world(path: str | Path) -> Iterator[dict[str, Any]]:
    """The step records of a world JSONL file in order (see ``read_lines``)."""
    for record in read_lines(path, "a world file"):
        if "step" not in record or not isinstance(record.get("persons"), list):
            raise ValueError(f"{path}: a line is not a world step record (no step or persons)")
        yield record
