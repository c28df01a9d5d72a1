"""A finished run's world skeletons as TRC (OpenSim, Pose2Sim), CSV and NumPy, from its world JSONL.

Every export reads the world JSON Lines file (``--save-world``, or the one a run with ``--export-trc``
spools on its own), so a killed run can still be exported from what it wrote; TRC and CSV take two
passes over it (steps and persons, then rows), so memory stays flat. The formats, field by field, are
in docs/MOCAP.md: TRC (one file per world person, metres, an invalid point's fields empty; ``up="y"``
turns the world's Z-up into OpenSim's Y-up as Pose2Sim does, ``up="z"`` keeps it as calibrated), CSV
(one row per step and person) and NumPy (``xyz`` (T, P, K, 3) float32, NaN where not valid, with
``valid``, ``error_px``, ``views``, ``ids``, ``time_s``, ``step`` and ``names``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from stages.metadata import load_metadata

from .world import read_world


@dataclass(frozen=True)
class Export:
    """What one export wrote: its format, its files (one per person for TRC; none for a TRC of no
    person), the steps and person ids, and what a file holds."""

    kind: str
    paths: list[Path]
    steps: int
    ids: list[int]
    holds: str

    def wrote(self) -> list[str]:
        """One ``wrote PATH (...)`` line per file written."""
        if self.kind == "TRC":
            return [f"wrote {path} (TRC: person {pid}, {self.holds})" for pid, path in zip(self.ids, self.paths)]
        return [f"wrote {path} ({self.kind}: {self.holds})" for path in self.paths]

    def warning(self) -> str | None:
        """The one line that says an export holds no person, or None."""
        if self.ids:
            return None
        steps = f"{self.steps} world step{'s' if self.steps != 1 else ''}"
        if self.kind == "TRC":
            return f"no person was triangulated in the {steps}: no TRC written"
        return f"no person was triangulated in the {steps}: {self.paths[0]} holds no person ({self.kind})"


@dataclass(frozen=True)
class Survey:
    """What the first pass finds: steps, person ids (in order of appearance), keypoints, times."""

    steps: int
    ids: list[int]
    num_keypoints: int
    first_s: float
    rate: float


def survey(path: str | Path) -> Survey:
    """Count the steps and persons of a world file; the rate is the median of the step intervals."""
    steps, ids, k, times = 0, {}, 0, []
    for record in read_world(path):
        steps += 1
        times.append(float(record.get("time_s", 0.0)))
        for person in record["persons"]:
            ids.setdefault(int(person["id"]), None)
            k = k or len(person.get("keypoints") or [])
    intervals = np.diff(np.asarray(times))
    intervals = intervals[intervals > 0]
    rate = float(1.0 / np.median(intervals)) if len(intervals) else 30.0
    return Survey(steps, list(ids), k or load_metadata().num_keypoints, times[0] if times else 0.0, rate)


def _names(k: int) -> list[str]:
    names = [str(n) for n in load_metadata().keypoint_names]
    return names if len(names) == k else [f"kp{i}" for i in range(k)]


def _xyz(point: Any, up: str) -> tuple[str, str, str]:
    if not isinstance(point, list) or len(point) != 3 or not all(isinstance(v, int | float) and math.isfinite(v)
                                                                  for v in point):
        return "", "", ""
    x, y, z = point
    if up == "y":
        x, y, z = y, z, x
    return f"{x:.5f}", f"{y:.5f}", f"{z:.5f}"


def trc_paths(path: str | Path, ids: list[int]) -> dict[int, Path]:
    """Each person's TRC file: ``{person}`` in the name is the id; otherwise one person writes
    ``path`` itself and several write ``<stem>_P<id>.trc`` beside it."""
    path = Path(path)
    if "{person}" in str(path):
        return {i: Path(str(path).replace("{person}", str(i))) for i in ids}
    if len(ids) <= 1:
        return dict.fromkeys(ids, path)
    return {i: path.with_name(f"{path.stem}_P{i}{path.suffix}") for i in ids}


def _trc_header(out: TextIO, path: Path, names: list[str], steps: int, rate: float, camera_rate: float) -> None:
    out.write(f"PathFileType\t4\t(X/Y/Z)\t{path.name}\n")
    out.write("DataRate\tCameraRate\tNumFrames\tNumMarkers\tUnits\tOrigDataRate\tOrigDataStartFrame\tOrigNumFrames\n")
    out.write(f"{rate:.2f}\t{camera_rate:.2f}\t{steps}\t{len(names)}\tm\t{rate:.2f}\t1\t{steps}\n")
    out.write("Frame#\tTime\t" + "\t".join(f"{n}\t\t" for n in names).rstrip("\t") + "\n")
    out.write("\t\t" + "\t".join(f"X{i}\tY{i}\tZ{i}" for i in range(1, len(names) + 1)) + "\n")
    out.write("\n")


def write_trc(world_jsonl: str | Path, path: str | Path, up: str = "y", rate: float | None = None,
              camera_rate: float | None = None) -> Export:
    """TRC files of every person of a world file (see the module docstring); none without a person.
    DataRate is ``rate`` or the steps' own (the median interval: a live run that dropped frames has
    fewer steps than its cameras' frames); CameraRate is ``camera_rate`` (the cameras' nominal fps)
    or the same. Each file is written to ``.part`` and renamed when whole: a failed export leaves
    no torn TRC."""
    info = survey(world_jsonl)
    rate = rate or info.rate
    camera_rate = camera_rate or rate
    names = _names(info.num_keypoints)
    paths = trc_paths(path, info.ids)
    files: dict[int, TextIO] = {}
    try:
        for pid, target in paths.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            files[pid] = target.with_name(target.name + ".part").open("w", encoding="ascii", newline="\n")
            _trc_header(files[pid], target, names, info.steps, rate, camera_rate)
        empty = "\t".join([""] * (3 * len(names)))
        for row, record in enumerate(read_world(world_jsonl), start=1):
            time_s = float(record.get("time_s", 0.0)) - info.first_s
            present = {int(p["id"]): p for p in record["persons"]}
            for pid, out in files.items():
                person = present.get(pid)
                values = empty if person is None else "\t".join(
                    "\t".join(_xyz(point, up)) for point in person["keypoints"])
                out.write(f"{row}\t{time_s:.6f}\t{values}\n")
    finally:
        for out in files.values():
            out.close()
    for pid, target in paths.items():
        target.with_name(target.name + ".part").replace(target)
    return Export("TRC", list(paths.values()), info.steps, info.ids,
                  f"{info.steps} steps of {len(names)} markers at {rate:.2f} Hz, metres, {up.upper()} up")


def write_csv(world_jsonl: str | Path, path: str | Path) -> Export:
    """One row per step and person (see the module docstring)."""
    info = survey(world_jsonl)
    names = _names(info.num_keypoints)
    path = Path(path)
    part = path.with_name(path.name + ".part")
    rows = 0
    with part.open("w", encoding="ascii", newline="\n") as out:
        out.write("step,time_s,person," + ",".join(f"{n}_x,{n}_y,{n}_z" for n in names) + "\n")
        for record in read_world(world_jsonl):
            time_s = float(record.get("time_s", 0.0)) - info.first_s
            for person in record["persons"]:
                values = ",".join(",".join(_xyz(point, "z")) for point in person["keypoints"])
                out.write(f"{int(record['step'])},{time_s:.6f},{int(person['id'])},{values}\n")
                rows += 1
    part.replace(path)
    return Export("CSV", [path], info.steps, info.ids,
                  f"{rows} rows, one per step and person: {info.steps} steps, {len(info.ids)} persons; "
                  f"x, y, z of {len(names)} keypoints in metres, as calibrated")


def write_npz(world_jsonl: str | Path, path: str | Path) -> Export:
    """The arrays of the module docstring in one .npz (memory: steps x persons x keypoints x 3 floats)."""
    info = survey(world_jsonl)
    k, column = info.num_keypoints, {pid: i for i, pid in enumerate(info.ids)}
    shape = (info.steps, len(info.ids), k)
    xyz = np.full((*shape, 3), np.nan, np.float32)
    error = np.zeros(shape, np.float32)
    views = np.zeros(shape, np.uint8)
    time_s = np.zeros(info.steps)
    step = np.zeros(info.steps, np.int64)
    for t, record in enumerate(read_world(world_jsonl)):
        time_s[t], step[t] = float(record.get("time_s", 0.0)) - info.first_s, int(record["step"])
        for person in record["persons"]:
            p = column[int(person["id"])]
            points = [v if isinstance(v, list) else [None] * 3 for v in person["keypoints"]]
            xyz[t, p] = np.array([[np.nan if c is None else c for c in v] for v in points], np.float32)
            error[t, p] = [0.0 if e is None else e for e in person.get("error_px", [None] * k)]
            views[t, p] = person.get("views", [0] * k)
    valid = np.isfinite(xyz).all(axis=-1)
    path = Path(path)
    with path.with_name(path.name + ".part").open("wb") as out:
        np.savez(out, xyz=xyz, valid=valid, error_px=error, views=views, ids=np.array(info.ids, np.int64),
                 time_s=time_s, step=step, names=np.array(_names(k)))
    path.with_name(path.name + ".part").replace(path)
    return Export("NumPy", [path], info.steps, info.ids,
                  f"xyz of {info.steps} steps x {len(info.ids)} persons x {k} keypoints in metres, NaN where "
                  "not valid")
