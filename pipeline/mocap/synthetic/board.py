"""Rendered ChArUco views through virtual cameras of KNOWN calibration and distortion.

Each output pixel is undistorted with the true camera, its ray intersected with the board plane at
the board's true pose, and the board's picture sampled there (cv2.remap), 2x2 supersampled so the
edges are anti-aliased as a real sensor would integrate them; a grey background and a little
noise. The board shows only from its printed side (a board seen from behind is background).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np
from scipy.interpolate import RectBivariateSpline

from stages.mocap.camera import Camera, horizontal_fov_matrix, look_at
from stages.mocap.charuco import Board

BACKGROUND = 128


@dataclass(frozen=True)
class BoardPose:
    """The board's pose in the world: board frame (OpenCV's) -> world, x_world = R x_board + t."""

    rotation: np.ndarray  # (3, 3)
    translation: np.ndarray  # (3,)


@dataclass
class Renderer:
    """Renders ``board`` through cameras; a camera's rays are computed once (they depend on its
    intrinsics only, which key them)."""

    board: Board
    px_per_square: int = 80
    supersample: int = 2
    margin_squares: float = 0.5  # the white paper around the squares
    _rays: dict[tuple, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        margin = round(self.margin_squares * self.px_per_square)
        self._texture = cv2.copyMakeBorder(self.board.image(self.px_per_square), margin, margin, margin, margin,
                                           cv2.BORDER_CONSTANT, value=255).astype(np.float32)
        self._margin = margin

    def _rays_of(self, camera: Camera) -> np.ndarray:
        """Undistorted normalised coordinates (h*k, w*k, 2) float32 of every sample of the image: exact
        (OpenCV's inverse) on every 4th sample, a cubic spline in between (the field is smooth: measured
        2e-5 px off the exact one), as undistorting a million points takes a second."""
        key = (camera.size, camera.matrix.tobytes(), camera.dist.tobytes(), camera.fisheye)
        if key not in self._rays:
            w, h = camera.size
            k = self.supersample
            step = 4
            coarse_u = (np.arange(0, w * k + 2 * step, step) + 0.5) / k - 0.5  # sample index -> pixel
            coarse_v = (np.arange(0, h * k + 2 * step, step) + 0.5) / k - 0.5
            coarse = camera.undistort(np.stack(np.meshgrid(coarse_u, coarse_v), axis=-1))
            fine_u, fine_v = (np.arange(w * k) + 0.5) / k - 0.5, (np.arange(h * k) + 0.5) / k - 0.5
            self._rays[key] = np.stack(
                [RectBivariateSpline(coarse_v, coarse_u, coarse[..., i])(fine_v, fine_u) for i in (0, 1)],
                axis=-1).astype(np.float32)
        return self._rays[key]

    def _box(self, camera: Camera, r: np.ndarray, t: np.ndarray) -> tuple[int, int, int, int] | None:
        """The sample rows/columns (y0, y1, x0, x1) the paper can cover, from its outline projected
        (edges sampled densely: distortion bends them), or None when it is out of view."""
        m = self._margin * self.board.square_m / self.px_per_square
        x0, y0 = -m, -m
        x1, y1 = self.board.squares_x * self.board.square_m + m, self.board.squares_y * self.board.square_m + m
        s = np.linspace(0.0, 1.0, 32)
        outline = np.concatenate([np.stack([x0 + (x1 - x0) * s, np.full_like(s, y)], 1) for y in (y0, y1)]
                                 + [np.stack([np.full_like(s, x), y0 + (y1 - y0) * s], 1) for x in (x0, x1)])
        cam = np.concatenate([outline, np.zeros((len(outline), 1))], 1) @ r.T + t  # (P, 3) camera frame
        if (cam[:, 2] <= 1e-3).any():  # partly behind the camera: no board in these scenes does that
            return None
        origin = Camera(camera.name, camera.size, camera.matrix, camera.dist, np.zeros(3), np.zeros(3))
        px, _ = origin.project(cam)
        k = self.supersample
        w, h = camera.size
        lo = np.floor((px.min(0) - 2) * k).astype(int).clip(0, [w * k, h * k])
        hi = np.ceil((px.max(0) + 3) * k).astype(int).clip(0, [w * k, h * k])
        if (hi <= lo).any():
            return None
        # Whole pixels only, so the supersampled block averages stay aligned.
        lo, hi = lo // k * k, -(-hi // k) * k
        return int(lo[1]), int(hi[1]), int(lo[0]), int(hi[0])

    def render(self, camera: Camera, pose: BoardPose, rng: np.random.Generator, noise: float = 1.5) -> np.ndarray:
        """The board at ``pose`` seen by ``camera``: (h, w) uint8."""
        w, h = camera.size
        k = self.supersample
        r = camera.rotation @ pose.rotation  # board -> camera
        t = camera.rotation @ pose.translation + camera.tvec
        image = np.full((h * k, w * k), BACKGROUND, dtype=np.float32)
        box = self._box(camera, r, t) if (-r.T @ t)[2] < 0 else None  # only from the printed side (board -z)
        if box is not None:
            y0, y1, x0, x1 = box
            xy = self._rays_of(camera)[y0:y1, x0:x1]
            rx, ry = xy[..., 0], xy[..., 1]  # the ray (rx, ry, 1) of each sample, camera frame
            a, b, n = r[:, 0], r[:, 1], r[:, 2]  # the board's axes and normal in the camera frame
            depth = np.float32(n @ t) / (np.float32(n[0]) * rx + np.float32(n[1]) * ry + np.float32(n[2]))
            # Board coordinates of the hit (depth * ray - t, along the board's x and y), in texture pixels.
            scale = self.px_per_square / self.board.square_m
            f32 = np.float32
            map_x = depth * (f32(a[0] * scale) * rx + f32(a[1] * scale) * ry + f32(a[2] * scale)) \
                + f32(self._margin - 0.5 - scale * (a @ t))
            map_y = depth * (f32(b[0] * scale) * rx + f32(b[1] * scale) * ry + f32(b[2] * scale)) \
                + f32(self._margin - 0.5 - scale * (b @ t))
            map_x[depth <= 0] = -1e6
            image[y0:y1, x0:x1] = cv2.remap(self._texture, map_x, map_y, cv2.INTER_LINEAR,
                                            borderMode=cv2.BORDER_CONSTANT, borderValue=BACKGROUND)
        image = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA)  # the mean of each k x k block
        image += rng.standard_normal(image.shape, dtype=np.float32) * np.float32(noise)
        return np.clip(image.round(), 0, 255).astype(np.uint8)


def rig_cameras(size: tuple[int, int] = (640, 480)) -> list[Camera]:
    """Four cameras on an arc in front of the volume (azimuths -45..45 degrees, 1.3-1.5 m away, above
    it looking down a little), each with its own focal length, principal point and distortion."""
    w, h = size
    specs = [  # azimuth deg, distance m, height m, hfov deg, principal offset px, (k1, k2, p1, p2)
        (-45, 1.35, 1.4, 62, (4.0, -3.0), (-0.12, 0.04, 0.001, -0.0005)),
        (-15, 1.5, 1.5, 56, (-5.0, 2.0), (-0.08, 0.02, -0.0008, 0.0006)),
        (15, 1.3, 1.35, 66, (2.0, 5.0), (-0.15, 0.06, 0.0005, 0.001)),
        (45, 1.45, 1.55, 60, (-3.0, -4.0), (-0.10, 0.03, 0.0, -0.001)),
    ]
    cameras = []
    for i, (azimuth, distance, height, fov, (dx, dy), dist) in enumerate(specs):
        a = np.radians(azimuth)
        eye = (distance * np.sin(a), -distance * np.cos(a), height)
        rvec, tvec = look_at(eye, (0.0, 0.0, 1.0))
        k = horizontal_fov_matrix(w, h, fov)
        k[0, 2] += dx
        k[1, 2] += dy
        k[1, 1] *= 1.002  # pixels not quite square: fx and fy are fitted apart
        cameras.append(Camera(f"cam{i}", (w, h), k, np.array(dist), rvec, tvec))
    return cameras


def rotation_about(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    """The rotation (3, 3) of ``degrees`` about ``axis`` (a unit vector)."""
    return cv2.Rodrigues(np.asarray(axis, dtype=np.float64) * np.radians(degrees))[0]


def board_poses(board: Board, n: int, seed: int = 0) -> list[BoardPose]:
    """``n`` poses of the board around (0, 0, 1) m, facing the cameras (toward -y) with tilts up to
    ~40 degrees, turned about its normal, at various depths; every fourth is turned hard to one side
    (only the cameras on that side see it)."""
    rng = np.random.default_rng(seed)
    # Facing -y: board x -> world x, board y (down the rows) -> world -z, board z -> world +y.
    facing = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])
    centre = np.array([board.squares_x, board.squares_y, 0.0]) * board.square_m / 2
    poses = []
    for i in range(n):
        yaw = (70.0 if i % 8 == 3 else -70.0) if i % 4 == 3 else rng.uniform(-35, 35)
        tilt = rotation_about((0, 0, 1), yaw) @ rotation_about((1, 0, 0), rng.uniform(-35, 35))
        rotation = tilt @ facing @ rotation_about((0, 0, 1), rng.uniform(-30, 30))  # last: about the board normal
        position = np.array([rng.uniform(-0.2, 0.2), rng.uniform(-0.3, 0.2), rng.uniform(0.85, 1.15)])
        poses.append(BoardPose(rotation, position - rotation @ centre))
    return poses


def fisheye_cameras(size: tuple[int, int] = (640, 480)) -> list[Camera]:
    """Two fisheye cameras (equidistant, 170 and 160 degrees across, k1..k4 of their own) half a metre
    from (0, 0, 1) m, 44 degrees apart, looking at it."""
    w, h = size
    cameras = []
    for i, (azimuth, distance, fov, dist) in enumerate([(-22, 0.5, 170, (0.06, -0.03, 0.01, -0.002)),
                                                         (22, 0.52, 160, (0.03, 0.01, -0.01, 0.002))]):
        a = np.radians(azimuth)
        rvec, tvec = look_at((distance * np.sin(a), -distance * np.cos(a), 1.1), (0.0, 0.0, 1.0))
        f = w / 2 / np.radians(fov / 2)  # equidistant: r = f * theta
        k = np.array([[f, 0.0, (w - 1) / 2 + 3 * i], [0.0, f * 1.001, (h - 1) / 2 - 2 * i], [0.0, 0.0, 1.0]])
        cameras.append(Camera(f"fish{i}", (w, h), k, np.array(dist), rvec, tvec, fisheye=True))
    return cameras


def _facing(normal: np.ndarray, rng: np.random.Generator, tilt_deg: float) -> np.ndarray:
    """A board rotation (board -> world) whose z (into the board) is ``normal``, tilted up to
    ``tilt_deg`` about its x and y and turned up to 40 degrees about its normal."""
    z = normal / np.linalg.norm(normal)
    x = np.cross(z, [0.0, 0.0, 1.0])
    x /= np.linalg.norm(x)
    base = np.stack([x, np.cross(z, x), z], axis=1)
    return (base @ rotation_about((1, 0, 0), rng.uniform(-tilt_deg, tilt_deg))
            @ rotation_about((0, 1, 0), rng.uniform(-tilt_deg, tilt_deg)) @ rotation_about((0, 0, 1), rng.uniform(-40, 40)))


def fisheye_board_poses(board: Board, cameras: list[Camera], shared: int, per_camera: int,
                        seed: int = 0) -> list[BoardPose]:
    """``shared`` poses near (0, 0, 1) m facing the cameras (both see them: they place the cameras), then
    ``per_camera`` poses for each camera 35-78 degrees off its axis, 0.30-0.45 m away, facing it: the
    edges and corners of a wide image, where a fisheye lens departs most from a pinhole."""
    rng = np.random.default_rng(seed)
    centre = np.array([board.squares_x, board.squares_y, 0.0]) * board.square_m / 2
    poses = []
    for _ in range(shared):
        rotation = _facing(np.array([0.0, 1.0, 0.0]), rng, 30)
        position = np.array([rng.uniform(-0.06, 0.06), rng.uniform(-0.05, 0.08), rng.uniform(0.95, 1.05)])
        poses.append(BoardPose(rotation, position - rotation @ centre))
    for camera in cameras:
        eye = camera.centre
        for _ in range(per_camera):
            theta, phi = np.radians(rng.uniform(35, 78)), rng.uniform(0, 2 * np.pi)
            ray = np.array([np.sin(theta) * np.cos(phi), 0.7 * np.sin(theta) * np.sin(phi), np.cos(theta)])
            ray = camera.rotation.T @ (ray / np.linalg.norm(ray))  # camera -> world
            rotation = _facing(ray, rng, 25)
            poses.append(BoardPose(rotation, eye + ray * rng.uniform(0.30, 0.45) - rotation @ centre))
    return poses
