"""The ZeroMQ wire format (docs/WIRE.md is normative; this is its reference implementation).

A message is ``[topic, header, part...]``: topic ``<kind>.<source_id>`` (ASCII), header a msgpack
map (or a JSON object), each part a binary payload described in order by ``header["parts"]``.

``decode`` treats every message as hostile: sizes are checked with exact integer arithmetic
against :class:`Limits` before any allocation, image sizes read from the PNG/JPEG headers before
decoding, every header field type-checked (``fields``). It raises :class:`WireError` (with a ``reason`` that
subscribers count by) and nothing else. No pickle anywhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import msgpack
import numpy as np

from . import images
# The refusals and the header field checks live in their own modules; they are part of this one's API.
from .errors import REASONS, MessageTooLarge, SchemaVersionError, WireError  # noqa: F401
from .fields import (_SOURCE_RE, _UINT64_MAX, _is_int, check_event, check_frame_fields,  # noqa: F401
                     check_source_id, check_status_fields, check_world_fields)

SCHEMA = "sapiens2.stream"
SCHEMA_VERSION = 1
KINDS = ("keypoints", "frame", "seg", "matte", "status", "world")
IMAGE_KINDS = ("frame", "seg", "matte")
HEADER_FORMATS = ("msgpack", "json")
ENCODINGS = ("raw", "jpeg", "png")
IMAGE_ENCODINGS = ("jpeg", "png")
# Only plain numeric dtypes may cross the wire (never object arrays).
RAW_DTYPES = frozenset({"|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"})
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Loopback defaults: a pipeline publishes on DEFAULT_ENDPOINT; a broker takes publishers on BROKER_XSUB
# and serves subscribers on BROKER_XPUB (all distinct: they can share a host).
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
BROKER_XSUB = "tcp://127.0.0.1:5556"
BROKER_XPUB = "tcp://127.0.0.1:5557"

@dataclass(frozen=True)
class Limits:
    """What a receiver accepts; every check happens before the allocation it guards."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # all frames of one message together
    max_header_bytes: int = 64 * 1024
    max_parts: int = 16
    max_dims: int = 4
    max_array_bytes: int = 256 * 1024 * 1024  # one decoded part; also a message's images together
    max_pixels: int = 64 * 1024 * 1024  # one image part: width * height
    max_header_depth: int = 4  # header -> parts -> part -> shape


@dataclass
class FrameMeta:
    """Per-frame header fields shared by keypoints, frame, seg, matte and world messages."""

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
    session: int = 0


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
        "latency_ms": {str(k): float(v) for k, v in meta.latency_ms.items() if math.isfinite(float(v))},
        "drops": {str(k): int(v) for k, v in meta.drops.items()},
        "width": int(meta.width),
        "height": int(meta.height),
        "random_weights": bool(meta.random_weights),
        "session": int(meta.session),
    }


def meta_from_header(header: dict[str, Any]) -> FrameMeta:
    """The FrameMeta of a per-frame header that ``decode`` validated."""
    tb = header.get("time_base")
    return FrameMeta(
        source_id=header["source_id"],
        frame_index=header["frame_index"],
        pts=header.get("pts"),
        time_base=None if tb is None else Fraction(tb[0], tb[1]),
        capture_ns=header.get("capture_ns", 0),
        latency_ms=dict(header.get("latency_ms", {})),
        drops=dict(header.get("drops", {})),
        width=header.get("width", 0),
        height=header.get("height", 0),
        random_weights=header.get("random_weights", False),
        session=header.get("session", 0),
    )


# -- encoding --------------------------------------------------------------------------------
def _encode_part(part: Part, jpeg_quality: int) -> tuple[dict[str, Any], bytes]:
    a = part.array
    if part.encoding == "raw":
        le = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        desc = {"name": part.name, "encoding": "raw", "dtype": le.dtype.str, "shape": list(a.shape)}
        if desc["dtype"] not in RAW_DTYPES:
            raise ValueError(f"{part.name}: dtype {a.dtype} cannot cross the wire")
        return desc, le.tobytes()
    if a.dtype != np.uint8:
        raise ValueError(f"{part.name}: {part.encoding} needs uint8, got {a.dtype}")
    if part.encoding == "jpeg":
        if a.ndim != 3 or a.shape[2] != 3:
            raise ValueError(f"{part.name}: expected (H, W, 3) RGB, got {tuple(a.shape)}")
        data = images.encode_jpeg_rgb(a, jpeg_quality)
    elif part.encoding == "png":
        if a.ndim != 2:
            raise ValueError(f"{part.name}: expected (H, W) for PNG, got {tuple(a.shape)}")
        data = images.encode_png_gray(a)
    else:
        raise ValueError(f"unknown encoding {part.encoding!r}; expected one of {', '.join(ENCODINGS)}")
    return image_descriptor(part.name, part.encoding, a.shape), data


def image_descriptor(name: str, encoding: str, shape: Sequence[int]) -> dict[str, Any]:
    """The part descriptor of an encoded image (also for images encoded elsewhere, e.g. on a GPU)."""
    desc: dict[str, Any] = {"name": name, "encoding": encoding, "dtype": "|u1", "shape": [int(s) for s in shape]}
    if encoding == "jpeg":
        desc["color"] = "rgb"
    return desc


def dump_header(header: dict[str, Any], header_format: str = "msgpack") -> bytes:
    """Serialise a header map as msgpack (default) or JSON."""
    if header_format == "msgpack":
        return msgpack.packb(header, use_bin_type=True)
    if header_format == "json":
        return json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
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
    encoded_parts: Sequence[tuple[dict[str, Any], bytes]] = (),
) -> list[bytes]:
    """Build the multipart frames ``[topic, header, part...]`` of one message.

    ``encoded_parts`` are (descriptor, bytes) pairs already encoded (e.g. a JPEG from the GPU),
    sent after ``parts``.
    """
    topic = topic_for(kind, source_id)
    encoded = [_encode_part(p, jpeg_quality) for p in parts] + list(encoded_parts)
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


# -- decoding --------------------------------------------------------------------------------
def load_header(data: bytes, limits: Limits = Limits()) -> dict[str, Any]:
    """Parse a header; JSON when its first byte is ``{``, msgpack otherwise. Bounded in size and depth."""
    if len(data) > limits.max_header_bytes:
        raise MessageTooLarge(f"header of {len(data)} bytes exceeds the {limits.max_header_bytes}-byte limit")
    try:
        if data[:1] == b"{":
            header = json.loads(data.decode("utf-8"))  # UTF-8 only (json.loads would guess UTF-16/32)
        else:
            n = limits.max_header_bytes
            header = msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=n,
                                     max_bin_len=n, max_array_len=n, max_map_len=n, max_ext_len=0)
    except RecursionError:
        raise WireError("header is nested too deeply", "header") from None
    except (ValueError, TypeError, msgpack.UnpackException) as e:  # JSONDecodeError, UnicodeDecodeError, msgpack's
        raise WireError(f"header is neither msgpack nor JSON: {e}", "header") from e
    if not isinstance(header, dict):
        raise WireError(f"header must be a map, got {type(header).__name__}", "header")
    if _depth(header, limits.max_header_depth + 1) > limits.max_header_depth:
        raise WireError(f"header is nested deeper than {limits.max_header_depth} levels", "header")
    return header


_LEAVES = (str, bytes, int, float, bool, type(None))  # what msgpack and JSON decode to, besides maps and arrays


def _depth(value: Any, stop: int) -> int:
    """Nesting depth of maps and arrays (a scalar is 0), counted up to ``stop`` without recursion.

    Raises WireError("header") for a value no header may hold: a msgpack ext (a Timestamp, an
    ExtType) or a string that is not valid Unicode (a JSON ``"\\ud800"`` decodes to a lone surrogate,
    which no UTF-8 output can write)."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            if deepest >= stop:
                return deepest
            if isinstance(item, dict):
                todo.extend((k, level) for k in item)
                todo.extend((v, level) for v in item.values())
            else:
                todo.extend((v, level) for v in item)
        elif not isinstance(item, _LEAVES):
            raise WireError(f"header holds a {type(item).__name__}, which no field may be", "header")
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise WireError(f"header holds a string that is not valid Unicode: {item!r:.40}", "header") from None
    return deepest


def _check_shape(name: str, shape: Any, limits: Limits) -> list[int]:
    if not isinstance(shape, list) or len(shape) > limits.max_dims or not all(_is_int(s, 0, 2**31) for s in shape):
        raise WireError(f"part {name!r}: bad shape {shape!r:.80} (at most {limits.max_dims} sizes, each 0..2^31)",
                        "shape")
    return shape


def _decode_part(desc: Any, data: bytes, limits: Limits) -> tuple[str, np.ndarray]:
    if not isinstance(desc, dict) or not {"name", "encoding", "dtype", "shape"} <= desc.keys():
        raise WireError(f"part descriptor needs name, encoding, dtype, shape: {desc!r:.80}", "parts")
    name, enc, dtype = desc["name"], desc["encoding"], desc["dtype"]
    if not isinstance(name, str) or not isinstance(enc, str):
        raise WireError(f"part name and encoding must be strings: {desc!r:.80}", "parts")
    shape = _check_shape(name, desc["shape"], limits)
    if not isinstance(dtype, str) or dtype not in RAW_DTYPES:
        raise WireError(f"part {name!r}: dtype {dtype!r:.40} not allowed", "dtype")
    dt = np.dtype(dtype)
    want = math.prod(shape) * dt.itemsize  # Python ints: exact, never wraps
    if want > limits.max_array_bytes:
        raise MessageTooLarge(f"part {name!r}: shape {shape} {dtype} is {want} bytes, over the "
                              f"{limits.max_array_bytes}-byte limit")
    if enc == "raw":
        if len(data) != want:
            raise WireError(f"part {name!r}: {len(data)} bytes for shape {shape} {dtype} ({want} expected)", "shape")
        return name, np.frombuffer(data, dtype=dt).reshape(shape)
    if enc not in ("jpeg", "png"):
        raise WireError(f"part {name!r}: unknown encoding {enc!r:.40}", "encoding")
    return name, _decode_image(name, enc, dtype, shape, data, limits)


def _decode_image(name: str, enc: str, dtype: str, shape: list[int], data: bytes, limits: Limits) -> np.ndarray:
    channels = 3 if enc == "jpeg" else 1
    ndim = 3 if enc == "jpeg" else 2
    wanted_shape = [*shape[:2], 3] if enc == "jpeg" else shape[:2]
    if dtype != "|u1" or len(shape) != ndim or shape != wanted_shape:
        what = "(H, W, 3) |u1" if enc == "jpeg" else "(H, W) |u1"
        raise WireError(f"part {name!r}: a {enc} part must declare {what}, got {shape} {dtype}", "shape")
    try:
        info = images.jpeg_info(data) if enc == "jpeg" else images.png_info(data)
    except images.ImageHeaderError as e:
        raise WireError(f"part {name!r}: {enc} data does not decode ({e})", "image") from None
    if (info.height, info.width) != (shape[0], shape[1]) or info.channels != channels or info.bit_depth != 8:
        raise WireError(f"part {name!r}: the {enc} holds {info.width}x{info.height}x{info.channels} "
                        f"({info.bit_depth}-bit), the header says {shape}", "shape")
    if info.width * info.height > limits.max_pixels:
        raise MessageTooLarge(f"part {name!r}: {info.width}x{info.height} pixels exceed the limit of "
                              f"{limits.max_pixels}")
    try:
        image = images.decode_jpeg_rgb(data) if enc == "jpeg" else images.decode_png_gray(data)
    except images.CodecMissing:
        raise
    except Exception as e:  # the decoder's own refusal (Pillow's bomb check, MemoryError, ...)
        raise WireError(f"part {name!r}: {enc} does not decode ({type(e).__name__})", "image") from None
    if image is None or list(image.shape) != wanted_shape or image.dtype != np.uint8:
        got = None if image is None else (image.shape, image.dtype)
        raise WireError(f"part {name!r}: {enc} data does not decode to {shape} (got {got})", "image")
    return image


def decode(
    frames: Sequence[bytes],
    *,
    max_bytes: int | None = None,
    limits: Limits | None = None,
    expected_version: int = SCHEMA_VERSION,
) -> Decoded:
    """Validate and decode the multipart frames of one message.

    Raises WireError (MessageTooLarge and SchemaVersionError are kinds of it); never anything else
    for bad input.
    """
    limits = limits or Limits()
    if max_bytes is not None:
        limits = dataclasses.replace(limits, max_message_bytes=max_bytes)
    size = sum(len(f) for f in frames)
    if size > limits.max_message_bytes:
        raise MessageTooLarge(f"message of {size} bytes exceeds the {limits.max_message_bytes}-byte limit")
    if len(frames) < 2:
        raise WireError(f"expected [topic, header, part...], got {len(frames)} frame(s)", "frames")
    if len(frames) - 2 > limits.max_parts:
        raise WireError(f"{len(frames) - 2} parts; at most {limits.max_parts} are accepted", "frames")
    try:
        topic = bytes(frames[0]).decode("ascii")
    except UnicodeDecodeError as e:
        raise WireError("topic is not ASCII", "topic") from e
    header = load_header(bytes(frames[1]), limits)
    if header.get("schema") != SCHEMA:
        raise WireError(f"schema {header.get('schema')!r:.40} is not {SCHEMA!r}", "schema")
    if header.get("version") != expected_version:
        raise SchemaVersionError(
            f"publisher speaks {SCHEMA} version {header.get('version')!r:.20}, this subscriber reads "
            f"version {expected_version}; install matching sapiens2-stream versions on both ends"
        )
    kind, source_id = header.get("kind"), header.get("source_id")
    if kind not in KINDS or not isinstance(source_id, str) or not _SOURCE_RE.fullmatch(source_id):
        raise WireError(f"bad kind {kind!r:.40} or source_id {source_id!r:.80}", "field")
    if topic != f"{kind}.{source_id}":
        raise WireError(f"topic {topic!r:.80} does not match header kind/source {kind!r}/{source_id!r}", "topic")
    if not _is_int(header.get("publish_ns", 0), 0, _UINT64_MAX):
        raise WireError("publish_ns must be an unsigned integer")
    if kind == "status":
        check_status_fields(header)
    else:
        check_frame_fields(header)
    descs = header.get("parts", [])
    if not isinstance(descs, list) or len(descs) != len(frames) - 2:
        raise WireError(f"header describes {descs!r:.80} parts but {len(frames) - 2} were sent", "parts")
    pixels = sum(math.prod(_check_shape(d.get("name"), d.get("shape"), limits)) for d in descs
                 if isinstance(d, dict) and d.get("encoding") in IMAGE_ENCODINGS)
    if pixels > limits.max_array_bytes:  # before any decodes: a PNG decodes to far more than it weighs
        raise MessageTooLarge(f"the images of this message declare {pixels} bytes, over {limits.max_array_bytes}")
    arrays: dict[str, np.ndarray] = {}
    for desc, data in zip(descs, frames[2:]):
        name, array = _decode_part(desc, bytes(data), limits)
        if name in arrays:
            raise WireError(f"part {name!r} appears twice", "parts")
        arrays[name] = array
    return Decoded(topic=topic, kind=kind, source_id=source_id, header=header, arrays=arrays)
