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


# OpenBLAS runs a GEMM of m x n x k over 262,144 on every core (interface/gemm.c): for products this
# small the other threads spin more than they help (8 persons x 8 cameras: twice the CPU time for the
# same wall time), and the cores belong to the pipeline. The product is made in chunks under that size.
_ONE_THREAD_MNK = 262_144
_NORMAL = [0, 1, 2, 5, 6, 10, 3, 7, 11]  # of a row-major 4x4 normal matrix: m00 m01 m02 m11 m12 m22 m03 m13 m23


def normal_blocks(extrinsics: np.ndarray) -> np.ndarray:
    """The constant part of every view's normal equations, (9, 4C): the entries of the symmetric
    4x4 matrices that the 3x3 solve reads (see ``solve_dlt``)."""
    blocks = []
    for e in extrinsics:  # e: (3, 4) = [R | t]; rows r1, r2, r3
        r1, r2, r3 = e
        blocks += [np.outer(r3, r3), -(np.outer(r3, r1) + np.outer(r1, r3)), -(np.outer(r3, r2) + np.outer(r2, r3)),
                   np.outer(r1, r1) + np.outer(r2, r2)]
    c = len(extrinsics)
    full = np.stack(blocks).reshape(c, 4, 16).transpose(1, 0, 2).reshape(4 * c, 16)
    return np.ascontiguousarray(full[:, _NORMAL].T)


def solve_dlt(blocks: np.ndarray, normalised: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted linear triangulation. blocks: ``normal_blocks`` of the C views; normalised (N, C, 2);
    weights (N, C) -> points (N, 3) and whether each system was solvable (N,).

    Each view gives two equations (x P3 - P1) . [X, 1] = 0 and (y P3 - P2) . [X, 1] = 0, scaled by
    its weight w. Their normal matrix sum_c w^2 [(x r3 - r1)(x r3 - r1)^T + (y r3 - r2)(y r3 - r2)^T]
    is, per view, w^2 (x^2 + y^2) r3 r3^T - w^2 x (r3 r1^T + r1 r3^T) - w^2 y (r3 r2^T + r2 r3^T)
    + w^2 (r1 r1^T + r2 r2^T): four constant 4x4 matrices weighted by four numbers per point, so the
    entries every point's solve needs are a GEMM of (9, 4C) by (4C, N) (in chunks that OpenBLAS runs
    on one thread), one contiguous row per entry. Its 3x3 system is solved in closed form (the
    adjugate): no per-point LAPACK call."""
    w2 = weights * weights  # (N, C)
    x, y = normalised[..., 0], normalised[..., 1]  # (N, C)
    coefficients = np.concatenate([w2 * (x * x + y * y), w2 * x, w2 * y, w2], axis=1)  # (N, 4C)
    m = np.empty((len(blocks), len(coefficients)))
    step = max(1, _ONE_THREAD_MNK // (blocks.size or 1))
    for start in range(0, len(coefficients), step):
        np.matmul(blocks, coefficients[start:start + step].T, out=m[:, start:start + step])
    m00, m01, m02, m11, m12, m22, m03, m13, m23 = m  # (N,) each
    # the adjugate of the symmetric 3x3 part; the right-hand side is -(m03, m13, m23)
    c00, c01, c02 = m11 * m22 - m12 * m12, m02 * m12 - m01 * m22, m01 * m12 - m02 * m11
    c11, c12, c22 = m00 * m22 - m02 * m02, m01 * m02 - m00 * m12, m00 * m11 - m01 * m01
    det = m00 * c00 + m01 * c01 + m02 * c02
    scale = m00 + m11 + m22  # singular relative to the system's own size (trace^3)
    ok = np.abs(det) > 1e-12 * scale ** 3
    minus_inverse = np.where(ok, -1.0 / np.where(ok, det, 1.0), 0.0)
    points = np.empty((len(det), 3))
    points[:, 0] = (c00 * m03 + c01 * m13 + c02 * m23) * minus_inverse
    points[:, 1] = (c01 * m03 + c11 * m13 + c12 * m23) * minus_inverse
    points[:, 2] = (c02 * m03 + c12 * m13 + c22 * m23) * minus_inverse
    return points, ok


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
