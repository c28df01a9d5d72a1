"""The shared wire test vectors (clients/vectors/vectors.json): every case decodes as written, every
malformed one is refused with its reason, and the committed file is what the encoder makes today."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sapiens2_client import wire
from sapiens2_client.messages import decode_message

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
CASES = json.loads((VECTORS / "vectors.json").read_text())["cases"]


def _plain(value):
    """The JSON form back to Python values ({"$int": "..."} -> int)."""
    if isinstance(value, dict):
        if set(value) == {"$int"}:
            return int(value["$int"])
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _frames(case: dict) -> list[bytes]:
    return [base64.b64decode(f) for f in case["frames"]]


@pytest.mark.parametrize("case", [c for c in CASES if "expect" in c], ids=lambda c: c["name"])
def test_good_vectors_decode_as_expected(case: dict) -> None:
    expect = case["expect"]
    decoded = wire.decode(_frames(case))
    assert (decoded.topic, decoded.kind, decoded.source_id) == (expect["topic"], expect["kind"], expect["source_id"])
    assert decoded.header == _plain(expect["header"])
    assert set(decoded.arrays) == set(expect["arrays"])
    for name, want in expect["arrays"].items():
        array = decoded.arrays[name]
        assert array.dtype.str == want["dtype"] and list(array.shape) == want["shape"], name
        if "sha256" in want:
            assert hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest() == want["sha256"], name
        else:  # lossy JPEG: close to the pixels that were encoded
            reference = np.frombuffer(base64.b64decode(want["reference"]), np.uint8).reshape(array.shape)
            assert np.abs(array.astype(int) - reference.astype(int)).mean() <= want["max_mean_abs_diff"], name
    msg = decode_message(_frames(case))  # and it makes a typed message
    if "keypoints3d" in expect["arrays"]:
        k3 = msg.keypoints3d
        assert k3.xyz.shape == (*msg.keypoints.shape[:2], 3) and k3.valid.dtype == bool
        assert k3.metric is expect["header"]["keypoints3d_metric"]
        assert not k3.xyz[~k3.valid].any()  # invalid points are zeros on the wire
        rel, ok = k3.relative()
        np.testing.assert_allclose(rel[ok], (k3.xyz - k3.root[:, None])[ok])
    elif expect["kind"] == "keypoints":
        assert msg.keypoints3d is None
    if expect["kind"] == "world":
        n, k = expect["arrays"]["world_valid"]["shape"]
        assert msg.cameras == expect["header"]["cameras"] and msg.units == "m"
        assert msg.camera_frames == expect["header"]["camera_frames"]
        assert msg.world_keypoints.shape == (n, k, 3) and msg.world_valid.dtype == bool
        assert msg.world_members.shape == (n, len(msg.cameras)) and msg.single_view.shape[1:] == (2,)
        invalid = ~msg.world_valid  # invalid points are zeros on the wire, in every part
        assert not msg.world_keypoints[invalid].any() and not msg.world_error[invalid].any()
        assert not msg.world_views[invalid].any() and (msg.world_views[msg.world_valid] >= 2).all()
        for p in range(n):
            assert msg.members_of(p) == {c: int(i) for c, i in zip(msg.cameras, msg.world_members[p]) if i >= 0}


@pytest.mark.parametrize("case", [c for c in CASES if "error" in c], ids=lambda c: c["name"])
def test_malformed_vectors_are_refused_with_their_reason(case: dict) -> None:
    with pytest.raises(wire.WireError) as info:
        decode_message(_frames(case))
    assert info.value.reason == case["error"], str(info.value)


def test_every_refusal_reason_is_documented_and_covered() -> None:
    covered = {c["error"] for c in CASES if "error" in c}
    assert covered <= set(wire.REASONS)
    assert covered == set(wire.REASONS), f"no vector for {set(wire.REASONS) - covered}"
    docs = (Path(__file__).resolve().parents[3] / "docs" / "WIRE.md").read_text()
    for reason in wire.REASONS:
        assert f"`{reason}`" in docs, f"docs/WIRE.md does not describe the reason {reason!r}"


def test_committed_vectors_are_what_the_encoder_makes() -> None:
    pytest.importorskip("cv2", reason="the committed JPEG bytes come from OpenCV's encoder")
    fresh = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                            "import make_vectors; sys.stdout.write(make_vectors.render())", str(VECTORS)],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert fresh == (VECTORS / "vectors.json").read_text(), \
        "vectors.json is stale: run python clients/vectors/make_vectors.py and commit it"
