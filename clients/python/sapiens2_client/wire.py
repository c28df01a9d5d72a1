"""The ZeroMQ wire format: schema constants and pure encode/decode functions.

A message is multipart ``[topic, header, part...]``. The topic is ``<kind>.<source_id>``
(ASCII), the header a msgpack map (or a JSON object, whose first byte is ``{``), and each
part one binary payload described, in order, by ``header["parts"]``. docs/WIRE.md is the
normative description; this module is its reference implementation. No pickle anywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import cv2
import msgpack
import numpy as np

SCHEMA = "sapiens2.stream"
SCHEMA_VERSION = 1
KINDS = ("keypoints", "frame", "seg", "matte", "status")
IMAGE_KINDS = ("frame", "seg", "matte")
HEADER_FORMATS = ("msgpack", "json")
ENCODINGS = ("raw", "jpeg", "png")
# Only plain numeric dtypes may cross the wire (never object arrays).
RAW_DTYPES = frozenset({"|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"})
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Default endpoints (loopback): a pipeline publishes on DEFAULT_ENDPOINT; a broker takes publishers
# on BROKER_XSUB and serves subscribers on BROKER_XPUB (distinct ports: both can run on one host).
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
BROKER_XSUB = "tcp://127.0.0.1:5556"
BROKER_XPUB = "tcp://127.0.0.1:5557"
_SOURCE_RE = re.compile(r"^[A-Za-z0-9_\-:]{1,64}$")


class WireError(ValueError):
    """A message does not follow the wire format (malformed, oversized, wrong schema)."""


class MessageTooLarge(WireError):
    """A message is larger than the receiver's limit."""


class SchemaVersionError(WireError):
    """The publisher speaks another major version of the schema."""


@dataclass
class FrameMeta:
    """Per-frame header fields shared by keypoints, frame, seg and matte messages."""

    source_id: str
    frame_index: int
    pts: int | None = None
    time_base: Fraction | None = None
    capture_ns: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    width: int = 0
    height: int = 0
    random_weights: bool = False


@dataclass
class Decoded:
    """A decoded message: its topic, kind, header map and named payload arrays."""

    topic: str
    kind: str
    source_id: str
    header: dict[str, Any]
    arrays: dict[str, np.ndarray]


@dataclass(frozen=True)
class Part:
    """One binary payload to send: a name, the array, and how to encode it."""

    name: str
    array: np.ndarray
    encoding: str = "raw"  # raw | jpeg | png


def check_source_id(source_id: str) -> str:
    """Return source_id if it can be used in a topic, else raise ValueError."""
    if not _SOURCE_RE.match(source_id):
        raise ValueError(
            f"source id {source_id!r} must be 1-64 characters of letters, digits, '_', '-' or ':'"
        )
    return source_id


def topic_for(kind: str, source_id: str) -> str:
    """The topic string of a message: ``<kind>.<source_id>``."""
    if kind not in KINDS:
        raise ValueError(f"unknown message kind {kind!r}; expected one of {', '.join(KINDS)}")
    return f"{kind}.{check_source_id(source_id)}"


def meta_fields(meta: FrameMeta) -> dict[str, Any]:
    """The header fields of a FrameMeta (time_base as [num, den] or None)."""
    tb = meta.time_base
    return {
        "source_id": meta.source_id,
        "frame_index": int(meta.frame_index),
        "pts": None if meta.pts is None else int(meta.pts),
        "time_base": None if tb is None else [tb.numerator, tb.denominator],
        "capture_ns": int(meta.capture_ns),
        "latency_ms": {str(k): float(v) for k, v in meta.latency_ms.items()},
        "drops": {str(k): int(v) for k, v in meta.drops.items()},
        "width": int(meta.width),
        "height": int(meta.height),
        "random_weights": bool(meta.random_weights),
    }


def meta_from_header(header: dict[str, Any]) -> FrameMeta:
    """Rebuild the FrameMeta of a decoded per-frame header."""
    tb = header.get("time_base")
    return FrameMeta(
        source_id=header["source_id"],
        frame_index=int(header["frame_index"]),
        pts=header.get("pts"),
        time_base=None if tb is None else Fraction(int(tb[0]), int(tb[1])),
        capture_ns=int(header.get("capture_ns", 0)),
        latency_ms=dict(header.get("latency_ms", {})),
        drops=dict(header.get("drops", {})),
        width=int(header.get("width", 0)),
        height=int(header.get("height", 0)),
        random_weights=bool(header.get("random_weights", False)),
    )


def _encode_part(part: Part, jpeg_quality: int) -> tuple[dict[str, Any], bytes]:
    a = part.array
    if part.encoding == "raw":
        le = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        desc = {"name": part.name, "encoding": "raw", "dtype": le.dtype.str, "shape": list(a.shape)}
        assert desc["dtype"] in RAW_DTYPES, desc["dtype"]
        return desc, le.tobytes()
    if a.dtype != np.uint8:
        raise ValueError(f"{part.name}: {part.encoding} needs uint8, got {a.dtype}")
    if part.encoding == "jpeg":
        if a.ndim != 3 or a.shape[2] != 3:
            raise ValueError(f"{part.name}: expected (H, W, 3) RGB, got {tuple(a.shape)}")
        ok, buf = cv2.imencode(".jpg", cv2.cvtColor(a, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality])
    elif part.encoding == "png":
        if a.ndim != 2:
            raise ValueError(f"{part.name}: expected (H, W) for PNG, got {tuple(a.shape)}")
        ok, buf = cv2.imencode(".png", np.ascontiguousarray(a))
    else:
        raise ValueError(f"unknown encoding {part.encoding!r}; expected one of {', '.join(ENCODINGS)}")
    if not ok:
        raise ValueError(f"{part.name}: {part.encoding} encoding failed")
    desc = {"name": part.name, "encoding": part.encoding, "dtype": "|u1", "shape": list(a.shape)}
    if part.encoding == "jpeg":
        desc["color"] = "rgb"
    return desc, buf.tobytes()


def dump_header(header: dict[str, Any], header_format: str = "msgpack") -> bytes:
    """Serialise a header map as msgpack (default) or JSON."""
    if header_format == "msgpack":
        return msgpack.packb(header, use_bin_type=True)
    if header_format == "json":
        return json.dumps(header, separators=(",", ":")).encode()
    raise ValueError(f"unknown header format {header_format!r}; expected msgpack or json")


def encode(
    kind: str,
    source_id: str,
    fields: dict[str, Any],
    parts: Sequence[Part] = (),
    *,
    publish_ns: int,
    header_format: str = "msgpack",
    jpeg_quality: int = 90,
) -> list[bytes]:
    """Build the multipart frames ``[topic, header, part...]`` of one message."""
    topic = topic_for(kind, source_id)
    encoded = [_encode_part(p, jpeg_quality) for p in parts]
    header = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "kind": kind,
        **fields,
        "source_id": source_id,
        "publish_ns": int(publish_ns),
        "parts": [d for d, _ in encoded],
    }
    return [topic.encode(), dump_header(header, header_format), *(b for _, b in encoded)]


def load_header(data: bytes) -> dict[str, Any]:
    """Parse a header; JSON when its first byte is ``{``, msgpack otherwise."""
    try:
        if data[:1] == b"{":
            header = json.loads(data)
        else:
            header = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as e:  # JSONDecodeError and msgpack errors
        raise WireError(f"header is neither msgpack nor JSON: {e}") from e
    if not isinstance(header, dict):
        raise WireError(f"header must be a map, got {type(header).__name__}")
    return header


def _decode_part(desc: Any, data: bytes) -> tuple[str, np.ndarray]:
    if not isinstance(desc, dict) or not {"name", "encoding", "dtype", "shape"} <= desc.keys():
        raise WireError(f"part descriptor needs name, encoding, dtype, shape: {desc!r}")
    name, enc, dtype, shape = desc["name"], desc["encoding"], desc["dtype"], desc["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError(f"part {name!r}: bad shape {shape!r}")
    if dtype not in RAW_DTYPES:
        raise WireError(f"part {name!r}: dtype {dtype!r} not allowed")
    if enc == "raw":
        dt = np.dtype(dtype)
        want = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if len(data) != want:
            raise WireError(f"part {name!r}: {len(data)} bytes for shape {shape} {dtype} ({want} expected)")
        return name, np.frombuffer(data, dtype=dt).reshape(shape)
    if enc not in ("jpeg", "png"):
        raise WireError(f"part {name!r}: unknown encoding {enc!r}")
    flag = cv2.IMREAD_COLOR if enc == "jpeg" else cv2.IMREAD_UNCHANGED
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flag) if data else None
    if img is None:
        raise WireError(f"part {name!r}: {enc} data does not decode")
    if enc == "jpeg":
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if list(img.shape) != shape or img.dtype != np.uint8:
        raise WireError(f"part {name!r}: decoded {img.shape} {img.dtype}, header says {shape} {dtype}")
    return name, img


def decode(
    frames: list[bytes],
    *,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    expected_version: int = SCHEMA_VERSION,
) -> Decoded:
    """Validate and decode the multipart frames of one message.

    Raises MessageTooLarge, SchemaVersionError or WireError; never anything else for bad input.
    """
    size = sum(len(f) for f in frames)
    if size > max_bytes:
        raise MessageTooLarge(f"message of {size} bytes exceeds the {max_bytes}-byte limit")
    if len(frames) < 2:
        raise WireError(f"expected [topic, header, part...], got {len(frames)} frame(s)")
    try:
        topic = bytes(frames[0]).decode("ascii")
    except UnicodeDecodeError as e:
        raise WireError("topic is not ASCII") from e
    header = load_header(bytes(frames[1]))
    if header.get("schema") != SCHEMA:
        raise WireError(f"schema {header.get('schema')!r} is not {SCHEMA!r}")
    if header.get("version") != expected_version:
        raise SchemaVersionError(
            f"publisher speaks {SCHEMA} version {header.get('version')!r}, this subscriber reads "
            f"version {expected_version}; install matching sapiens2-stream versions on both ends"
        )
    kind, source_id = header.get("kind"), header.get("source_id")
    if kind not in KINDS or not isinstance(source_id, str):
        raise WireError(f"bad kind {kind!r} or source_id {source_id!r}")
    if topic != f"{kind}.{source_id}":
        raise WireError(f"topic {topic!r} does not match header kind/source {kind!r}/{source_id!r}")
    if kind != "status" and not isinstance(header.get("frame_index"), int):
        raise WireError(f"{kind} header lacks an integer frame_index")
    descs = header.get("parts", [])
    if not isinstance(descs, list) or len(descs) != len(frames) - 2:
        raise WireError(f"header describes {descs!r} parts but {len(frames) - 2} were sent")
    arrays = dict(_decode_part(d, bytes(f)) for d, f in zip(descs, frames[2:]))
    return Decoded(topic=topic, kind=kind, source_id=source_id, header=header, arrays=arrays)
