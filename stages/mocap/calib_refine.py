"""The joint refinement of a ChArUco rig calibration (bundle adjustment over cameras and board views).

Every detected corner of every shared view is one observation: the board point X (board
coordinates, metres) of view v seen by camera c at pixel p. The model is
``p ~ project_c(R_c (R_v X + t_v) + t_c)``: the board pose (R_v, t_v) in the reference camera's
frame, then the pose of camera c relative to the reference. The reference camera's pose is the
identity and stays fixed: that fixes the gauge (the world frame is placed afterwards). The board's
square length fixes the scale, so intrinsics can be refined too. scipy's ``least_squares`` minimises
the reprojection in pixels with a robust loss (a few bad corners must not pull the rig); its Jacobian
is taken by finite differences in groups, as a residual depends on one camera and one view only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.sparse import coo_matrix, csr_matrix

from .camera import Camera

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observations:
    """Detected board corners: camera index (M,), view index (M,), board point (M, 3), pixel (M, 2)."""

    camera: np.ndarray
    view: np.ndarray
    board: np.ndarray
    pixel: np.ndarray

    def __post_init__(self) -> None:
        m = len(self.camera)
        shapes = {"camera": (m,), "view": (m,), "board": (m, 3), "pixel": (m, 2)}
        for key, shape in shapes.items():
            if np.shape(getattr(self, key)) != shape:
                raise ValueError(f"observations: {key} expected {shape}, got {np.shape(getattr(self, key))}")

    def __len__(self) -> int:
        return len(self.camera)


def rodrigues(rvecs: np.ndarray) -> np.ndarray:
    """Rotation vectors (K, 3) -> rotation matrices (K, 3, 3), vectorised (cv2.Rodrigues is one at a time)."""
    rvecs = np.asarray(rvecs, dtype=np.float64).reshape(-1, 3)
    theta = np.linalg.norm(rvecs, axis=1)  # (K,)
    small = theta < 1e-12
    axis = rvecs / np.where(small, 1.0, theta)[:, None]
    kx, ky, kz = axis.T
    zero = np.zeros_like(kx)
    cross = np.stack([zero, -kz, ky, kz, zero, -kx, -ky, kx, zero], axis=1).reshape(-1, 3, 3)  # (K, 3, 3)
    sin, cos = np.sin(theta)[:, None, None], np.cos(theta)[:, None, None]
    rot = np.eye(3) + sin * cross + (1 - cos) * (cross @ cross)
    rot[small] = np.eye(3)
    return rot


def _intrinsic_layout(cameras: list[Camera]) -> list[int]:
    """How many intrinsic parameters each camera refines: fx, fy, cx, cy and up to 5 distortion
    coefficients (higher rational/prism terms of a file's camera stay as they are)."""
    return [4 + min(camera.dist.size, 5) for camera in cameras]


def _with_intrinsics(camera: Camera, values: np.ndarray) -> Camera:
    k = camera.matrix.copy()
    k[0, 0], k[1, 1], k[0, 2], k[1, 2] = values[:4]
    dist = camera.dist.copy()
    dist[: values.size - 4] = values[4:]
    # A camera at the origin: points are already in its frame, so project() only applies intrinsics.
    return Camera(camera.name, camera.size, k, dist, np.zeros(3), np.zeros(3), camera.fisheye)


def _at_origin(camera: Camera) -> Camera:
    return Camera(camera.name, camera.size, camera.matrix, camera.dist, np.zeros(3), np.zeros(3), camera.fisheye)


def _groups(obs: Observations, n_cams: int, n_views: int, n_intr: list[int], intr_start: np.ndarray) -> \
        list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Finite-difference groups: parameters that no residual shares, so one evaluation perturbs them
    all. Each is (parameters (P,), observations (K,) it moves, the parameter of each (K,)): the k-th
    pose parameter of every view; of every moving camera; the k-th intrinsic of every camera."""
    m = np.arange(len(obs))
    view_base, groups = 6 * (n_cams - 1), []
    for k in range(6):
        groups.append((view_base + 6 * np.arange(n_views) + k, m, view_base + 6 * obs.view + k))
    moving = m[obs.camera > 0]
    for k in range(6):
        if n_cams > 1:
            groups.append((6 * np.arange(n_cams - 1) + k, moving, 6 * (obs.camera[moving] - 1) + k))
    for k in range(max(n_intr)):
        cams = np.array([c for c in range(n_cams) if n_intr[c] > k], dtype=int)
        rows = m[np.isin(obs.camera, cams)]
        groups.append((intr_start[cams] + k, rows, intr_start[obs.camera[rows]] + k))
    return groups


def _jacobian(fun: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
              groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n: int) -> csr_matrix:
    """Forward differences by group (a residual pair depends on one camera and one view only):
    at most 6 + 6 + 9 evaluations whatever the number of views."""
    f0 = fun(x).reshape(-1, 2)
    rows, cols, values = [], [], []
    for params, obs_rows, obs_cols in groups:
        step = np.sqrt(np.finfo(float).eps) * np.maximum(1.0, np.abs(x[params]))
        x1 = x.copy()
        x1[params] += step
        h = np.zeros(n)
        h[params] = x1[params] - x[params]  # the step as represented
        d = (fun(x1).reshape(-1, 2)[obs_rows] - f0[obs_rows]) / h[obs_cols][:, None]  # (K, 2)
        rows += [2 * obs_rows, 2 * obs_rows + 1]
        cols += [obs_cols, obs_cols]
        values += [d[:, 0], d[:, 1]]
    rows, cols, values = np.concatenate(rows), np.concatenate(cols), np.concatenate(values)
    return coo_matrix((values, (rows, cols)), shape=(f0.size, n)).tocsr()


@dataclass(frozen=True)
class Refined:
    """The refinement's result: each camera (intrinsics possibly refined) posed relative to the
    reference camera, each view's board pose (V, 6) [rvec, tvec] in the reference frame, and each
    observation's residual (M, 2) in pixels."""

    cameras: list[Camera]
    views: np.ndarray
    residuals: np.ndarray


def refine(cameras: list[Camera], views: np.ndarray, obs: Observations, *, refine_intrinsics: bool = False,
           loss: str = "soft_l1", f_scale_px: float = 1.0, max_nfev: int | None = None) -> Refined:
    """Jointly refine the poses of cameras 1.. (camera 0 is the reference, fixed at the identity;
    the others' rvec/tvec are their poses relative to it) and of every view's board (V, 6), and the
    intrinsics with ``refine_intrinsics``, minimising the robust reprojection error of ``obs``."""
    n_cams, n_views = len(cameras), len(views)
    n_intr = _intrinsic_layout(cameras) if refine_intrinsics else [0] * n_cams
    intr_start = np.concatenate([[0], np.cumsum(n_intr)])[:-1] + 6 * (n_cams - 1) + 6 * n_views
    x0 = [np.concatenate([c.rvec, c.tvec]) for c in cameras[1:]] + [views.reshape(-1)]
    for camera, n in zip(cameras, n_intr):
        if n:
            x0.append(np.concatenate([[camera.matrix[0, 0], camera.matrix[1, 1], camera.matrix[0, 2],
                                       camera.matrix[1, 2]], camera.dist[: n - 4]]))
    x0 = np.concatenate(x0)
    fixed = [_at_origin(c) for c in cameras]
    masks = [obs.camera == c for c in range(n_cams)]

    def unpack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[Camera]]:
        poses = np.vstack([np.zeros(6), x[: 6 * (n_cams - 1)].reshape(-1, 6)])  # (C, 6)
        board = x[6 * (n_cams - 1): 6 * (n_cams - 1) + 6 * n_views].reshape(-1, 6)  # (V, 6)
        intr = [_with_intrinsics(c, x[s: s + n]) if n else f for c, f, s, n in zip(cameras, fixed, intr_start, n_intr)]
        return poses, board, intr

    def residuals(x: np.ndarray) -> np.ndarray:
        poses, board, intr = unpack(x)
        rv, rc = rodrigues(board[:, :3]), rodrigues(poses[:, :3])
        ref = np.einsum("mij,mj->mi", rv[obs.view], obs.board) + board[obs.view, 3:]  # (M, 3) reference frame
        cam = np.einsum("mij,mj->mi", rc[obs.camera], ref) + poses[obs.camera, 3:]  # (M, 3) camera frames
        out = np.empty_like(obs.pixel)
        for c, mask in enumerate(masks):
            out[mask] = intr[c].project(cam[mask])[0]
        return (out - obs.pixel).reshape(-1)

    groups = _groups(obs, n_cams, n_views, n_intr, intr_start)
    before = float(np.sqrt(np.mean(residuals(x0) ** 2) * 2))
    # Tight tolerances for the iterative (lsmr) trust-region steps: with the intrinsics free the
    # problem is ill-conditioned, and lsmr's defaults took 7x the iterations (measured 176 vs 24).
    # (The exact solver's dense SVDs are slower still on a shared machine: multithreaded BLAS.)
    result = least_squares(residuals, x0, jac=lambda x: _jacobian(residuals, x, groups, x0.size), loss=loss,
                           f_scale=f_scale_px, x_scale="jac", method="trf", tr_solver="lsmr",
                           tr_options={"atol": 1e-12, "btol": 1e-12}, max_nfev=max_nfev)
    poses, board, intr = unpack(result.x)
    posed = [Camera(c.name, c.size, i.matrix, i.dist, p[:3], p[3:], c.fisheye) for c, i, p in zip(cameras, intr, poses)]
    res = result.fun.reshape(-1, 2)
    log.info("joint refinement: %d corners, %d cameras, %d views: RMS %.3f -> %.3f px (%d evaluations, %s)",
             len(obs), n_cams, n_views, before, float(np.sqrt(np.mean(np.sum(res ** 2, axis=1)))), result.nfev,
             result.message)
    return Refined(posed, board, res)
