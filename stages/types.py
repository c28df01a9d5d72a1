"""Validated records that stages exchange (never loose tuples).

Shapes are documented on each field; constructors validate them and raise
``ValueError("expected (N, 4), got (3,)")`` style errors. Arrays here are host numpy
arrays: device tensors stay inside a stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np


def _check(name: str, array: np.ndarray, shape: tuple[int | None, ...]) -> None:
    ok = array.ndim == len(shape) and all(s is None or s == a for s, a in zip(shape, array.shape))
    if not ok:
        want = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name}: expected {want}, got {tuple(array.shape)}")


@dataclass(frozen=True)
class StreamInfo:
    """Facts about a stream known when it opens."""

    source_id: str
    width: int
    height: int
    fps: float | None  # nominal frame rate; None when unknown (live sources may not say)
    time_base: Fraction | None
    live: bool
    random_weights: bool = False


@dataclass
class Frame:
    """One decoded frame and where it came from.

    image: (H, W, 3) uint8 RGB. pts is in units of time_base (None when the source has no clock).
    capture_ns: wall clock (time.time_ns) when the frame was captured or decoded.
    session: how often the source was reopened before this frame (a new session is a new stream:
    tracks, smoothing and carried boxes restart).
    skipped_before: frames of the source before this one that were not processed (a live source
    replaced them): exactly what a gap in ``index`` up to this frame owes to the source.
    live: the source is a camera or stream (its clock is the capture time), not a file.
    released_ns: wall clock when the pipeline took the frame from its source's queue (0 until then): a
    file is decoded ahead of the models, so its frames wait there; ``released_ns - capture_ns`` is that wait.
    """

    index: int
    image: np.ndarray
    pts: int | None
    time_base: Fraction | None
    capture_ns: int
    source_id: str = "src"
    session: int = 0
    skipped_before: int = 0
    live: bool = False
    released_ns: int = 0

    @property
    def clock_s(self) -> float:
        """Seconds on the frame's own clock: a file's media time (pts; the same however fast it decodes), else
        the capture time (a live source, or one without pts)."""
        if self.live or self.pts is None or self.time_base is None:
            return self.capture_ns / 1e9
        return float(self.pts * self.time_base)

    def __post_init__(self) -> None:
        _check("Frame.image", self.image, (None, None, 3))
        if self.image.dtype != np.uint8:
            raise ValueError(f"Frame.image: expected uint8, got {self.image.dtype}")

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    @property
    def width(self) -> int:
        return int(self.image.shape[1])


@dataclass
class Detections:
    """People found in one frame.

    boxes: (N, 4) float32 xyxy pixels; scores: (N,) float32; track_ids: (N,) int64, -1 when untracked.
    """

    boxes: np.ndarray
    scores: np.ndarray
    track_ids: np.ndarray

    def __post_init__(self) -> None:
        self.boxes = np.asarray(self.boxes, dtype=np.float32)
        if self.boxes.size == 0:
            self.boxes = self.boxes.reshape(0, 4)
        self.scores = np.asarray(self.scores, dtype=np.float32)
        self.track_ids = np.asarray(self.track_ids, dtype=np.int64)
        _check("Detections.boxes", self.boxes, (None, 4))
        n = len(self.boxes)
        _check("Detections.scores", self.scores, (n,))
        _check("Detections.track_ids", self.track_ids, (n,))

    @classmethod
    def empty(cls) -> Detections:
        return cls(np.zeros((0, 4), np.float32), np.zeros((0,), np.float32), np.zeros((0,), np.int64))

    def __len__(self) -> int:
        return len(self.boxes)


@dataclass
class Keypoints:
    """Whole-body keypoints of the persons of one frame, in image pixels.

    xy: (N, K, 2) float32; scores: (N, K) float32 (raw heatmap maxima).
    """

    xy: np.ndarray
    scores: np.ndarray

    def __post_init__(self) -> None:
        self.xy = np.asarray(self.xy, dtype=np.float32)
        self.scores = np.asarray(self.scores, dtype=np.float32)
        _check("Keypoints.xy", self.xy, (None, None, 2))
        _check("Keypoints.scores", self.scores, self.xy.shape[:2])

    @classmethod
    def empty(cls, num_keypoints: int = 308) -> Keypoints:
        return cls(np.zeros((0, num_keypoints, 2), np.float32), np.zeros((0, num_keypoints), np.float32))

    def __len__(self) -> int:
        return len(self.xy)


@dataclass
class Keypoints3D:
    """The persons' keypoints in the pointmap's 3D camera frame (see stages.keypoints3d).

    xyz: (N, K, 3) float32, zeros where not valid; valid: (N, K) bool; root: (N, 3) float32, the
    mean of the valid hips (zeros when none); root_valid: (N,) bool; metric: the pointmap was
    divided by its predicted scale (metric), else it is in canonical camera space.
    """

    xyz: np.ndarray
    valid: np.ndarray
    root: np.ndarray
    root_valid: np.ndarray
    metric: bool = True

    def __post_init__(self) -> None:
        self.xyz = np.asarray(self.xyz, dtype=np.float32)
        self.valid = np.asarray(self.valid, dtype=bool)
        self.root = np.asarray(self.root, dtype=np.float32)
        self.root_valid = np.asarray(self.root_valid, dtype=bool)
        _check("Keypoints3D.xyz", self.xyz, (None, None, 3))
        n, k = self.xyz.shape[:2]
        _check("Keypoints3D.valid", self.valid, (n, k))
        _check("Keypoints3D.root", self.root, (n, 3))
        _check("Keypoints3D.root_valid", self.root_valid, (n,))
        if not np.isfinite(self.xyz).all() or not np.isfinite(self.root).all():
            raise ValueError("Keypoints3D: non-finite values (invalid points must be zeros with valid=False)")

    @classmethod
    def empty(cls, num_keypoints: int = 308, metric: bool = True) -> Keypoints3D:
        return cls(np.zeros((0, num_keypoints, 3), np.float32), np.zeros((0, num_keypoints), bool),
                   np.zeros((0, 3), np.float32), np.zeros((0,), bool), metric)

    def __len__(self) -> int:
        return len(self.xyz)


@dataclass
class Matte:
    """alpha: (H, W) float32 in [0, 1]; foreground: (H, W, 3) float32 premultiplied RGB in [0, 1]."""

    alpha: np.ndarray
    foreground: np.ndarray

    def __post_init__(self) -> None:
        _check("Matte.alpha", self.alpha, (None, None))
        _check("Matte.foreground", self.foreground, (*self.alpha.shape, 3))


@dataclass
class FrameResult:
    """Everything the stages produced for one frame; sinks consume this.

    seg: (H, W) uint8 class ids or None; latency_ms: per-stage milliseconds.
    """

    frame: Frame
    detections: Detections = field(default_factory=Detections.empty)
    keypoints: Keypoints | None = None
    seg: np.ndarray | None = None
    matte: Matte | None = None
    normals: np.ndarray | None = None
    pointmap: np.ndarray | None = None
    keypoints3d: Keypoints3D | None = None
    maps: dict[str, Any] = field(default_factory=dict)  # task -> result, for tasks with no field (stages.tasks)
    annotated: np.ndarray | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    random_weights: bool = False

    def __post_init__(self) -> None:
        if self.seg is not None:
            _check("FrameResult.seg", self.seg, (self.frame.height, self.frame.width))
        if self.keypoints is not None and len(self.keypoints) != len(self.detections):
            raise ValueError(
                f"FrameResult: {len(self.keypoints)} keypoint sets for {len(self.detections)} detections"
            )
        if self.keypoints3d is not None and len(self.keypoints3d) != len(self.detections):
            raise ValueError(
                f"FrameResult: {len(self.keypoints3d)} 3D keypoint sets for {len(self.detections)} detections"
            )
