"""Sapiens2 keypoint and segmentation metadata, loaded once from package data.

The JSON (``stages/sapiens2/data/sapiens2_metadata.json``) holds facts from the original
Sapiens2 repository: the 308 keypoint names and colours, flip pairs, skeleton links, keypoint
groups, OKS sigmas and the 29 body-part classes with their palette. Everything that draws or
flips keypoints reads these tables; nothing hard-codes them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

_PACKAGE = "stages.sapiens2"
_RESOURCE = ("data", "sapiens2_metadata.json")


class MetadataError(ValueError):
    """The metadata file is missing or inconsistent."""


@dataclass(frozen=True)
class Sapiens2Metadata:
    """Keypoint and segmentation tables (all arrays read-only).

    keypoint_names: (K,) str; keypoint_colors: (K, 3) uint8 RGB; flip_pairs: (P, 2) int64;
    skeleton_links: (L, 2) int64 keypoint indices; link_colors: (L, 3) uint8 RGB;
    sigmas: (K,) float32 OKS sigmas; groups: name -> (G,) int64 indices (body, foot, left_hand,
    right_hand, extra, face); face_indices: groups["face"]; seg_class_names: (C,) str;
    seg_palette: (C, 3) uint8 RGB indexed by class id; background_id: the class left undrawn.
    """

    keypoint_names: np.ndarray
    keypoint_colors: np.ndarray
    flip_pairs: np.ndarray
    skeleton_links: np.ndarray
    link_colors: np.ndarray
    sigmas: np.ndarray
    groups: dict[str, np.ndarray]
    face_indices: np.ndarray
    seg_class_names: np.ndarray
    seg_palette: np.ndarray
    background_id: int

    @property
    def num_keypoints(self) -> int:
        return int(len(self.keypoint_names))

    @property
    def num_classes(self) -> int:
        return int(len(self.seg_class_names))

    def keypoint_index(self, name: str) -> int:
        """Index of a keypoint by name (e.g. ``"neck"`` -> 69)."""
        hits = np.flatnonzero(self.keypoint_names == name)
        if len(hits) == 0:
            raise KeyError(f"unknown keypoint {name!r}")
        return int(hits[0])


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _array(data: Any, dtype: type, shape: tuple[int | None, ...], what: str) -> np.ndarray:
    try:
        array = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise MetadataError(f"metadata {what}: cannot read as {np.dtype(dtype).name}: {exc}") from exc
    if array.size == 0 and len(shape) == 2:
        array = array.reshape(0, shape[1] or 0)
    ok = array.ndim == len(shape) and all(s is None or s == a for s, a in zip(shape, array.shape))
    if not ok:
        want = "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"
        raise MetadataError(f"metadata {what}: expected {want}, got {tuple(array.shape)}")
    return _frozen(array)


def parse_metadata(data: dict[str, Any]) -> Sapiens2Metadata:
    """Validate the metadata JSON (as a dict) and convert it to arrays."""
    try:
        kp = data["keypoints"]
        seg = data["segmentation"]
        names = kp["names"]
        colors = kp["colors_rgb"]
        flip_pairs = kp["flip_pairs"]
        skeleton = kp["skeleton"]
        groups_raw = kp["groups"]
        classes = sorted(seg["classes"], key=lambda c: int(c["id"]))
        background_id = int(seg["background_id"])
        links = [s["link"] for s in skeleton]
        link_colors = [s["color"] for s in skeleton]
        class_names = [c["name"] for c in classes]
        class_colors = [c["color_rgb"] for c in classes]
        class_ids = [int(c["id"]) for c in classes]
    except (KeyError, TypeError) as exc:
        raise MetadataError(f"metadata is missing field {exc}") from exc

    k = len(names)
    meta = Sapiens2Metadata(
        keypoint_names=_frozen(np.asarray(names, dtype=str)),
        keypoint_colors=_array(colors, np.uint8, (k, 3), "keypoints.colors_rgb"),
        flip_pairs=_array(flip_pairs, np.int64, (None, 2), "keypoints.flip_pairs"),
        skeleton_links=_array(links, np.int64, (None, 2), "keypoints.skeleton links"),
        link_colors=_array(link_colors, np.uint8, (len(links), 3), "keypoints.skeleton colors"),
        sigmas=_array(kp.get("sigmas", [0.0] * k), np.float32, (k,), "keypoints.sigmas"),
        groups={g: _array(ix, np.int64, (None,), f"keypoints.groups.{g}") for g, ix in groups_raw.items()},
        face_indices=_array(groups_raw.get("face", []), np.int64, (None,), "keypoints.groups.face"),
        seg_class_names=_frozen(np.asarray(class_names, dtype=str)),
        seg_palette=_array(class_colors, np.uint8, (len(classes), 3), "segmentation.classes colors"),
        background_id=background_id,
    )
    if "num_keypoints" in kp and int(kp["num_keypoints"]) != k:
        raise MetadataError(f"metadata: num_keypoints is {kp['num_keypoints']} but {k} names are listed")
    if class_ids != list(range(len(classes))):
        raise MetadataError(f"metadata: segmentation class ids must be 0..{len(classes) - 1}, got {class_ids}")
    if not 0 <= background_id < len(classes):
        raise MetadataError(f"metadata: background_id {background_id} is not a class id")
    for what, ix in [
        ("flip_pairs", meta.flip_pairs),
        ("skeleton", meta.skeleton_links),
        *[(f"groups.{g}", v) for g, v in meta.groups.items()],
    ]:
        if ix.size and (ix.min() < 0 or ix.max() >= k):
            raise MetadataError(f"metadata {what}: keypoint index out of range 0..{k - 1}")
    return meta


@functools.lru_cache(maxsize=1)
def load_metadata() -> Sapiens2Metadata:
    """Load the packaged Sapiens2 metadata (parsed once, then cached)."""
    resource = resources.files(_PACKAGE) / _RESOURCE[0] / _RESOURCE[1]
    try:
        text = resource.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError) as exc:
        raise MetadataError(
            f"cannot read {'/'.join(_RESOURCE)} from package {_PACKAGE}: {exc}; reinstall the package"
        ) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MetadataError(f"{'/'.join(_RESOURCE)} is not valid JSON: {exc}") from exc
    return parse_metadata(data)
