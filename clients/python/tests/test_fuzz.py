"""Fuzzing the decoder with generated messages: whatever arrives, only WireError may come out.

Three generators: random bytes, headers built from the format's own fields with hostile values
(every type in every field, huge shapes, odd dtypes), and real encoded messages with bytes flipped,
cut or inserted.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapiens2_client import wire
from sapiens2_client.messages import decode_message

CASES = json.loads((Path(__file__).resolve().parents[2] / "vectors" / "vectors.json").read_text())["cases"]
GOOD = [[base64.b64decode(f) for f in c["frames"]] for c in CASES if "expect" in c]
SMALL = wire.Limits(max_message_bytes=1 << 20, max_array_bytes=1 << 20, max_pixels=1 << 16)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.binary(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                                          inner, max_size=4),
                      max_leaves=12)
shapes = st.lists(st.one_of(st.integers(min_value=-3, max_value=2**40), values), max_size=6)
descriptors = st.fixed_dictionaries({
    "name": st.one_of(st.sampled_from(["keypoints", "keypoint_scores", "boxes", "box_scores", "track_ids", "image",
                                       "classes", "alpha"]), values),
    "encoding": st.one_of(st.sampled_from(["raw", "jpeg", "png"]), values),
    "dtype": st.one_of(st.sampled_from(sorted(wire.RAW_DTYPES) + ["|O", "<c8", ">f4", "V8"]), values),
    "shape": st.one_of(shapes, values),
})


def _decode(frames: list[bytes]) -> None:
    try:
        decode_message(frames, limits=SMALL)
    except wire.WireError:
        pass  # refused: fine. Anything else escaping is the failure this test looks for.


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_random_frames(frames: list[bytes]) -> None:
    _decode(frames)


@FUZZ
@given(kind=st.sampled_from(wire.KINDS), source=st.sampled_from(["cam0", "a:b-c_d"]),
       fields=st.dictionaries(st.sampled_from(["frame_index", "pts", "time_base", "capture_ns", "latency_ms", "drops",
                                               "width", "height", "random_weights", "session", "fps", "health",
                                               "frames", "last_frame_index", "sent", "num_persons", "publish_ns",
                                               "annotated", "alpha_scale", "nominal_fps", "uptime_s"]), values),
       parts=st.lists(st.tuples(descriptors, st.binary(max_size=256)), max_size=6),
       json_header=st.booleans())
def test_hostile_headers(kind: str, source: str, fields: dict, parts: list, json_header: bool) -> None:
    header = {"schema": wire.SCHEMA, "version": wire.SCHEMA_VERSION, "kind": kind, "source_id": source, **fields,
              "parts": [d for d, _ in parts]}
    try:
        data = json.dumps(header, default=repr).encode() if json_header else msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return  # not representable in that format at all
    _decode([f"{kind}.{source}".encode(), data, *(b for _, b in parts)])


@FUZZ
@given(case=st.sampled_from(GOOD), frame=st.integers(min_value=0, max_value=10), pos=st.integers(min_value=0),
       change=st.one_of(st.binary(min_size=1, max_size=8), st.just(b"")), cut=st.booleans())
def test_mutated_real_messages(case: list[bytes], frame: int, pos: int, change: bytes, cut: bool) -> None:
    frames = list(case)
    i = frame % len(frames)
    data = bytearray(frames[i])
    p = pos % (len(data) + 1)
    data = data[:p] if cut else data[:p] + change + data[p + len(change):]
    frames[i] = bytes(data)
    _decode(frames)


@pytest.mark.parametrize("case", GOOD[:3])
def test_good_messages_pass_the_fuzzing_limits(case: list[bytes]) -> None:
    decode_message(case, limits=SMALL)  # the limits used above do not refuse real messages
