"""One world step: the persons the cameras saw at one moment -> skeletons in world coordinates.

``WorldFuser.step`` takes each camera's frame of the step (its clock, detections and keypoints) and:

1. keeps the views within ``window_s`` of the step's median clock (a lagging camera is left out);
2. undistorts the keypoints (stages.mocap.undistort) and associates persons across views (stages.mocap.associate);
3. triangulates each world person (stages.mocap.triangulate); a view outvoted on most of a person's
   points leaves that person, who is solved again;
4. keeps world ids: the last step's person that shares the most camera tracks, else the nearest one
   within ``max_speed_mps`` of travel;
5. smooths the points with the One-Euro filter when asked (invalid points never come back as held values).

Persons seen by one camera only are reported (``single_view``), never triangulated. Host numpy, off
the device loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from stages.smoothing import KeypointSmoother
from stages.types import Detections, Keypoints

from .associate import Association, View, assign, associate
from .camera import CameraSet, Rig
from .points import Triangulation
from .triangulate import triangulate_rows
from .undistort import GridSet, UndistortGrid

_BODY = slice(0, 15)  # Sapiens2's body joints: a person's position for identity is their mean


@dataclass(frozen=True)
class Fusion:
    """How steps are fused. window_s: the largest distance of a view's clock from the step's median;
    max_speed_mps: how far a person may move between steps and keep their id (plus 0.3 m);
    forget_s: how long an unseen id is remembered; smooth: (min_cutoff Hz, beta) of a One-Euro
    filter over the world points, None for none; outlier_fraction: a view rejected for more than
    this fraction of a person's points leaves the person."""

    window_s: float = 0.02
    association: Association = field(default_factory=Association)
    triangulation: Triangulation = field(default_factory=Triangulation)
    max_speed_mps: float = 4.0
    forget_s: float = 1.0
    smooth: tuple[float, float] | None = None
    outlier_fraction: float = 0.5


@dataclass(frozen=True)
class CameraView:
    """What one camera gives a step: its frame's index and clock (s), capture time, persons."""

    frame_index: int
    clock_s: float
    capture_ns: int
    detections: Detections
    keypoints: Keypoints


@dataclass
class WorldFrame:
    """One step's world persons (docs/WIRE.md, "World keypoints").

    cameras: the rig's camera names (columns of ``members``); camera_frames: camera -> frame index
    used; xyz (N, K, 3) float32 metres (zeros where not valid); valid (N, K) bool; error (N, K)
    float32 RMS reprojection px; views (N, K) uint8; ids (N,) int64; members (N, C) int32 person
    index in each camera's frame or -1; single_view (S, 2) int32 (camera column, person index)."""

    index: int
    capture_ns: int
    time_s: float
    cameras: list[str]
    camera_frames: dict[str, int]
    xyz: np.ndarray
    valid: np.ndarray
    error: np.ndarray
    views: np.ndarray
    ids: np.ndarray
    members: np.ndarray
    single_view: np.ndarray
    latency_ms: dict[str, float] = field(default_factory=dict)
    late: list[str] = field(default_factory=list)  # cameras whose frame was outside the window
    random_weights: bool = False

    def __post_init__(self) -> None:
        n, k = self.valid.shape
        if self.xyz.shape != (n, k, 3) or self.members.shape != (n, len(self.cameras)) or len(self.ids) != n:
            raise ValueError(f"WorldFrame: xyz {self.xyz.shape}, members {self.members.shape}, ids {self.ids.shape} "
                             f"do not fit valid {self.valid.shape} and {len(self.cameras)} cameras")
        if not np.isfinite(self.xyz).all() or not np.isfinite(self.error).all():
            raise ValueError("WorldFrame: non-finite values (invalid points are zeros with valid=False)")

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class _Known:
    """A world person of an earlier step, for identity."""

    centre: np.ndarray
    seen_s: float
    keys: set[tuple[str, int]]


class WorldFuser:
    """Fuses each step of a rig's cameras into a WorldFrame (see the module docstring)."""

    def __init__(self, rig: Rig, spec: Fusion = Fusion(), num_keypoints: int = 308) -> None:
        self.rig, self.spec, self.num_keypoints = rig, spec, num_keypoints
        self.names = rig.names
        self._column = {name: c for c, name in enumerate(self.names)}
        self._known: dict[int, _Known] = {}
        self._next_id = 0
        self._index = 0
        self._smoother = KeypointSmoother(*spec.smooth, max_age_s=spec.forget_s) if spec.smooth else None
        self._sets: dict[tuple[str, ...], CameraSet] = {}  # the cameras of a step, by names (a few combinations)
        self._undistort = {name: UndistortGrid(rig[name]) for name in rig.names}  # built once: tens of ms each
        self._grids: dict[tuple[str, ...], GridSet] = {}  # the step's cameras' tables, by names

    def step(self, views: Mapping[str, CameraView], random_weights: bool = False) -> WorldFrame:
        """Fuse one step. ``views``: camera name -> its view (cameras the rig lacks are refused)."""
        t0 = time.perf_counter()
        unknown = [name for name in views if name not in self._column]
        if unknown:
            raise KeyError(f"cameras {unknown} are not in the calibration")
        clocks = {name: view.clock_s for name, view in views.items()}
        middle = _median(list(clocks.values())) if clocks else 0.0
        inside = {name: v for name, v in views.items() if abs(v.clock_s - middle) <= self.spec.window_s}
        late = sorted(set(views) - set(inside))
        names = [name for name in self.names if name in inside]  # rig order
        cams = [self.rig[name] for name in names]
        grids = self._grids.get(tuple(names))
        if grids is None:
            grids = self._grids[tuple(names)] = GridSet([self._undistort[name] for name in names])
        normalised = grids([inside[name].keypoints.xy for name in names])
        groups = associate([View(cam, nrm, inside[name].keypoints.scores) for name, cam, nrm
                            in zip(names, cams, normalised)], self.spec.association)
        multi = [g for g in groups if len(g) >= 2]
        points, multi, singles = self._solve(names, inside, normalised, multi)
        singles += [g for g in groups if len(g) == 1]
        k = self.num_keypoints if not inside else next(iter(inside.values())).keypoints.xy.shape[1]
        members = np.full((len(multi), len(self.names)), -1, np.int32)
        for p, group in enumerate(multi):
            for v, i in group.items():
                members[p, self._column[names[v]]] = i
        single = np.array([[self._column[names[v]], i] for g in singles for v, i in g.items()], np.int32).reshape(-1, 2)
        ids = self._identify(names, inside, multi, points, middle)
        xyz, valid, error, count = points if points is not None else (
            np.zeros((0, k, 3), np.float32), np.zeros((0, k), bool), np.zeros((0, k), np.float32),
            np.zeros((0, k), np.uint8))
        if self._smoother is not None and len(ids):
            smoothed = self._smoother(np.where(valid[..., None], xyz, np.nan), ids, middle)
            valid = valid & np.isfinite(smoothed).all(axis=-1)
            xyz = np.where(valid[..., None], smoothed, 0.0).astype(np.float32)
            error, count = np.where(valid, error, 0.0).astype(np.float32), np.where(valid, count, 0).astype(np.uint8)
        capture = int(_median([v.capture_ns for v in inside.values()])) if inside else time.time_ns()
        frame = WorldFrame(self._index, capture, middle, list(self.names),
                           {name: int(v.frame_index) for name, v in inside.items()}, xyz, valid, error, count, ids,
                           members, single, {"triangulate": (time.perf_counter() - t0) * 1000.0}, late, random_weights)
        self._index += 1
        return frame

    def _solve(self, names: list[str], inside: Mapping[str, CameraView], normalised: list[np.ndarray],
               groups: list[dict[int, int]]) -> tuple[tuple | None, list[dict[int, int]], list[dict[int, int]]]:
        """Triangulate the groups; a view rejected for most of a person's points leaves that person
        (it becomes single-view) and the person is solved again. Returns (xyz, valid, error, views)
        or None, the groups kept and the members that left."""
        if not groups:
            return None, [], []
        cams = self._sets.get(tuple(names))
        if cams is None:
            cams = self._sets[tuple(names)] = CameraSet([self.rig[name] for name in names])
        spec = self.spec.triangulation
        left: list[dict[int, int]] = []
        for _ in range(2):
            rows = self._stack(names, inside, normalised, groups)
            points = triangulate_rows(cams, rows, spec)
            wanted = rows[4].swapaxes(0, 1) >= spec.min_score  # (P, C, K)
            tested = wanted & points.valid[:, None, :]  # points the other views solved
            rejected = tested & ~points.used  # ... without this view
            n_tested, n_rejected = tested.sum(axis=2), rejected.sum(axis=2)  # (P, C)
            outvoted = (n_tested >= 10) & (n_rejected > self.spec.outlier_fraction * n_tested)
            changed = False
            for p, group in enumerate(groups):
                if len(group) < 3:
                    continue  # two views cannot outvote each other
                for v in list(group):
                    if outvoted[p, v]:
                        left.append({v: group.pop(v)})
                        changed = True
            if not changed:
                break
        kept = [g for g in groups if len(g) >= 2]
        left += [g for g in groups if len(g) == 1]
        if len(kept) != len(groups):
            points = triangulate_rows(cams, self._stack(names, inside, normalised, kept), spec)
        return (points.xyz, points.valid, points.error, points.views), kept, left

    @staticmethod
    def _stack(names: list[str], inside: Mapping[str, CameraView], normalised: list[np.ndarray],
               groups: list[dict[int, int]]) -> np.ndarray:
        """(5, C, P, K) the groups' pixels u, v, normalised x, y and scores, one row per view (zeros
        where a camera lacks the person): ``triangulate_rows``'s layout."""
        c = len(names)
        k = normalised[0].shape[1] if normalised else 0
        rows = np.zeros((5, c, len(groups), k))
        for p, group in enumerate(groups):
            for v, i in group.items():
                kp = inside[names[v]].keypoints
                rows[:2, v, p], rows[2:4, v, p], rows[4, v, p] = kp.xy[i].T, normalised[v][i].T, kp.scores[i]
        return rows

    def _identify(self, names: list[str], inside: Mapping[str, CameraView], groups: list[dict[int, int]],
                  points: tuple | None, now: float) -> np.ndarray:
        """World ids for the groups: shared camera tracks first, else the nearest earlier person."""
        self._known = {i: k for i, k in self._known.items() if now - k.seen_s <= self.spec.forget_s}
        if not groups:
            return np.zeros((0,), np.int64)
        xyz, valid = points[0], points[1]
        centres = []  # each person's position: the mean of their valid body joints, else of all their valid points
        for p in range(len(groups)):
            body = valid[p, _BODY]
            pts = xyz[p, _BODY][body] if body.any() else xyz[p][valid[p]]
            centres.append(pts.sum(axis=0) / len(pts) if len(pts) else None)  # np.mean's value, a tenth the calls
        tracks = {name: inside[name].detections.track_ids.tolist() for name in names}
        keys = [{(names[v], tracks[names[v]][i]) for v, i in g.items() if tracks[names[v]][i] >= 0} for g in groups]
        known = list(self._known.items())
        cost = np.full((len(groups), len(known)), 1e9)
        for p in range(len(groups)):
            centre = None if centres[p] is None else centres[p].tolist()
            for q, (_, k) in enumerate(known):
                shared = len(keys[p] & k.keys)
                if shared:
                    cost[p, q] = -float(shared)
                elif centre is not None:
                    reach = self.spec.max_speed_mps * max(now - k.seen_s, 0.0) + 0.3
                    distance = math.dist(centre, k.centre.tolist())
                    if distance <= reach:
                        cost[p, q] = distance
        ids = [-1] * len(groups)
        if known:
            rows, cols = assign(cost)
            for p, q in zip(rows.tolist(), cols.tolist()):
                if cost[p, q] < 1e9:
                    ids[p] = known[q][0]
        for p in range(len(groups)):
            if ids[p] < 0:
                ids[p] = self._next_id
                self._next_id += 1
            old = self._known.get(ids[p])
            centre = centres[p] if centres[p] is not None else (old.centre if old else np.zeros(3))
            self._known[ids[p]] = _Known(centre, now, keys[p])
        return np.array(ids, np.int64)


def _median(values: list[float] | list[int]) -> float:
    """np.median of a few numbers (as float64), without its array machinery."""
    ordered = sorted(values)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[half])
    return (float(ordered[half - 1]) + float(ordered[half])) / 2
