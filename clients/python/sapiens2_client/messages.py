"""Typed records of the wire messages (see docs/WIRE.md) and the checks that tie their parts together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from .wire import Decoded, FrameMeta, WireError, meta_from_header


@dataclass
class Keypoints3D:
    """The persons' keypoints in the camera's 3D frame (docs/WIRE.md, "3D keypoints").

    xyz: (N, K, 3) float32, zeros where not valid; valid: (N, K) bool; root: (N, 3) float32, the
    mean of the valid hips; root_valid: (N,) bool; metric: the values are metric (the pointmap
    model has its scale branch), else in the model's canonical camera space.
    """

    xyz: np.ndarray
    valid: np.ndarray
    root: np.ndarray
    root_valid: np.ndarray
    metric: bool

    def relative(self) -> tuple[np.ndarray, np.ndarray]:
        """Root-relative coordinates (N, K, 3) and their validity (point and root valid)."""
        ok = self.valid & self.root_valid[:, None]
        return np.where(ok[..., None], self.xyz - self.root[:, None, :], 0.0).astype(np.float32), ok


@dataclass
class KeypointsMessage:
    """keypoints: (N, K, 2) float32 pixels; keypoint_scores: (N, K); boxes: (N, 4) xyxy;
    box_scores: (N,); track_ids: (N,) int64, -1 when untracked. K is 0 when not computed.
    keypoints3d: the 3D keypoints when the publisher lifts them (--keypoints3d), else None."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    keypoints: np.ndarray
    keypoint_scores: np.ndarray
    boxes: np.ndarray
    box_scores: np.ndarray
    track_ids: np.ndarray
    keypoints3d: Keypoints3D | None = None


@dataclass
class FrameMessage:
    """image: (H, W, 3) uint8 RGB, decoded from JPEG; annotated: whether overlays are drawn."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    image: np.ndarray
    annotated: bool


@dataclass
class SegMessage:
    """classes: (H, W) uint8 class ids, decoded from PNG (lossless)."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    classes: np.ndarray


@dataclass
class MatteMessage:
    """alpha: (H, W) uint8, alpha_float = alpha / alpha_scale (255) in [0, 1]."""

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    alpha: np.ndarray

    @property
    def alpha_float(self) -> np.ndarray:
        return self.alpha.astype(np.float32) / float(self.header.get("alpha_scale", 255))


@dataclass
class StatusMessage:
    """Periodic health of one source: fps, drop counters, health string (and the event that
    triggered it, when a change of health did)."""

    topic: str
    header: dict[str, Any]
    source_id: str
    publish_ns: int
    fps: float
    health: str
    frames: int
    last_frame_index: int
    drops: dict[str, int]
    detector: str | None = None  # how persons are found: "yolo", "full-frame" (the whole frame is one person)


@dataclass
class WorldMessage:
    """One step of a calibrated rig (docs/WIRE.md, "World keypoints"): N persons triangulated into
    the calibration's world frame (right-handed, metres: ``units``), K keypoints each.

    world_keypoints: (N, K, 3) float32 X, Y, Z, 0 where not valid; world_valid: (N, K) bool (seen
    well by at least two views); world_error: (N, K) float32 RMS reprojection error in pixels;
    world_views: (N, K) uint8 views used; world_ids: (N,) int64 world person ids, stable over time;
    world_members: (N, C) int32, the person's index in the keypoints message of camera
    ``cameras[c]`` of frame ``camera_frames[cameras[c]]``, -1 where that camera does not see them;
    single_view: (S, 2) int32 (camera column, person index) of persons one camera alone sees.
    """

    topic: str
    header: dict[str, Any]
    meta: FrameMeta
    cameras: list[str]
    camera_frames: dict[str, int]  # camera -> its frame_index used in this step (absent: none in the window)
    units: str
    world_keypoints: np.ndarray
    world_valid: np.ndarray
    world_error: np.ndarray
    world_views: np.ndarray
    world_ids: np.ndarray
    world_members: np.ndarray
    single_view: np.ndarray

    def members_of(self, person: int) -> dict[str, int]:
        """Camera -> the index of world person ``person`` in that camera's keypoints message, for the
        cameras that see them."""
        return {c: int(i) for c, i in zip(self.cameras, self.world_members[person]) if i >= 0}


Message = Union[KeypointsMessage, FrameMessage, SegMessage, MatteMessage, StatusMessage, WorldMessage]

# name -> (dtype, shape in terms of N persons and K keypoints)
KEYPOINT_PARTS = {
    "keypoints": ("<f4", ("N", "K", 2)),
    "keypoint_scores": ("<f4", ("N", "K")),
    "boxes": ("<f4", ("N", 4)),
    "box_scores": ("<f4", ("N",)),
    "track_ids": ("<i8", ("N",)),
}
# the optional 3D group: all four parts or none
KEYPOINT3D_PARTS = {
    "keypoints3d": ("<f4", ("N", "K", 3)),
    "keypoints3d_valid": ("|u1", ("N", "K")),
    "root3d": ("<f4", ("N", 3)),
    "root3d_valid": ("|u1", ("N",)),
}
# a world message's parts: N persons, K keypoints, C cameras (len(cameras)), S single-view persons
WORLD_PARTS = {
    "world_keypoints": ("<f4", ("N", "K", 3)),
    "world_valid": ("|u1", ("N", "K")),
    "world_error": ("<f4", ("N", "K")),
    "world_views": ("|u1", ("N", "K")),
    "world_ids": ("<i8", ("N",)),
    "world_members": ("<i4", ("N", "C")),
    "single_view": ("<i4", ("S", 2)),
}
IMAGE_PART = {"frame": "image", "seg": "classes", "matte": "alpha"}


def _check_parts(arrays: dict[str, np.ndarray], table: dict, sizes: dict[str, int], kind: str = "keypoints") -> None:
    for name, (dtype, shape) in table.items():
        array = arrays[name]
        want = tuple(sizes.get(s, s) for s in shape)
        if array.dtype.str != dtype or array.shape != want:
            raise WireError(f"{kind} part {name!r} is {array.shape} {array.dtype.str}, expected {want} {dtype}",
                            "shape")


def _keypoint_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The five keypoint parts, with their dtypes and N/K agreeing across parts; raises WireError."""
    missing = [name for name in KEYPOINT_PARTS if name not in arrays]
    if missing:
        raise WireError(f"keypoints message lacks parts {missing}", "parts")
    n = arrays["boxes"].shape[0] if arrays["boxes"].ndim else -1
    k = arrays["keypoints"].shape[1] if arrays["keypoints"].ndim == 3 else -1
    sizes = {"N": n, "K": k}
    _check_parts(arrays, KEYPOINT_PARTS, sizes)
    present = [name for name in KEYPOINT3D_PARTS if name in arrays]
    if present and len(present) != len(KEYPOINT3D_PARTS):
        missing = [name for name in KEYPOINT3D_PARTS if name not in arrays]
        raise WireError(f"keypoints message has 3D parts {present} but lacks {missing}", "parts")
    if present:
        _check_parts(arrays, KEYPOINT3D_PARTS, sizes)
    return arrays


def _world_arrays(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The seven world parts, with their dtypes, N/K/S agreeing across parts, C = len(cameras), and
    every index in range (members -1 or more, single-view columns 0..C-1 and persons 0 or more)."""
    missing = [name for name in WORLD_PARTS if name not in arrays]
    if missing:
        raise WireError(f"world message lacks parts {missing}", "parts")
    ids, xyz, members, single = (arrays[name] for name in ("world_ids", "world_keypoints", "world_members",
                                                            "single_view"))
    sizes = {"N": ids.shape[0] if ids.ndim == 1 else -1, "K": xyz.shape[1] if xyz.ndim == 3 else -1,
             "C": len(header["cameras"]), "S": single.shape[0] if single.ndim == 2 else -1}
    _check_parts(arrays, WORLD_PARTS, sizes, "world")
    if members.size and members.min() < -1:
        raise WireError(f"world_members holds {members.min()}: an index is -1 (not seen) or more", "shape")
    if single.size and not (0 <= single[:, 0].min() and single[:, 0].max() < sizes["C"] and single[:, 1].min() >= 0):
        raise WireError(f"single_view holds a camera column outside 0..{sizes['C'] - 1} or a negative person "
                        "index", "shape")
    return arrays


def _keypoints3d(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Keypoints3D | None:
    if "keypoints3d" not in arrays:
        return None
    return Keypoints3D(arrays["keypoints3d"], arrays["keypoints3d_valid"] != 0, arrays["root3d"],
                       arrays["root3d_valid"] != 0, bool(header.get("keypoints3d_metric", False)))


def to_message(d: Decoded) -> Message:
    """Turn a decoded wire message into its typed record; raises WireError on missing or inconsistent parts."""
    h, a = d.header, d.arrays
    if d.kind == "status":
        return StatusMessage(d.topic, h, d.source_id, h.get("publish_ns", 0), float(h["fps"]), h["health"],
                             h["frames"], h["last_frame_index"], dict(h.get("drops", {})), h.get("detector"))
    meta = meta_from_header(h)
    if d.kind == "keypoints":
        k = _keypoint_arrays(a)
        return KeypointsMessage(d.topic, h, meta, k["keypoints"], k["keypoint_scores"], k["boxes"], k["box_scores"],
                                k["track_ids"], _keypoints3d(h, k))
    if d.kind == "world":
        w = _world_arrays(h, a)
        return WorldMessage(d.topic, h, meta, list(h["cameras"]), dict(h["camera_frames"]), h.get("units", "m"),
                            w["world_keypoints"], w["world_valid"] != 0, w["world_error"], w["world_views"],
                            w["world_ids"], w["world_members"], w["single_view"])
    name = IMAGE_PART[d.kind]
    if name not in a:
        raise WireError(f"{d.kind} message lacks its {name!r} part", "parts")
    encoding = next((p.get("encoding") for p in h.get("parts", []) if p.get("name") == name), None)
    part = a[name]  # a frame's picture is colour (H, W, 3) uint8 (JPEG, or raw), a map (H, W) uint8 (PNG, or raw)
    want, layout = ("jpeg", "H, W, 3") if d.kind == "frame" else ("png", "H, W")
    fits = part.dtype == np.uint8 and (part.shape[2:] == (3,) and part.ndim == 3 if d.kind == "frame" else
                                       part.ndim == 2)
    if encoding not in (want, "raw") or not fits:
        raise WireError(f"{d.kind} message: its {name!r} part must be {want} or raw ({layout}) |u1, got {encoding} "
                        f"{tuple(part.shape)} {part.dtype}", "encoding")
    if d.kind == "frame":
        return FrameMessage(d.topic, h, meta, a[name], h.get("annotated", False))
    if d.kind == "seg":
        return SegMessage(d.topic, h, meta, a[name])
    return MatteMessage(d.topic, h, meta, a[name])


def decode_message(frames, limits=None) -> Message:
    """Validate and decode one multipart message into its typed record; WireError if it is refused."""
    from .wire import decode

    return to_message(decode(frames, limits=limits))
