"""Pure encode/decode tests of the wire format (no sockets)."""

from __future__ import annotations

import json
from fractions import Fraction

import msgpack
import numpy as np
import pytest

from sapiens2_client import wire
from sapiens2_client.subscriber import FrameMessage, KeypointsMessage, MatteMessage, SegMessage, to_message


def _meta(**kw: object) -> wire.FrameMeta:
    base = dict(source_id="cam0", frame_index=7, pts=7000, time_base=Fraction(1, 90000), capture_ns=123456789,
                latency_ms={"det": 1.5, "pose": 3.25}, drops={"capture": 2}, width=64, height=48,
                random_weights=True)
    base.update(kw)
    return wire.FrameMeta(**base)  # type: ignore[arg-type]


def _keypoint_frames(header_format: str = "msgpack", n: int = 3) -> tuple[list[bytes], list[wire.Part]]:
    rng = np.random.default_rng(0)
    parts = [
        wire.Part("keypoints", rng.random((n, 308, 2), dtype=np.float32) * 100),
        wire.Part("keypoint_scores", rng.random((n, 308), dtype=np.float32)),
        wire.Part("boxes", rng.random((n, 4), dtype=np.float32)),
        wire.Part("box_scores", rng.random(n, dtype=np.float32)),
        wire.Part("track_ids", np.arange(n, dtype=np.int64) - 1),
    ]
    frames = wire.encode("keypoints", "cam0", wire.meta_fields(_meta()), parts, publish_ns=99,
                         header_format=header_format)
    return frames, parts


@pytest.mark.parametrize("header_format", ["msgpack", "json"])
def test_keypoints_round_trip(header_format: str) -> None:
    frames, parts = _keypoint_frames(header_format)
    assert frames[0] == b"keypoints.cam0"
    assert (frames[1][:1] == b"{") == (header_format == "json")
    msg = to_message(wire.decode(frames))
    assert isinstance(msg, KeypointsMessage)
    assert msg.meta == _meta()
    assert msg.header["publish_ns"] == 99 and msg.header["version"] == wire.SCHEMA_VERSION
    for p in parts:
        got = getattr(msg, p.name)
        assert got.dtype == p.array.dtype and np.array_equal(got, p.array)


def test_zero_persons_and_big_endian_input_are_little_endian_on_the_wire() -> None:
    be = np.arange(6, dtype=">f4").reshape(3, 2)
    frames = wire.encode("keypoints", "cam0", wire.meta_fields(_meta()), [wire.Part("x", be),
                         wire.Part("empty", np.zeros((0, 308, 2), np.float32))], publish_ns=1)
    header = msgpack.unpackb(frames[1])
    assert header["parts"][0]["dtype"] == "<f4" and frames[2] == be.astype("<f4").tobytes()
    d = wire.decode(frames)
    assert np.array_equal(d.arrays["x"], be) and d.arrays["empty"].shape == (0, 308, 2)


def test_images_round_trip() -> None:
    rng = np.random.default_rng(1)
    image = np.zeros((48, 64, 3), np.uint8)
    image[:, :32] = (255, 0, 0)  # red left half: checks RGB order survives JPEG
    classes = rng.integers(0, 29, (48, 64), dtype=np.uint8)
    alpha = rng.integers(0, 256, (48, 64), dtype=np.uint8)
    fields = wire.meta_fields(_meta())
    f = to_message(wire.decode(wire.encode("frame", "cam0", fields, [wire.Part("image", image, "jpeg")], publish_ns=1)))
    seg = wire.encode("seg", "cam0", fields, [wire.Part("classes", classes, "png")], publish_ns=1)
    s = to_message(wire.decode(seg))
    m = to_message(wire.decode(wire.encode("matte", "cam0", fields, [wire.Part("alpha", alpha, "png")], publish_ns=1)))
    assert isinstance(f, FrameMessage) and f.image.shape == (48, 64, 3)
    assert np.abs(f.image.astype(int) - image.astype(int)).mean() < 3
    assert f.image[10, 5, 0] > 200 and f.image[10, 5, 2] < 50
    assert isinstance(s, SegMessage) and np.array_equal(s.classes, classes)
    assert isinstance(m, MatteMessage) and np.array_equal(m.alpha, alpha)


def test_status_round_trip() -> None:
    frames = wire.encode("status", "cam0", {"fps": 29.5, "health": "ok", "frames": 10, "last_frame_index": 9,
                                            "drops": {"publish_frame": 3}}, publish_ns=5)
    msg = to_message(wire.decode(frames))
    assert (msg.fps, msg.health, msg.drops, msg.frames) == (29.5, "ok", {"publish_frame": 3}, 10)


def _mutate(key: str, value: object) -> list[bytes]:
    frames, _ = _keypoint_frames()
    header = msgpack.unpackb(frames[1])
    header[key] = value
    return [frames[0], msgpack.packb(header), *frames[2:]]


@pytest.mark.parametrize(
    "frames, match",
    [
        ([b"keypoints.cam0"], "got 1 frame"),
        ([b"keypoints.cam0", b"\xc1garbage"], "neither msgpack nor JSON"),
        ([b"keypoints.cam0", b"{not json"], "neither msgpack nor JSON"),
        ([b"keypoints.cam0", msgpack.packb([1, 2])], "must be a map"),
        ([b"\xff\xfe", msgpack.packb({})], "not ASCII"),
        (_mutate("schema", "other"), "schema"),
        (_mutate("source_id", "cam1"), "does not match"),
        (_mutate("kind", "nope"), "bad kind"),
        (_mutate("frame_index", "7"), "frame_index"),
        (_mutate("parts", []), "parts"),
        (_keypoint_frames()[0][:-1], "parts"),
        (_mutate("parts", [{"name": "k", "encoding": "raw", "dtype": "|O", "shape": [1]}] * 5), "not allowed"),
        (_mutate("parts", [{"name": "k", "encoding": "raw", "dtype": "<f4", "shape": [2]}] * 5), "bytes for shape"),
        (_mutate("parts", [{"name": "k", "encoding": "gif", "dtype": "|u1", "shape": [2]}] * 5), "unknown encoding"),
        (_mutate("parts", [{"name": "k", "encoding": "jpeg", "dtype": "|u1", "shape": [2, 2, 3]}] * 5), "decode"),
        (_mutate("parts", [{"name": "k"}] * 5), "descriptor"),
        (_mutate("parts", [{"name": "k", "encoding": "raw", "dtype": "<f4", "shape": [-1]}] * 5), "bad shape"),
    ],
)
def test_malformed_messages_raise_wire_error(frames: list[bytes], match: str) -> None:
    with pytest.raises(wire.WireError, match=match):
        wire.decode(frames)


def test_missing_typed_field_is_a_wire_error() -> None:
    frames = wire.encode("keypoints", "cam0", wire.meta_fields(_meta()), [], publish_ns=1)
    with pytest.raises(wire.WireError, match="keypoints"):
        to_message(wire.decode(frames))


def test_version_mismatch_and_size_limit() -> None:
    with pytest.raises(wire.SchemaVersionError, match="version 2"):
        wire.decode(_mutate("version", 2))
    frames, _ = _keypoint_frames()
    with pytest.raises(wire.MessageTooLarge, match="exceeds"):
        wire.decode(frames, max_bytes=1000)


@pytest.mark.parametrize("source", ["", "a b", "cam.0", "x" * 65, "caméra"])
def test_bad_source_ids_are_rejected(source: str) -> None:
    with pytest.raises(ValueError, match="source id"):
        wire.topic_for("keypoints", source)


def test_json_header_is_plain_json() -> None:
    frames, _ = _keypoint_frames("json")
    header = json.loads(frames[1])
    assert header["schema"] == wire.SCHEMA and header["time_base"] == [1, 90000]
    assert [p["name"] for p in header["parts"]] == ["keypoints", "keypoint_scores", "boxes", "box_scores", "track_ids"]
