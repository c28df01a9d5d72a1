"""Packaged Sapiens2 metadata: shapes, known facts, validation errors."""

from __future__ import annotations

import copy
import json
from importlib import resources

import numpy as np
import pytest

from stages.metadata import MetadataError, Sapiens2Metadata, load_metadata, parse_metadata


def _raw() -> dict:
    return json.loads((resources.files("stages.sapiens2") / "data" / "sapiens2_metadata.json").read_text())


def test_shapes_and_dtypes() -> None:
    meta = load_metadata()
    assert isinstance(meta, Sapiens2Metadata)
    assert meta.num_keypoints == 308
    assert meta.keypoint_colors.shape == (308, 3) and meta.keypoint_colors.dtype == np.uint8
    assert meta.flip_pairs.shape == (146, 2) and meta.flip_pairs.dtype == np.int64
    assert meta.skeleton_links.shape == (65, 2) and meta.skeleton_links.dtype == np.int64
    assert meta.link_colors.shape == (65, 3) and meta.link_colors.dtype == np.uint8
    assert meta.num_classes == 29
    assert meta.seg_palette.shape == (29, 3) and meta.seg_palette.dtype == np.uint8
    assert meta.sigmas.shape == (308,)


def test_known_facts() -> None:
    meta = load_metadata()
    assert meta.keypoint_index("neck") == 69
    assert meta.keypoint_index("right_wrist") == 41
    assert meta.keypoint_index("left_wrist") == 62
    np.testing.assert_array_equal(meta.face_indices, np.arange(70, 308))
    assert meta.seg_class_names[meta.background_id] == "Background"
    assert meta.background_id == 0
    # flip pairs are a symmetric involution: no keypoint appears twice
    assert len(np.unique(meta.flip_pairs)) == meta.flip_pairs.size


def test_cached_and_read_only() -> None:
    meta = load_metadata()
    assert load_metadata() is meta
    with pytest.raises(ValueError):
        meta.seg_palette[0, 0] = 1


def test_unknown_keypoint_name() -> None:
    with pytest.raises(KeyError, match="unknown keypoint"):
        load_metadata().keypoint_index("tail")


def _break_colors(d: dict) -> None:
    d["keypoints"]["colors_rgb"] = d["keypoints"]["colors_rgb"][:-1]


def _break_link(d: dict) -> None:
    d["keypoints"]["skeleton"][0]["link"] = [0, 999]


def _break_missing(d: dict) -> None:
    del d["segmentation"]["classes"]


def _break_background(d: dict) -> None:
    d["segmentation"]["background_id"] = 99


@pytest.mark.parametrize(
    ("breaker", "message"),
    [
        (_break_colors, r"colors_rgb: expected \(308, 3\), got \(307, 3\)"),
        (_break_link, "skeleton: keypoint index out of range"),
        (_break_missing, "missing field 'classes'"),
        (_break_background, "background_id 99"),
    ],
)
def test_invalid_metadata_is_rejected(breaker, message: str) -> None:
    data = copy.deepcopy(_raw())
    breaker(data)
    with pytest.raises(MetadataError, match=message):
        parse_metadata(data)
