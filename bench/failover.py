"""A fleet's cameras moving, seen by a subscriber at the broker: the newest frame index of each, then
the capture time of each one's first frame on its new GPU actor. Used by bench_fleet.py and by
tests/pipeline/cluster/test_fleet.py; both raise TimeoutError past their deadline."""

from __future__ import annotations

import time

from sapiens2_client.messages import KeypointsMessage, StatusMessage
from sapiens2_client.subscriber import ReceiveTimeout, Subscriber


def latest_indices(sub: Subscriber, cameras: set[str], deadline_s: float = 120.0,
                   drain_s: float = 1.0) -> dict[str, int]:
    """The newest frame index of every camera (receiving until each one has sent, then ``drain_s`` more)."""
    last: dict[str, int] = {}
    end, drain_end = time.monotonic() + deadline_s, None
    while drain_end is None or time.monotonic() < drain_end:
        if time.monotonic() > end:
            raise TimeoutError(f"no keypoints from {sorted(cameras - set(last))} within {deadline_s:.0f} s")
        try:
            msg = sub.recv(timeout_s=0.2)
        except ReceiveTimeout:
            continue
        if isinstance(msg, KeypointsMessage) and msg.meta.source_id in cameras:
            last[msg.meta.source_id] = msg.meta.frame_index
            if drain_end is None and set(last) == cameras:
                drain_end = time.monotonic() + drain_s
    return last


def first_frames_after(sub: Subscriber, since_ns: int, last: dict[str, int], deadline_s: float,
                       statuses: list | None = None) -> dict[str, int]:
    """Capture time of each camera's first frame on its new actor: a moved camera is a new source
    there, so its frame index starts again below the last one seen (frames the dying actor still
    sent do not count). Status messages received meanwhile go to ``statuses``."""
    first: dict[str, int] = {}
    end = time.monotonic() + deadline_s
    while set(first) != set(last):
        if time.monotonic() > end:
            raise TimeoutError(f"cameras {sorted(set(last) - set(first))} did not resume within {deadline_s:.0f} s")
        try:
            msg = sub.recv(timeout_s=1.0)
        except ReceiveTimeout:
            continue
        if isinstance(msg, StatusMessage) and statuses is not None:
            statuses.append(msg)
        cid = msg.meta.source_id if isinstance(msg, KeypointsMessage) else None
        if cid in last and cid not in first:
            if msg.meta.frame_index < last[cid] and msg.meta.capture_ns > since_ns:
                first[cid] = msg.meta.capture_ns
            else:
                last[cid] = max(last[cid], msg.meta.frame_index)
    return first
