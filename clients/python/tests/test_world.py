"""World messages (docs/WIRE.md, "World keypoints"): the typed record, its checks, and how the
``subscribe`` command prints one. The refusals are in the shared vectors (test_vectors.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sapiens2_client import cli, wire
from sapiens2_client.messages import WorldMessage, decode_message

CAMERAS = ["cam0", "cam1", "cam2"]


def _frames(n: int = 2, k: int = 5, header_format: str = "msgpack", **fields: object) -> list[bytes]:
    valid = np.ones((n, k), np.uint8)
    valid[:, -1] = 0
    xyz = np.where(valid[..., None] == 1, np.arange(n * k * 3, dtype=np.float32).reshape(n, k, 3) / 10, 0)
    members = np.array([[0, -1, 1], [1, 0, -1]][:n], np.int32).reshape(n, 3)
    parts = [wire.Part("world_keypoints", xyz.astype(np.float32)), wire.Part("world_valid", valid),
             wire.Part("world_error", (valid * 0.5).astype(np.float32)), wire.Part("world_views", valid * 2),
             wire.Part("world_ids", np.arange(n, dtype=np.int64) + 7), wire.Part("world_members", members),
             wire.Part("single_view", np.array([[2, 4]], np.int32))]
    meta = wire.meta_fields(wire.FrameMeta("rig", 3, capture_ns=10**18, latency_ms={"triangulate": 0.8}))
    header = {**meta, "num_persons": n, "num_keypoints": k, "units": "m", "cameras": CAMERAS,
              "camera_frames": {"cam0": 12, "cam1": 11}, **fields}
    return wire.encode("world", "rig", header, parts, publish_ns=10**18 + 5, header_format=header_format)


@pytest.mark.parametrize("header_format", ["msgpack", "json"])
def test_a_world_message_decodes_to_its_typed_record(header_format: str) -> None:
    msg = decode_message(_frames(header_format=header_format))
    assert isinstance(msg, WorldMessage) and msg.topic == "world.rig"
    assert msg.meta.frame_index == 3 and msg.meta.latency_ms == {"triangulate": 0.8}
    assert (msg.cameras, msg.camera_frames, msg.units) == (CAMERAS, {"cam0": 12, "cam1": 11}, "m")
    assert msg.world_keypoints.shape == (2, 5, 3) and msg.world_valid.dtype == bool
    assert msg.world_valid[:, :4].all() and not msg.world_valid[:, 4].any()
    assert msg.world_ids.tolist() == [7, 8] and msg.single_view.tolist() == [[2, 4]]
    assert msg.members_of(0) == {"cam0": 0, "cam2": 1} and msg.members_of(1) == {"cam0": 1, "cam1": 0}


def test_zero_persons_and_a_rig_without_cameras_decode() -> None:
    frames = wire.encode("world", "rig", {**wire.meta_fields(wire.FrameMeta("rig", 0)), "cameras": [],
                                          "camera_frames": {}}, [
        wire.Part("world_keypoints", np.zeros((0, 308, 3), np.float32)),
        *(wire.Part(name, np.zeros((0, 308), dtype)) for name, dtype in
          (("world_valid", np.uint8), ("world_error", np.float32), ("world_views", np.uint8))),
        wire.Part("world_ids", np.zeros(0, np.int64)), wire.Part("world_members", np.zeros((0, 0), np.int32)),
        wire.Part("single_view", np.zeros((0, 2), np.int32))], publish_ns=1)
    msg = decode_message(frames)
    assert isinstance(msg, WorldMessage) and msg.world_keypoints.shape == (0, 308, 3) and msg.cameras == []


def test_subscribe_prints_a_world_message_as_a_line_and_as_json() -> None:
    msg = decode_message(_frames())
    line = cli.line(msg)
    assert line.startswith("world.rig #3 persons=2 points=8/10 cameras=2/3 single_view=1 latency=0.8ms"), line
    record = json.loads(json.dumps(cli.summary(msg), allow_nan=False))
    assert record["persons"] == 2 and record["units"] == "m" and record["cameras"] == CAMERAS
    assert record["camera_frames"] == {"cam0": 12, "cam1": 11} and record["world_ids"] == [7, 8]
    assert record["world_keypoints"][0][4] is None and record["world_keypoints"][0][1] == pytest.approx([0.3, 0.4, 0.5])
    assert record["world_members"] == [[0, -1, 1], [1, 0, -1]] and record["single_view"] == [[2, 4]]


def test_subscribe_takes_world_as_a_topic(capsys: pytest.CaptureFixture[str]) -> None:
    """``--topic world`` is a kind: it is not refused as a prefix no topic starts with (the endpoint
    check that follows refuses this one)."""
    assert cli.main(["subscribe", "--topic", "world", "--endpoint", "tcp://127.0.0.1:99999"]) == 1
    err = capsys.readouterr().err
    assert "matches no message" not in err and "cannot connect" in err
