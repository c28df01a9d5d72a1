"""Calibrated cameras: the pinhole (or fisheye) model, projection, undistortion and the rig file.

A camera maps a world point X (metres) to its frame as x_cam = R X + t (R from the Rodrigues
vector ``rvec``), then through OpenCV's distortion model and the matrix K to pixels; the same
convention as OpenCV, Pose2Sim and aniposelib. ``project`` is plain numpy (vectorised over any
number of points, no per-point OpenCV call); ``undistort`` uses OpenCV's iterative inverse and
returns normalised image coordinates (x/z, y/z), the input of triangulation.

The rig file is TOML, one table per camera with the keys Pose2Sim and aniposelib write and read
(``name``, ``size`` = [width, height], ``matrix``, ``distortions``, ``rotation``, ``translation``,
``fisheye``) and a ``[metadata]`` table; ``read_rig`` takes either tool's file as is. Our files
add ``units = "m"`` to the metadata; a file that names ``mm`` or ``cm`` is scaled to metres on
reading (aniposelib's translations are in the board's units, often mm: say so with ``units``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import tomllib

from stages.errors import ConfigError

UNITS = {"m": 1.0, "cm": 0.01, "mm": 0.001}
_DIST_SIZES = (4, 5, 8, 12, 14)  # what OpenCV's pinhole model accepts; fisheye takes exactly 4


class CalibrationError(ConfigError):
    """A calibration file or a calibration that cannot be used; the message names the file and camera."""


@dataclass(frozen=True, eq=False)
class Camera:
    """One calibrated camera. size: (width, height) pixels; matrix (3, 3); dist (n,) OpenCV
    coefficients (k1, k2, p1, p2[, k3...]; fisheye: k1..k4); rvec, tvec (3,): world -> camera."""

    name: str
    size: tuple[int, int]
    matrix: np.ndarray
    dist: np.ndarray
    rvec: np.ndarray
    tvec: np.ndarray
    fisheye: bool = False
    rotation: np.ndarray = field(init=False, repr=False)  # (3, 3) from rvec
    extrinsic: np.ndarray = field(init=False, repr=False)  # (3, 4) [R | t]

    def __post_init__(self) -> None:
        for key, value, shape in (("matrix", self.matrix, (3, 3)), ("rvec", self.rvec, (3,)),
                                  ("tvec", self.tvec, (3,))):
            array = np.asarray(value, dtype=np.float64)
            if array.shape != shape or not np.isfinite(array).all():
                raise CalibrationError(f"camera {self.name!r}: {key} must be {shape} finite numbers, got "
                                       f"{np.shape(value)}")
            object.__setattr__(self, key, array)
        dist = np.asarray(self.dist, dtype=np.float64).reshape(-1)
        sizes = (4,) if self.fisheye else _DIST_SIZES
        if dist.size == 0:
            dist = np.zeros(4)
        if dist.size not in sizes or not np.isfinite(dist).all():
            raise CalibrationError(f"camera {self.name!r}: distortions must be {' or '.join(map(str, sizes))} "
                                   f"finite numbers, got {dist.size}")
        object.__setattr__(self, "dist", dist)
        k = self.matrix
        if not (k[0, 0] > 0 and k[1, 1] > 0 and k[2, 2] == 1 and k[1, 0] == k[2, 0] == k[2, 1] == 0):
            raise CalibrationError(f"camera {self.name!r}: matrix must be [[fx, s, cx], [0, fy, cy], [0, 0, 1]] "
                                   f"with fx, fy > 0, got {k.tolist()}")
        w, h = self.size
        if not (isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0):
            raise CalibrationError(f"camera {self.name!r}: size must be [width, height] in pixels, got {self.size}")
        rotation = cv2.Rodrigues(self.rvec)[0]
        object.__setattr__(self, "rotation", rotation)
        object.__setattr__(self, "extrinsic", np.hstack([rotation, self.tvec[:, None]]))

    @property
    def centre(self) -> np.ndarray:
        """The camera's optical centre in world coordinates (3,)."""
        return -self.rotation.T @ self.tvec

    def to_camera(self, points: np.ndarray) -> np.ndarray:
        """World points (..., 3) -> camera coordinates (..., 3)."""
        return points @ self.rotation.T + self.tvec

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World points (..., 3) -> pixels (..., 2) with distortion, and (...,) whether each point is in
        front of the camera (z > 0); pixels of points behind it are meaningless."""
        cam = self.to_camera(np.asarray(points, dtype=np.float64))
        z = cam[..., 2]
        front = z > 1e-9
        safe = np.where(front, z, 1.0)
        x, y = cam[..., 0] / safe, cam[..., 1] / safe
        xd, yd = self._distort(x, y)
        k = self.matrix
        u = k[0, 0] * xd + k[0, 1] * yd + k[0, 2]
        v = k[1, 1] * yd + k[1, 2]
        return np.stack([u, v], axis=-1), front

    def _distort(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = self.dist
        if self.fisheye:
            r = np.sqrt(x * x + y * y)
            theta = np.arctan(r)
            t2 = theta * theta
            theta_d = theta * (1 + t2 * (d[0] + t2 * (d[1] + t2 * (d[2] + t2 * d[3]))))
            scale = np.where(r > 1e-12, theta_d / np.maximum(r, 1e-12), 1.0)
            return x * scale, y * scale
        k1, k2, p1, p2 = d[:4]
        k3 = d[4] if d.size > 4 else 0.0
        k4, k5, k6 = (d[5], d[6], d[7]) if d.size > 7 else (0.0, 0.0, 0.0)
        r2 = x * x + y * y
        radial = (1 + r2 * (k1 + r2 * (k2 + r2 * k3))) / (1 + r2 * (k4 + r2 * (k5 + r2 * k6)))
        xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
        yd = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
        if d.size > 8:  # thin prism (s1..s4); the tilt terms (14 coefficients) are left to OpenCV
            s = d[8:12]
            xd = xd + s[0] * r2 + s[1] * r2 * r2
            yd = yd + s[2] * r2 + s[3] * r2 * r2
        return xd, yd

    def undistort(self, pixels: np.ndarray) -> np.ndarray:
        """Pixels (..., 2) -> normalised image coordinates (..., 2) (OpenCV's iterative inverse)."""
        pixels = np.asarray(pixels, dtype=np.float64)
        flat = pixels.reshape(-1, 1, 2)
        if flat.shape[0] == 0:
            return np.zeros(pixels.shape, dtype=np.float64)
        if self.fisheye:
            out = cv2.fisheye.undistortPoints(flat, self.matrix, self.dist)
        else:
            # Ten fixed-point iterations: 3e-5 px from exact at k1 = -0.3 (OpenCV's default five leave
            # 0.05 px there); an EPS criterion would reproject every iteration, at three times the cost.
            out = cv2.undistortPoints(flat, self.matrix, self.dist, None, None, None, (cv2.TERM_CRITERIA_COUNT, 10, 0))
        return out.reshape(pixels.shape)

    def rescaled(self, size: tuple[int, int]) -> Camera:
        """The same camera for its frames resized to ``size`` (width, height): the matrix scaled per
        axis about the pixel centres (x' = (x + 0.5) s - 0.5, as a resize maps them); the distortion
        (of normalised coordinates) and the pose are unchanged. Only a resize of the whole frame is
        this: a crop or another sensor mode (another aspect) is not (``same_aspect``)."""
        sx, sy = size[0] / self.size[0], size[1] / self.size[1]
        k = self.matrix.copy()
        k[0, 0], k[0, 1], k[0, 2] = k[0, 0] * sx, k[0, 1] * sx, (k[0, 2] + 0.5) * sx - 0.5
        k[1, 1], k[1, 2] = k[1, 1] * sy, (k[1, 2] + 0.5) * sy - 0.5
        return Camera(self.name, (int(size[0]), int(size[1])), k, self.dist, self.rvec, self.tvec, self.fisheye)

    def with_pose(self, rvec: np.ndarray, tvec: np.ndarray) -> Camera:
        """The same intrinsics at another pose."""
        return Camera(self.name, self.size, self.matrix, self.dist, rvec, tvec, self.fisheye)


def same_aspect(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether frames of size ``b`` (width, height) can be a resize of frames of size ``a``: each side
    within a pixel of the other scaled by the same factor (1280x720 and 854x480 are; 640x480 is not)."""
    (wa, ha), (wb, hb) = a, b
    return abs(wb - wa * hb / ha) <= 1 or abs(hb - ha * wb / wa) <= 1


class CameraSet:
    """Several cameras projecting the same points at once: one GEMM for all their rotations and the
    distortion over (C, N) arrays, one contiguous row per camera, each camera's coefficients broadcast
    down its row (pinhole cameras with up to 8 coefficients; the others one by one). An (N, C) layout
    broadcasts a (C,) row into every element and costs numpy three to four times as much. Points in
    float32 are projected in float32 (twice as fast; 1e-4 px off at 1080p, for checks far coarser)."""

    def __init__(self, cameras: Sequence[Camera]) -> None:
        self.cameras = list(cameras)
        c = len(self.cameras)
        self.rotations = np.concatenate([cam.rotation for cam in self.cameras]) if c else np.zeros((0, 3))  # (3C, 3)
        self.translations = (np.concatenate([cam.tvec for cam in self.cameras]) if c else np.zeros(0))[:, None]
        self.batched = [i for i, cam in enumerate(self.cameras) if not cam.fisheye and cam.dist.size <= 8]
        dist = np.zeros((c, 8))
        for i in self.batched:
            dist[i, :self.cameras[i].dist.size] = self.cameras[i].dist
        self.dist = dist.T[:, :, None]  # (8, C, 1)
        self.rational = bool(dist[:, 5:].any())  # k4..k6: a division more per point
        self.k = np.array([[cam.matrix[0, 0], cam.matrix[0, 1], cam.matrix[0, 2], cam.matrix[1, 1], cam.matrix[1, 2]]
                           for cam in self.cameras]).reshape(c, 5).T[:, :, None]  # (5, C, 1)
        self.skew = bool(self.k[1].any())
        self._single = tuple(a.astype(np.float32) for a in (self.rotations, self.translations, self.dist, self.k))
        self._cache: dict[str, Any] = {}

    def cached(self, key: str, make: Callable[[], Any]) -> Any:
        """What ``make`` returns, made once per set (e.g. the triangulation's constant matrices)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World points (N, 3) -> pixels (N, C, 2) in every camera and in_front (N, C)."""
        u, v, front = self.project_rows(points.T)
        return np.stack([u.T, v.T], axis=-1), np.ascontiguousarray(front.T)

    def project_rows(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """World points (3, N) -> u, v and in_front (C, N) in every camera: one row per camera."""
        n, c = points.shape[1], len(self.cameras)
        cam = (self.rotations @ points + self.translations).reshape(c, 3, n)  # (C, 3, N)
        return self._pixels(cam, np.broadcast_to(points, (c, 3, n)))

    def project_each(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Points (C, 3, N), row c for camera c only (e.g. each view's point as the other views place
        it) -> u, v and in_front (C, N) in that camera, and the points in its coordinates (C, 3, N)."""
        c = len(self.cameras)
        rotations, translations = (self._single[:2] if points.dtype == np.float32 else
                                   (self.rotations, self.translations))
        cam = rotations.reshape(c, 3, 3) @ points  # (C, 3, N)
        cam += translations.reshape(c, 3, 1)
        return (*self._pixels(cam, points), cam)

    def _pixels(self, cam: np.ndarray, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Camera coordinates (C, 3, N) of world points (C, 3, N) -> u, v and in_front (C, N): the
        batched cameras' distortion and matrix over whole rows, the others' one by one. In place where
        it can be (a temporary fewer is a few microseconds fewer at these sizes)."""
        z = cam[:, 2]
        front = z > 1e-9
        inverse = np.where(front, z, 1.0)
        np.divide(1.0, inverse, out=inverse)
        x, y = cam[:, 0] * inverse, cam[:, 1] * inverse  # (C, N)
        single = cam.dtype == np.float32
        k1, k2, p1, p2, k3, k4, k5, k6 = self._single[2] if single else self.dist
        xx, yy, xy = x * x, y * y, x * y
        r2 = xx + yy
        radial = r2 * k3
        radial += k2
        radial *= r2
        radial += k1
        radial *= r2
        radial += 1.0
        if self.rational:
            below = r2 * k6
            below += k5
            below *= r2
            below += k4
            below *= r2
            below += 1.0
            radial /= below
        # xd = x radial + 2 p1 x y + p2 (r2 + 2 x^2), yd = y radial + p1 (r2 + 2 y^2) + 2 p2 x y
        xx *= 2.0
        xx += r2
        xx *= p2
        yy *= 2.0
        yy += r2
        yy *= p1
        x *= radial
        x += xx
        y *= radial
        y += yy
        xy *= 2.0
        xd, yd = x, y
        xd += p1 * xy
        xy *= p2
        yd += xy
        fx, s, cx, fy, cy = self._single[3] if single else self.k
        u = xd * fx
        if self.skew:
            u += s * yd
        u += cx
        yd *= fy
        yd += cy
        v = yd
        for i, camera in enumerate(self.cameras):
            if i not in self.batched:
                pixels, front[i] = camera.project(points[i].T)
                u[i], v[i] = pixels[:, 0], pixels[:, 1]
        return u, v, front


@dataclass(frozen=True)
class Rig:
    """The calibrated cameras of one capture volume, by name, in file order."""

    cameras: dict[str, Camera]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.cameras) < 2:
            raise CalibrationError(f"a rig needs at least two cameras, got {len(self.cameras)}")

    @property
    def names(self) -> list[str]:
        return list(self.cameras)

    def __getitem__(self, name: str) -> Camera:
        return self.cameras[name]

    def check_sources(self, source_ids: Iterable[str], path: str | Path = "the calibration") -> None:
        """CalibrationError naming every source without a camera of that name (and the names the
        file has): a triangulation cannot use a view whose camera it does not know."""
        missing = [sid for sid in source_ids if sid not in self.cameras]
        if missing:
            raise CalibrationError(f"{path} has no camera named {', '.join(map(repr, missing))} (it has "
                                   f"{', '.join(map(repr, self.cameras))}); name the sources as the cameras, "
                                   "e.g. --source cam1=video1.mp4")


def _numbers(value: Any, where: str, key: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise CalibrationError(f"{where}: {key} must be numbers, got {value!r:.60}") from None
    return array


def camera_from_table(table: Mapping[str, Any], section: str, where: str, scale: float = 1.0) -> Camera:
    """A Camera from one TOML table of Pose2Sim's or aniposelib's format."""
    missing = [k for k in ("size", "matrix", "rotation", "translation") if k not in table]
    if missing:
        raise CalibrationError(f"{where}: camera [{section}] lacks {', '.join(missing)}")
    name = table.get("name", section)
    if not isinstance(name, str) or not name:
        raise CalibrationError(f"{where}: camera [{section}] has a name that is not a string: {name!r:.40}")
    size = _numbers(table["size"], where, f"[{section}] size")
    if size.shape != (2,) or not np.all(size == np.round(size)) or not np.all(size > 0):
        raise CalibrationError(f"{where}: [{section}] size must be [width, height] in pixels, got "
                               f"{table['size']!r:.60}")
    rotation = _numbers(table["rotation"], where, f"[{section}] rotation")
    if rotation.shape == (3, 3):  # some tools write the matrix instead of the Rodrigues vector
        rotation = cv2.Rodrigues(rotation)[0].reshape(3)
    translation = _numbers(table["translation"], where, f"[{section}] translation") * scale
    fisheye = table.get("fisheye", False)
    if not isinstance(fisheye, bool):
        raise CalibrationError(f"{where}: [{section}] fisheye must be true or false, got {fisheye!r:.20}")
    try:
        return Camera(name, (int(size[0]), int(size[1])), _numbers(table["matrix"], where, "matrix"),
                      _numbers(table.get("distortions", []), where, "distortions"), rotation.reshape(-1),
                      translation.reshape(-1), fisheye)
    except CalibrationError as exc:
        raise CalibrationError(f"{where}: {exc}") from None


def read_rig(path: str | Path) -> Rig:
    """Read a rig file (ours, Pose2Sim's or aniposelib's TOML); CalibrationError names what is wrong."""
    path = Path(path)
    where = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CalibrationError(f"calibration file {where} does not exist; make one with 'sapiens2-stream "
                               "calibrate' or pass a Pose2Sim/aniposelib .toml") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CalibrationError(f"calibration file {where} cannot be read as TOML: {exc}") from None
    metadata = data.get("metadata", {})
    if not isinstance(metadata, dict):
        metadata = {}
    units = metadata.get("units", "m")
    if units not in UNITS:
        raise CalibrationError(f"{where}: metadata units must be one of {', '.join(UNITS)}, got {units!r:.20}")
    cameras: dict[str, Camera] = {}
    for section, table in data.items():
        if section == "metadata" or not isinstance(table, dict) or "matrix" not in table:
            continue
        camera = camera_from_table(table, section, where, UNITS[units])
        if camera.name in cameras:
            raise CalibrationError(f"{where}: two cameras are named {camera.name!r}")
        cameras[camera.name] = camera
    if len(cameras) < 2:
        raise CalibrationError(f"{where} describes {len(cameras)} camera(s); triangulation needs at least two "
                               "(tables with name, size, matrix, distortions, rotation, translation)")
    return Rig(cameras, {**metadata, "units": "m"})


def rig_tables(rig: Rig, errors_px: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The TOML document of a rig (sections ``cam_01``... as Pose2Sim writes them), with each camera's
    reprojection error in the metadata when given."""
    doc: dict[str, Any] = {}
    for i, camera in enumerate(rig.cameras.values(), start=1):
        doc[f"cam_{i:02d}"] = {
            "name": camera.name, "size": [float(camera.size[0]), float(camera.size[1])],
            "matrix": camera.matrix.tolist(), "distortions": camera.dist.tolist(),
            "rotation": camera.rvec.tolist(), "translation": camera.tvec.tolist(), "fisheye": camera.fisheye,
        }
    meta = {k: v for k, v in rig.metadata.items() if isinstance(v, str | int | float | bool)}
    meta.update(adjusted=False, units="m")
    if errors_px:
        meta["error"] = float(max(errors_px.values()))
        meta["reprojection_error_px"] = {name: float(e) for name, e in errors_px.items()}
    doc["metadata"] = meta
    return doc


def write_rig(rig: Rig, path: str | Path, errors_px: Mapping[str, float] | None = None,
              overwrite: bool = False) -> None:
    """Write a rig file; an existing file is kept unless ``overwrite`` (a calibration is hours of work)."""
    import tomli_w

    path = Path(path)
    text = tomli_w.dumps(rig_tables(rig, errors_px))
    if path.exists() and not overwrite:
        raise CalibrationError(f"{path} exists; pass --overwrite to replace it, or write elsewhere")
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def look_at(eye: Iterable[float], target: Iterable[float], up: Iterable[float] = (0.0, 0.0, 1.0)) -> \
        tuple[np.ndarray, np.ndarray]:
    """(rvec, tvec) of a camera at ``eye`` looking at ``target`` with the image's up along ``up``
    (OpenCV axes: x right, y down, z forward). For synthetic rigs and tests."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    z = target - eye
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:
        raise ValueError("up is parallel to the viewing direction")
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    rotation = np.stack([x, y, z])
    return cv2.Rodrigues(rotation)[0].reshape(3), -rotation @ eye


def horizontal_fov_matrix(width: int, height: int, fov_deg: float) -> np.ndarray:
    """A pinhole matrix with square pixels and the principal point at the centre."""
    f = width / 2 / math.tan(math.radians(fov_deg) / 2)
    return np.array([[f, 0, (width - 1) / 2], [0, f, (height - 1) / 2], [0, 0, 1]], dtype=np.float64)
