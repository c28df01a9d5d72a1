"""A synthetic motion-capture rig for the tests, the benchmarks and the demo rig: known cameras
around a volume, known moving 308-keypoint skeletons, and what each camera sees of them (noise,
misses, a wrong detection).

World frame: metres, Z up, the floor at Z = 0. Skeletons are made from the keypoint groups of the
Sapiens2 metadata: the 15 body joints are placed by hand, feet, hands and face points sit around
their joint (fixed, seeded offsets), and the whole body walks and turns while its arms swing.
"""

from __future__ import annotations

import math

import numpy as np

from stages.metadata import load_metadata
from stages.mocap.camera import Camera, Rig, horizontal_fov_matrix, look_at
from stages.types import Detections, Keypoints

# Body joints (x forward, y left, z up), metres, of a person standing at the origin.
_BODY = {
    "nose": (0.10, 0.00, 1.62), "left_eye": (0.08, 0.03, 1.66), "right_eye": (0.08, -0.03, 1.66),
    "left_ear": (0.00, 0.08, 1.63), "right_ear": (0.00, -0.08, 1.63),
    "left_shoulder": (0.00, 0.19, 1.42), "right_shoulder": (0.00, -0.19, 1.42),
    "left_elbow": (0.02, 0.24, 1.14), "right_elbow": (0.02, -0.24, 1.14),
    "left_hip": (0.00, 0.11, 0.95), "right_hip": (0.00, -0.11, 0.95),
    "left_knee": (0.03, 0.11, 0.52), "right_knee": (0.03, -0.11, 0.52),
    "left_ankle": (0.00, 0.11, 0.08), "right_ankle": (0.00, -0.11, 0.08),
}
_WRISTS = {"left_wrist": (0.05, 0.26, 0.88), "right_wrist": (0.05, -0.26, 0.88)}


def base_skeleton(seed: int = 0) -> np.ndarray:
    """(308, 3) keypoints of a standing person (every Sapiens2 keypoint placed)."""
    meta = load_metadata()
    rng = np.random.default_rng(seed)
    names = [str(n) for n in meta.keypoint_names]
    points = np.full((len(names), 3), np.nan)
    for name, xyz in {**_BODY, **_WRISTS}.items():
        points[names.index(name)] = xyz
    anchors = {"foot": None, "left_hand": "left_wrist", "right_hand": "right_wrist", "face": "nose", "extra": None}
    for group, idx in meta.groups.items():
        for i in idx:
            if not np.isnan(points[i]).any():
                continue
            name = names[i]
            anchor = anchors.get(group)
            if group == "foot":
                anchor = "left_ankle" if name.startswith("left") else "right_ankle"
            elif anchor is None:  # extra points (olecranon, acromion, neck...): near the nearest named side
                anchor = ("left_shoulder" if "left" in name else "right_shoulder" if "right" in name else "nose")
            spread = {"face": 0.07, "left_hand": 0.06, "right_hand": 0.06, "foot": 0.08}.get(group, 0.05)
            points[i] = points[names.index(anchor)] + rng.normal(0, spread / 2, 3)
    if group_missing := np.isnan(points).any(axis=1).sum():
        raise AssertionError(f"{group_missing} keypoints were not placed")
    return points


def pose_at(base: np.ndarray, t: float, start: tuple[float, float] = (0.0, 0.0), speed: float = 0.6,
            heading: float = 0.0) -> np.ndarray:
    """The skeleton at time t (s): walking along ``heading`` from ``start``, turning slowly, arms
    swinging about the shoulders."""
    meta = load_metadata()
    names = [str(n) for n in meta.keypoint_names]
    points = base.copy()
    swing = 0.5 * math.sin(2 * math.pi * 0.8 * t)
    for side, sign in (("left", 1.0), ("right", -1.0)):
        shoulder = base[names.index(f"{side}_shoulder")]
        arm = [i for i, n in enumerate(names) if n.startswith(side) and any(
            part in n for part in ("elbow", "wrist", "thumb", "index", "middle", "ring", "pinky", "olecranon",
                                   "cubital"))]
        arm += list(meta.groups[f"{side}_hand"])
        a = sign * swing
        rot = np.array([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])  # about y
        points[arm] = (points[arm] - shoulder) @ rot.T + shoulder
    yaw = heading + 0.3 * t
    rz = np.array([[math.cos(yaw), -math.sin(yaw), 0], [math.sin(yaw), math.cos(yaw), 0], [0, 0, 1]])
    offset = np.array([start[0] + speed * t * math.cos(heading), start[1] + speed * t * math.sin(heading), 0.0])
    return points @ rz.T + offset


def ring_rig(n: int, radius: float = 4.0, height: float = 1.8, size: tuple[int, int] = (1280, 720),
             fov_deg: float = 70.0, distortion: tuple[float, ...] = (-0.12, 0.05, 0.0005, -0.0004, 0.0),
             names: list[str] | None = None) -> Rig:
    """n cameras on a circle around the origin at ``height``, looking at (0, 0, 1) with distortion."""
    cameras = {}
    for i in range(n):
        a = 2 * math.pi * i / n + 0.2
        name = names[i] if names else f"cam{i + 1}"
        rvec, tvec = look_at((radius * math.cos(a), radius * math.sin(a), height + 0.2 * (i % 2)), (0, 0, 1.0))
        k = horizontal_fov_matrix(*size, fov_deg)
        k[0, 2] += 7 * (i - n / 2)  # principal points off centre, as real lenses are
        cameras[name] = Camera(name, size, k, np.array(distortion) * (1 + 0.1 * i), rvec, tvec)
    return Rig(cameras)


def observe(rig: Rig, people: list[np.ndarray], rng: np.random.Generator, noise_px: float = 1.0,
            miss: float = 0.05, score: float = 0.9) -> dict[str, tuple[Detections, Keypoints]]:
    """What each camera's pose stage reports for these people: keypoints projected with Gaussian
    noise, a fraction ``miss`` of them with a low score (missed), persons in a random order;
    tracks are the person's index (as a tracker would keep them)."""
    out = {}
    for name, camera in rig.cameras.items():
        order = rng.permutation(len(people))
        xy, scores, boxes = [], [], []
        for j in order:
            pixels, front = camera.project(people[j])
            pixels = pixels + rng.normal(0, noise_px, pixels.shape)
            s = np.where(rng.random(len(pixels)) < miss, 0.05, score) * front
            xy.append(pixels)
            scores.append(s)
            boxes.append([*pixels.min(axis=0), *pixels.max(axis=0)])
        k = people[0].shape[0] if people else 308
        det = Detections(np.array(boxes, np.float32).reshape(-1, 4), np.full(len(order), 0.9, np.float32),
                         np.array(order, np.int64))
        kp = Keypoints(np.array(xy, np.float32).reshape(-1, k, 2), np.array(scores, np.float32).reshape(-1, k))
        out[name] = (det, kp)
    return out


def throw_off(observed: dict[str, tuple[Detections, Keypoints]], camera: str, track: int, share: float,
              px: float, rng: np.random.Generator) -> np.ndarray:
    """Throw a ``share`` of the keypoints of person ``track`` in ``camera``'s view ``px`` pixels off
    in random directions, their scores kept (a confused hand or face detection); returns which (M,)."""
    det, kp = observed[camera]
    row = int(np.flatnonzero(det.track_ids == track)[0])
    thrown = rng.choice(kp.xy.shape[1], round(share * kp.xy.shape[1]), replace=False)
    angle = rng.uniform(0, 2 * np.pi, len(thrown))
    xy = kp.xy.copy()
    xy[row, thrown] += px * np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    observed[camera] = (det, Keypoints(xy, kp.scores))
    return thrown
