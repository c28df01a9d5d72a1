"""Write vectors.json: encoded messages of every kind, and malformed ones, with what decoding must give.

Generated from the Python encoder (``sapiens2_client.wire``); the Python and the JavaScript test
suites both decode every case and compare, so the two clients stay byte-compatible. Regenerate
after a wire change with ``python clients/vectors/make_vectors.py`` (deterministic output) and
commit the result; a test fails when the committed file and a fresh generation differ.

Case format (JSON)::

    {"name": ..., "frames": [base64 of each ZeroMQ frame],
     "expect": {"topic", "kind", "source_id", "header": {...},
                "arrays": {name: {"dtype", "shape", "sha256"       # raw / png: exact bytes (C order)
                                  | "reference", "max_mean_abs_diff"}}}}   # jpeg: base64 of the pixels
    {"name": ..., "frames": [...], "error": REASON}                 # must be refused with this reason

Integers beyond 2**53 (timestamps) are written ``{"$int": "digits"}`` so a JSON parser that reads
numbers as doubles (JavaScript's) does not round them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import sys
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

from sapiens2_client import wire  # noqa: E402
from sapiens2_client.messages import decode_message  # noqa: E402

CAPTURE_NS = 1_764_579_600_123_456_789  # above 2**53: exercises exact 64-bit integers
PUBLISH_NS = CAPTURE_NS + 40_000_000


def _b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return value
    if isinstance(value, int):
        return {"$int": str(value)} if abs(value) > 2**53 else value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    raise TypeError(type(value))


def _meta(source: str = "cam0", index: int = 42) -> dict[str, Any]:
    return wire.meta_fields(wire.FrameMeta(
        source_id=source, frame_index=index, pts=index * 512, time_base=Fraction(1, 15360), capture_ns=CAPTURE_NS,
        latency_ms={"upload": 0.5, "detect": 4.25, "pose": 11.5}, drops={"source": 3, "publish_frame": 1},
        width=64, height=48, random_weights=False, session=1))


def _keypoint_parts(n: int, k: int = 308) -> list[wire.Part]:
    rng = np.random.default_rng(n)
    return [
        wire.Part("keypoints", (rng.random((n, k, 2), dtype=np.float32) * 60).astype("<f4")),
        wire.Part("keypoint_scores", rng.random((n, k), dtype=np.float32)),
        wire.Part("boxes", np.array([[1.5, 2.0, 30.0, 45.25]] * n, np.float32).reshape(n, 4)),
        wire.Part("box_scores", np.linspace(0.9, 0.5, n, dtype=np.float32)),
        wire.Part("track_ids", np.arange(n, dtype=np.int64) - (1 if n else 0)),
    ]


def _keypoint3d_parts(n: int, k: int = 308) -> list[wire.Part]:
    """The optional 3D group: some points and one root not valid (zeros there)."""
    rng = np.random.default_rng(100 + n)
    valid = (rng.random((n, k)) > 0.2).astype(np.uint8)
    xyz = np.where(valid[..., None] == 1, rng.standard_normal((n, k, 3)).astype(np.float32) + np.float32([0, 0, 3]),
                   np.float32(0))
    root_valid = np.ones(n, np.uint8)
    root_valid[-1:] = 0
    root = np.where(root_valid[:, None] == 1, xyz[:, 9:11].mean(axis=1), 0).astype(np.float32)
    return [wire.Part("keypoints3d", xyz.astype("<f4")), wire.Part("keypoints3d_valid", valid),
            wire.Part("root3d", root), wire.Part("root3d_valid", root_valid)]


WORLD_CAMERAS = ["cam0", "cam1", "side-2"]


def _world_fields(n: int, k: int = 308, cameras: list[str] | None = None) -> dict[str, Any]:
    """A world step's header fields: a rig of three cameras, side-2 without a frame in the window."""
    cameras = WORLD_CAMERAS if cameras is None else cameras
    meta = wire.meta_fields(wire.FrameMeta(source_id="rig", frame_index=7, capture_ns=CAPTURE_NS,
                                           latency_ms={"triangulate": 0.75}, drops={"source": 0}))
    return {**meta, "num_persons": n, "num_keypoints": k, "units": "m", "cameras": cameras,
            "camera_frames": {c: 40 + i for i, c in enumerate(cameras[:2])}}


def _world_parts(n: int, k: int = 308, c: int = 3, single: int = 1) -> list[wire.Part]:
    """The seven world parts: some points not valid (zeros there), some persons unseen by a camera."""
    rng = np.random.default_rng(200 + n)
    valid = (rng.random((n, k)) > 0.25).astype(np.uint8)
    xyz = np.where(valid[..., None] == 1, rng.standard_normal((n, k, 3)) * 0.3 + [0, 0, 1], 0).astype("<f4")
    error = np.where(valid == 1, rng.random((n, k)) * 3, 0).astype("<f4")
    views = (valid * rng.integers(2, c + 1, (n, k))).astype(np.uint8)
    members = np.tile(np.arange(n, dtype=np.int32)[:, None], (1, c))
    members[0::2, c - 1] = -1  # every other person is not seen by the last camera
    return [wire.Part("world_keypoints", xyz), wire.Part("world_valid", valid), wire.Part("world_error", error),
            wire.Part("world_views", views), wire.Part("world_ids", np.arange(n, dtype=np.int64) + 100),
            wire.Part("world_members", members),
            wire.Part("single_view", np.array([[c - 1, 3]] * single, np.int32).reshape(single, 2))]


def _replace(parts: list[wire.Part], name: str, array: np.ndarray) -> list[wire.Part]:
    return [wire.Part(name, array) if p.name == name else p for p in parts]


def _image() -> np.ndarray:
    y, x = np.mgrid[0:16, 0:24]
    return np.stack([x * 10, y * 14, (x + y) * 5], axis=-1).astype(np.uint8)  # smooth: JPEG stays close


def _classes() -> np.ndarray:
    return (np.add.outer(np.arange(16), np.arange(24)) % 29).astype(np.uint8)


def _png(width: int, height: int, color: int = 0, depth: int = 8, body: bytes = b"") -> bytes:
    """A PNG whose IHDR says what we like (the pixel data may be far smaller: an image bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(body)) + chunk(b"IEND", b"")


def _expect(frames: list[bytes], jpeg_reference: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    decoded = wire.decode(frames)
    arrays = {}
    for name, array in decoded.arrays.items():
        entry: dict[str, Any] = {"dtype": array.dtype.str, "shape": list(array.shape)}
        if jpeg_reference and name in jpeg_reference:
            entry["reference"] = _b64(np.ascontiguousarray(jpeg_reference[name]).tobytes())
            entry["max_mean_abs_diff"] = 4.0
        else:
            entry["sha256"] = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        arrays[name] = entry
    return {"topic": decoded.topic, "kind": decoded.kind, "source_id": decoded.source_id,
            "header": _jsonable(decoded.header), "arrays": arrays}


def _mutate(frames: list[bytes], **changes: Any) -> list[bytes]:
    header = msgpack.unpackb(frames[1])
    header.update(changes)
    return [frames[0], msgpack.packb(header), *frames[2:]]


def _with_part(frames: list[bytes], desc: dict[str, Any], data: bytes) -> list[bytes]:
    header = msgpack.unpackb(frames[1])
    header["parts"] = [desc]
    return [frames[0], msgpack.packb(header), data]


def cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def good(name: str, frames: list[bytes], **kw: Any) -> None:
        out.append({"name": name, "frames": [_b64(f) for f in frames], "expect": _expect(frames, **kw)})

    def bad(name: str, frames: list[bytes], reason: str) -> None:
        try:
            decode_message(frames)
        except wire.WireError as exc:
            assert exc.reason == reason, (name, exc.reason, exc)
        else:
            raise AssertionError(f"{name}: the Python decoder accepts it")
        out.append({"name": name, "frames": [_b64(f) for f in frames], "error": reason})

    enc = dict(publish_ns=PUBLISH_NS)
    kp = wire.encode("keypoints", "cam0", {**_meta(), "num_persons": 2, "num_keypoints": 308}, _keypoint_parts(2),
                     **enc)
    good("keypoints_two_persons", kp)
    good("keypoints_two_persons_json_header",
         wire.encode("keypoints", "cam0", {**_meta(), "num_persons": 2, "num_keypoints": 308}, _keypoint_parts(2),
                     header_format="json", **enc))
    good("keypoints_no_persons", wire.encode("keypoints", "lobby-2", {**_meta("lobby-2"), "num_persons": 0,
                                                                      "num_keypoints": 308}, _keypoint_parts(0), **enc))
    good("keypoints_not_computed", wire.encode("keypoints", "cam0", {**_meta(), "num_persons": 1, "num_keypoints": 0},
                                               _keypoint_parts(1, k=0), **enc))
    kp3d = wire.encode("keypoints", "cam0", {**_meta(), "num_persons": 2, "num_keypoints": 308,
                                             "keypoints3d_metric": True},
                       _keypoint_parts(2) + _keypoint3d_parts(2), **enc)
    good("keypoints_with_3d", kp3d)
    image = _image()
    good("frame_jpeg", wire.encode("frame", "cam0", {**_meta(), "annotated": True},
                                   [wire.Part("image", image, "jpeg")], jpeg_quality=95, **enc),
         jpeg_reference={"image": image})
    good("seg_png", wire.encode("seg", "cam0", _meta(), [wire.Part("classes", _classes(), "png")], **enc))
    alpha = (np.arange(16 * 24) % 256).astype(np.uint8).reshape(16, 24)
    good("matte_png", wire.encode("matte", "cam0", {**_meta(), "alpha_scale": 255},
                                  [wire.Part("alpha", alpha, "png")], **enc))
    status = {"fps": 29.75, "health": "stalled", "frames": 1200, "last_frame_index": 1199,
              "drops": {"source": 3, "publish_frame": 1}, "sent": {"keypoints": 1200}, "uptime_s": 40.5,
              "width": 64, "height": 48, "nominal_fps": 30.0, "live": True, "random_weights": False,
              "detector": "full-frame", "event": {"event": "stalled", "time_ns": CAPTURE_NS, "session": 0, "last_frame": 1199}}
    good("status_with_event", wire.encode("status", "cam0", status, **enc))
    good("unknown_keys_are_ignored", _mutate(kp, future_field={"anything": [1, 2]}, another=3))
    world = wire.encode("world", "rig", _world_fields(2), _world_parts(2), **enc)
    good("world_two_persons", world)
    good("world_two_persons_json_header", wire.encode("world", "rig", _world_fields(2), _world_parts(2),
                                                      header_format="json", **enc))
    good("world_no_persons", wire.encode("world", "rig", _world_fields(0), _world_parts(0, single=0), **enc))
    good("world_no_cameras_in_the_window", wire.encode("world", "rig", {**_world_fields(0), "camera_frames": {}},
                                                       _world_parts(0, single=0), **enc))

    # -- malformed: each must be refused with its reason, never crash a decoder ---------------
    bad("one_frame_only", [b"keypoints.cam0"], "frames")
    bad("header_not_msgpack", [b"keypoints.cam0", b"\xc1garbage"], "header")
    bad("header_not_a_map", [b"keypoints.cam0", msgpack.packb([1, 2])], "header")
    bad("header_nested_too_deep", [b"status.cam0", msgpack.packb(
        {"schema": wire.SCHEMA, "version": 1, "kind": "status", "source_id": "cam0",
         "x": [[[[[[[[1]]]]]]]]})], "header")
    bad("header_too_large", [b"status.cam0", msgpack.packb({"schema": wire.SCHEMA, "pad": "x" * 70_000})], "too_large")
    bad("topic_not_ascii", [b"\xff\xfe", msgpack.packb({})], "topic")
    bad("wrong_schema", _mutate(kp, schema="other.schema"), "schema")
    bad("newer_version", _mutate(kp, version=2), "version")
    bad("topic_does_not_match", _mutate(kp, source_id="cam1"), "topic")
    bad("bad_source_id", _mutate(kp, source_id="cam 0"), "field")
    bad("frame_index_is_a_string", _mutate(kp, frame_index="42"), "field")
    bad("time_base_zero_denominator", _mutate(kp, time_base=[1, 0]), "field")
    bad("latency_not_a_number", _mutate(kp, latency_ms={"pose": "fast"}), "field")
    bad("drops_hold_bytes", _mutate(kp, drops={"source": b"\x00\x01"}), "field")
    bad("capture_ns_negative", _mutate(kp, capture_ns=-5), "field")
    bad("parts_count_differs", kp[:-1], "parts")
    bad("keypoints3d_group_incomplete",
        wire.encode("keypoints", "cam0", {**_meta(), "num_persons": 2, "num_keypoints": 308},
                    _keypoint_parts(2) + _keypoint3d_parts(2)[:1], **enc), "parts")
    three = _keypoint3d_parts(3)
    bad("keypoints3d_persons_differ",
        wire.encode("keypoints", "cam0", {**_meta(), "num_persons": 2, "num_keypoints": 308},
                    _keypoint_parts(2) + _keypoint3d_parts(2)[:2] + three[2:], **enc), "shape")
    bad("keypoints3d_valid_not_bytes",
        wire.encode("keypoints", "cam0", {**_meta(), "num_persons": 2, "num_keypoints": 308},
                    _keypoint_parts(2) + [p if p.name != "keypoints3d_valid" else
                                          wire.Part(p.name, p.array.astype(np.float32))
                                          for p in _keypoint3d_parts(2)], **enc), "shape")
    bad("keypoints3d_metric_not_a_boolean", _mutate(kp3d, keypoints3d_metric="yes"), "field")
    bad("shape_overflows_int64", _with_part(kp, {"name": "keypoints", "encoding": "raw", "dtype": "<f4",
                                                 "shape": [2**32, 2**32, 2]}, b""), "shape")
    bad("shape_negative", _with_part(kp, {"name": "boxes", "encoding": "raw", "dtype": "<f4", "shape": [-1, 4]},
                                     b""), "shape")
    bad("raw_size_differs", _with_part(kp, {"name": "boxes", "encoding": "raw", "dtype": "<f4", "shape": [2, 4]},
                                       b"\x00" * 31), "shape")
    bad("dtype_object", _with_part(kp, {"name": "boxes", "encoding": "raw", "dtype": "|O", "shape": [1]},
                                   b"\x00" * 8), "dtype")
    bad("dtype_not_a_string", _with_part(kp, {"name": "boxes", "encoding": "raw", "dtype": ["<f4"], "shape": [1]},
                                         b"\x00" * 4), "dtype")
    bad("source_id_with_newline", _mutate([b"keypoints.cam0\n", *kp[1:]], source_id="cam0\n"), "field")
    bad("fps_beyond_float", wire.encode("status", "cam0", {"fps": 10**400, "health": "ok", "frames": 1,
                                                           "last_frame_index": 0, "drops": {}},
                                        header_format="json", **enc), "field")
    bad("encoding_unknown", _with_part(kp, {"name": "image", "encoding": "gif", "dtype": "|u1",
                                            "shape": [2, 2, 3]}, b"GIF89a"), "encoding")
    frame = wire.encode("frame", "cam0", _meta(), [wire.Part("image", image, "jpeg")], **enc)
    bad("jpeg_not_jpeg", _with_part(frame, {"name": "image", "encoding": "jpeg", "dtype": "|u1",
                                            "shape": [16, 24, 3]}, b"not a jpeg"), "image")
    bad("jpeg_size_differs_from_header", _with_part(frame, {"name": "image", "encoding": "jpeg", "dtype": "|u1",
                                                            "shape": [16, 25, 3]}, frame[2]), "shape")
    bad("jpeg_shape_too_short", _with_part(frame, {"name": "image", "encoding": "jpeg", "dtype": "|u1",
                                                   "shape": [16]}, frame[2]), "shape")
    bad("json_header_not_utf8", [b"status.cam0", "{\"schema\": \"sapiens2.stream\"}".encode("utf-16-le")],
        "header")
    seg = wire.encode("seg", "cam0", _meta(), [wire.Part("classes", _classes(), "png")], **enc)
    bad("png_bomb_declared_small", _with_part(seg, {"name": "classes", "encoding": "png", "dtype": "|u1",
                                                    "shape": [16, 24]}, _png(30000, 30000)), "shape")
    bad("png_bomb_declared_large", _with_part(seg, {"name": "classes", "encoding": "png", "dtype": "|u1",
                                                    "shape": [30000, 30000]}, _png(30000, 30000)), "too_large")
    bad("png_sixteen_bit", _with_part(seg, {"name": "classes", "encoding": "png", "dtype": "|u1",
                                            "shape": [16, 24]}, _png(24, 16, depth=16)), "shape")
    bad("keypoints_parts_disagree", wire.encode("keypoints", "cam0", _meta(), [
        wire.Part("keypoints", np.zeros((2, 308, 2), np.float32)), wire.Part("keypoint_scores", np.zeros((3, 308),
                                                                                                          np.float32)),
        wire.Part("boxes", np.zeros((2, 4), np.float32)), wire.Part("box_scores", np.zeros(2, np.float32)),
        wire.Part("track_ids", np.zeros(2, np.int64))], **enc), "shape")
    bad("keypoints_part_missing", wire.encode("keypoints", "cam0", _meta(), _keypoint_parts(1)[:4], **enc), "parts")
    parts = _world_parts(2)
    bad("world_part_missing", wire.encode("world", "rig", _world_fields(2), parts[:-1], **enc), "parts")
    bad("world_keypoints_not_xyz", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "world_keypoints", np.zeros((2, 308, 2), np.float32)), **enc), "shape")
    bad("world_keypoints_disagree", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "world_error", np.zeros((2, 307), np.float32)), **enc), "shape")
    bad("world_persons_disagree", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "world_ids", np.arange(3, dtype=np.int64)), **enc), "shape")
    bad("world_valid_not_bytes", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "world_valid", np.ones((2, 308), np.float32)), **enc), "shape")
    bad("world_members_not_int32", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "world_members", np.zeros((2, 3), np.int64)), **enc), "shape")
    bad("world_cameras_do_not_match_members", wire.encode("world", "rig", _world_fields(2, cameras=["cam0", "cam1"]),
                                                          parts, **enc), "shape")
    bad("world_member_out_of_range", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "world_members", np.array([[0, -2, 1], [1, 1, -1]], np.int32)), **enc), "shape")
    bad("world_single_view_camera_out_of_range", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "single_view", np.array([[3, 0]], np.int32)), **enc), "shape")
    bad("world_single_view_person_negative", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "single_view", np.array([[0, -1]], np.int32)), **enc), "shape")
    bad("world_single_view_not_pairs", wire.encode("world", "rig", _world_fields(2), _replace(
        parts, "single_view", np.array([0, 1], np.int32)), **enc), "shape")
    bad("world_cameras_missing", _mutate(world, cameras=None), "field")
    bad("world_camera_not_a_source_id", _mutate(world, cameras=["cam0", "cam 1", "side-2"]), "field")
    bad("world_cameras_repeated", _mutate(world, cameras=["cam0", "cam0", "side-2"]), "field")
    bad("world_camera_frames_of_another_camera", _mutate(world, camera_frames={"cam0": 40, "cam9": 41}), "field")
    bad("world_camera_frames_negative", _mutate(world, camera_frames={"cam0": -1}), "field")
    bad("world_units_not_a_string", _mutate(world, units=1), "field")
    bad("status_fps_not_a_number", wire.encode("status", "cam0", {**status, "fps": "fast"}, **enc), "field")
    bad("status_detector_not_a_string", wire.encode("status", "cam0", {**status, "detector": 1}, **enc), "field")
    return out


def render() -> str:
    return json.dumps({"schema": wire.SCHEMA, "version": wire.SCHEMA_VERSION, "cases": cases()}, indent=1) + "\n"


if __name__ == "__main__":
    (HERE / "vectors.json").write_text(render())
    print(f"wrote {HERE / 'vectors.json'}")
