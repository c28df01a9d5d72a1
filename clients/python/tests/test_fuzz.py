"""Fuzzing the decoder with generated messages: whatever arrives, only WireError may come out, and
whatever it lets through, the CLI can print (text line, ``--json``, ``--save-keypoints``).

Four generators: random bytes, headers built from the format's own fields with hostile values
(every type in every field, huge shapes, odd dtypes), real encoded messages with bytes flipped,
cut or inserted, and real messages with hostile values where the format leaves room (a status
``event``, keys it does not define, strings that are not valid Unicode).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapiens2_client import cli, wire
from sapiens2_client.messages import Message, decode_message

CASES = json.loads((Path(__file__).resolve().parents[2] / "vectors" / "vectors.json").read_text())["cases"]
GOOD = [[base64.b64decode(f) for f in c["frames"]] for c in CASES if "expect" in c]
SMALL = wire.Limits(max_message_bytes=1 << 20, max_array_bytes=1 << 20, max_pixels=1 << 16)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LONE_SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc80"])  # JSON "\ud800" decodes to these
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.binary(max_size=12),
                    LONE_SURROGATES)
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


def _print_all_ways(msg: Message) -> None:
    """What ``subscribe`` does with a message it accepted: none of it may raise."""
    cli.line(msg).encode("utf-8")  # stdout is UTF-8 (strict): a lone surrogate would raise here
    json.dumps(cli.summary(msg), allow_nan=False)  # --json
    record = cli.jsonl_record(msg)  # --save-keypoints, serialised as LineWriter does
    if record is not None:
        json.dumps(record, separators=(",", ":"), allow_nan=False).encode()


def _decode(frames: list[bytes]) -> None:
    try:
        msg = decode_message(frames, limits=SMALL)
    except wire.WireError:
        return  # refused: fine. Anything else escaping is the failure this test looks for.
    _print_all_ways(msg)


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


def _pack(header: dict, json_header: bool) -> bytes | None:
    try:
        return json.dumps(header).encode() if json_header else msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return None  # not representable in that format (bytes in JSON, a lone surrogate in msgpack)


extras = st.dictionaries(st.one_of(st.text(max_size=8), LONE_SURROGATES), values, max_size=3)
events = st.one_of(values, st.dictionaries(st.sampled_from(["event", "time_ns", "session", "last_frame", "reason",
                                                            "silent_s", "outage_s", "first_frame", "other"]),
                                           values, max_size=5),
                   st.builds(lambda name, rest: {"event": name, **rest}, st.one_of(st.text(max_size=8), values),
                             extras))


STATUS = wire.encode("status", "cam0", {"fps": 1.0, "health": "ok", "frames": 1, "last_frame_index": 0,
                                        "event": {"event": "resumed", "time_ns": 1, "session": 1, "outage_s": 0.5,
                                                  "first_frame": 3, "reason": "x"}}, publish_ns=1)


@FUZZ
@given(event=events, extra=extras, health=st.one_of(st.text(max_size=8), LONE_SURROGATES), json_header=st.booleans())
def test_accepted_status_messages_print_every_way(event, extra: dict, health: str, json_header: bool) -> None:
    """A status with hostile values where a valid one has room: its event, its health, unknown keys."""
    data = _pack({**wire.load_header(STATUS[1]), **extra, "health": health, "event": event}, json_header)
    if data is not None:
        _decode([STATUS[0], data])


@FUZZ
@given(case=st.sampled_from(GOOD), extra=extras, json_header=st.booleans())
def test_accepted_messages_with_unknown_keys_print_every_way(case: list[bytes], extra: dict,
                                                             json_header: bool) -> None:
    data = _pack({**wire.load_header(case[1]), **extra}, json_header)
    if data is not None:
        _decode([case[0], data, *case[2:]])


@pytest.mark.parametrize("event", [{"event": "stalled", "x": b"\x00"}, {"event": "stalled", "x": [1, b"\x00"]},
                                   {"event": b"stalled"}, {"event": "stalled", "time_ns": b"1"},
                                   {"event": "stalled", "x": msgpack.ExtType(5, b"")}])
def test_a_status_event_holding_bytes_or_ext_is_refused(event: dict) -> None:
    header = {**wire.load_header(STATUS[1]), "event": event}
    with pytest.raises(wire.WireError) as refused:
        decode_message([STATUS[0], msgpack.packb(header, use_bin_type=True)], limits=SMALL)
    assert refused.value.reason in ("field", "header")


@pytest.mark.parametrize("where", ["health", "key", "unknown"])
def test_a_json_header_with_a_lone_surrogate_is_refused(where: str) -> None:
    header = wire.load_header(STATUS[1])
    if where == "health":
        header["health"] = "\ud800"
    else:
        header["\ud800" if where == "key" else "future"] = "\udfff" if where == "unknown" else 1
    with pytest.raises(wire.WireError) as refused:
        decode_message([STATUS[0], json.dumps(header).encode()], limits=SMALL)
    assert refused.value.reason == "header"


def test_a_documented_event_passes() -> None:
    _print_all_ways(decode_message(STATUS, limits=SMALL))
