"""Undistortion of a step's keypoints by lookup: each pinhole camera's exact inverse tabulated once
(``UndistortGrid``), every camera of a step looked up in one pass (``GridSet``).

Used by the world step (stages.mocap.fuse), which undistorts every keypoint of every camera each
step; ``Camera.undistort`` (OpenCV's iteration) is the reference and the fallback.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import cv2
import numpy as np

from .camera import Camera


class UndistortGrid:
    """``Camera.undistort`` of a pinhole camera by bilinear lookup: its exact inverse (OpenCV's
    iteration run to convergence) on a grid every ``step`` pixels over the frame and a margin, one
    table row of four float32 corner terms per cell. A few numpy calls for any number of points,
    where OpenCV's ten iterations cost 3.5 times as much (126 vs 36 us for 1,232 points, this
    machine); the world step undistorts every keypoint of every camera each step. Points off the
    grid (or not finite) go through ``Camera.undistort``. The coarsest of ``steps`` whose table is
    within ``tolerance_px`` of the exact inverse (checked at every cell's centre, where bilinear
    lookup is worst) is used; where none is, and for fisheye cameras, ``usable`` is False and the
    camera's own undistort applies. A 1080p camera of ordinary distortion: 8 px, 1 MB, ~20 ms to build."""

    def __init__(self, camera: Camera, steps: Sequence[int] = (8, 4), tolerance_px: float = 0.01) -> None:
        self.camera, self.usable, self.error_px = camera, False, math.inf
        if camera.fisheye:
            return
        focal = max(camera.matrix[0, 0], camera.matrix[1, 1])
        w, h = camera.size
        for step in steps:
            xs = np.arange(-2 * step, w + 3 * step, step, dtype=np.float64)
            ys = np.arange(-2 * step, h + 3 * step, step, dtype=np.float64)
            self.step, self.origin, self.nx, self.ny = step, (xs[0], ys[0]), len(xs), len(ys)
            nodes = _exact_undistort(camera, np.stack(np.meshgrid(xs, ys), axis=-1))  # (ny, nx, 2)
            a, b, c, d = nodes[:-1, :-1], nodes[:-1, 1:], nodes[1:, :-1], nodes[1:, 1:]
            # value = a + fx (b - a) + fy (c - a) + fx fy (d - b - c + a), x and y interleaved
            self.cells = np.ascontiguousarray(  # (8, cells): a row per term, for np.take's rows
                np.concatenate([a, b - a, c - a, d - b - c + a], axis=-1).reshape(-1, 8).T, np.float32)
            centres = np.stack(np.meshgrid(xs[:-1] + step / 2, ys[:-1] + step / 2), axis=-1).reshape(-1, 2)
            looked, _ = self._lookup(centres)
            self.error_px = float(np.abs(looked - _exact_undistort(camera, centres)).max() * focal)
            if self.error_px <= tolerance_px:
                self.usable = True
                return
        del self.cells

    def _lookup(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(N, 2) pixels -> (N, 2) normalised and (N,) which were off the grid (their rows are
        meaningless), None when none was."""
        return _lookup(self.cells, self.origin, self.step, self.nx, self.ny, flat)

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        """Pixels (..., 2) -> normalised image coordinates (..., 2), as ``Camera.undistort``."""
        if not self.usable:
            return self.camera.undistort(pixels)
        pixels = np.asarray(pixels, dtype=np.float64)
        flat = pixels.reshape(-1, 2)
        out, off = self._lookup(flat)
        if off is not None:
            out[off] = self.camera.undistort(flat[off])
        return out.reshape(pixels.shape)


def _exact_undistort(camera: Camera, pixels: np.ndarray) -> np.ndarray:
    """OpenCV's iterative inverse, the grid's reference: 25 fixed-point iterations where
    ``undistort`` runs ten (on this project's test lens, k1 = -0.12, ten are already 4e-10 px from
    200; at k1 = -0.3 they are 0.05 px off in the frame's corners, where the table is refused)."""
    flat = np.ascontiguousarray(pixels, dtype=np.float64).reshape(-1, 1, 2)
    criteria = (cv2.TERM_CRITERIA_COUNT, 25, 0)
    return cv2.undistortPoints(flat, camera.matrix, camera.dist, None, None, None, criteria).reshape(pixels.shape)


class GridSet:
    """The UndistortGrids of a step's cameras looked up in one pass: the tables of the cameras that
    share the most common grid step, padded to one size (NaN beyond a camera's own grid, so a point
    there goes to the exact inverse as any point off a grid does) and stacked; the other cameras
    (another step, no usable table) one by one. One pass over all keypoints costs a third of one per
    camera (the numpy calls, not the arithmetic, set the time at a few thousand points)."""

    def __init__(self, grids: Sequence[UndistortGrid]) -> None:
        self.grids = list(grids)
        steps = Counter(g.step for g in self.grids if g.usable)
        self.step = steps.most_common(1)[0][0] if steps else 0
        self.batched = [i for i, g in enumerate(self.grids) if g.usable and g.step == self.step]
        if not self.batched:
            return
        chosen = [self.grids[i] for i in self.batched]
        self.origin = chosen[0].origin  # (-2 step, -2 step) for every grid of this step
        self.nx, self.ny = max(g.nx for g in chosen), max(g.ny for g in chosen)
        cells = np.full((8, len(chosen), self.ny - 1, self.nx - 1), np.nan, np.float32)
        for c, g in enumerate(chosen):
            cells[:, c, :g.ny - 1, :g.nx - 1] = g.cells.reshape(8, g.ny - 1, g.nx - 1)
        self.cells = cells.reshape(8, -1)
        self.per_camera = (self.ny - 1) * (self.nx - 1)

    def __call__(self, pixels: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each camera's pixels (..., 2) -> its normalised image coordinates (..., 2), as
        ``Camera.undistort``."""
        out: list[np.ndarray | None] = [None] * len(self.grids)
        if self.batched:
            parts = [np.asarray(pixels[i]).reshape(-1, 2) for i in self.batched]
            flat = np.concatenate(parts).astype(np.float64, copy=False)  # (M, 2)
            base = np.repeat(np.arange(len(parts)) * self.per_camera, [len(p) for p in parts])  # (M,)
            values, off = _lookup(self.cells, self.origin, self.step, self.nx, self.ny, flat, base)
            off = np.isnan(values[:, 0]) if off is None else off | np.isnan(values[:, 0])
            start = 0
            for i, part in zip(self.batched, parts):
                piece = values[start:start + len(part)]
                miss = off[start:start + len(part)]
                if miss.any():
                    piece[miss] = self.grids[i].camera.undistort(part[miss].astype(np.float64))
                out[i] = piece.reshape(np.shape(pixels[i]))
                start += len(part)
        for i, grid in enumerate(self.grids):
            if out[i] is None:
                out[i] = grid(pixels[i])
        return out


def _lookup(cells: np.ndarray, origin: tuple[float, float], step: int, nx: int, ny: int, flat: np.ndarray,
            base: np.ndarray | int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """(N, 2) pixels -> (N, 2) normalised by bilinear lookup in ``cells`` ((8, M): columns of grids
    of nx x ny nodes, ``base`` the first column of each point's grid) and (N,) which were off the grid (their rows
    are meaningless), None when none was."""
    gx = (flat[:, 0] - origin[0]) * (1.0 / step)
    gy = (flat[:, 1] - origin[1]) * (1.0 / step)
    on = (gx >= 0) & (gy >= 0) & (gx < nx - 1) & (gy < ny - 1)  # False for NaN
    off = None if on.all() else ~on
    if off is not None:
        gx, gy = np.where(on, gx, 0.0), np.where(on, gy, 0.0)
    ix, iy = gx.astype(np.intp), gy.astype(np.intp)
    fx, fy = gx - ix, gy - iy
    index = iy * (nx - 1)
    index += ix
    index += base
    q = np.take(cells, index, axis=1).astype(np.float64)  # (8, N): take is ten times faster than cells[:, index]
    fxy = fx * fy
    out = np.empty(flat.shape)
    out[:, 0] = q[0] + fx * q[2] + fy * q[4] + fxy * q[6]
    out[:, 1] = q[1] + fx * q[3] + fy * q[5] + fxy * q[7]
    return out, off
