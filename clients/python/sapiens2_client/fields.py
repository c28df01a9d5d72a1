"""Type and range checks of the header fields (docs/WIRE.md, "Header fields"), run by ``wire.decode``
on every message before its parts are read. The JavaScript client's src/fields.js mirrors them, in
the same order and with the same refusal reasons."""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import WireError

_SOURCE_RE = re.compile(r"[A-Za-z0-9_\-:]{1,64}")  # (fullmatch: no trailing newline slips through)
_INT64_MAX = 2**63 - 1
_UINT64_MAX = 2**64 - 1


def check_source_id(source_id: str) -> str:
    """Return source_id if it can be used in a topic, else raise ValueError."""
    if not isinstance(source_id, str) or not _SOURCE_RE.fullmatch(source_id):
        raise ValueError(
            f"source id {source_id!r} must be 1-64 characters of letters, digits, '_', '-' or ':'"
        )
    return source_id


def _is_int(value: Any, lo: int = 0, hi: int = _INT64_MAX) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _is_number(value: Any) -> bool:
    """A finite float, or an int a float can hold (a 400-digit int would overflow float())."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= _UINT64_MAX
    return isinstance(value, float) and math.isfinite(value)


def _check_map(header: dict, key: str, check_value, what: str) -> None:
    value = header.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and check_value(v) for k, v in value.items()):
        raise WireError(f"{key} must be a map of names to {what}, got {value!r:.80}")


def _optional(header: dict, key: str, check, what: str) -> None:
    if key in header and not check(header[key]):
        raise WireError(f"{key} must be {what}, got {header[key]!r:.80}")


def check_frame_fields(header: dict[str, Any]) -> None:
    """Type and range of every per-frame field (keypoints, frame, seg, matte, world); raises WireError."""
    if not _is_int(header.get("frame_index")):
        raise WireError(f"{header.get('kind')} header lacks an integer frame_index")
    _optional(header, "pts", lambda v: v is None or _is_int(v, -_INT64_MAX - 1), "an integer or nil")
    tb = header.get("time_base")
    if tb is not None and not (isinstance(tb, list) and len(tb) == 2 and _is_int(tb[0], 1, 2**31)
                               and _is_int(tb[1], 1, 2**31)):
        raise WireError(f"time_base must be nil or [num, den] with positive integers, got {tb!r:.80}")
    _optional(header, "capture_ns", lambda v: _is_int(v, 0, _UINT64_MAX), "an unsigned integer")
    _optional(header, "session", _is_int, "a non-negative integer")
    _check_map(header, "latency_ms", _is_number, "finite numbers")
    _check_map(header, "drops", _is_int, "non-negative integers")
    for key in ("width", "height"):
        _optional(header, key, lambda v: _is_int(v, 0, 2**31), "a non-negative integer")
    _optional(header, "random_weights", lambda v: isinstance(v, bool), "a boolean")
    if header["kind"] == "keypoints":
        for key in ("num_persons", "num_keypoints"):
            _optional(header, key, lambda v: _is_int(v, 0, 2**31), "a non-negative integer")
        _optional(header, "keypoints3d_metric", lambda v: isinstance(v, bool), "a boolean")
    elif header["kind"] == "frame":
        _optional(header, "annotated", lambda v: isinstance(v, bool), "a boolean")
    elif header["kind"] == "matte":
        _optional(header, "alpha_scale", lambda v: _is_number(v) and v > 0, "a positive number")
    elif header["kind"] == "world":
        check_world_fields(header)


def check_world_fields(header: dict[str, Any]) -> None:
    """The fields of a world message: its counts, units, the rig's cameras (distinct source ids, the
    column order of ``world_members``) and the frame of each camera used in the step."""
    for key in ("num_persons", "num_keypoints"):
        _optional(header, key, lambda v: _is_int(v, 0, 2**31), "a non-negative integer")
    _optional(header, "units", lambda v: isinstance(v, str) and 0 < len(v) <= 16, "a short string")
    cameras = header.get("cameras")
    if not (isinstance(cameras, list) and all(isinstance(c, str) and _SOURCE_RE.fullmatch(c) for c in cameras)
            and len(set(cameras)) == len(cameras)):
        raise WireError(f"cameras must be a list of distinct source ids, got {cameras!r:.80}")
    known, frames = set(cameras), header.get("camera_frames")
    if not (isinstance(frames, dict) and all(k in known and _is_int(v) for k, v in frames.items())):
        raise WireError(f"camera_frames must map cameras to frame indices, got {frames!r:.80}")


def check_status_fields(header: dict[str, Any]) -> None:
    """Type and range of the status fields; raises WireError."""
    if not _is_number(header.get("fps")) or not isinstance(header.get("health"), str):
        raise WireError("status needs a finite number fps and a string health")
    if not _is_int(header.get("frames")) or not _is_int(header.get("last_frame_index"), -1):
        raise WireError("status needs integer frames and last_frame_index")
    _check_map(header, "drops", _is_int, "non-negative integers")
    _check_map(header, "sent", _is_int, "non-negative integers")
    _optional(header, "uptime_s", _is_number, "a finite number")
    _optional(header, "nominal_fps", lambda v: v is None or _is_number(v), "a finite number or nil")
    for key in ("width", "height"):
        _optional(header, key, lambda v: _is_int(v, 0, 2**31), "a non-negative integer")
    for key in ("live", "random_weights"):
        _optional(header, key, lambda v: isinstance(v, bool), "a boolean")
    _optional(header, "detector", lambda v: isinstance(v, str) and 0 < len(v) <= 64, "a short string")
    if "event" in header:
        check_event(header["event"])


# The fields of a status ``event`` map (docs/WIRE.md) and what each must be; unknown keys are
# allowed (the version rule), but only as plain JSON-able values (no bytes), since clients print them.
_EVENT_FIELDS = {
    "event": (lambda v: isinstance(v, str) and 0 < len(v) <= 64, "a short string"),
    "time_ns": (lambda v: _is_int(v, 0, _UINT64_MAX), "an unsigned integer"),
    "session": (_is_int, "a non-negative integer"),
    "last_frame": (lambda v: _is_int(v, -1), "an integer >= -1"),
    "first_frame": (_is_int, "a non-negative integer"),
    "silent_s": (lambda v: _is_number(v) and v >= 0, "a non-negative number"),
    "outage_s": (lambda v: _is_number(v) and v >= 0, "a non-negative number"),
    "reason": (lambda v: isinstance(v, str), "a string"),
}


def _json_value(value: Any) -> bool:
    """A value with no bytes anywhere (maps keyed by strings), which JSON can hold."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                return False
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, bytes):
            return False
    return True


def check_event(event: Any) -> None:
    """A status ``event`` map: ``event`` present, every documented field typed; raises WireError."""
    if not isinstance(event, dict) or "event" not in event:
        raise WireError(f"event must be a map with an event name, got {event!r:.80}")
    for key, value in event.items():
        check, what = _EVENT_FIELDS.get(key, (_json_value, "plain data (no bytes)"))
        if not isinstance(key, str) or not check(value):
            raise WireError(f"event field {key!r:.40} must be {what}, got {value!r:.80}")
