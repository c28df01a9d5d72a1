"""Robust weighted triangulation of many keypoints of many persons from calibrated views.

Every point is solved the same way, all at once (numpy, no loop over points):

1. Weighted linear triangulation (DLT) in normalised image coordinates (the views' pixels
   undistorted with their calibration): each view c with weight w_c (its keypoint score, 0 when
   the score is under the threshold or the camera does not see the person) adds the equations
   w_c (x P3 - P1) X = 0 and w_c (y P3 - P2) X = 0 of its extrinsic P = [R | t]; every point's
   normal equations come from one matrix product and are solved in closed form, all at once.
2. Each view's reprojection error in pixels (through its distortion and matrix: the error is in
   the pixels the detector saw). While a point has three or more views and its worst view's error
   is over ``max_error_px``, that view is dropped and the point solved again: one wrong detection
   (a swapped side, a keypoint on another person) cannot drag the point away.
3. A point is valid when at least ``min_views`` views remain, every one of them under
   ``max_error_px`` and in front of its camera (z > 0). An invalid point is zeros with
   valid=False, error 0 and views 0: nothing made up, nothing non-finite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .camera import Camera, CameraSet
from .dlt import normal_blocks, solve_dlt


@dataclass(frozen=True)
class Triangulation:
    """min_score: a view's keypoint counts from this score; max_error_px: a view over this
    reprojection error is rejected; min_views: views a valid point needs (2 or more)."""

    min_score: float = 0.3
    max_error_px: float = 15.0
    min_views: int = 2

    def __post_init__(self) -> None:
        if self.min_views < 2:
            raise ValueError(f"min_views must be at least 2 (one view has no depth), got {self.min_views}")
        if not self.max_error_px > 0:
            raise ValueError(f"max_error_px must be positive, got {self.max_error_px}")


@dataclass
class Points3D:
    """xyz (P, K, 3) float32 metres, zeros where not valid; valid (P, K) bool; error (P, K) float32 RMS
    reprojection error in pixels over the views used; views (P, K) uint8 views used; used (P, C, K)
    bool: which views each point was solved from."""

    xyz: np.ndarray
    valid: np.ndarray
    error: np.ndarray
    views: np.ndarray
    used: np.ndarray


def reprojection_errors(cameras: CameraSet, xyz: np.ndarray, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pixel distance between each view's observation (N, C, 2) and the point (N, 3) projected into
    it -> errors (N, C) and in_front (N, C)."""
    projected, front = cameras.project(xyz)  # (N, C, 2), (N, C)
    d = projected - pixels
    return np.sqrt(d[..., 0] ** 2 + d[..., 1] ** 2), front


def triangulate(cameras: Sequence[Camera] | CameraSet, pixels: np.ndarray, scores: np.ndarray,
                normalised: np.ndarray, spec: Triangulation = Triangulation()) -> Points3D:
    """Persons' keypoints seen by the cameras -> their 3D points (see the module docstring).

    cameras: the C views (a CameraSet keeps what they share between calls); pixels (P, C, K, 2) as
    detected (distorted); scores (P, C, K), 0 where a camera does not see the person; normalised
    (P, C, K, 2): ``pixels`` undistorted by each camera.
    """
    views = cameras if isinstance(cameras, CameraSet) else CameraSet(cameras)
    p, c, k = scores.shape
    # One row per point: (P, C, K, ...) -> (P*K, C, ...)
    pix = np.moveaxis(pixels, 1, 2).reshape(p * k, c, 2)
    nrm = np.moveaxis(normalised, 1, 2).reshape(p * k, c, 2)
    score = np.moveaxis(scores, 1, 2).reshape(p * k, c)
    # one test of a sum for five: a sum is finite exactly when its terms are (float32 keypoints and
    # their undistortion cannot overflow a float64 sum), and reductions over an axis of 2 are slow
    finite = np.isfinite(pix[..., 0] + pix[..., 1] + nrm[..., 0] + nrm[..., 1] + score)
    used = finite & (score >= spec.min_score)  # (N, C)
    pix = np.where(finite[..., None], pix, 0.0)
    nrm = np.where(finite[..., None], nrm, 0.0)
    weights = np.where(used, score, 0.0)
    blocks = views.cached("normal_blocks", lambda: normal_blocks(np.stack([c.extrinsic for c in views.cameras])))
    # Round one solves every point at once (whole arrays: no gather, no scatter); the points it leaves
    # with a view to drop are solved again, a few at a time.
    xyz, solvable = solve_dlt(blocks, nrm, weights)
    errors, front = reprojection_errors(views, xyz, pix)
    todo = np.flatnonzero(used.sum(axis=1) >= spec.min_views)  # the points worth solving
    for round_ in range(max(1, c - spec.min_views + 1)):  # each round drops at most one view per point
        if round_:
            xyz[todo], solvable[todo] = solve_dlt(blocks, nrm[todo], weights[todo])
            errors[todo], front[todo] = reprojection_errors(views, xyz[todo], pix[todo])
        u = used[todo]
        bad = u & ((errors[todo] > spec.max_error_px) | ~front[todo])  # (T, C)
        droppable = bad.any(axis=1) & (u.sum(axis=1) > spec.min_views) & solvable[todo]
        if not droppable.any():
            break
        todo = todo[droppable]
        worst = np.argmax(np.where(used[todo], np.where(front[todo], errors[todo], np.inf), -1.0), axis=1)
        used[todo, worst] = False  # the worst view of each such point
        weights[todo, worst] = 0.0
    count = used.sum(axis=1)
    ok = used & front & (errors <= spec.max_error_px)
    valid = (count >= spec.min_views) & (ok.sum(axis=1) == count) & solvable & np.isfinite(xyz).all(axis=-1)
    rms = np.sqrt(np.sum(np.where(used, errors, 0.0) ** 2, axis=1) / np.maximum(count, 1))
    xyz = np.where(valid[:, None], xyz, 0.0)
    return Points3D(xyz.reshape(p, k, 3).astype(np.float32), valid.reshape(p, k),
                    np.where(valid, rms, 0.0).reshape(p, k).astype(np.float32),
                    np.where(valid, count, 0).reshape(p, k).astype(np.uint8),
                    np.moveaxis((used & valid[:, None]).reshape(p, k, c), 2, 1))
