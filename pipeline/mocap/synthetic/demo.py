"""The demo rig's scene: four virtual cameras round a capture volume, a ChArUco board shown to them,
and two people walking, all of known truth (``sapiens2-stream demo-rig``).

World frame: metres, Z up, the floor at Z = 0, and the origin at the first inner corner of the
board in its first pose, where it lies face up on the floor. That is exactly the world frame
``calibrate`` makes of this take (the board in the first view of the first camera: origin at its
first corner, x along its rows, z out of its face), so a calibration of it compares with the
truth as it is, and the skeletons it triangulates stand on the floor.
"""

from __future__ import annotations

import math

import numpy as np

from stages.mocap.camera import Camera, Rig, horizontal_fov_matrix, look_at
from stages.mocap.charuco import Board

from .board import BoardPose, rotation_about
from .people import base_skeleton, pose_at

BOARD = Board(5, 7, 0.15, 0.11)  # 75 x 105 cm: a volume's board (an A4 board is for a camera at arm's length)
SIZE = (1280, 720)
FPS = 30
PATHS = (((-0.9, 0.35), 0.0), ((0.7, -0.45), math.pi))  # each person's start (x, y) and heading


def cameras() -> Rig:
    """Four cameras on an arc in front of the volume (azimuths -60..60 degrees), 3.2 m from its middle
    and 2.5 m up, looking at (0, 0, 0.9), each with its own principal point and lens distortion."""
    out = {}
    for i, azimuth in enumerate((-60, -20, 20, 60)):
        a = math.radians(azimuth)
        rvec, tvec = look_at((3.2 * math.sin(a), -3.2 * math.cos(a), 2.5), (0.0, 0.0, 0.9))
        k = horizontal_fov_matrix(*SIZE, 70.0)
        k[0, 2] += 5 * (i - 1.5)
        k[1, 2] -= 3 * (i - 1.5)
        name = f"cam{i + 1}"
        out[name] = Camera(name, SIZE, k, np.array([-0.1 + 0.02 * i, 0.03, 0.0005, -0.0003]), rvec, tvec)
    return Rig(out, {"units": "m", "world": "the demo rig's floor board: its first corner, z up"})


def board_poses(n: int = 30, seed: int = 0) -> list[BoardPose]:
    """The board lying face up on the floor with its first inner corner at the origin, then ``n - 1``
    poses held up in the volume facing the cameras, tilted and turned up to 30-45 degrees."""
    rng = np.random.default_rng(seed)
    floor = np.diag([1.0, -1.0, -1.0])  # board x -> world x, board y (down the rows) -> -y, into the board -> down
    poses = [BoardPose(floor, -floor @ BOARD.corners[0])]
    facing = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])  # its face toward -y: the cameras
    centre = np.array([BOARD.squares_x, BOARD.squares_y, 0.0]) * BOARD.square_m / 2
    for _ in range(n - 1):
        rotation = (rotation_about((0, 0, 1), rng.uniform(-45, 45)) @ rotation_about((1, 0, 0), rng.uniform(-30, 30)) @ facing
                    @ rotation_about((0, 0, 1), rng.uniform(-25, 25)))
        position = np.array([rng.uniform(-0.8, 0.8), rng.uniform(-0.8, 0.6), rng.uniform(0.7, 1.5)])
        poses.append(BoardPose(rotation, position - rotation @ centre))
    return poses


def people(t: float) -> list[np.ndarray]:
    """The two people at time t (s): (308, 3) keypoints each, walking across the volume."""
    return [pose_at(base_skeleton(i), t, start=start, speed=0.5, heading=heading)
            for i, (start, heading) in enumerate(PATHS)]
