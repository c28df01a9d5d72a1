"""ChArUco calibration of a rig of cameras: board, detection, intrinsics, extrinsics.

``detect`` finds the board's inner corners in one image (OpenCV's CharucoDetector, sub-pixel).
``calibrate_intrinsics`` fits one camera's matrix and distortion (cv2.calibrateCamera, or
cv2.fisheye.calibrate for a fisheye lens) to the views where it saw the board. ``calibrate_rig``
places every camera: views with the same index across cameras are simultaneous; the board's pose
in each such view (solvePnP) gives the relative pose of each pair of cameras that share views,
chained from the reference camera (the first) over the cameras' sharing graph; then one joint
refinement (``calib_refine``) over all camera poses and all shared views' board poses minimises
the reprojection of every detected corner.

The world frame is the board in the first view the reference camera saw it: origin at the board's
first inner corner (id 0), x along the board's rows, z out of the printed face toward the cameras
(OpenCV's board frame with y and z flipped; right-handed), metres.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import cv2
import numpy as np

from . import DEFAULT_MIN_VIEWS
from .calib_refine import Observations, refine
from .camera import CalibrationError, Camera, Rig

log = logging.getLogger(__name__)

DICTIONARIES = tuple(sorted(name for name in dir(cv2.aruco) if name.startswith("DICT_")))
MIN_CORNERS = 6  # fewer corners of a view fit any pose (and are often nearly collinear): ignored
MAX_INTRINSIC_VIEWS = 60  # calibrateCamera's time grows with views; 60 spread over the take are plenty
# World axes from OpenCV's board frame (x right, y down the printed rows, z into the board).
FLIP = np.diag([1.0, -1.0, -1.0])


@dataclass(frozen=True)
class Board:
    """A ChArUco board: squares across (x) and down (y), square and marker side in metres, the ArUco
    dictionary's OpenCV name, and ``legacy`` for boards made by OpenCV before 4.6 with an even
    number of rows (their first square differs)."""

    squares_x: int
    squares_y: int
    square_m: float
    marker_m: float
    dictionary: str = "DICT_4X4_50"
    legacy: bool = False

    def __post_init__(self) -> None:
        if not all(isinstance(n, int) and n >= 3 for n in (self.squares_x, self.squares_y)):
            raise CalibrationError(f"board: needs at least 3x3 squares, got {self.squares_x}x{self.squares_y}")
        if not 0 < self.marker_m < self.square_m < np.inf:
            raise CalibrationError(f"board: the marker ({self.marker_m} m) must be smaller than the square "
                                   f"({self.square_m} m), both positive; measure them on the printed board")
        if self.dictionary not in DICTIONARIES:
            raise CalibrationError(f"board: unknown ArUco dictionary {self.dictionary!r}; use one of "
                                   f"{', '.join(DICTIONARIES)}")
        have = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary)).bytesList.shape[0]
        need = self.squares_x * self.squares_y // 2
        if need > have:
            raise CalibrationError(f"board: {self.squares_x}x{self.squares_y} squares hold {need} markers but "
                                   f"{self.dictionary} has {have}; use a larger dictionary")

    @cached_property
    def cv_board(self) -> cv2.aruco.CharucoBoard:
        dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, self.dictionary))
        board = cv2.aruco.CharucoBoard((self.squares_x, self.squares_y), self.square_m, self.marker_m, dictionary)
        board.setLegacyPattern(self.legacy)
        return board

    @cached_property
    def detector(self) -> cv2.aruco.CharucoDetector:
        return cv2.aruco.CharucoDetector(self.cv_board)

    @cached_property
    def corners(self) -> np.ndarray:
        """The inner corners in OpenCV's board frame (n, 3), metres, by id."""
        return np.asarray(self.cv_board.getChessboardCorners(), dtype=np.float64).reshape(-1, 3)

    def image(self, px_per_square: int) -> np.ndarray:
        """The board's picture (H, W) uint8 without margin: pixel centre (u, v) is board point
        ((u + 0.5) * s, (v + 0.5) * s) with s = square_m / px_per_square."""
        size = (self.squares_x * px_per_square, self.squares_y * px_per_square)
        return self.cv_board.generateImage(size, marginSize=0, borderBits=1)

    def describe(self) -> str:
        return (f"{self.squares_x}x{self.squares_y} squares of {self.square_m:g} m, markers {self.marker_m:g} m, "
                f"{self.dictionary}{' (legacy)' if self.legacy else ''}")


def parse_squares(text: str) -> tuple[int, int]:
    """``"5x7"`` -> (5, 7): squares across and down; CalibrationError for anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None or min(int(match.group(1)), int(match.group(2))) < 3:
        raise CalibrationError(f"board {text!r}: write the squares as COLUMNSxROWS, e.g. 5x7 (at least 3x3)")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class Detection:
    """The board corners found in one image: pixels (n, 2) float64 and their board ids (n,)."""

    corners: np.ndarray
    ids: np.ndarray

    def __post_init__(self) -> None:
        corners = np.asarray(self.corners, dtype=np.float64)
        ids = np.asarray(self.ids, dtype=np.int64).reshape(-1)
        if corners.shape != (ids.size, 2):
            raise ValueError(f"detection: expected corners ({ids.size}, 2), got {corners.shape}")
        object.__setattr__(self, "corners", corners)
        object.__setattr__(self, "ids", ids)

    def __len__(self) -> int:
        return self.ids.size

    @classmethod
    def empty(cls) -> Detection:
        return cls(np.zeros((0, 2)), np.zeros(0, dtype=np.int64))


def detect(board: Board, image: np.ndarray) -> Detection:
    """The board's inner corners in ``image`` ((H, W) grey or (H, W, 3)), sub-pixel; empty when not found."""
    grey = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    corners, ids, _, _ = board.detector.detectBoard(np.ascontiguousarray(grey))
    if ids is None or len(ids) == 0:
        return Detection.empty()
    return Detection(corners.reshape(-1, 2), ids.reshape(-1))


def _usable(board: Board, det: Detection | None, min_corners: int) -> bool:
    # Collinear corners (one row of the board) give no homography: calibrateCamera would fail.
    return (det is not None and len(det) >= min(min_corners, len(board.corners))
            and not board.cv_board.checkCharucoCornersCollinear(det.ids.astype(np.int32).reshape(-1, 1)))


@dataclass(frozen=True)
class IntrinsicFit:
    """One camera's intrinsics (posed at the origin), their RMS reprojection error and the views used."""

    camera: Camera
    error_px: float
    views: int


def calibrate_intrinsics(board: Board, detections: Sequence[Detection | None], size: tuple[int, int], *,
                         name: str, min_views: int = DEFAULT_MIN_VIEWS, min_corners: int = MIN_CORNERS,
                         max_views: int = MAX_INTRINSIC_VIEWS, fit_k3: bool = False,
                         fisheye: bool = False) -> IntrinsicFit:
    """Fit the matrix and distortion of camera ``name`` (image ``size`` = (w, h)) to its views with at
    least ``min_corners`` corners; CalibrationError when fewer than ``min_views``. Distortion is
    (k1, k2, p1, p2) as Pose2Sim writes it; ``fit_k3`` adds k3 (wide-angle lenses): with a dozen
    views of an ordinary lens k3 trades off against k2 and the focal length instead of helping.
    ``fisheye``: OpenCV's fisheye model (equidistant, k1..k4), for lenses of 120 degrees and more,
    where the pinhole's polynomial cannot follow the edges of the image; show such a lens the board
    near the edges and corners of its image too."""
    usable = [d for d in detections if _usable(board, d, min_corners)]
    if len(usable) < min_views:
        raise CalibrationError(
            f"camera {name!r}: the board was seen in {len(usable)} view(s) with at least {min_corners} corners, "
            f"its intrinsics need {min_views}; show it the board in more frames (near and far, tilted, over the "
            "whole image) or take its intrinsics from a calibration file")
    if len(usable) > max_views:  # evenly over the take: neighbouring frames add little
        usable = [usable[i] for i in np.linspace(0, len(usable) - 1, max_views).round().astype(int)]
    objects = [board.corners[d.ids].astype(np.float32) for d in usable]
    pixels = [d.corners.astype(np.float32) for d in usable]
    criteria = (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-10)
    try:
        if fisheye:  # (its own layout: (1, N, 3) and (1, N, 2) float64 per view)
            rms, matrix, dist, _, _ = cv2.fisheye.calibrate(
                [o.reshape(1, -1, 3).astype(np.float64) for o in objects],
                [p.reshape(1, -1, 2).astype(np.float64) for p in pixels], tuple(size), None, None,
                flags=cv2.CALIB_RECOMPUTE_EXTRINSIC | cv2.CALIB_FIX_SKEW, criteria=criteria)
        else:
            rms, matrix, dist, _, _ = cv2.calibrateCamera(objects, pixels, tuple(size), None, None,
                                                          flags=0 if fit_k3 else cv2.CALIB_FIX_K3, criteria=criteria)
    except cv2.error as exc:
        raise CalibrationError(f"camera {name!r}: OpenCV could not fit its {'fisheye ' if fisheye else ''}intrinsics "
                               f"({exc.err}); use views where more of the board is visible") from None
    if not np.isfinite(rms) or not np.isfinite(matrix).all() or not np.isfinite(dist).all():
        raise CalibrationError(f"camera {name!r}: its intrinsics fit diverged; use views where more of the board "
                               "is visible, spread over the whole image")
    dist = dist.reshape(-1)[: 5 if fit_k3 and not fisheye else 4]
    camera = Camera(name, (int(size[0]), int(size[1])), matrix, dist, np.zeros(3), np.zeros(3), fisheye)
    log.info("%s: %sintrinsics from %d views, RMS %.3f px, f=(%.1f, %.1f) c=(%.1f, %.1f)", name,
             "fisheye " if fisheye else "", len(usable), rms, matrix[0, 0], matrix[1, 1], matrix[0, 2], matrix[1, 2])
    return IntrinsicFit(camera, float(rms), len(usable))


@dataclass(frozen=True)
class RigCalibration:
    """A calibrated rig and, per camera: the RMS reprojection error (px) over its corners in the joint
    refinement, the shared views it was seen in, and its intrinsic fit's error and views (None where
    the intrinsics came from elsewhere); ``world_view``: the view whose board is the world frame."""

    rig: Rig
    error_px: dict[str, float]
    views: dict[str, int]
    intrinsic_error_px: dict[str, float | None]
    intrinsic_views: dict[str, int | None]
    world_view: int


def _pose(camera: Camera, board: Board, det: Detection) -> tuple[np.ndarray, np.ndarray]:
    """The board's pose (R (3, 3), t (3,)) in ``camera``'s frame from one detection (planar PnP on
    undistorted points: the same for pinhole and fisheye cameras)."""
    normalised = camera.undistort(det.corners)
    ok, rvec, tvec = cv2.solvePnP(board.corners[det.ids], normalised, np.eye(3), None, flags=cv2.SOLVEPNP_IPPE)
    assert ok, "IPPE failed on a usable (non-collinear) view"
    return cv2.Rodrigues(rvec)[0], tvec.reshape(3)


def _mean_rotation(rotations: list[np.ndarray]) -> np.ndarray:
    u, _, vt = np.linalg.svd(np.sum(rotations, axis=0))  # the chordal mean: nearest rotation to the sum
    return u @ np.diag([1.0, 1.0, np.linalg.det(u @ vt)]) @ vt


def _chain(names: list[str], poses: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]) -> \
        dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each camera's pose relative to camera 0 (R, t: reference frame -> camera frame), over a spanning
    tree of the sharing graph grown from camera 0 along the pairs with the most shared views; the
    cameras it cannot reach are absent."""
    by_view: dict[int, list[int]] = {}
    for c, v in poses:
        by_view.setdefault(v, []).append(c)
    shared: dict[tuple[int, int], list[int]] = {}
    for v, cams in by_view.items():
        for a in cams:
            for b in cams:
                if a != b:
                    shared.setdefault((a, b), []).append(v)
    placed = {0: (np.eye(3), np.zeros(3))}
    while True:
        edges = [(len(vs), a, b) for (a, b), vs in shared.items() if a in placed and b not in placed]
        if not edges:
            return placed
        _, a, b = max(edges)
        rel_r, rel_t = [], []
        for v in shared[(a, b)]:
            (ra, ta), (rb, tb) = poses[(a, v)], poses[(b, v)]
            r = rb @ ra.T  # camera a -> camera b through the board of view v
            rel_r.append(r)
            rel_t.append(tb - r @ ta)
        r_ab = _mean_rotation(rel_r)
        t_ab = np.median(rel_t, axis=0)
        r0, t0 = placed[a]
        placed[b] = (r_ab @ r0, r_ab @ t0 + t_ab)
        log.debug("placed %s from %s over %d shared views", names[b], names[a], len(rel_r))


def _intrinsics(board: Board, detections: Mapping[str, Sequence[Detection | None]],
                sizes: Mapping[str, tuple[int, int]], given: Mapping[str, Camera], min_views: int, min_corners: int,
                fit_k3: bool, fisheye: Collection[str]) -> tuple[list[Camera], dict[str, IntrinsicFit | None]]:
    """Each camera's intrinsics: given, or fitted; one CalibrationError naming every camera that
    saw the board too rarely."""
    for name, camera in given.items():
        if name in detections and tuple(camera.size) != tuple(sizes[name]):
            raise CalibrationError(f"camera {name!r}: its intrinsics are for {camera.size[0]}x{camera.size[1]} images "
                                   f"but its frames are {sizes[name][0]}x{sizes[name][1]}; calibrate it at this size")
    fits: dict[str, IntrinsicFit | None] = {}
    short: list[tuple[str, CalibrationError]] = []
    for name in detections:
        if name in given:
            fits[name] = None
            continue
        try:
            fits[name] = calibrate_intrinsics(board, detections[name], sizes[name], name=name, min_views=min_views,
                                              min_corners=min_corners, fit_k3=fit_k3, fisheye=name in fisheye)
        except CalibrationError as exc:
            short.append((name, exc))
    if len(short) == 1:
        raise short[0][1]
    if short:
        counts = ", ".join(f"{n!r} ({sum(_usable(board, d, min_corners) for d in detections[n])})" for n, _ in short)
        raise CalibrationError(f"cameras {counts} saw the board in too few views (at least {min_corners} corners); "
                               f"intrinsics need {min_views}: show them the board in more frames or take their "
                               "intrinsics from a calibration file")
    return [given[n] if fits[n] is None else fits[n].camera for n in detections], fits


def _placed(names: list[str], poses: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
            min_corners: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every camera's pose relative to the reference (``_chain``); CalibrationError naming a camera
    that never saw the board, or never at the same time as the others."""
    blind = [n for c, n in enumerate(names) if not any(k[0] == c for k in poses)]
    if blind:  # only where its intrinsics came from a file (else its fit failed before)
        raise CalibrationError(f"camera {blind[0]!r}: the board was found in none of its views (at least "
                               f"{min_corners} corners); it cannot be placed")
    placed = _chain(names, poses)
    lost = [n for c, n in enumerate(names) if c not in placed]
    if lost:
        seen = [n for c, n in enumerate(names) if c in placed]
        raise CalibrationError(
            f"camera{'s' if len(lost) > 1 else ''} {', '.join(map(repr, lost))} never saw the board at the same "
            f"time as {', '.join(map(repr, seen))} (not connected); record frames where the board is visible to "
            "it and at least one of those cameras at once")
    return placed


def _observations(board: Board, detections: list[Sequence[Detection | None]], views: list[int],
                  by_view: dict[int, list[int]]) -> Observations:
    """Every corner that a camera saw in one of ``views`` (numbered by their place in ``views``)."""
    cams, nums, points, pixels = [], [], [], []
    for i, v in enumerate(views):
        for c in by_view[v]:
            det = detections[c][v]
            cams.append(np.full(len(det), c))
            nums.append(np.full(len(det), i))
            points.append(board.corners[det.ids])
            pixels.append(det.corners)
    return Observations(np.concatenate(cams), np.concatenate(nums), np.concatenate(points), np.concatenate(pixels))


def calibrate_rig(board: Board, detections: Mapping[str, Sequence[Detection | None]],
                  sizes: Mapping[str, tuple[int, int]], *, intrinsics: Mapping[str, Camera] | None = None,
                  refine_intrinsics: bool = False, min_views: int = DEFAULT_MIN_VIEWS,
                  min_corners: int = MIN_CORNERS, fit_k3: bool = False, fisheye: Collection[str] = (),
                  loss: str = "soft_l1", f_scale_px: float = 1.0) -> RigCalibration:
    """Calibrate the cameras named by ``detections`` (camera -> its detections by view index; the same
    index across cameras is the same moment; the first camera is the reference) with images of
    ``sizes``; ``intrinsics`` (camera -> Camera) replaces the intrinsic fit of the cameras it names;
    the cameras named in ``fisheye`` are fitted with the fisheye model. CalibrationError names a
    camera with too few views or one that never shares a view."""
    names = list(detections)
    unknown = sorted(set(fisheye) - set(names))
    if unknown:
        raise CalibrationError(f"fisheye: no camera {unknown[0]!r} in this rig ({', '.join(names)})")
    fixed = sorted(set(fisheye) & set(intrinsics or {}))
    if fixed:
        raise CalibrationError(f"camera {fixed[0]!r}: its intrinsics come from a file, lens model included; "
                               "fit them here to choose the fisheye model")
    if len(names) < 2:
        raise CalibrationError(f"calibration needs at least two cameras, got {len(names)}")
    if not any(_usable(board, d, min_corners) for name in names for d in detections[name]):
        raise CalibrationError(f"the board ({board.describe()}) was found in no view of {', '.join(names)}; "
                               "check the board's squares, dictionary and legacy pattern, and the lighting")
    cams, fits = _intrinsics(board, detections, sizes, dict(intrinsics or {}), min_views, min_corners, fit_k3,
                             fisheye)
    per_camera = [detections[n] for n in names]
    poses = {(c, v): _pose(cams[c], board, det) for c in range(len(names)) for v, det in enumerate(per_camera[c])
             if _usable(board, det, min_corners)}  # the board in camera c's frame in view v
    placed = _placed(names, poses, min_corners)

    # The views of the refinement: every view that two or more cameras saw, and the world's view.
    by_view: dict[int, list[int]] = {}
    for c, v in poses:
        by_view.setdefault(v, []).append(c)
    world_view = min(v for c, v in poses if c == 0)
    views = sorted(v for v, cs in by_view.items() if len(cs) > 1 or v == world_view)
    init = []
    for v in views:
        c = max(by_view[v], key=lambda c: len(per_camera[c][v]))  # the camera that saw most of it
        (rb, tb), (rc, tc) = poses[(c, v)], placed[c]
        init.append(np.concatenate([cv2.Rodrigues(rc.T @ rb)[0].reshape(3), rc.T @ (tb - tc)]))  # board -> reference
    posed = [cams[c].with_pose(cv2.Rodrigues(placed[c][0])[0].reshape(3), placed[c][1]) for c in range(len(names))]
    obs = _observations(board, per_camera, views, by_view)
    result = refine(posed, np.asarray(init), obs, refine_intrinsics=refine_intrinsics, loss=loss,
                    f_scale_px=f_scale_px)

    # Place the world: x_ref = R_w (FLIP X_world + o) + t_w, o the first corner in the board frame.
    rw = cv2.Rodrigues(result.views[views.index(world_view), :3])[0]
    tw = result.views[views.index(world_view), 3:] + rw @ board.corners[0]
    rw = rw @ FLIP
    cameras: dict[str, Camera] = {}
    errors: dict[str, float] = {}
    used: dict[str, int] = {}
    for c, (name, camera) in enumerate(zip(names, result.cameras)):
        cameras[name] = camera.with_pose(cv2.Rodrigues(camera.rotation @ rw)[0].reshape(3),
                                         camera.rotation @ tw + camera.tvec)
        mask = obs.camera == c
        errors[name] = float(np.sqrt(np.mean(np.sum(result.residuals[mask] ** 2, axis=1))))
        used[name] = len(set(obs.view[mask].tolist()))
    rig = Rig(cameras, {"board": board.describe(), "reference": names[0]})
    return RigCalibration(rig, errors, used, {n: f.error_px if f else None for n, f in fits.items()},
                          {n: f.views if f else None for n, f in fits.items()}, world_view)
